"""`trawmem serve`: dynamic batching (one encoder call per batch) and overload: 429 on a full queue,
504 past a deadline, draining at shutdown.

The real server in-process on 127.0.0.1 and a free port, driven with httpx.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, running  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from serve_cases import coll, sample_coll  # noqa: E402, F401, F811 (fixtures)
from serve_cases import QUESTION, _post, _wait_for  # noqa: E402


# ----------------------------------------------------------------------------------------------
# dynamic batching
# ----------------------------------------------------------------------------------------------
def test_concurrent_requests_share_encoder_and_engine_calls(coll):
    """15 requests that queue while a batch runs are answered by one encoder call and one
    engine call (the first batch is held at a gate, so no timing decides the batches)."""
    cfg = ServeConfig(collection=coll, max_batch=32, max_wait_ms=0)
    with running(cfg) as (url, service, _):
        enc_calls, eng_calls = [], []
        inner = service.encoder.inner.encode
        service.encoder.inner.encode = lambda texts, **k: enc_calls.append(len(texts)) or inner(texts, **k)
        eng = service.engines.engine
        sel = eng.select_units
        eng.select_units = lambda b, q, Z, **k: eng_calls.append(len(b)) or sel(b, q, Z, **k)
        gate, _ = _gate(service)
        body = lambda i: {"bank_id": SAMPLE_BANK, "question": f"{QUESTION} ({i})"}  # noqa: E731
        with httpx.Client(base_url=url, timeout=600) as c, ThreadPoolExecutor(16) as ex:
            futs = [ex.submit(_post, c, "/v1/select", body(0))]
            _wait_for(lambda: service.batcher.running == 1)  # the first batch is held at the gate
            futs += [ex.submit(_post, c, "/v1/select", body(i)) for i in range(1, 16)]
            _wait_for(lambda: service.batcher.depth == 15)
            gate.set()
            rs = [f.result() for f in futs]
        assert all(r.status_code == 200 for r in rs)
        sizes = [r.json()["timings"]["batch_size"] for r in rs]
        assert enc_calls == [1, 15] and eng_calls == [1, 15]  # coalesced: one call for the 15 queued
        assert sorted(sizes) == [1] + [15] * 15


def test_batcher_unit_behaviour():
    """The batcher alone: max batch, multi-item admission all-or-nothing, queued timeouts skipped."""
    import asyncio

    from trawmem_gpu.serve.batcher import DeadlineExceeded, DynamicBatcher, QueueFull, ShuttingDown

    seen: list[list] = []
    gate = threading.Event()

    def process(items):
        gate.wait(600)  # a safety bound only: the test sets the gate
        seen.append(list(items))
        return [x * 10 for x in items]

    async def until(cond):  # polls the loop (bounded); asserts on state, never on elapsed time
        for _ in range(12000):
            if cond():
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the batcher never got there")

    async def main():
        with ThreadPoolExecutor(1) as ex:
            b = DynamicBatcher(process, max_batch=3, max_wait_s=0.05, max_queue=4, executor=ex)
            b.start()
            t1 = asyncio.ensure_future(b.submit([1], 60))
            await until(lambda: b.running == 1)  # batch [1] is running (blocked on the gate)
            t2 = asyncio.ensure_future(b.submit([2, 3, 4, 5], 60))  # fills the queue exactly
            await until(lambda: b.depth == 4)
            with pytest.raises(QueueFull) as e:
                await b.submit([6], 10)
            assert e.value.retry_after >= 1
            t3 = asyncio.ensure_future(b.submit([7], 0.05))  # 4 queued of 4: still full
            with pytest.raises(QueueFull):
                await t3
            gate.set()
            assert await t1 == [10]
            assert await t2 == [20, 30, 40, 50]
            # a request that times out while queued never reaches process()
            gate.clear()
            t4 = asyncio.ensure_future(b.submit([8], 60))
            await until(lambda: b.running == 1)
            with pytest.raises(DeadlineExceeded):
                await b.submit([9], 0.1)
            gate.set()
            assert await t4 == [80]
            await b.close()
            with pytest.raises(ShuttingDown):
                await b.submit([10], 1)

    asyncio.run(main())
    assert seen[0] == [1] and all(len(s) <= 3 for s in seen)
    assert [x for s in seen for x in s] == [1, 2, 3, 4, 5, 8]


def test_batcher_answers_chunks_together():
    """Results handed over as ``Later`` (one pool future per chunk): each request gets its own
    element, an exception element fails only that request, a failed chunk fails its requests."""
    import asyncio

    from trawmem_gpu.serve.batcher import DynamicBatcher, Later

    pool = ThreadPoolExecutor(2)

    def chunk(xs):
        time.sleep(0.02)
        if 13 in xs:
            raise RuntimeError("whole chunk failed")
        return [ValueError(f"bad {x}") if x < 0 else x * 10 for x in xs]

    def process(items):
        out = []
        for c in range(0, len(items), 2):  # chunks of two
            fut = pool.submit(chunk, items[c:c + 2])
            out += [Later(fut, k) for k in range(len(items[c:c + 2]))]
        return out

    async def main():
        with ThreadPoolExecutor(1) as ex:
            b = DynamicBatcher(process, max_batch=8, max_wait_s=0.05, max_queue=64, executor=ex)
            b.start()
            one = [asyncio.ensure_future(b.submit([x], 10)) for x in (1, -2, 3, 4, 5)]
            res = await asyncio.gather(*one, return_exceptions=True)
            assert res[0] == [10] and res[2:] == [[30], [40], [50]]
            assert isinstance(res[1], ValueError) and "bad -2" in str(res[1])
            assert await b.submit([6, 7, 8], 10) == [60, 70, 80]
            with pytest.raises(RuntimeError, match="whole chunk"):
                await b.submit([13, 14], 10)
            await b.close()

    asyncio.run(main())
    pool.shutdown()
# ----------------------------------------------------------------------------------------------
# overload, deadlines, draining
# ----------------------------------------------------------------------------------------------
def _gate(service):
    """Block the batch function until the returned event is set; returns (event, processed items)."""
    gate, seen = threading.Event(), []
    orig = service.batcher.process

    def gated(items):
        gate.wait(600)  # a safety bound only: every test sets the gate
        seen.extend(it.question for it in items)
        return orig(items)

    service.batcher.process = gated
    return gate, seen


def test_full_queue_gets_429_with_retry_after(coll):
    cfg = ServeConfig(collection=coll, max_batch=1, max_queue=2, max_wait_ms=0)
    with running(cfg) as (url, service, _):
        gate, _ = _gate(service)
        body = lambda i: {"bank_id": SAMPLE_BANK, "question": f"{QUESTION} {i}"}  # noqa: E731
        with httpx.Client(base_url=url, timeout=600) as c, ThreadPoolExecutor(3) as ex:
            futs = [ex.submit(_post, c, "/v1/select", body(0))]
            _wait_for(lambda: service.batcher.running == 1)  # taken into a batch, held at the gate
            futs += [ex.submit(_post, c, "/v1/select", body(i)) for i in (1, 2)]
            _wait_for(lambda: service.batcher.depth == 2)  # the queue is full
            r = _post(c, "/v1/select", body(9))
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
            r = _post(c, "/v1/select/batch", {"requests": [body(10), body(11)]})
            assert r.status_code == 429
            gate.set()
            assert [f.result().status_code for f in futs] == [200, 200, 200]
            assert _post(c, "/v1/select", body(12)).status_code == 200
            assert 'status="429"' in c.get("/metrics").text


def test_deadline_gets_504_and_expired_requests_are_dropped(coll):
    cfg = ServeConfig(collection=coll, max_batch=1, timeout_s=0.5, max_wait_ms=0)
    with running(cfg) as (url, service, _):
        gate, seen = _gate(service)
        with httpx.Client(base_url=url, timeout=60) as c, ThreadPoolExecutor(2) as ex:
            first = ex.submit(_post, c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": "first"})
            _wait_for(lambda: service.batcher.running == 1)  # first is held at the gate
            second = ex.submit(_post, c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": "second"})
            r1, r2 = first.result(), second.result()
            assert r1.status_code == r2.status_code == 504 and "timeout_s" in r1.json()["detail"]
            gate.set()
            _wait_for(lambda: not service.batcher.running)
            r = _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": "third"})
            assert r.status_code == 200
        assert "second" not in seen  # expired while queued: never cost engine time


def test_shutdown_drains_in_flight_requests(coll):
    cfg = ServeConfig(collection=coll, max_batch=2, max_wait_ms=0, timeout_s=30)
    from trawmem_gpu.serve.server import BackgroundServer, build_app

    app, service = build_app(cfg)
    srv = BackgroundServer(app, cfg).start()
    gate, seen = _gate(service)
    with httpx.Client(base_url=srv.url, timeout=60) as c, ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(_post, c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": f"q{i}"}) for i in range(4)]
        _wait_for(lambda: service.batcher.depth + service.batcher.running == 4)
        stopper = threading.Thread(target=srv.stop)
        stopper.start()  # SIGTERM-equivalent: stop accepting, drain
        time.sleep(0.3)
        assert stopper.is_alive()  # waiting for the in-flight requests
        gate.set()
        stopper.join(60)
        assert [f.result().status_code for f in futs] == [200] * 4
    assert sorted(seen) == [f"q{i}" for i in range(4)]
    assert service.batcher.closing and not service.ready
