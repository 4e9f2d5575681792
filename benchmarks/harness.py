"""What every benchmark script shares: the machine record, thread pinning, the dev-data paths,
and writing results.

How the scripts import. ``benchmarks/`` is a package: ``python -m benchmarks run NAME`` (the
suite's runner, ``benchmarks/__main__.py``) or ``python -m benchmarks.MODULE`` runs a script from
the repository root with the package installed (``pip install -e .``, or ``PYTHONPATH`` on the
tree), and scripts import this module and their sibling modules relatively (``from . import
harness``; ``from .. import harness`` in ``select_bench/``, ``experiments/`` and the other
subpackages). ``python benchmarks/NAME.py`` runs the same module: its first lines hand over to
``_boot.run_file``, which loads this folder as the ``benchmarks`` package by its location, so
whichever ``trawmem_gpu`` ``PYTHONPATH`` names is the one measured (``bench_select.py --versus``
spawns its workers that way, one per source tree). Nothing under ``benchmarks/`` edits
``sys.path``; the one module outside ``benchmarks/`` a script needs, a helper of the test suite,
is loaded by :func:`tests_module`.

This module imports only the standard library at import time (the package, torch, numpy, numba,
filelock and matplotlib are imported where used), so ``--help`` stays fast and a worker running
against another source tree can import it there too.

* :func:`machine`: the one machine-description record of every result file.
* :func:`pin_threads`: torch, BLAS / OpenMP (threadpoolctl), numba and the thread variables of
  child processes held at ``n`` threads for a block.
* :func:`dev_data` / :func:`require_data`: where the LoCoMo and LongMemEval dev files are read
  (``../shared/data`` beside the repository, or ``TRAWMEM_DEV_DATA``), and a one-line error
  (exit 2) when one is missing.
* :func:`results_dir`, :func:`save`, :func:`load`, :func:`locked`: ``NAME.json`` (and
  ``NAME.png``) written atomically under ``benchmarks/results/`` (``results/archive/`` for the
  experiments; or ``TRAWMEM_BENCH_OUT``, or a script's ``--out-dir``), with the machine record
  and the command line inside; a read-modify-write of a result file holds its lock.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
ARCHIVE = RESULTS / "archive"
"""Where the experiments (``benchmarks/experiments/``) write: their results are kept, not current."""
SHARED_DATA = ROOT.parent / "shared" / "data"
DEV_FILES = {"locomo": Path("locomo") / "locomo_dev.json",
             "longmemeval": Path("longmemeval") / "longmemeval_s_dev.json.gz"}
DEV_NAMES = {"locomo": "LoCoMo", "longmemeval": "LongMemEval-S"}
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")

# Offline and quiet for every script: no model download at run time, no tokenizer fork warnings.
for _k, _v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_k, _v)


# ----------------------------------------------------------------------------------------------
# the machine
# ----------------------------------------------------------------------------------------------
def machine(**extra) -> dict:
    """The machine a result was measured on: the record ``trawmem sweep`` writes
    (``eval.sweep.machine_info``: platform, Python, CPUs, torch and its threads, device, 1-minute
    load average) with the numpy and numba versions and the CUDA device's name (None without one)
    added. ``extra`` adds script-specific fields (e.g. the ``threads`` a run was pinned to)."""
    import torch

    from trawmem_gpu.eval.sweep import machine_info

    rec = machine_info()
    for mod in ("numpy", "numba"):
        try:
            rec[mod] = __import__(mod).__version__
        except ImportError:  # numba is optional for the engine: recorded as absent
            rec[mod] = None
    rec["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    rec.update(extra)
    return rec


# ----------------------------------------------------------------------------------------------
# threads
# ----------------------------------------------------------------------------------------------
@contextmanager
def pin_threads(n: int):
    """Hold every thread pool of this process at ``n`` threads inside the block, and restore them
    after: torch's intra-op pool (``torch.set_num_threads``), the BLAS / OpenMP pools of the
    loaded libraries (``threadpoolctl``), numba's pool (``numba.set_num_threads``), and the
    ``OMP/MKL/OPENBLAS_NUM_THREADS`` variables, which libraries loaded later and child processes
    (servers, ``--versus`` workers) read at start-up (a child that needs ``NUMBA_NUM_THREADS`` is
    given it in its own environment, as ``THREAD_VARS`` lists).

    Benchmarks pin to get per-core figures that hold still on a shared machine: one query's
    matrices are small, so spare pool threads add hand-offs and spin-waits rather than speed.
    The torch and BLAS part is what ``eval.sweep.query_threads`` does for ``trawmem sweep``; it is
    written here against torch and threadpoolctl themselves because ``bench_select.py --versus``
    runs this module in workers over another source tree, whose package may not have that helper.
    """
    if n < 1:
        raise ValueError(f"threads must be at least 1, got {n}")
    import numba  # loaded first: its pool is sized by set_num_threads, never by its variable (below)
    import torch
    from threadpoolctl import threadpool_limits

    # NUMBA_NUM_THREADS stays as it is in this process: numba reads it again at every compile and
    # refuses a value other than the pool it launched; child processes get it from their own env
    env_vars = tuple(k for k in THREAD_VARS if k != "NUMBA_NUM_THREADS")
    old_env = {k: os.environ.get(k) for k in env_vars}
    os.environ.update({k: str(n) for k in env_vars})
    prev_torch = torch.get_num_threads()
    prev_numba = numba.get_num_threads()
    torch.set_num_threads(n)
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        torch.set_num_threads(prev_torch)
        numba.set_num_threads(prev_numba)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pct(xs, q) -> float:
    """The ``q``-th percentile of ``xs`` (NaN when empty): the latency summaries' one helper."""
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else float("nan")


