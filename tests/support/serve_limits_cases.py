"""Shared by the serve-limits tests (tests/serve/test_serve_limits_*.py): the sample collection
(module fixture, so one per test file) and a private copy per test, two tenants' keys, turns."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from serve_util import SAMPLE_BANK, build_sample_collection, copy_collection

QUESTION = "Why did Ana walk home during her long run?"
KEYS = {"a": "key-limits-a-0123456789", "b": "key-limits-b-0123456789"}


@pytest.fixture(scope="module")
def sample_coll(tmp_path_factory) -> Path:
    return build_sample_collection(tmp_path_factory.mktemp("limits") / "coll", extra_ids=("b-1",))


@pytest.fixture
def coll(sample_coll, tmp_path) -> str:
    return copy_collection(sample_coll, tmp_path / "coll")


def _keys(path: Path, limits_a: dict | None = None) -> str:
    h = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    a = {"sha256": h(KEYS["a"]), "tenant": "a", "banks": [SAMPLE_BANK], "access": "read-write"}
    if limits_a:
        a["limits"] = limits_a
    path.write_text(json.dumps({"keys": [a, {"sha256": h(KEYS["b"]), "tenant": "b", "banks": ["b-*"],
                                              "access": "read-write"}]}))
    return str(path)


def _auth(k):
    return {"Authorization": f"Bearer {KEYS[k]}"}


def _turn(tid, text="We adopted a puppy called Biscuit today.", ts="2031-06-01T10:00:00"):
    return {"turn_id": tid, "speaker": "Ana", "text": text, "timestamp": ts}


def _wait_for(cond, limit_s: float = 120.0) -> None:
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < limit_s:
        time.sleep(0.01)
