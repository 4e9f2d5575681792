"""Issue 23: no tenant can stall `trawmem serve`. Bounded fields, fair batches across keys,
per-key limits (429), appends apart from the query encoder, connection limits, honest statuses
after a lost engine, idempotent appends and the thread default.

No assertion here is on a latency: batches are read from a controlled queue, blocking is shown
by holding an encoder at an event while other requests are answered.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, build_sample_collection, copy_collection, running  # noqa: E402
from trawmem_gpu.data.types import MAX_TEXT_CHARS  # noqa: E402
from trawmem_gpu.errors import ConfigError  # noqa: E402
from trawmem_gpu.serve.batcher import DynamicBatcher, FairQueue, InFlight, OutcomeUnknown, QueueFull, \
    ShuttingDown, _Pending  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig, default_threads  # noqa: E402
from trawmem_gpu.serve.keys import KeyStore  # noqa: E402
from trawmem_gpu.serve.lanes import AppendEncoder, QueryFirst  # noqa: E402

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


# ----------------------------------------------------------------------------------------------
# bounded fields
# ----------------------------------------------------------------------------------------------
def test_every_field_is_bounded_and_never_echoed(coll):
    cfg = ServeConfig(collection=coll, max_wait_ms=0, max_body_bytes=8 << 20)
    big = "7" * 3_500_000
    ok = {"bank_id": SAMPLE_BANK, "question": QUESTION}
    cases = [
        ("/v1/select", {**ok, "date": big}, "date: String should have at most 64 characters"),
        ("/v1/select", {**ok, "question": "why " * 20000}, "question: String should have at most 65536"),
        ("/v1/select", {**ok, "question": "why " * 2000}, "question is 8000 characters; the limit is 4000"),
        ("/v1/select", {**ok, "bank_id": "b" * 300}, "bank_id: String should have at most 256"),
        ("/v1/select", {**ok, "question_vector": [0.5] * 9000}, "question_vector: List should have at most 8192"),
        ("/v1/select/batch", {"requests": [ok] * 5000}, "requests: List should have at most 4096"),
        ("/v1/select/batch", {"requests": [ok] * 300}, "requests holds 300 requests; the limit is 256"),
        (f"/v1/banks/{SAMPLE_BANK}/turns", {"turns": [{**_turn("n1"), "timestamp": big}]},
         "turns[0].timestamp: String should have at most 64"),
        (f"/v1/banks/{SAMPLE_BANK}/turns", {"turns": [_turn("n1", text="x" * (MAX_TEXT_CHARS + 1))]},
         f"turns[0].text: String should have at most {MAX_TEXT_CHARS}"),
        (f"/v1/banks/{SAMPLE_BANK}/turns", {"turns": [{**_turn("n1"), "speaker": "s" * 300}]},
         "turns[0].speaker: String should have at most 256"),
        (f"/v1/banks/{SAMPLE_BANK}/turns", {"turns": [_turn("x" * 300)]}, "turns[0].turn_id"),
    ]
    with running(cfg) as (url, service, _), httpx.Client(base_url=url, timeout=60) as c:
        n0 = service.registry.get(SAMPLE_BANK).n_units
        for path, body, msg in cases:
            r = c.post(path, json=body)
            assert r.status_code == 422 and msg in r.json()["detail"], (path, r.status_code, r.text[:300])
            assert len(r.content) < 2000  # the value is never echoed back
            assert c.get("/healthz").status_code == 200
        r = c.post("/v1/select", content=b'{"bank_id": "ana-ben", "question": "q", "date": "' + b"1" * (9 << 20) + b'"}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]
        assert c.post("/v1/select", json={**ok, "date": "2031-05-09"}).status_code == 200
        assert service.registry.get(SAMPLE_BANK).n_units == n0


def test_a_trickled_body_gets_408(coll):
    cfg = ServeConfig(collection=coll, max_wait_ms=0, body_timeout_s=0.5, warmup=False)
    with running(cfg) as (url, service, srv):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        s.sendall(b"POST /v1/select HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"bank_id\"")  # then nothing more
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        s.close()
        assert data.startswith(b"HTTP/1.1 408"), data[:200]
        assert httpx.get(url + "/healthz", timeout=30).status_code == 200


# ----------------------------------------------------------------------------------------------
# fair batches and per-key limits
# ----------------------------------------------------------------------------------------------
class _Fut:
    def __init__(self, done=False):
        self._done = done

    def done(self):
        return self._done


def _pend(key, i, done=False):
    return _Pending((key, i), 0.0, _Fut(done))


def test_fair_queue_takes_round_robin_across_keys():
    q = FairQueue()
    q.push("big", [_pend("big", i) for i in range(256)])
    q.push("one", [_pend("one", 0)])
    first = [p.item for p in q.take(64)]
    assert len(first) == 64 and first[:2] == [("big", 0), ("one", 0)]  # the single query is in this batch
    assert [k for k, _ in first[2:]] == ["big"] * 62
    assert len(q) == 256 - 63 and q.depth_of("one") == 0 and q.depth_of("big") == 193
    # the rotation goes on across batches: a key arriving now is served first in the next batch
    q.push("c", [_pend("c", i) for i in range(3)])
    q.push("d", [_pend("d", 0), _pend("d", 1, done=True), _pend("d", 2)])
    nxt = [p.item for p in q.take(8)]
    assert nxt == [("big", 63), ("c", 0), ("d", 0), ("big", 64), ("c", 1), ("d", 2), ("big", 65), ("c", 2)]
    assert q.oldest_arrival() == 0.0


def test_a_keys_share_bounds_its_part_of_a_batch():
    q = FairQueue()
    q.push("big", [_pend("big", i) for i in range(256)], share=16)
    q.push("one", [_pend("one", 0)], share=16)
    first = [p.item for p in q.take(64)]
    assert len(first) == 17 and ("one", 0) in first and sum(k == "big" for k, _ in first) == 16
    assert [k for k, _ in (p.item for p in q.take(64))] == ["big"] * 16  # alone: batches of its share
    q.push("free", [_pend("free", i) for i in range(40)])  # no share (the tenant of a server without keys)
    nxt = [p.item[0] for p in q.take(64)]
    assert nxt.count("big") == 16 and nxt.count("free") == 40


def test_assembly_pool_takes_jobs_round_robin_across_keys():
    from trawmem_gpu.serve.lanes import FairPool

    pool, gate, started, order = FairPool(1), threading.Event(), threading.Event(), []
    first = pool.submit("big", lambda: (started.set(), gate.wait(60)))  # holds the one thread
    started.wait(60)
    futs = [pool.submit("big", order.append, ("big", i)) for i in range(5)]
    futs.append(pool.submit("one", order.append, ("one", 0)))
    gate.set()
    for f in [first, *futs]:
        f.result(60)
    assert order[:2] == [("big", 0), ("one", 0)] and len(order) == 6
    boom = pool.submit("x", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        boom.result(60)
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit("x", print)


def test_one_keys_big_batch_delays_anothers_query_by_one_engine_call():
    """Key A's first query is held in a running batch; meanwhile A queues 200 more and B one: the
    very next batch carries B's query (batch composition, read from the batch function)."""
    started, release, batches = threading.Event(), threading.Event(), []

    def process(items):
        batches.append(list(items))
        started.set()
        release.wait(60)
        return [i for i in items]

    async def main():
        ex = ThreadPoolExecutor(1)
        b = DynamicBatcher(process, max_batch=32, max_wait_s=0.0, max_queue=1024, executor=ex)
        b.start()
        t1 = asyncio.ensure_future(b.submit([("a", -1)], 60, key="a"))
        while not started.is_set():
            await asyncio.sleep(0.005)
        ta = asyncio.ensure_future(b.submit([("a", i) for i in range(200)], 60, key="a"))
        tb = asyncio.ensure_future(b.submit([("b", 0)], 60, key="b"))
        while b.depth < 201:
            await asyncio.sleep(0.005)
        release.set()
        await asyncio.gather(t1, ta, tb)
        await b.close()
        ex.shutdown()

    asyncio.run(main())
    assert batches[0] == [("a", -1)]
    assert ("b", 0) in batches[1] and len(batches[1]) == 32
    assert sum(len(x) for x in batches) == 202


