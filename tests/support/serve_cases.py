"""Shared by the serve integration tests (tests/serve/test_serve_*.py): the sample collection
(module fixtures, so one per test file), a private copy per test, one read-only server for the
tests that only query, and small request helpers."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from serve_util import build_sample_collection, copy_collection, running
from trawmem_gpu.serve.config import ServeConfig

QUESTION = "Why did Ana walk home during her long run?"


@pytest.fixture(scope="module")
def sample_coll(tmp_path_factory) -> Path:
    return build_sample_collection(tmp_path_factory.mktemp("serve") / "coll", extra_ids=("acme-1", "other-1"))


@pytest.fixture
def coll(sample_coll, tmp_path) -> str:
    """A private copy of the sample collection (tests that append mutate it)."""
    return copy_collection(sample_coll, tmp_path / "coll")


@pytest.fixture(scope="module")
def shared(sample_coll, tmp_path_factory):
    """One read-only server for the tests that only query."""
    path = copy_collection(sample_coll, tmp_path_factory.mktemp("shared") / "coll")
    with running(ServeConfig(collection=path, max_wait_ms=2)) as (url, service, srv):
        with httpx.Client(base_url=url, timeout=60) as c:
            yield c, service


def _post(c, path, body):
    return c.post(path, json=body)


def _wait_for(cond, limit_s: float = 120.0) -> None:
    """Poll ``cond`` until it holds (bounded); the test then asserts on the state, not on time."""
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < limit_s:
        time.sleep(0.01)


def _turn(tid, text="We adopted a puppy called Biscuit today.", ts="2024-06-01T10:00:00", **kw):
    return {"turn_id": tid, "speaker": "Ana", "text": text, "timestamp": ts, **kw}
