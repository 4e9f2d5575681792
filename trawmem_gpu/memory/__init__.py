"""The Python API: :class:`Memory` over one collection (add, select, select_many, forget, banks),
and :class:`AsyncMemory`, its methods as coroutines (:mod:`.aio`).

The core it shares with the server and the CLI (``MemoryCore``: banks, encoder, engine, the append
and forget paths) is in :mod:`.core`; erasure of forgotten turns from caches in :mod:`.erase`.
Reference: ``docs/python-api.md``.
"""
from ..data.types import Turn
from .aio import AsyncMemory
from .api import Memory
from .options import MemoryOptions
from .result import SelectedWorkspace, Thread, Unit

__all__ = ["AsyncMemory", "Memory", "MemoryOptions", "SelectedWorkspace", "Thread", "Turn", "Unit"]
