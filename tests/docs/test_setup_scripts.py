"""The README's install scripts: they pick the right Python, and check the torch build.

Nothing is installed here: the refusal happens before pip runs, and the build check reads a
stand-in ``torch`` module.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PY = Path("/usr/bin/python3")


def _bare_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    return env


def _system_python_is_bare() -> bool:
    if not SYSTEM_PY.exists():
        return False
    r = subprocess.run([str(SYSTEM_PY), "-c", "import sys; print(sys.prefix == sys.base_prefix)"],
                       capture_output=True, text=True, env=_bare_env())
    return r.stdout.strip() == "True"


@pytest.mark.skipif(not _system_python_is_bare() or shutil.which("bash") is None,
                    reason="needs bash and a system /usr/bin/python3 outside any virtual environment")
@pytest.mark.parametrize("script", ["setup.sh", "test.sh"])
def test_scripts_refuse_a_system_python_without_a_venv(tmp_path, script):
    """A fresh shell, no .venv: stop with what to do, before pip can touch the system Python."""
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    r = subprocess.run(["bash", str(tmp_path / "scripts" / script)], capture_output=True, text=True,
                       env=_bare_env(), cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "python3 -m venv .venv" in r.stderr and "TRAWMEM_ALLOW_SYSTEM_PYTHON=1" in r.stderr
    assert "pip" not in r.stdout


@pytest.mark.skipif(not _system_python_is_bare() or shutil.which("bash") is None,
                    reason="needs bash and a system /usr/bin/python3 outside any virtual environment")
def test_scripts_activate_dot_venv_when_it_exists(tmp_path):
    """With ./.venv there, the scripts use it (its python3 runs), even in a fresh shell."""
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    # a stand-in venv: its activate puts a python3 first on PATH that reports being a venv and
    # records that it ran, then the unknown option stops setup.sh before any install
    (venv_bin / "python3").write_text(f"#!/bin/sh\ntouch {tmp_path}/venv-used\nexit 0\n")
    (venv_bin / "python3").chmod(0o755)
    (venv_bin / "activate").write_text(f'export VIRTUAL_ENV={tmp_path}/.venv PATH="{venv_bin}:$PATH"\n')
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh"), "--bogus"], capture_output=True,
                       text=True, env=_bare_env(), cwd=tmp_path, timeout=120)
    assert "using the virtual environment .venv" in r.stderr, r.stderr
    assert r.returncode == 2 and "unknown option '--bogus'" in r.stderr


@pytest.mark.parametrize("version,cuda,gpu,rc", [
    ("2.13.0+cpu", None, "0", 0),
    ("2.13.0", None, "0", 0),
    ("2.13.0", "12.8", "0", 1),      # PyPI's default Linux build on a CPU machine
    ("2.13.0+cu128", "12.8", "0", 1),
    ("2.13.0", "12.8", "1", 0),      # a CUDA host keeps its CUDA build
])
def test_torch_build_check(tmp_path, version, cuda, gpu, rc):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"__version__ = {version!r}\nfrom . import version\n")
    (fake / "version.py").write_text(f"cuda = {cuda!r}\n")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_torch.py"), gpu], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60)
    assert r.returncode == rc, r.stderr
    assert ("CUDA build on a machine without an NVIDIA GPU" in r.stderr) == (rc == 1)
