"""Handing the C heap's freed pages back to the system after a large build.

glibc's allocator keeps the pages of freed blocks in its arenas (below ``M_TRIM_THRESHOLD`` at the
top of a heap, and any page inside one) for later allocations, so a build that allocates and frees
hundreds of MiB of temporaries (an engine's tables over a large bank, a faiss index's training
copies) leaves the process's resident size above what it still references. ``malloc_trim(0)``
returns those pages. Measured at 10^5 units (``benchmarks.experiments.engine_resident``,
``engine_trimmed``): 28-29 MiB of 507 MiB after the engine build; at 10^6, 30 MiB
(``docs/scaling.md``, compact vectors).
"""
from __future__ import annotations

import ctypes
import sys
from functools import lru_cache

TRIM_MIN_UNITS = 1 << 16
"""Builds over at least this many units (or vectors) trim the heap after them; a smaller build's
temporaries are too few to be worth the call (a trim walks the heap: milliseconds)."""


@lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (not Linux, or another C library: musl has none)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap(units: int) -> bool:
    """``malloc_trim(0)`` after a build over ``units`` units when there are at least
    :data:`TRIM_MIN_UNITS` and the C library is glibc; whether it was called."""
    fn = _malloc_trim()
    if fn is None or units < TRIM_MIN_UNITS:
        return False
    fn(0)
    return True
