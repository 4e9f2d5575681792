"""``njit``: numba's compiler when numba imports, else the plain Python function.

The compiled variants of the method's steps sit beside their NumPy and torch twins (in
``steps/`` and ``objective.py``); each is decorated once, where it is defined, so a compiled
function that calls another one sees the compiled callee (numba resolves globals at compile
time) and nothing is rebound at run time. Without numba the decorated functions stay Python and
the engine does not select its compiled backend (``HAS_NUMBA``).

Cached machine code goes to one directory per version of this package's selection sources
(``~/.cache/trawmem_gpu/numba/<hash>``): numba keys a cache entry on the file of the function
it compiles, not on the files of the functions it calls, so an edit of a callee in another
module would otherwise leave a stale caller in ``__pycache__``. Compiled code also freezes the
globals it reads (the term lists' weight columns, for one): a term is a module of ``terms/``, one
of these sources, so a tree with other terms caches apart.
"""
from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

try:  # noqa: SIM105 - any import failure means: no compiled backend
    import numba

    HAS_NUMBA = True
except Exception:  # noqa: BLE001
    numba = None
    HAS_NUMBA = False

_SELECT = Path(__file__).resolve().parent


@lru_cache(maxsize=1)
def cache_dir() -> str:
    """Numba's cache directory for the current selection sources (created on first use)."""
    h = hashlib.sha256()
    for p in sorted(_SELECT.rglob("*.py")):
        h.update(p.relative_to(_SELECT).as_posix().encode() + b"\0" + p.read_bytes())
    root = os.environ.get("TRAWMEM_NUMBA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trawmem_gpu", "numba")
    return os.path.join(root, h.hexdigest()[:16])


@contextmanager
def _cache_dir():
    """numba reads ``config.CACHE_DIR`` when a function's cache is created (at decoration)."""
    old = numba.config.CACHE_DIR
    try:
        d = cache_dir()
        os.makedirs(d, exist_ok=True)
        numba.config.CACHE_DIR = d
    except OSError:  # unwritable home: numba's default (next to the sources, or none)
        d = old
    try:
        yield
    finally:
        numba.config.CACHE_DIR = old


def njit(**options):
    """``numba.njit(**options)`` (with ``cache=True`` into :func:`cache_dir`), or the identity."""

    def deco(f):
        if not HAS_NUMBA:
            return f
        if options.get("cache"):
            with _cache_dir():
                return numba.njit(**options)(f)
        return numba.njit(**options)(f)

    return deco


LINE_BYTES = 64
"""A cache line (:func:`prefetch_row` asks for one per this many bytes of a row)."""


def _prefetch():
    """``prefetch(a, i, k)``: a compiled hint that ``a[i, k]`` (a 2-D array) will be read soon
    (LLVM's ``llvm.prefetch``: read, high locality, data cache). A hint only: it changes no
    value and never faults, so a compiled gather of scattered rows may ask for the rows it reads
    next while it sums the one it holds (a row of 384 float32 spans 24 lines; the hardware
    prefetcher does not follow a list of row numbers)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def prefetch(typingctx, a, i, k):
        if not (isinstance(a, types.Array) and a.ndim == 2 and isinstance(i, types.Integer)
                and isinstance(k, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1], args[2]])
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
            return context.get_dummy_value()
        return types.void(a, i, k), codegen
    return prefetch


if HAS_NUMBA:
    prefetch = _prefetch()
else:
    def prefetch(a, i, k) -> None:  # noqa: ARG001 - the plain form: a hint, so nothing
        """Without numba: nothing (see ``_prefetch``)."""


@njit(cache=True, nogil=True, inline="always")
def prefetch_row(a, i):  # pragma: no cover - compiled
    """:func:`prefetch` every cache line of row ``i`` of ``a`` (2-D, rows contiguous)."""
    step = max(1, LINE_BYTES // a.itemsize)
    for k in range(0, a.shape[1], step):
        prefetch(a, i, k)


@njit(cache=True, nogil=True, inline="always")
def prefetch_ahead(a, rows, base, i, ahead):  # pragma: no cover - compiled
    """At step ``i`` of a pass reading rows ``base + rows[0], base + rows[1], ...`` of ``a``: the
    rows ``ahead`` of it asked for (:func:`prefetch_row`; at step 0 the first ``ahead`` too)."""
    n = rows.shape[0]
    if i == 0:
        for j in range(min(ahead, n)):
            prefetch_row(a, base + rows[j])
    if i + ahead < n:
        prefetch_row(a, base + rows[i + ahead])
