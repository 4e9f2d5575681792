"""A temporary copy of the repository's library tree, for tests that change it (apply an example
patch, add a term module) and then import it or run the layout checks on it in a fresh interpreter,
so the running process, its registry and the working tree stay as they are."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("trawmem_gpu", "tests/test_layout.py", "docs/architecture.md", "README.md", "pyproject.toml")
"""What the copy holds: the library, and what ``tests/test_layout.py`` reads besides it."""
LAYOUT_CHECKS = "cycle or stage or limit or architecture or json"
"""``pytest -k`` for the layout test's static checks (the import graph, the layers, the size limits)."""


def copy_tree(dest: Path) -> Path:
    """Copy :data:`COPIED` from the repository to ``dest`` (bytecode left out); return ``dest``."""
    for rel in COPIED:
        src, dst = ROOT / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)
    return dest


def apply_patch(tree: Path, patch: Path) -> None:
    """Apply ``patch`` (a ``git diff``) to the copy ``tree``; a patch that does not apply fails."""
    r = subprocess.run(["git", "apply", "--verbose", str(patch)], cwd=tree, capture_output=True, text=True)
    assert r.returncode == 0, f"{patch.name} does not apply:\n{r.stderr}"


def _env(tree: Path) -> dict[str, str]:
    """The copy first on the path (before the installed package), then the tests' support modules."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(ROOT / "tests" / "support")]))


def run_python(tree: Path, script: str, timeout: float = 1800) -> dict:
    """Run ``script`` against the copy in a fresh interpreter; return the JSON object it prints on a
    line ``RESULT {...}`` (it must exit 0)."""
    import json

    r = subprocess.run([sys.executable, "-c", script], cwd=tree, env=_env(tree), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])


def run_layout_checks(tree: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """``tests/test_layout.py``'s static checks (:data:`LAYOUT_CHECKS`) run on the copy."""
    return subprocess.run([sys.executable, "-m", "pytest", "tests/test_layout.py", "-q", "-p", "no:cacheprovider",
                           "-k", LAYOUT_CHECKS], cwd=tree, env=_env(tree), capture_output=True, text=True,
                          timeout=timeout)