def test_per_key_queue_limit_gets_429_and_other_keys_are_admitted():
    release = threading.Event()

    async def main():
        ex = ThreadPoolExecutor(1)
        b = DynamicBatcher(lambda items: (release.wait(60), items)[1], max_batch=1, max_wait_s=0.0,
                           max_queue=1024, executor=ex)
        b.start()
        held = asyncio.ensure_future(b.submit(["x"], 60, key="a", key_limit=4))
        while b.running != 1:
            await asyncio.sleep(0.005)
        queued = asyncio.ensure_future(b.submit(["y"] * 4, 60, key="a", key_limit=4))
        while b.depth < 4:
            await asyncio.sleep(0.005)
        with pytest.raises(QueueFull) as e:
            await b.submit(["z"], 60, key="a", key_limit=4)
        other = asyncio.ensure_future(b.submit(["w"], 60, key="b", key_limit=4))
        await asyncio.sleep(0)
        assert b.depth == 5  # b's query was admitted
        release.set()
        await asyncio.gather(held, queued, other)
        await b.close()
        ex.shutdown()
        return e.value

    err = asyncio.run(main())
    assert err.retry_after >= 1 and "this key has 4 queries waiting" in str(err) and "tenant_max_queued" in str(err)


def test_a_request_gone_while_queued_frees_its_keys_slot_at_once():
    """A queued request that is cancelled (or timed out) while a batch runs leaves the queue then,
    not when the dispatcher next takes: the key may queue again at once, within its limit."""
    release = threading.Event()

    async def main():
        ex = ThreadPoolExecutor(1)
        b = DynamicBatcher(lambda items: (release.wait(60), items)[1], max_batch=1, max_wait_s=0.0,
                           max_queue=2, executor=ex)
        b.start()
        held = asyncio.ensure_future(b.submit(["x"], 60, key="a", key_limit=1))
        while b.running != 1:
            await asyncio.sleep(0.005)
        gone = asyncio.ensure_future(b.submit(["y", "y2"], 60, key="a", key_limit=2))
        while b.depth < 2:
            await asyncio.sleep(0.005)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        depth = b.depth
        again = asyncio.ensure_future(b.submit(["z"], 60, key="a", key_limit=1))  # QueueFull before
        await asyncio.sleep(0)
        release.set()
        res = await asyncio.gather(held, again)
        await b.close()
        ex.shutdown()
        return depth, res

    depth, res = asyncio.run(main())
    assert depth == 0 and res == [["x"], ["z"]]


