"""``python benchmarks/NAME.py``: the script run as the module ``benchmarks.NAME``.

A script run as a file has no package, so its relative imports (``from . import harness``) would
fail. Its first lines hand over here instead::

    if not __package__:  # python benchmarks/NAME.py: run as benchmarks.NAME
        import _boot; _boot.run_file(__file__)

:func:`run_file` loads this folder as the ``benchmarks`` package by its location (not through
``sys.path``, which is left as Python set it: ``benchmarks/`` first, then ``PYTHONPATH``), then
runs the script's module as ``__main__``. So whichever ``trawmem_gpu`` comes first on the path is
the one measured, as before the folder was a package: ``bench_select.py --versus`` spawns its
workers this way with ``PYTHONPATH`` set to each source tree. Standard library only.
"""
from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_package() -> None:
    """``benchmarks`` in ``sys.modules``: this folder's package, loaded from its ``__init__.py``."""
    mod = sys.modules.get("benchmarks")
    if mod is not None and Path(getattr(mod, "__file__", "") or "").resolve().parent == HERE:
        return
    spec = importlib.util.spec_from_file_location("benchmarks", HERE / "__init__.py",
                                                  submodule_search_locations=[str(HERE)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = mod
    spec.loader.exec_module(mod)


def module_name(path) -> str:
    """``benchmarks/bench_select.py`` -> ``benchmarks.bench_select`` (any file under this folder)."""
    rel = Path(path).resolve().relative_to(HERE).with_suffix("")
    return ".".join(("benchmarks", *rel.parts))


def run_file(path) -> None:
    """Run the script at ``path`` as its module (``__main__``, with ``sys.argv`` as given); exits."""
    load_package()
    runpy.run_module(module_name(path), run_name="__main__", alter_sys=True)
    raise SystemExit(0)
