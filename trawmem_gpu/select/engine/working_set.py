"""Pieces of ``shortlist.working_sets`` and ``shortlist.grown`` compiled (steps 1-2 and 4 of ``shortlist.py``), each beside
its plain NumPy form, which states the math and which :data:`COMPILED` off selects; the outputs
are equal, dtypes included (``tests/select/test_working_set.py``), so nothing picked changes:

* :func:`head_order`: the index's proposals ordered by exact cosine descending, ties to the lower
  unit (``np.lexsort((i, -c))``), the first ``M`` of them (the working set's seeds) and the
  ``[2, K]`` head (cosines, units as float64). The index returns them by its own float32 score,
  so the float64 order is nearly that one: an insertion sort, with a stable merge sort of the
  units then the cosines where it would move too much.
* :func:`assemble`: ``W``, every unit of the threads given (``threads_units``: whole threads,
  ascending), and with ``context`` the previous / next unit in its session of each of them
  (``rel_idx`` columns 1-2, -1 for none) too (``np.union1d``), in one pass: the units of the
  sorted threads, each neighbour looked up in them by a galloping search from its unit, the
  missing ones sorted and merged in.
* :func:`missing_units`: what a grown working set adds (``shortlist.grown``, step 4): the units of
  the neighbourhood threads that ``W`` lacks, by :func:`absent`, ``np.setdiff1d`` of two ascending
  unique arrays by one merge (the plain form: :func:`threads_units` of :func:`missing_threads`,
  less ``W`` by ``np.setdiff1d``).

Measured at 10^6 units (``benchmarks/experiments/working_set_pieces.py``): the lexsort and stack
0.12 ms a query, ``threads_units`` 0.08 and ``np.union1d`` 0.28 ms of ``working_sets``' 3.3.
"""
from __future__ import annotations

import numpy as np

from .._jit import njit

COMPILED = True
"""``working_sets`` orders the proposals and assembles ``W`` by the compiled forms; False: the
plain NumPy forms (the same arrays)."""
MOVES_PER_UNIT = 8
"""The insertion sort gives up past this many moves per proposal (the merge sort then orders them)."""


def head_order(c: np.ndarray, i: np.ndarray, M: int, placed: bool = False) -> tuple:
    """``(near, head)``: the ``M`` first units ``i`` by cosine ``c`` descending, ties to the lower
    unit, and ``[2, K]`` float64 (``c`` and ``i`` in that order); ``placed``: and each proposal's
    place in that order (``head[:, placed[j]]`` is proposal ``j``'s). Non-finite cosines take the
    plain form (``np.lexsort``'s place for NaN)."""
    if len(c) != len(i):
        raise ValueError(f"cosines and units differ in length ({len(c)} vs {len(i)})")
    if not COMPILED or not np.isfinite(c).all():
        return head_order_plain(c, i, M, placed)
    c64, i64 = np.ascontiguousarray(c, dtype=np.float64), np.ascontiguousarray(i, dtype=np.int64)
    o = _order(c64, i64)
    return _taken(o, i, M, _gathered(c64, i64, o), placed)


def head_order_plain(c: np.ndarray, i: np.ndarray, M: int, placed: bool = False) -> tuple:
    """:func:`head_order` in NumPy (the reference)."""
    o = np.lexsort((i, -c))
    return _taken(o, i, M, np.stack([c[o], i[o].astype(np.float64)]), placed)


def _taken(o: np.ndarray, i: np.ndarray, M: int, head: np.ndarray, placed: bool) -> tuple:
    """``(near, head)`` of the order ``o``, and with ``placed`` each proposal's place in it."""
    if not placed:
        return i[o[:M]], head
    at = np.empty(len(o), np.int64)
    at[o] = np.arange(len(o))
    return i[o[:M]], head, at