def test_a_submission_larger_than_a_limit_is_422_not_a_429_to_retry_forever():
    """A batch of more queries than the key's limit (or the whole queue) can never be admitted:
    it is bad input (422), not a full queue that a retry after Retry-After would pass."""
    from trawmem_gpu.errors import InputError

    async def main():
        ex = ThreadPoolExecutor(1)
        b = DynamicBatcher(lambda items: items, max_batch=4, max_wait_s=0.0, max_queue=8, executor=ex)
        b.start()
        errs = []
        for kw in ({"key_limit": 2}, {}):
            try:
                await b.submit(["q"] * (3 if kw else 9), 60, key="a", **kw)
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        ok = await b.submit(["q"] * 2, 60, key="a", key_limit=2)
        await b.close()
        ex.shutdown()
        return errs, ok

    (per_key, whole), ok = asyncio.run(main())
    assert isinstance(per_key, InputError) and not isinstance(per_key, QueueFull)
    assert "3 queries" in str(per_key) and "limit is 2" in str(per_key) and "tenant_max_queued" in str(per_key)
    assert isinstance(whole, InputError) and "9 queries" in str(whole) and "max_queue" in str(whole)
    assert ok == ["q", "q"]


def test_in_flight_appends_are_limited_per_key():
    f = InFlight()
    with f.hold("a", 2), f.hold("a", 2):
        with pytest.raises(QueueFull, match="2 appends in flight; its limit is 2"):
            with f.hold("a", 2):
                pass
        with f.hold("b", 2):
            assert f.count("b") == 1
    assert f.count("a") == 0 and f.count("b") == 0
    with f.hold("a", None), f.hold("a", None), f.hold("a", None):  # no limit
        assert f.count("a") == 3


def test_keys_file_limits(tmp_path):
    ks = KeyStore.load(_keys(tmp_path / "k.json", {"max_queued": 8, "max_appends": 1}))
    a, b = ks.authenticate(KEYS["a"]), ks.authenticate(KEYS["b"])
    cfg = ServeConfig(tenant_max_queued=100, tenant_max_appends=3)
    assert (a.quota(cfg).max_queued, a.quota(cfg).max_appends) == (8, 1)
    assert (b.quota(cfg).max_queued, b.quota(cfg).max_appends) == (100, 3)
    for bad in ({"max_queued": 0}, {"max_queued": True}, {"max_appends": "2"}, {"burst": 3}):
        with pytest.raises(ConfigError, match="limits"):
            KeyStore.load(_keys(tmp_path / "bad.json", bad))