def repin(n: int) -> None:
    """Set torch's pool back to ``n`` inside a :func:`pin_threads` block, after code that may
    have changed the shared OpenMP runtime (a numba compilation, apricot's greedy)."""
    import torch

    torch.set_num_threads(n)


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
def dev_data(name: str = "locomo") -> Path:
    """The default path of a dev file (``name``: ``locomo`` or ``longmemeval``).

    ``TRAWMEM_DEV_DATA`` may name the LoCoMo file (as for the tests) or a folder laid out like
    ``../shared/data`` (``locomo/locomo_dev.json``, ``longmemeval/longmemeval_s_dev.json.gz``);
    without it, or for LongMemEval when it names a file, the file under ``../shared/data``
    beside the repository. The path may not exist: :func:`require_data` says so."""
    if name not in DEV_FILES:
        raise ValueError(f"name must be one of {', '.join(DEV_FILES)}, got {name!r}")
    env = os.environ.get("TRAWMEM_DEV_DATA")
    if env:
        p = Path(env)
        if p.is_dir():
            return p / DEV_FILES[name]
        if name == "locomo":
            return p
    return SHARED_DATA / DEV_FILES[name]


def require_data(path, name: str = "locomo", flag: str = "--data") -> Path:
    """``path`` if it exists; else a one-line error on stderr and exit status 2."""
    p = Path(path)
    if not p.exists():
        print(f"{Path(sys.argv[0]).name}: {DEV_NAMES.get(name, name)} dev data not found at {p}; pass {flag} "
              f"or set TRAWMEM_DEV_DATA (the LoCoMo file, or a folder with locomo/ and longmemeval/)",
              file=sys.stderr)
        raise SystemExit(2)
    return p


def tests_module(name: str):
    """A helper module of the test suite (``tests/support/NAME.py``, e.g. the local LLM server), loaded
    from its file so that ``tests/`` need not be on ``sys.path``."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "support" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------
def results_dir(out_dir=None, default: Path = RESULTS) -> Path:
    """Where result files go: ``out_dir`` (a script's ``--out-dir``) if given, else
    ``TRAWMEM_BENCH_OUT`` if set (smoke runs write there, leaving the committed results alone),
    else ``default`` (``benchmarks/results``; :data:`ARCHIVE` for an experiment). Created if
    missing."""
    d = Path(out_dir or os.environ.get("TRAWMEM_BENCH_OUT") or default)
    d.mkdir(parents=True, exist_ok=True)
    return d


def out_file(path_or_none, default_name: str, default: Path = RESULTS) -> Path:
    """A script's ``--out FILE``: the file given, else ``default_name`` under :func:`results_dir`."""
    return Path(path_or_none) if path_or_none else results_dir(default=default) / default_name


RUN_AS: list[str] | None = None
"""The runner's command (``["python", "-m", "benchmarks", "run", NAME]``) while it runs an entry;
:func:`command` records it in place of the script's path."""


def command() -> str:
    """The command line that ran, as typed from the repository root."""
    if RUN_AS:
        return shlex.join([*RUN_AS, *sys.argv[1:]])
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


_LOCKS: dict = {}
_UMASK = os.umask(0)
os.umask(_UMASK)


def _lock(d: Path, name: str):
    """The cross-process lock of result ``name`` in folder ``d`` (``d/.locks/NAME.lock``; one for
    its JSON and PNG together), reentrant: one object per lock in this process, so a
    :func:`save` inside :func:`locked` re-enters instead of waiting on itself."""
    from filelock import FileLock

    lock_dir = d / ".locks"
    key = str((lock_dir / name).resolve())
    if key not in _LOCKS:
        lock_dir.mkdir(parents=True, exist_ok=True)
        _LOCKS[key] = FileLock(str(lock_dir / f"{name}.lock"))
    return _LOCKS[key]


def _write_atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # as a plain write would create it (mkstemp makes it private)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> Path:
    """``text`` to ``path`` atomically, under the lock of its file name (for the ``.md`` tables
    scripts write beside their JSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path.parent, path.name):
        _write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


def save(name: str, record: dict, fig=None, out_dir=None, dpi: int = 110) -> Path:
    """Write ``record`` as ``NAME.json`` (and ``fig`` as ``NAME.png``, then close it) under
    :func:`results_dir`, each atomically (a temporary file renamed over the old one), both under
    ``NAME``'s lock. ``machine`` (:func:`machine`) and ``command`` (:func:`command`) are added unless
    the record has them. Returns the JSON path."""
    d = results_dir(out_dir)
    rec = dict(record)
    rec.setdefault("machine", machine())
    rec.setdefault("command", command())
    path = d / f"{name}.json"
    text = json.dumps(rec, indent=1, default=_json_default)
    with _lock(d, name):
        _write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        if fig is not None:
            _write_atomic(d / f"{name}.png", lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    if fig is not None:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return path


def load(name: str, out_dir=None) -> dict:
    """``NAME.json`` under :func:`results_dir` as a dict ({} when there is none yet)."""
    p = results_dir(out_dir) / f"{name}.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


@contextmanager
def locked(name: str, out_dir=None):
    """Hold ``NAME.json``'s lock for a read-modify-write: yields :func:`load`'s record; a
    :func:`save` of the same name inside the block writes under the same lock."""
    with _lock(results_dir(out_dir), name):
        yield load(name, out_dir)


def figure(*args, **kw):
    """``matplotlib.pyplot.subplots(*args, **kw)`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kw)
