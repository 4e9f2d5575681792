"""The real-model fixture of the tests marked ``real_llm`` (a plugin named in ``conftest.py``).

The fake protocol server (``llm_server.py``) stays the suite's LLM; these tests run every LLM path
against a real small model as well (llama.cpp's server with SmolLM2-135M-Instruct,
``scripts/real_llm.sh``), and run only when asked:

* ``TRAWMEM_REAL_LLM_URL=http://127.0.0.1:8791/v1``: a server already running (left running);
* ``TRAWMEM_REAL_LLM=1``: ``bash scripts/real_llm.sh start`` first (compiles llama-cpp-python once,
  30-60 minutes, unless a portable wheel is cached; the model wheel comes from PyPI), stopped at
  the end when this session started it; ``TRAWMEM_REAL_LLM=full`` also runs the long-reply tests
  (marked ``slow`` too: facts, profiles, prompt evolution);
* under CI (``CI=true``) when a portable wheel is cached (``bash scripts/real_llm.sh cached``),
  as ``TRAWMEM_REAL_LLM=1``.

Otherwise each test skips with that reason. Replies go to a fresh LLM cache per session.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real_llm.sh"
HOW = ("real-model tests are opt-in: set TRAWMEM_REAL_LLM=1 (bash scripts/real_llm.sh start: compiles "
       "llama-cpp-python once, 30-60 min, unless a portable wheel is cached; the model wheel comes from PyPI), "
       "TRAWMEM_REAL_LLM=full for the long-reply paths too, or TRAWMEM_REAL_LLM_URL=<base URL> of a running server")


def _wanted() -> str | None:
    """``"url"``, ``"start"`` or None (skip)."""
    if os.environ.get("TRAWMEM_REAL_LLM_URL"):
        return "url"
    if os.environ.get("TRAWMEM_REAL_LLM", "").lower() in ("1", "true", "yes", "full"):
        return "start"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        cached = subprocess.run(["bash", str(SCRIPT), "cached"], capture_output=True, text=True)
        if cached.returncode == 0 and cached.stdout.strip():
            return "start"
    return None


def full() -> bool:
    """Whether the long-reply paths run too (``TRAWMEM_REAL_LLM=full``)."""
    return os.environ.get("TRAWMEM_REAL_LLM", "").lower() == "full"


@pytest.fixture(scope="session")
def real_llm_url():
    """The base URL of the real model's server (started here when asked; module docstring)."""
    how = _wanted()
    if how is None:
        pytest.skip(HOW)
    if how == "url":
        yield os.environ["TRAWMEM_REAL_LLM_URL"].rstrip("/")
        return
    running = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True)
    started = running.returncode != 0
    if started:
        p = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=4 * 3600)
        if p.returncode != 0:
            pytest.fail(f"scripts/real_llm.sh start failed: {p.stderr[-1500:]}")
        url = p.stdout.strip().splitlines()[-1]
    else:
        url = running.stdout.strip().splitlines()[-1]
    try:
        yield url
    finally:
        if started:
            subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def real_cache(tmp_path_factory):
    """A fresh LLM reply cache directory for the session's real-model tests."""
    return tmp_path_factory.mktemp("real-llm-cache")


@pytest.fixture
def real_llm(real_llm_url, real_cache, monkeypatch):
    """A checked, cached backend on the real model (``llm_from_args``, the CLI's defaults)."""
    from trawmem_gpu.llm.factory import llm_from_args

    monkeypatch.setenv("TRAWMEM_CACHE", str(real_cache))
    be = llm_from_args(real_llm_url, real_cache / "llm.sqlite", check=True)
    try:
        yield be
    finally:
        be.close()
