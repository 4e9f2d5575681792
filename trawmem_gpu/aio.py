"""One bounded await for the package's async code: :func:`within`, in place of ``asyncio.wait_for``.

On CPython 3.11 ``asyncio.wait_for`` can lose a cancellation: when the task that awaits it is
cancelled in the loop iteration where the awaited thing has just finished, ``wait_for`` returns
its result and the task goes on as if never cancelled (bpo-42130; 3.12 rewrote ``wait_for`` over
``asyncio.timeout``). A front's poll loop cancelled at shutdown that way polled on forever, and
the ``stop`` that gathered it never returned (``tests/serve/test_serve_engine_failures.py`` hung a
CI run). ``asyncio.timeout`` (3.11+) counts cancellations (``Task.uncancel``) and never loses one:
:func:`within` awaits under it, with ``wait_for``'s contract otherwise (``TimeoutError``, which
is ``asyncio.TimeoutError``, when ``seconds`` pass; what is awaited is cancelled then).
"""
from __future__ import annotations

import asyncio


async def within(aw, seconds: float | None):
    """``await aw``, cancelled with :class:`TimeoutError` after ``seconds`` (None: no bound)."""
    async with asyncio.timeout(seconds):
        return await aw
