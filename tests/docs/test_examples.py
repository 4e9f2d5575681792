"""The worked examples in ``docs/examples/`` stay usable: every ``*.patch`` there applies to the
working tree (``git apply --check``, run in the repository root), and ``docs/examples/README.md``
explains each one. A change to the files a patch touches that breaks it fails here, and the patch
is then refreshed against the tree (``git diff`` with the patch applied and its conflicts resolved).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
PATCHES = sorted(EXAMPLES.glob("*.patch"))


def _git_root() -> Path | None:
    """The repository root when ``ROOT`` is the top of a git checkout and git runs, else None."""
    if shutil.which("git") is None:
        return None
    r = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0 or Path(r.stdout.strip()).resolve() != ROOT.resolve():
        return None
    return ROOT


def test_there_are_examples():
    assert PATCHES, f"no *.patch under {EXAMPLES}"


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_the_patch_applies_to_the_working_tree(patch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot check that the example patches apply")
    if _git_root() is None:
        pytest.skip(f"{ROOT} is not the root of a git checkout: cannot check that the example patches apply")
    r = subprocess.run(["git", "apply", "--check", str(patch.relative_to(ROOT))], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, (f"docs/examples/{patch.name} no longer applies to the tree (or is applied "
                               f"already); refresh it against the current files:\n{r.stderr}")


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_the_readme_explains_the_patch(patch):
    assert f"`{patch.name}`" in (EXAMPLES / "README.md").read_text(encoding="utf-8")
