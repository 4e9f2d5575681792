"""Issue 23.2: a query that sends its ``question_vector`` never waits for an encoder call, not
even the one of the text queries it is batched with.

No assertion here is on a latency: the query encoder is held at an event inside its encode
while the vector query of the same batch is answered.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, build_sample_collection, running  # noqa: E402
from trawmem_gpu.serve.batcher import DynamicBatcher  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402

QUESTION = "Why did Ana walk home during her long run?"
OTHER = "What did Ben cook for the party?"


def _wait_for(cond, limit_s: float = 120.0) -> None:
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < limit_s:
        time.sleep(0.01)


def test_ahead_items_run_first_and_are_answered_before_the_rest_is_processed():
    """The batch is formed as before (round robin, one batch); its ``ahead`` items go in a call of
    their own, first, and their futures are settled while the rest's call is still running."""
    calls, rest_inside, release = [], threading.Event(), threading.Event()

    def process(items):
        calls.append(list(items))
        if any(not v for _, v in items):
            rest_inside.set()
            release.wait(60)
        return [k for k, _ in items]

    async def main():
        ex = ThreadPoolExecutor(1)
        b = DynamicBatcher(process, max_batch=4, max_wait_s=60.0, max_queue=64, executor=ex,
                           ahead=lambda it: it[1])
        b.start()
        # one submission per request; the batch forms once all four are queued (max_batch)
        reqs = [("a", ("a0", False)), ("a", ("a1", True)), ("b", ("b0", True)), ("b", ("b1", False))]
        tasks = {}
        for key, it in reqs:
            tasks[it[0]] = asyncio.ensure_future(b.submit([it], 60, key=key))
            await asyncio.sleep(0)
        while not rest_inside.is_set():
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)  # let the loop run the settle callbacks already scheduled
        # the rest's call is held: the ahead requests are answered, the others wait
        state = {k: t.done() for k, t in tasks.items()}
        depth = b.depth
        release.set()
        res = {k: (await t)[0] for k, t in tasks.items()}
        await b.close()
        ex.shutdown()
        return state, depth, res

    state, depth, res = asyncio.run(main())
    assert state == {"a0": False, "a1": True, "b0": True, "b1": False}
    assert depth == 0 and res == {k: k for k in res}
    # one batch taken round robin (a0 b0 a1 b1); its ahead part first, in batch order, then the rest
    assert calls == [[("b0", True), ("a1", True)], [("a0", False), ("b1", False)]]


@pytest.fixture(scope="module")
def coll(tmp_path_factory) -> str:
    return str(build_sample_collection(tmp_path_factory.mktemp("vfirst") / "coll"))


def test_a_vector_query_is_answered_while_its_batchs_encoder_call_is_held(coll):
    """Text query A runs (its encode held); text query B and vector query V queue, and form the
    next batch together. V's answer arrives while B's encode is still held, with the same picks
    as V alone."""
    cfg = ServeConfig(collection=coll, max_wait_ms=0, max_batch=8, timeout_s=120)
    with running(cfg) as (url, service, _), httpx.Client(base_url=url, timeout=120) as c:
        z = service.encoder.encode([OTHER], is_query=True)[0]
        v_body = {"bank_id": SAMPLE_BANK, "question": OTHER, "question_vector": [float(x) for x in z]}
        alone = c.post("/v1/select", json=v_body)
        assert alone.status_code == 200
        inner = service.encoder.inner
        real = inner.encode
        gates = [threading.Event(), threading.Event()]
        inside = [threading.Event(), threading.Event()]
        sizes: list[int] = []
        n = [0]

        def held(texts, **kw):
            k = min(n[0], 1)
            n[0] += 1
            sizes.append(len(texts))
            inside[k].set()
            gates[k].wait(60)
            return real(texts, **kw)

        inner.encode = held
        try:
            post = lambda body: httpx.post(f"{url}/v1/select", json=body, timeout=120)  # noqa: E731
            with ThreadPoolExecutor(3) as ex:
                fa = ex.submit(post, {"bank_id": SAMPLE_BANK, "question": QUESTION})
                _wait_for(inside[0].is_set)
                assert inside[0].is_set()
                fb = ex.submit(post, {"bank_id": SAMPLE_BANK, "question": OTHER})
                _wait_for(lambda: service.queue_depth() == 1)
                fv = ex.submit(post, v_body)
                _wait_for(lambda: service.queue_depth() == 2)
                assert service.queue_depth() == 2  # B and V wait together for the next batch
                gates[0].set()
                _wait_for(inside[1].is_set)
                assert inside[1].is_set()  # B's batch is in its encoder call, held
                rv = fv.result(timeout=60)  # without the split: TimeoutError (V waits for B's encode)
                assert not fb.done() and not gates[1].is_set()
                assert rv.status_code == 200
                assert rv.json()["units"] == alone.json()["units"] and rv.json()["text"] == alone.json()["text"]
                assert rv.json()["timings"]["encode_ms"] == 0.0
                gates[1].set()
                assert fa.result(timeout=60).status_code == 200 and fb.result(timeout=60).status_code == 200
        finally:
            gates[0].set()
            gates[1].set()
            inner.encode = real
        assert sizes == [1, 1]  # B's encode held only B's question
