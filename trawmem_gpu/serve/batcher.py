"""Dynamic batching: concurrent requests coalesced into one call of a batch function.

Requests wait in a bounded queue, one FIFO per key (API key / tenant, :class:`FairQueue`). A
single dispatcher task (on the event loop) waits until ``max_batch`` requests are queued or
``max_wait`` has passed since the oldest *arrived* (so requests that queued while the previous
batch ran go out at once), then forms the batch round robin across keys, one request per key
per turn, continuing from the key after the last one served: one key's large batch call delays
another key's single query by at most the engine call already running. The batch goes to
``process`` on a worker thread: the event loop never runs model or engine code. One batch runs
at a time, so the batch grows with the load. With ``ahead``, the requests of a batch it marks
(queries that bring their own vector) run in their own call first and are answered before the
rest of the batch (those that need an encoder call) starts: the batch is formed the same way.

Light first: a request submitted alone (one query, :attr:`_Pending.light`) never shares an engine
call with another request's many queries. The calls of a batch run in this order: the ``ahead``
items, then the light ones (single selects, whatever their key), then the rest (multi-query
submissions such as a tenant's 256-query batch), so a single select waits behind at most the call
already running, never behind the encode and select of a batch formed with it.

* A full queue, or a key over its own limit of queued requests, raises :class:`QueueFull`
  (HTTP 429) with a Retry-After estimate from the measured service rate; a multi-request
  submission is admitted whole or not at all (one larger than either limit, which no wait would
  admit, is ``InputError``, HTTP 422).
* Every request carries a deadline; past it :meth:`DynamicBatcher.submit` raises
  :class:`DeadlineExceeded` (HTTP 504) and a request still queued is dropped before it costs
  engine time.
* :meth:`DynamicBatcher.close` refuses new requests (:class:`ShuttingDown`, HTTP 503) and
  returns once every queued and running request has been answered.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import math
import time
from concurrent.futures import Executor
from typing import Callable, NamedTuple

from ..aio import within
from ..errors import InputError

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The request queue (or this key's share of it) is full; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int, detail: str | None = None):
        super().__init__(detail or f"the request queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


class FairQueue:
    """Pending requests in one FIFO per key, taken round robin across keys.

    :meth:`take` gives each key with requests waiting one slot per turn, in a rotation that goes
    on from batch to batch (the key after the last one served comes first), so a key with one
    request waiting is in the next batch whatever another key has queued. A key pushed with a
    ``share`` contributes at most that many requests to one batch, so the engine call another
    key's query may wait behind stays short (a key alone with a large backlog then runs in
    batches of its share). Requests whose future is done (timed out, gone) are dropped as they
    come up, without taking a slot or the key's turn.
    """

    def __init__(self):
        self._q: dict[object, collections.deque] = {}
        self._order: collections.deque = collections.deque()  # keys with requests, in turn
        self._share: dict = {}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def depth_of(self, key) -> int:
        q = self._q.get(key)
        return 0 if q is None else len(q)

    def push(self, key, items, share: int | None = None) -> None:
        """Queue ``items`` of ``key``; ``share``: most of them one batch takes (None: no bound)."""
        q = self._q.get(key)
        if q is None:
            q = self._q[key] = collections.deque()
            self._order.append(key)
        q.extend(items)
        self._n += len(items)
        if share is not None:
            self._share[key] = share

    def remove(self, key, items) -> None:
        """Take those of ``items`` still queued under ``key`` out (requests gone before a batch
        took them), so they stop counting against the queue's and the key's limits at once."""
        q = self._q.get(key)
        if q is None:
            return
        gone = {id(p) for p in items}
        kept = collections.deque(p for p in q if id(p) not in gone)
        self._n -= len(q) - len(kept)
        if kept:
            self._q[key] = kept
        else:
            del self._q[key]
            self._order.remove(key)
            self._share.pop(key, None)

    def oldest_arrival(self) -> float:
        """``arrived`` of the oldest request at the head of any key's queue (``inf`` when empty)."""
        return min((q[0].arrived for q in self._q.values()), default=math.inf)

    def take(self, n: int) -> list:
        """Up to ``n`` live requests, round robin across keys, at most a key's ``share`` each."""
        out, taken = [], {}
        order, qs, shares = self._order, self._q, self._share
        passed = 0  # keys passed over in a row because their share is used up
        while order and len(out) < n and passed < len(order):
            key = order[0]
            share = shares.get(key)
            if share is not None and taken.get(key, 0) >= share:
                order.rotate(-1)
                passed += 1
                continue
            passed = 0
            q = qs[key]
            live = None
            while q and live is None:  # the key's next live request; the dead ones go
                p = q.popleft()
                self._n -= 1
                if not p.future.done():
                    live = p
            if not q:
                order.popleft()
                del qs[key]
                shares.pop(key, None)
            else:
                order.rotate(-1)
            if live is not None:
                out.append(live)
                taken[key] = taken.get(key, 0) + 1
        return out


