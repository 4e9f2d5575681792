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

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEV_DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


def dev_data_path() -> Path:
    p = Path(os.environ.get("TRAWMEM_DEV_DATA", DEV_DATA))
    return p


@pytest.fixture(scope="session")
def dev_path():
    p = dev_data_path()
    if not p.exists():
        pytest.fail(f"LoCoMo dev data not found at {p}; set TRAWMEM_DEV_DATA")
    return p


@pytest.fixture
def server():
    """A local OpenAI-compatible chat server on 127.0.0.1 (tests/llm_server.py), stopped after the test."""
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