@njit(cache=True, nogil=True)
def _before(c, i, a, b):  # pragma: no cover - compiled
    """Whether proposal ``a`` orders before ``b``: a larger cosine, or the same and a lower unit."""
    return c[a] > c[b] or (c[a] == c[b] and i[a] < i[b])


@njit(cache=True, nogil=True)
def _order(c, i):  # pragma: no cover - compiled
    """The permutation of ``np.lexsort((i, -c))`` for finite ``c`` (stable: equal keys keep their
    order): an insertion sort over the index's nearly sorted order, or past ``MOVES_PER_UNIT``
    moves a unit, a stable merge sort by unit, then by cosine descending."""
    n = len(c)
    o = np.arange(n)
    moves, limit = 0, MOVES_PER_UNIT * n
    for k in range(1, n):
        x = o[k]
        j = k - 1
        while j >= 0 and _before(c, i, x, o[j]):
            o[j + 1] = o[j]
            j -= 1
            moves += 1
        o[j + 1] = x
        if moves > limit:
            by_unit = np.argsort(i, kind="mergesort")
            return by_unit[np.argsort(-c[by_unit], kind="mergesort")]
    return o


@njit(cache=True, nogil=True)
def _gathered(c, i, o):  # pragma: no cover - compiled
    """``np.stack([c[o], i[o].astype(np.float64)])``."""
    out = np.empty((2, len(o)))
    for k in range(len(o)):
        out[0, k] = c[o[k]]
        out[1, k] = i[o[k]]
    return out


def assemble(offsets: np.ndarray, threads: np.ndarray, rel: np.ndarray, uo: int, context: bool) -> np.ndarray:
    """``W`` (int64, ascending): every unit of ``threads`` (bank-local, any order, repeats allowed;
    thread ``j`` holds units ``offsets[j]:offsets[j + 1]``) and, with ``context``, the units
    ``rel[uo + w, 1:3]`` of those (bank-local; -1: none)."""
    if not COMPILED:
        return assemble_plain(offsets, threads, rel, uo, context)
    return _assemble(np.asarray(offsets, dtype=np.int64), np.asarray(threads), rel, int(uo), bool(context))