class InFlight:
    """Per-key counts of operations in flight (appends), refused over a key's limit."""

    def __init__(self):
        self._n: dict[object, int] = {}

    def count(self, key) -> int:
        return self._n.get(key, 0)

    @contextlib.contextmanager
    def hold(self, key, limit: int | None, what: str = "appends", retry_after: int = 1):
        """Count one operation of ``key`` while the block runs; ``QueueFull`` when ``key`` already
        has ``limit`` in flight (None: no limit)."""
        n = self._n.get(key, 0)
        if limit is not None and n >= limit:
            raise QueueFull(retry_after, f"this key has {n} {what} in flight; its limit is {limit} "
                                         f"(`tenant_max_appends` or the keys file's limits); retry in {retry_after} s")
        self._n[key] = n + 1
        try:
            yield
        finally:
            if self._n[key] <= 1:
                del self._n[key]
            else:
                self._n[key] -= 1


class DeadlineExceeded(Exception):
    """The request was not answered within its deadline."""


class ShuttingDown(Exception):
    """The server is draining and takes no new requests."""


class OutcomeUnknown(Exception):
    """An append (or forget) whose answer was lost (the engine process went away, or did not
    answer in time): it may or may not have been done. Answered 503 with ``"outcome": "unknown"``;
    resending it is safe (turns already stored are reported, not stored twice; turns already
    forgotten are reported missing)."""


class _Pending:
    __slots__ = ("item", "arrived", "future", "light")

    def __init__(self, item, arrived, future, light: bool = False):
        self.item, self.arrived, self.future = item, arrived, future
        self.light = light
        """Submitted alone (one query): runs before the batch's multi-query submissions."""


class Later(NamedTuple):
    """A result still being computed on another pool: element ``index`` of the list that
    ``future`` returns (an exception instance there fails only that request). The requests
    sharing one future are answered together, with one wake-up of the event loop."""

    future: concurrent.futures.Future
    index: int


def _later_done(loop: asyncio.AbstractEventLoop, parts: list, fut: concurrent.futures.Future) -> None:
    try:  # on the pool's thread
        loop.call_soon_threadsafe(_settle_parts, parts, fut)
    except RuntimeError:  # pragma: no cover - the loop closed first
        pass


def _settle_parts(parts: list, fut: concurrent.futures.Future) -> None:
    exc = None if not fut.cancelled() else asyncio.CancelledError()
    res = None
    if exc is None:
        exc = fut.exception()
        res = fut.result() if exc is None else None
    for target, i in parts:
        if target.done():
            continue
        r = exc if exc is not None else res[i]
        if isinstance(r, BaseException):
            target.set_exception(r)
        else:
            target.set_result(r)


