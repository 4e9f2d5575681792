"""Shared test set-up.

Triton kernels run on the CPU through the interpreter when no CUDA device is present; the
variable must be set before any kernel module is imported, hence here at the top.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    os.environ.setdefault("TRITON_INTERPRET", "1")

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the tests import ``benchmarks.*`` (appended: the installed package keeps its place)
    sys.path.append(str(ROOT))
# The shared helper modules (tests/support/: local servers, fakes, synthetic banks and files) import
# by their plain names from every stage folder (pytest's "prepend" mode adds only each test file's own folder).
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
# Session fixtures shared by several test files (a plugin, so each is built once per session).
pytest_plugins = ["build_store_fixtures", "real_llm_fixture"]


from dev_data_files import need_dev_data  # noqa: E402  (tests/support: the one rule for a missing dev file)


@pytest.fixture(scope="session")
def dev_path():
    """The LoCoMo dev file (``need_dev_data``: skipped without it, failed under CI)."""
    return need_dev_data("locomo")


@pytest.fixture(scope="session")
def lme_dev_path():
    """The LongMemEval-S dev slice (``need_dev_data``: skipped without it, failed under CI)."""
    return need_dev_data("longmemeval")


@pytest.fixture
def server():
    """A local OpenAI-compatible chat server on 127.0.0.1 (tests/support/llm_server.py), stopped after the test."""
    from llm_server import LLMServer

    s = LLMServer().start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def llm(server):
    """An OpenAI-protocol backend on the local ``server`` answering TriMem's prompts (``trimem_fake.respond``)."""
    from trimem_fake import respond

    from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend

    server.responders.append(respond)
    b = OpenAIHTTPBackend(server.base_url, model="test-model-a", max_retries=0)
    try:
        yield b
    finally:
        b.close()


requires_cuda = pytest.mark.skipif(not (lambda: __import__("torch").cuda.is_available())(), reason="needs CUDA")
