"""Issue 23, `trawmem serve` limits: fair batches across keys and per-key limits (429, 422), in the
batcher and through the server.

No assertion here is on a latency: batches are read from a controlled queue, blocking is shown
by holding an encoder at an event while other requests are answered.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, running  # noqa: E402
from trawmem_gpu.errors import ConfigError  # noqa: E402
from trawmem_gpu.serve.batcher import DynamicBatcher, FairQueue, InFlight, QueueFull, _Pending  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from trawmem_gpu.serve.keys import KeyStore  # noqa: E402

from serve_limits_cases import coll, sample_coll  # noqa: E402, F401, F811 (fixtures)
from serve_limits_cases import KEYS, QUESTION, _auth, _keys, _turn, _wait_for  # noqa: E402


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
    very next engine call is B's query (batch composition, read from the batch function)."""
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
    assert batches[1] == [("b", 0)]  # light-first: B's single query in an engine call of its own, first
    assert all(len(x) <= 32 for x in batches) and all(k == "a" for x in batches[2:] for k, _ in x)
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