class DynamicBatcher:
    """Coalesces :meth:`submit` calls into calls of ``process(items) -> results``.

    :param process: runs on ``executor``; gets a list of items, returns one result per item
        (an ``Exception`` instance as a result fails only that request; a :class:`Later` answers
        it when its chunk's future completes, so a later stage can run on another pool while the
        next batch starts)
    :param max_batch: most items per call
    :param max_wait_s: longest the oldest queued item waits for others when idle
    :param max_queue: most items queued (not counting the running batch)
    :param executor: where ``process`` runs (a one-thread pool keeps the engine single-writer)
    :param on_batch: called on the loop with (batch size, seconds) after each batch
    :param ahead: ``ahead(item)`` true: the item runs in a first call of its own, with the other
        items so marked in its batch, and is answered before the batch's other items are
        processed (None: one call per batch)
    """

    def __init__(self, process: Callable[[list], list], *, max_batch: int, max_wait_s: float, max_queue: int,
                 executor: Executor, on_batch: Callable[[int, float], None] | None = None,
                 ahead: Callable[[object], bool] | None = None):
        self.process, self.executor, self.on_batch, self.ahead = process, executor, on_batch, ahead
        self.max_batch, self.max_wait_s, self.max_queue = int(max_batch), float(max_wait_s), int(max_queue)
        self._queue = FairQueue()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._rate = 0.0  # items/s, exponentially smoothed over batches (for Retry-After)
        self.running = 0

    @property
    def depth(self) -> int:
        """Requests waiting (not yet in a running batch)."""
        return len(self._queue)

    @property
    def closing(self) -> bool:
        return self._closing

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="trawmem-batcher")

    async def close(self) -> None:
        """Stop taking requests; return when everything queued or running is answered."""
        self._closing = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task

    def retry_after(self, backlog: int | None = None) -> int:
        """Seconds until ``backlog`` queries (default: all queued and running) are answered at the
        measured rate."""
        backlog = len(self._queue) + self.running if backlog is None else backlog
        return max(1, math.ceil(backlog / self._rate)) if self._rate > 0 else 1

    async def submit(self, items: list, timeout_s: float, key=None, key_limit: int | None = None,
                     key_share: int | None = None) -> list:
        """Results for ``items`` (in order); raises QueueFull, DeadlineExceeded or ShuttingDown.

        :param key: whose requests these are (batches are formed round robin across keys)
        :param key_limit: most requests ``key`` may have waiting (None: only ``max_queue``)
        :param key_share: most requests of ``key`` in one batch (None: up to ``max_batch``)
        """
        if self._closing or self._task is None:
            raise ShuttingDown("the server is shutting down")
        for limit, what in ((key_limit, "queries this key may have queued: `tenant_max_queued` or the keys file's "
                                        "limits"), (self.max_queue, "queries the queue holds: `max_queue`")):
            if limit is not None and len(items) > limit:  # never admitted, so no 429 to retry
                raise InputError(f"{len(items)} queries in one request; the limit is {limit} ({what})")
        if len(self._queue) + len(items) > self.max_queue:
            raise QueueFull(self.retry_after())
        if key_limit is not None:
            mine = self._queue.depth_of(key)
            if mine + len(items) > key_limit:
                ra = self.retry_after(mine)
                raise QueueFull(ra, f"this key has {mine} queries waiting and sent {len(items)}; its limit is "
                                    f"{key_limit} (`tenant_max_queued` or the keys file's limits); retry in {ra} s")
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        light = len(items) == 1
        pend = [_Pending(it, now, loop.create_future(), light) for it in items]
        self._queue.push(key, pend, key_share)
        self._wake.set()
        try:
            if len(pend) == 1:  # the common case, without a gathering future
                return [await within(pend[0].future, timeout_s)]
            return await within(asyncio.gather(*(p.future for p in pend)), timeout_s)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"no answer within the {timeout_s:g} s deadline") from None
        finally:
            for p in pend:  # a timed-out or cancelled request leaves the queue without costing a batch
                if not p.future.done():
                    p.future.cancel()
            gone = [p for p in pend if p.future.cancelled()]  # (cancelling a gather cancels them too)
            if gone:
                self._queue.remove(key, gone)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        q = self._queue
        while True:
            if not q:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = q.oldest_arrival() + self.max_wait_s
            while len(q) < self.max_batch and not self._closing:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._wake.clear()
                try:
                    await within(self._wake.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch = q.take(self.max_batch)  # round robin across keys; skips requests gone while queued
            if not batch:
                continue
            self.running = len(batch)
            t0 = time.perf_counter()
            for part in self._parts(batch):
                await self._run_part(loop, part)
            dt = time.perf_counter() - t0
            self.running = 0
            self._rate = len(batch) / dt if self._rate == 0 else 0.8 * self._rate + 0.2 * len(batch) / max(dt, 1e-9)
            if self.on_batch is not None:
                self.on_batch(len(batch), dt)

    def _parts(self, batch: list) -> list[list]:
        """The calls of one batch, each in batch order: the ``ahead`` items, then the light ones
        (submitted alone), then the rest; empty groups are left out."""
        ahead = self.ahead or (lambda _item: False)
        groups: tuple[list, list, list] = ([], [], [])
        for p in batch:
            groups[0 if ahead(p.item) else 1 if p.light else 2].append(p)
        return [g for g in groups if g]

    async def _run_part(self, loop: asyncio.AbstractEventLoop, part: list) -> None:
        """One call of ``process`` for ``part``; settles its requests (or hooks their ``Later``).
        Requests gone meanwhile (timed out while an earlier part ran) are left out."""
        part = [p for p in part if not p.future.done()]
        if not part:
            return
        try:
            results = await loop.run_in_executor(self.executor, self.process, [p.item for p in part])
            if len(results) != len(part):
                raise RuntimeError(f"batch function returned {len(results)} results for {len(part)} items")
        except Exception as e:  # a bug in process: fail this call's requests, keep serving
            log.exception("batch of %d failed", len(part))
            results = [e] * len(part)
        later: dict[int, tuple] = {}
        for p, r in zip(part, results):
            if isinstance(r, Later):  # finished later on another pool, with its chunk
                later.setdefault(id(r.future), (r.future, []))[1].append((p.future, r.index))
            elif not p.future.done():
                if isinstance(r, BaseException):
                    p.future.set_exception(r)
                else:
                    p.future.set_result(r)
        for fut, parts in later.values():
            fut.add_done_callback(functools.partial(_later_done, loop, parts))
