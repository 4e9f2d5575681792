"""Fixtures of the build-and-store tests (tests/ingest/test_build_store_*.py): the MiniLM encoder,
the synthetic conversation and its bank, and the seven LoCoMo dev conversations built with the
default config. A plugin (``pytest_plugins`` in tests/conftest.py), so session scope builds each
once for all those files; encoding goes through the on-disk embedding cache."""
from __future__ import annotations

import pytest

from trawmem_gpu.ingest import build_banks
from trawmem_gpu.ingest.config import BuildConfig
from trawmem_gpu.data import load_locomo
from trawmem_gpu.encode import get_encoder
from build_store_cases import synthetic_conversation


@pytest.fixture(scope="session")
def encoder():
    return get_encoder("minilm")


@pytest.fixture(scope="session")
def syn_conv():
    return synthetic_conversation()


@pytest.fixture(scope="session")
def syn_bank(syn_conv, encoder):
    (bank,), _ = build_banks([syn_conv], BuildConfig(), encoder, progress=False)
    return bank


@pytest.fixture(scope="session")
def dev_banks(dev_path, encoder):
    """(conversations, banks, stats) for all 7 dev conversations, default build config."""
    convs = load_locomo(dev_path)
    banks, stats = build_banks(convs, BuildConfig(), encoder, progress=False)
    return convs, banks, stats
