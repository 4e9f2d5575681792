"""Issue 23, `trawmem serve` limits: appends apart from the query encoder, honest statuses after a
lost engine (outcome unknown) and idempotent appends.

No assertion here is on a latency: batches are read from a controlled queue, blocking is shown
by holding an encoder at an event while other requests are answered.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, running  # noqa: E402
from trawmem_gpu.serve.batcher import OutcomeUnknown, ShuttingDown  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from trawmem_gpu.serve.lanes import AppendEncoder, QueryFirst  # noqa: E402

from serve_limits_cases import coll, sample_coll  # noqa: E402, F401, F811 (fixtures)
from serve_limits_cases import QUESTION, _turn, _wait_for  # noqa: E402


# ----------------------------------------------------------------------------------------------
# appends apart from queries
# ----------------------------------------------------------------------------------------------
class _Enc:
    id, dim = "fake", 4

    def __init__(self):
        self.calls = []

    def encode(self, texts, **kw):
        self.calls.append(list(texts))
        return np.array([[len(t), 1.0, 0.0, 0.0] for t in texts], dtype=np.float32)


def test_append_encoder_works_in_chunks_that_give_way():
    inner, waits = _Enc(), []
    enc = AppendEncoder(inner, 16, lambda: waits.append(1))
    texts = [f"t{'x' * (i % 7)}{i}" for i in range(40)]
    out = enc.encode(texts, batch_size=64, is_query=False)
    assert [len(c) for c in inner.calls] == [16, 16, 8] and len(waits) == 3 and enc.chunks == 3
    np.testing.assert_array_equal(out[:, 0], [len(t) for t in texts])  # input order kept


def test_query_first_gate():
    g = QueryFirst(max_wait_s=0.01)
    assert g.wait_idle() and not g.busy
    with g.running():
        assert g.busy and not g.wait_idle()  # bounded: an append under load still moves on
    assert g.wait_idle()


def test_append_runs_on_its_own_encoder_and_queries_pass_it(coll):
    """An append held inside its encoder call does not stop text or vector queries."""
    cfg = ServeConfig(collection=coll, max_wait_ms=0, append_chunk=4)
    with running(cfg) as (url, service, _), httpx.Client(base_url=url, timeout=120) as c:
        enc = service.append_encoder()
        assert enc.inner.lock is not service.encoder.lock and enc.inner.inner is not service.encoder.inner
        gate, inside = threading.Event(), threading.Event()
        real = enc.inner.inner.encode

        def held(texts, **kw):
            inside.set()
            gate.wait(60)
            return real(texts, **kw)

        enc.inner.inner.encode = held
        turns = [_turn(f"c{i}", f"Note {i} about the long garden walk.") for i in range(10)]
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(c.post, f"/v1/banks/{SAMPLE_BANK}/turns", json={"turns": turns})
            _wait_for(inside.is_set)
            with httpx.Client(base_url=url, timeout=120) as c2:
                for _ in range(3):
                    assert c2.post("/v1/select", json={"bank_id": SAMPLE_BANK, "question": QUESTION}).status_code == 200
            assert not fut.done()
            gate.set()
            r = fut.result()
        assert r.status_code == 200 and r.json()["appended"] == 10 and enc.chunks >= 3


# ----------------------------------------------------------------------------------------------
# honest statuses and idempotent appends
# ----------------------------------------------------------------------------------------------
def test_resent_turns_are_reported_not_duplicated(coll):
    cfg = ServeConfig(collection=coll, max_wait_ms=0)
    T = f"/v1/banks/{SAMPLE_BANK}/turns"
    with running(cfg) as (url, service, _), httpx.Client(base_url=url, timeout=120) as c:
        n0 = service.registry.get(SAMPLE_BANK).n_units
        r = c.post(T, json={"turns": [_turn("r1"), _turn("r2", "A second note.")]})
        assert r.status_code == 200 and r.json()["stored"] == ["r1", "r2"] and r.json()["already_stored"] == []
        r = c.post(T, json={"turns": [_turn("r1"), _turn("r2", "A second note.")]})  # the retry
        assert r.status_code == 200 and r.json()["appended"] == 0 and r.json()["already_stored"] == ["r1", "r2"]
        r = c.post(T, json={"turns": [_turn("r2", "A second note."), _turn("r3", "A third note.")]})
        assert r.status_code == 200 and r.json()["stored"] == ["r3"] and r.json()["already_stored"] == ["r2"]
        r = c.post(T, json={"turns": [_turn("r3", "Different words.")], "atomic": True})
        assert r.status_code == 409 and "with other content" in r.json()["detail"]
        r = c.post(T, json={"turns": [_turn("r3", "Different words.")]})  # per item: refused, naming the field
        assert r.status_code == 200 and r.json()["refused"][0]["field"] == "turns[0].turn_id", r.text
        assert service.registry.get(SAMPLE_BANK).n_units == n0 + 3
        from trawmem_gpu.store import Collection

        ids = [t.turn_id for t in Collection(coll).load(SAMPLE_BANK).turns]
        assert ids.count("r1") == ids.count("r2") == ids.count("r3") == 1


def test_an_append_whose_answer_is_lost_says_outcome_unknown():
    """The engine process reads the append and drops the connection: the front answers
    OutcomeUnknown (503 with "outcome": "unknown"), a select in the same state ShuttingDown; the
    engine still accepts, so the front connects again instead of shutting down."""
    from trawmem_gpu.serve.remote import RemoteBackend, frame, read_frame
    from trawmem_gpu.serve.wire import blob

    d = tempfile.mkdtemp(prefix="tm-lost-")
    path = os.path.join(d, "e.sock")
    lost = []

    async def engine(reader, writer):
        while True:
            try:
                msgs = await read_frame(reader)
            except Exception:  # noqa: BLE001
                return
            for rid, op, args in msgs:
                if op == "state":
                    writer.write(frame([(rid, True, blob({"ready": True, "queue_depth": 0, "dim": 4,
                                                          "encoder_id": "f", "defaults": (8, 1, None)}))]))
                elif op in ("append", "forget", "select"):
                    writer.close()  # killed mid-call
                    return

    calls = {"append": lambda be: be.append("b", [_turn("t")]), "forget": lambda be: be.forget("b", ["t"]),
             "select": lambda be: be.select([])}

    async def main():
        srv = await asyncio.start_unix_server(engine, path=path)
        out = []
        for op, call in calls.items():
            be = RemoteBackend(path, ServeConfig(), on_engine_lost=lambda: lost.append(1))
            await be.start()
            try:
                await call(be)
            except Exception as e:  # noqa: BLE001
                out.append(e)
            await be.stop()
        srv.close()
        return out

    err_append, err_forget, err_select = asyncio.run(main())
    assert isinstance(err_append, OutcomeUnknown) and "resend" in str(err_append)
    # a forget is a write too: it may have been done, and saying "shutting down" would hide that
    assert isinstance(err_forget, OutcomeUnknown) and "forget" in str(err_forget)
    assert isinstance(err_select, ShuttingDown) and not isinstance(err_select, OutcomeUnknown)
    assert lost == []  # the engine process still accepts: each front connected again


def test_outcome_unknown_is_answered_503_with_outcome(tmp_path):
    from trawmem_gpu.serve.app import create_app
    from trawmem_gpu.serve.server import BackgroundServer

    class Lost:
        ready, dim, encoder_id, defaults = True, 4, "f", (8, 1, None)

        async def start(self):
            pass

        async def stop(self):
            pass

        def queue_depth(self):
            return 0

        async def append(self, bank_id, records, quota=None):
            raise OutcomeUnknown("the append's outcome is unknown (engine gone)")

    cfg = ServeConfig(collection=str(tmp_path / "c"))
    with BackgroundServer(create_app(Lost(), cfg), cfg) as srv:
        r = httpx.post(srv.url + "/v1/banks/b/turns", json={"turns": [_turn("t")]}, timeout=30)
    assert r.status_code == 503 and r.json()["outcome"] == "unknown" and r.headers["Retry-After"] == "1"
