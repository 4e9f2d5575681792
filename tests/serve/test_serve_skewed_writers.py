"""Two HTTP clients whose clocks are 45 minutes apart write interleaved turns to one bank through
a real server (issue 45 item 1): nothing is lost, no request gets a 422, and the bank equals the
build of the same turns in time order (turn order, sessions, threads, heads, graph); the history
route shows each turn's event time and when it was stored.

The real server in-process on 127.0.0.1 and a free port, driven with the project's client."""
from __future__ import annotations

import threading
from datetime import datetime, timedelta

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")

from serve_util import running  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402

TOPICS = ["the garden", "a train to Lisbon", "the bakery job", "the violin lessons"]
ROUNDS = 6


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def _turn(name: str, i: int, skew: timedelta) -> dict:
    """Writer ``name``'s ``i``-th turn, dated by its own clock (``skew`` off the true time)."""
    said = datetime(2031, 3, 1, 9) + timedelta(minutes=20 * i, seconds=7 if name == "y" else 0) + skew
    return {"turn_id": f"{name}{i}", "speaker": "Ana" if name == "x" else "Ben",
            "text": f"{name} on {TOPICS[i % len(TOPICS)]}, note {i}.", "timestamp": said.isoformat()}


def test_two_clients_with_clocks_45_minutes_apart_lose_nothing_and_get_no_422(tmp_path):
    from trawmem_gpu import Memory
    from trawmem_gpu.client import Client
    from trawmem_gpu.store import Collection

    path = tmp_path / "coll"
    Collection(path, create=True)
    skews = {"x": timedelta(0), "y": timedelta(minutes=-45)}  # y's clock lags: its turns arrive late
    barrier = threading.Barrier(2, timeout=600)  # a hang guard, not a deadline
    errors: list = []
    with running(ServeConfig(collection=str(path), max_wait_ms=2)) as (url, _service, _srv):
        def writer(name: str):
            try:
                with Client(url, timeout=600, deadline=600) as c:
                    for i in range(ROUNDS):
                        barrier.wait()  # both write round i at once
                        res = c.append("b", [_turn(name, i, skews[name])])
                        assert list(res.stored) == [f"{name}{i}"] and not res.refused
            except Exception as e:  # noqa: BLE001 - reported below (a 422 raises here)
                errors.append(e)
                barrier.abort()

        ths = [threading.Thread(target=writer, args=(n,)) for n in skews]
        for t in ths:
            t.start()
        for t in ths:
            t.join(timeout=900)
        assert not errors, errors
        with Client(url, timeout=600, deadline=600) as c:
            hist = c.history("b", "y0").events[-1]
            assert hist.event == "added" and hist.event_time == _turn("y", 0, skews["y"])["timestamp"]
            assert hist.stored_at is not None

    sent = [_turn(n, i, skews[n]) for n in skews for i in range(ROUNDS)]
    ref = Memory(tmp_path / "ordered")  # no two turns share a time: the time order is the one order
    ref.add("b", sorted(sent, key=lambda t: t["timestamp"]))
    got, want = Collection(path).load("b"), Collection(tmp_path / "ordered").load("b")
    assert sorted(t.turn_id for t in got.turns) == sorted(t["turn_id"] for t in sent)  # nothing lost
    assert [t.turn_id for t in got.turns] == [t.turn_id for t in want.turns]
    assert [t.session for t in got.turns] == [t.session for t in want.turns]
    assert np.array_equal(got.thread_offsets, want.thread_offsets) and got.heads == want.heads
    assert np.allclose(got.unit_vecs, want.unit_vecs, atol=1e-5)
    assert np.array_equal(got.edge_src, want.edge_src) and np.array_equal(got.edge_dst, want.edge_dst)
    assert all(t.stored_at is not None for t in got.turns)
