"""Tenant isolation on the serving path (issue 42 item 2): a single select never shares an engine
call with another tenant's large batch, append threads run at a lower CPU priority, and the
append encoder is loaded after start-up, before the first append."""
from __future__ import annotations

import asyncio
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from trawmem_gpu.serve.batcher import DynamicBatcher
from trawmem_gpu.serve.lanes import APPEND_NICENESS, lower_priority

from serve_cases import coll, sample_coll  # noqa: E402, F401, F811 (fixtures)


def test_single_select_runs_in_its_own_call_before_a_hostile_batch():
    """With the first call held at a gate, a hostile key queues 256 queries and a victim key one;
    the victim's query goes out alone, in the call before any of the hostile queries."""
    gate, calls = threading.Event(), []

    def process(items):
        calls.append(list(items))
        if items == ["hold"]:
            gate.wait(60)
        return list(items)

    async def main():
        with ThreadPoolExecutor(1) as ex:
            b = DynamicBatcher(process, max_batch=512, max_wait_s=0.01, max_queue=1024, executor=ex)
            b.start()
            held = asyncio.ensure_future(b.submit(["hold"], 60, key="other"))
            while not calls:
                await asyncio.sleep(0.01)
            hostile = asyncio.ensure_future(b.submit([f"h{i}" for i in range(256)], 60, key="hostile"))
            victim = asyncio.ensure_future(b.submit(["victim"], 60, key="victim"))
            while b.depth < 257:
                await asyncio.sleep(0.01)
            gate.set()
            assert await victim == ["victim"]
            assert len(await hostile) == 256 and await held == ["hold"]
            await b.close()

    asyncio.run(main())
    later = calls[1:]
    first_victim = next(i for i, c in enumerate(later) if "victim" in c)
    assert later[first_victim] == ["victim"]
    assert all(not any(x.startswith("h") for x in c) for c in later[:first_victim + 1])
    assert sorted(x for c in later for x in c if x != "victim") == sorted(f"h{i}" for i in range(256))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")
def test_append_threads_run_at_lower_priority():
    """``lower_priority`` raises the calling thread's niceness alone; the service's append pool
    runs its jobs on such threads."""
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def nice_after():
        lower_priority()
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    with ThreadPoolExecutor(1) as ex:
        assert ex.submit(nice_after).result() == min(19, base + APPEND_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # this thread untouched


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")
def test_service_append_pool_is_niced_and_append_encoder_preloaded(coll):
    """After start-up, with no append made, the append encoder is loaded in the background (on
    an append thread), and that thread's niceness is raised."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from serve_util import running
    from trawmem_gpu.serve.config import ServeConfig

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with running(ServeConfig(collection=coll, max_wait_ms=2)) as (_url, service, _srv):
        loaded = service.append_encoder_loaded
        assert loaded is not None
        for _ in range(600):  # the server loop's future, polled (a hang guard, not a timing check)
            if loaded.done():
                break
            threading.Event().wait(0.1)
        assert loaded.done() and loaded.exception() is None
        assert service._append_encoder is not None and loaded.result() is service._append_encoder
        nice = service.appender.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert nice.result(60) == min(19, base + APPEND_NICENESS)