def test_per_key_limits_through_the_server(coll, tmp_path):
    cfg = ServeConfig(collection=coll, keys_file=_keys(tmp_path / "k.json", {"max_queued": 2, "max_appends": 1}),
                      max_wait_ms=0, max_batch=1)
    with running(cfg) as (url, service, _), httpx.Client(base_url=url, timeout=120) as c:
        q = {"bank_id": SAMPLE_BANK, "question": QUESTION}
        r = c.post("/v1/select/batch", json={"requests": [q] * 3}, headers=_auth("a"))
        # more than the key may ever queue: 422 (a 429's retry could never pass)
        assert r.status_code == 422 and "limit is 2" in r.json()["detail"], r.text
        assert c.post("/v1/select/batch", json={"requests": [q] * 2}, headers=_auth("a")).status_code == 200
        # an append in flight (held in its encoder): the key's second one gets 429
        gate, inside = threading.Event(), threading.Event()
        enc = service.append_encoder()
        orig = enc.before_chunk
        enc.before_chunk = lambda: (inside.set(), gate.wait(60), orig())
        with ThreadPoolExecutor(1) as ex:
            first = ex.submit(c.post, f"/v1/banks/{SAMPLE_BANK}/turns", json={"turns": [_turn("p1")]},
                              headers=_auth("a"))
            _wait_for(inside.is_set)
            with httpx.Client(base_url=url, timeout=120) as c2:
                r = c2.post(f"/v1/banks/{SAMPLE_BANK}/turns", json={"turns": [_turn("p2")]}, headers=_auth("a"))
                assert r.status_code == 429 and "appends in flight" in r.json()["detail"], r.text
                # meanwhile queries, with and without a vector, are answered (no shared encoder lock)
                z = service.encoder.encode([QUESTION], is_query=True)[0]
                for body in (q, {**q, "question_vector": [float(x) for x in z]}):
                    assert c2.post("/v1/select", json=body, headers=_auth("a")).status_code == 200
            assert not first.done()
            gate.set()
            assert first.result().status_code == 200


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
        r = c.post(T, json={"turns": [_turn("r3", "Different words.")]})
        assert r.status_code == 409 and "with other content" in r.json()["detail"]
        assert service.registry.get(SAMPLE_BANK).n_units == n0 + 3
        from trawmem_gpu.store import Collection

        ids = [t.turn_id for t in Collection(coll).load(SAMPLE_BANK).turns]
        assert ids.count("r1") == ids.count("r2") == ids.count("r3") == 1


def test_an_append_whose_answer_is_lost_says_outcome_unknown():
    """The engine process reads the append and goes away: the front answers OutcomeUnknown (503
    with "outcome": "unknown"), a select in the same state ShuttingDown."""
    from trawmem_gpu.serve.remote import RemoteBackend, frame, read_frame

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
                    writer.write(frame([(rid, True, {"ready": True, "queue_depth": 0, "dim": 4, "encoder_id": "f",
                                                     "defaults": (8, 1, None)})]))
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
    assert lost == [1, 1, 1]


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


# ----------------------------------------------------------------------------------------------
# connection limits, threads
# ----------------------------------------------------------------------------------------------
def _read_until_closed(s: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = s.recv(4096)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def test_connection_cap_and_header_timeout(coll):
    cfg = ServeConfig(collection=coll, max_connections=4, header_timeout_s=0.5, warmup=False)
    with running(cfg) as (url, service, srv), httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/healthz").status_code == 200  # an open keep-alive connection: 1 of 4
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=30) for _ in range(3)]
        _wait_for(lambda: len(srv.server.server_state.connections) == 4)
        extra = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        assert _read_until_closed(extra) == b""  # over the cap: closed at once
        assert c.get("/healthz").status_code == 200  # the open connection is still served
        idle[0].sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # slow headers: never finished
        for s in idle:  # idle and slow-header connections get 408 and are closed
            assert _read_until_closed(s).startswith(b"HTTP/1.1 408")
            s.close()
        extra.close()


def test_default_threads_suit_the_host_and_workers():
    assert default_threads(0, cores=2) == 1
    assert default_threads(2, cores=2) == 1
    assert default_threads(0, cores=16) == 8
    assert default_threads(2, cores=16) == 6
    assert ServeConfig().threads is None  # the default is computed at start; --threads overrides
