"""Appends apart from the query path: their own encoder, in chunks that give way to queries.

A query batch never waits behind an append's encode (a 300-turn append encodes for seconds):

* the batch worker encodes queries with the service's query encoder, which nothing else calls;
* appends encode with an :class:`AppendEncoder` over a second instance of the same model (loaded
  in the background once the server has started, so no append pays the load), so an append never holds a lock a query needs;
* an append encodes ``chunk`` turns per call and, before each chunk, waits while a query batch
  is running on the batch worker (:class:`QueryFirst`; at most ``max_wait_s`` per chunk, so an
  append under steady query load still progresses): on a host with few cores the append takes
  the CPU between query batches instead of competing with them for their whole duration;
* the append threads run at a lower CPU priority (:func:`lower_priority`, niceness +10 on
  Linux), so the OS scheduler gives the cores to query threads first whenever both are runnable.
"""
from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future

import numpy as np

from ..encode.base import Encoder
from .batcher import FairQueue, _Pending


APPEND_NICENESS = 10
"""How much the append threads lower their own CPU priority (added to the process's niceness)."""


def lower_priority(inc: int = APPEND_NICENESS) -> bool:
    """Raise the calling thread's niceness by ``inc`` (Linux: ``setpriority`` on the thread's own
    id, which sets that thread alone). True when done; False where threads have no priority of
    their own (not Linux) or the OS refuses."""
    import os
    import sys

    if not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + int(inc))
    except OSError:  # pragma: no cover - refused (a sandbox)
        return False
    return True


def chain(*inits):
    """One thread initializer that runs ``inits`` in order."""
    def init():
        for f in inits:
            f()

    return init


class QueryFirst:
    """Query batches before append chunks: the batch worker marks each batch it runs
    (:meth:`running`); an append chunk first waits for none to be running (:meth:`wait_idle`)."""

    def __init__(self, max_wait_s: float = 0.25):
        self.max_wait_s = float(max_wait_s)
        self._running = 0
        self._cv = threading.Condition()

    @contextlib.contextmanager
    def running(self):
        with self._cv:
            self._running += 1
        try:
            yield
        finally:
            with self._cv:
                self._running -= 1
                if not self._running:
                    self._cv.notify_all()

    @property
    def busy(self) -> bool:
        return self._running > 0

    def wait_idle(self) -> bool:
        """Wait until no query batch runs (at most ``max_wait_s``); True when none runs."""
        with self._cv:
            return self._cv.wait_for(lambda: self._running == 0, timeout=self.max_wait_s)


class AppendEncoder(Encoder):
    """``inner`` for appends: texts encoded ``chunk`` at a time, longest-alike together (the
    texts are length-sorted first, as :meth:`Encoder.encode` does), each chunk after
    ``before_chunk()`` (e.g. :meth:`QueryFirst.wait_idle`)."""

    def __init__(self, inner: Encoder, chunk: int, before_chunk=lambda: None):
        self.inner, self.id, self.dim = inner, inner.id, inner.dim
        self.chunk, self.before_chunk = max(1, int(chunk)), before_chunk
        self.chunks = 0
        """Encoder calls made (tests read it)."""

    def _encode_batch(self, texts, is_query):  # pragma: no cover - encode() is overridden
        return self.inner._encode_batch(texts, is_query)

    def encode(self, texts, *, batch_size: int = 64, **kw) -> np.ndarray:
        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        step = min(self.chunk, int(batch_size))
        for s in range(0, len(order), step):
            idx = order[s:s + step]
            self.before_chunk()
            out[idx] = self.inner.encode([texts[i] for i in idx], batch_size=step, **kw)
            self.chunks += 1
        return out


class FairPool:
    """A thread pool whose jobs are taken round robin across keys (workspace assembly): one
    key's backlog of finished selections waiting to be rendered does not hold up another key's.
    ``submit(key, fn, *args)`` returns a ``concurrent.futures.Future``, like an executor's. The
    jobs wait in a :class:`~.batcher.FairQueue` (the batcher's rotation, one job per take)."""

    def __init__(self, threads: int, name: str = "trawmem-assemble", initializer=None):
        self._q = FairQueue()
        self._cv = threading.Condition()
        self._closed = False
        self._outstanding: set = set()
        self._init = initializer
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def submit(self, key, fn, *args) -> Future:
        fut = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._q.push(key, [_Pending((fn, args), 0.0, fut)])
            self._outstanding.add(fut)
            self._cv.notify()
        fut.add_done_callback(self._done)
        return fut

    def _done(self, fut) -> None:
        with self._cv:
            self._outstanding.discard(fut)

    def outstanding(self) -> list:
        """The futures of every job submitted and not finished yet (queued or running)."""
        with self._cv:
            return list(self._outstanding)

    def _next(self):
        """The next job (round robin across keys; cancelled ones are skipped), None once closed and empty."""
        with self._cv:
            while True:
                job = self._q.take(1)
                if job:
                    return job[0]
                if self._closed:
                    return None
                self._cv.wait()

    def _work(self) -> None:
        if self._init is not None:
            self._init()
        while True:
            job = self._next()
            if job is None:
                return
            (fn, args), fut = job.item, job.future
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the future, as an executor does
                fut.set_exception(e)

    def shutdown(self, wait: bool = True) -> None:
        """Finish the queued jobs, then stop the threads."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if wait:
            for t in self._threads:
                t.join()