def assemble_plain(offsets: np.ndarray, threads: np.ndarray, rel: np.ndarray, uo: int, context: bool) -> np.ndarray:
    """:func:`assemble` in NumPy (the reference, as ``shortlist.working_sets`` wrote it)."""
    t = np.unique(threads)
    lo, hi = offsets[t], offsets[t + 1]
    lens = (hi - lo).astype(np.int64)
    W = np.repeat(lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(int(lens.sum()))
    if context:
        nb = rel[uo + W][:, 1:3].ravel()
        W = np.union1d(W, nb[nb >= 0])
    return W.astype(np.int64, copy=False)


@njit(cache=True, nogil=True)
def _assemble(offsets, threads, rel, uo, context):  # pragma: no cover - compiled
    """See :func:`assemble`."""
    t = np.unique(threads)
    n = 0
    for j in t:
        n += offsets[j + 1] - offsets[j]
    W = np.empty(n, np.int64)
    k = 0
    for j in t:
        for u in range(offsets[j], offsets[j + 1]):
            W[k] = u
            k += 1
    if not context:
        return W
    extra = np.empty(2 * n, np.int64)
    m = 0
    for a in range(n):
        for col in range(1, 3):
            v = np.int64(rel[uo + W[a], col])
            if v >= 0 and not _holds(W, a, v):
                extra[m] = v
                m += 1
    if m == 0:
        return W
    e = np.unique(extra[:m])
    out = np.empty(n + len(e), np.int64)
    a = b = 0
    for k in range(len(out)):  # two ascending runs with nothing in common
        if b == len(e) or (a < n and W[a] < e[b]):
            out[k] = W[a]
            a += 1
        else:
            out[k] = e[b]
            b += 1
    return out


@njit(cache=True, nogil=True)
def _holds(W, a, v):  # pragma: no cover - compiled
    """Whether ascending ``W`` holds ``v``, searched outward from ``W[a]`` (a session's neighbour
    is mostly near its unit): a galloping search, then a binary search in the bracket found."""
    n = len(W)
    step = 1
    if v >= W[a]:  # W[lo] <= v
        lo = a
        while lo + step < n and W[lo + step] < v:
            lo += step
            step *= 2
        hi = min(n, lo + step + 1)
    else:  # W[hi] > v
        hi = a
        while hi - step >= 0 and W[hi - step] > v:
            hi -= step
            step *= 2
        lo = max(0, hi - step)
    p = lo + np.searchsorted(W[lo:hi], v)
    return p < n and W[p] == v


def threads_units(offsets: np.ndarray, threads: np.ndarray) -> np.ndarray:
    """Every unit of ``threads`` (bank-local, ascending unique), ascending."""
    threads = np.unique(threads)
    return _ranges(offsets[threads], offsets[threads + 1])


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The integers of ``[lo[i], hi[i])``, range after range."""
    lens = (hi - lo).astype(np.int64)
    at = starts(lens)
    return np.repeat(lo - at[:-1], lens) + np.arange(int(at[-1]))


def starts(lens: np.ndarray) -> np.ndarray:
    """``[len(lens) + 1]`` int64: 0 then the running sums of ``lens`` (each part's start, then the end)."""
    out = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def missing_threads(offsets: np.ndarray, w: np.ndarray, hthread: np.ndarray) -> np.ndarray:
    """The neighbourhood threads ``hthread`` (bank-local) of which ``w`` lacks a unit (the plain
    form of :func:`missing_units`' threads)."""
    have = np.searchsorted(w, offsets[hthread + 1]) - np.searchsorted(w, offsets[hthread])
    return hthread[have < offsets[hthread + 1] - offsets[hthread]]


def missing_units(offsets: np.ndarray, w: np.ndarray, hthread: np.ndarray) -> np.ndarray:
    """The units, ascending, of the neighbourhood threads ``hthread`` (bank-local, any order) that
    ``w`` (ascending) lacks, what ``shortlist.grown`` adds: every unit of the threads less ``w``
    (:func:`absent`; a thread ``w`` holds whole adds nothing). :data:`COMPILED` off: the plain form,
    :func:`threads_units` of :func:`missing_threads` less ``w``."""
    hthread = np.asarray(hthread, dtype=np.int64)
    if not COMPILED:
        hthread = missing_threads(offsets, w, hthread)
    return absent(threads_units(offsets, hthread).astype(np.int64, copy=False), np.ascontiguousarray(w, dtype=np.int64))


def absent(more: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The units of ``more`` not in ``w`` (both int64, ascending and unique), ascending: ``np.setdiff1d``
    by one compiled merge (:data:`COMPILED` off: ``np.setdiff1d`` itself)."""
    if not COMPILED:
        return np.setdiff1d(more, w, assume_unique=True).astype(np.int64)
    return _absent(more, w)


@njit(cache=True, nogil=True)
def _absent(more, w):  # pragma: no cover - compiled
    """:func:`absent`, compiled."""
    out = np.empty(len(more), np.int64)
    k = p = 0
    for j in range(len(more)):
        x = more[j]
        while p < len(w) and w[p] < x:
            p += 1
        if p == len(w) or w[p] != x:
            out[k] = x
            k += 1
    return out[:k]


def warm(unit_thread: np.ndarray, rel: np.ndarray) -> None:
    """Compile (or load from numba's cache) the compiled forms with the argument types a query
    passes (``unit_thread``'s and ``rel_idx``'s dtypes), on empty input."""
    head_order(np.zeros(1), np.zeros(1, np.int64), 1)
    missing_units(np.zeros(2, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    absent(np.zeros(0, np.int64), np.zeros(0, np.int64))
    for context in (False, True):
        assemble(np.zeros(2, np.int64), np.zeros(0, unit_thread.dtype), rel[:0], 0, context)
