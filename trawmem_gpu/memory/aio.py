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
    return sorted(n for n, v in vars(cls).items() if not n.startswith("_") and inspect.isfunction(v))


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

    async def aclose(self) -> None:
        """Wait for the calls under way, then stop the pool (the ``Memory`` stays usable); a later
        call raises :class:`~trawmem_gpu.errors.Closed`."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, functools.partial(self._pool.shutdown, wait=True))

    async def __aenter__(self) -> "AsyncMemory":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


MIRRORED = tuple(_public_methods(Memory))
"""Memory's public methods, each an ``AsyncMemory`` coroutine (tests hold the two in step)."""
for _name in MIRRORED:
    setattr(AsyncMemory, _name, _coroutine(_name))
del _name
