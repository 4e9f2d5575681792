"""``aio.within`` never loses a cancellation (CPython 3.11's ``asyncio.wait_for`` can: bpo-42130).

The race: a task waits on an event under a bound; the event is set and the task is cancelled a
few loop iterations later, at every offset. A lost cancellation shows as a task that goes on
past the wait although cancelled before it resumed; with ``within`` none does. The same drive over
``asyncio.wait_for`` shows the race is real on this interpreter where it loses one.
"""
from __future__ import annotations

import asyncio
import sys

import pytest

from trawmem_gpu.aio import within


def _lost_at(bounded) -> list[int]:
    """The offsets (loop iterations between the event's set and the cancel) at which a task
    waiting in ``bounded(event.wait(), 60)`` went on past the wait although it had been
    cancelled before it resumed (``Task.cancelling``), instead of ending cancelled."""
    async def one(k: int) -> bool:
        ev, went_on = asyncio.Event(), []

        async def waiter():
            await bounded(ev.wait(), 60)
            if asyncio.current_task().cancelling():  # cancelled, yet the wait returned: the cancel was lost
                went_on.append(1)

        t = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)
        ev.set()
        for _ in range(k):
            await asyncio.sleep(0)
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)  # it ends either way: cancelled, or past the wait
        return bool(went_on)

    async def main():
        return [k for k in range(8) if await one(k)]

    return asyncio.run(main())


def test_within_ends_cancelled_at_every_offset():
    assert _lost_at(within) == []


def test_within_returns_the_result_and_raises_timeout_error():
    async def main():
        async def slow():
            await asyncio.sleep(60)

        got = await within(asyncio.sleep(0, result=7), 5)
        with pytest.raises(asyncio.TimeoutError):  # the same class as TimeoutError since 3.11
            await within(slow(), 0.01)
        fut = asyncio.get_running_loop().create_future()
        with pytest.raises(TimeoutError):
            await within(fut, 0.01)
        return got, fut.cancelled(), await within(asyncio.sleep(0, result=8), None)

    assert asyncio.run(main()) == (7, True, 8)  # a timed-out future is cancelled, as wait_for does


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 rewrote asyncio.wait_for over asyncio.timeout")
def test_wait_for_loses_one_here():
    """Why ``within`` exists: on this interpreter ``asyncio.wait_for`` loses the cancellation
    at some offset of the same drive."""
    assert _lost_at(asyncio.wait_for) != []
