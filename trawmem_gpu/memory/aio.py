"""``AsyncMemory``: :class:`~trawmem_gpu.memory.Memory`'s methods as coroutines, for asyncio programs.

::

    from trawmem_gpu import AsyncMemory
    async with AsyncMemory("memories/") as mem:
        await mem.add("ana-ben", messages=[{"role": "user", "content": "I moved to Lyon."}])
        ws = await mem.select("ana-ben", "Where does Ana live?", token_budget=800)

It is a ``Memory`` (one :class:`~trawmem_gpu.memory.core.MemoryCore`: the same banks, engine,
append and forget paths, the same picks) whose calls run on a thread pool of its own, so the event
loop never blocks on an encoder call, an engine call or a bank write. Every public method of
``Memory`` is here, with the same parameters (forwarded unchanged: a parameter ``Memory`` gains is
``AsyncMemory``'s too) and the same errors, raised in the awaiting task.

Safe from many tasks at once: ``Memory`` is thread-safe (appends and forgets of one bank run one
after another, selections see a bank before or after a write, never a mix), and so is this. A
cancelled task stops waiting; the call it started runs to its end on its thread (a write is never
left half-done). ``AsyncMemory.of(memory)`` shares a ``Memory`` that other threads use.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
from concurrent.futures import ThreadPoolExecutor

from ..errors import Closed
from .api import Memory

DEFAULT_WORKERS = 4
"""Threads of an ``AsyncMemory``'s pool: calls that run at once (the engine serializes selections;
writes of different banks run side by side)."""


def _public_methods(cls) -> list[str]:
    """The public methods of ``cls`` and of the classes it mixes in (``Memory``'s export and import
    come from ``memory.export.Portable``)."""
    names = {n for c in cls.__mro__ if c is not object for n, v in vars(c).items()
             if not n.startswith("_") and inspect.isfunction(v)}
    return sorted(names)


def _coroutine(name: str):
    """The coroutine ``AsyncMemory.<name>``: ``Memory.<name>`` on the pool, same signature and docs."""
    fn = getattr(Memory, name)

    @functools.wraps(fn)
    async def call(self, *args, **kw):
        return await self._run(getattr(self._memory, name), *args, **kw)

    call.__doc__ = f"``await``-able :meth:`Memory.{name}`.\n\n{fn.__doc__ or ''}"
    return call


class AsyncMemory:
    """Agent memory for asyncio programs: :class:`Memory`'s constructor arguments, its methods as
    coroutines (module docstring).

    :param workers: threads that run its calls (default :data:`DEFAULT_WORKERS`)
    """

    def __init__(self, path=None, options=None, *, workers: int = DEFAULT_WORKERS, memory: Memory | None = None,
                 **kw):
        if memory is None:
            memory = Memory(path, options, **kw)
        elif path is not None or options is not None or kw:
            raise TypeError("AsyncMemory(memory=...) takes no other arguments (the Memory is opened already)")
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise TypeError(f"AsyncMemory() workers: expected a positive integer, got {workers!r}")
        self._memory = memory
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="trawmem-async")
        self._closed = False

    @classmethod
    def of(cls, memory: Memory, *, workers: int = DEFAULT_WORKERS) -> "AsyncMemory":
        """An ``AsyncMemory`` over an open ``Memory`` (its core, shared with whoever else uses it)."""
        if not isinstance(memory, Memory):
            raise TypeError(f"AsyncMemory.of(): expected a Memory, got {type(memory).__name__}")
        return cls(memory=memory, workers=workers)

    @property
    def memory(self) -> Memory:
        """The ``Memory`` underneath (its methods, called from a thread, block)."""
        return self._memory

    async def _run(self, fn, *args, **kw):
        closed = Closed(f"this AsyncMemory is closed (aclose() was called): open another, or call its "
                        f"Memory (.memory) from a thread ({fn.__name__} was not run)")
        if self._closed:
            raise closed
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(self._pool, functools.partial(fn, *args, **kw))
        except RuntimeError:  # the pool's "cannot schedule new futures after shutdown": closed meanwhile
            if not self._closed:
                raise
            raise closed from None
        return await fut

    # the properties and plain lookups of Memory (no I/O: answered at once)
    path = property(lambda self: self._memory.path)
    encoder_id = property(lambda self: self._memory.encoder_id)
    defaults = property(lambda self: self._memory.defaults)
    quarantined = property(lambda self: self._memory.quarantined)

    def __contains__(self, bank_id: str) -> bool:
        return bank_id in self._memory

    def __repr__(self) -> str:
        return f"Async{self._memory!r}"

    async def export_lines(self, banks=None, *, where=None, vectors: bool = False, chunk: int = 256):
        """:meth:`Memory.export_lines` as an async iterator (``async for line in
        mem.export_lines()``): the export is made on the pool, ``chunk`` lines at a time, so a
        long export never blocks the event loop; each bank is read from one revision as in
        ``Memory.export_lines``."""
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise TypeError(f"AsyncMemory.export_lines() chunk: expected a positive integer, got {chunk!r}")
        it = await self._run(self._memory.export_lines, banks, where=where, vectors=vectors)
        try:
            while lines := await self._run(_next_lines, it, chunk):
                for line in lines:
                    yield line
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    async def aclose(self) -> None:
        """Wait for the calls under way, then stop the pool (the ``Memory`` stays usable); a later
        call raises :class:`~trawmem_gpu.errors.Closed`."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, functools.partial(self._pool.shutdown, wait=True))

    async def __aenter__(self) -> "AsyncMemory":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _next_lines(it, n: int) -> list[str]:
    """Up to ``n`` more lines of the iterator ``it`` (fewer at its end, none after it)."""
    out = []
    for line in it:
        out.append(line)
        if len(out) == n:
            break
    return out


STREAMED = ("export_lines",)
"""Memory's methods that return an iterator: ``AsyncMemory``'s are async iterators, written above."""
MIRRORED = tuple(n for n in _public_methods(Memory) if n not in STREAMED)
"""Memory's other public methods, each an ``AsyncMemory`` coroutine (tests hold the two in step)."""
for _name in MIRRORED:
    setattr(AsyncMemory, _name, _coroutine(_name))
del _name
