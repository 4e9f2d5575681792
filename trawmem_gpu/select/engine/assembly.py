"""A front round's arguments over the working sets, compiled (``shortlist.py``, step 3; the plain
form is ``shortlist.thread_space`` + ``shortlist.compact``, :data:`shortlist.ASSEMBLY` off).

Each front round of a query over its working set ``W`` (bank-local units, ascending) reads:

* its :class:`shortlist.ThreadSpace`: the threads of ``W``'s units, every thread within the
  query's ``hops`` of them and, when ``W`` has fewer threads than seeds, the bank's lowest
  (``shortlist._space``), renumbered ``0 ..`` in bank order, with the edges among them, as many
  columns as the longest row a walk reads (the thread table is padded to the bank's widest
  degree, 75 at 10^6 synthetic units where the median is 8: the columns past every read row's
  last neighbour are -1, so neither the walk nor propagation needs them; a batch's queries are
  padded to their widest);
* each unit's thread as a position in that space (``ult``);
* ``W``'s BM25 as one sparse column (the positions of its nonzero scores and the scores);
* for the learned affinity, each unit's ``rel_idx`` row with its previous / next unit as a
  position in ``W`` (-1 outside ``W``), and its temporal flag and ``words`` feature.

:func:`front_args` builds them with one compiled call per query (:func:`_assemble`: the walk of
``_space`` over each row's neighbours only (a row is packed: :func:`packed_length`), a position
table over the space instead of ``np.searchsorted``, binary searches in ``W`` for the neighbours) and lays the queries out as ``shortlist.compact`` does; the arrays are
equal, dtypes included (``tests/select/test_assembly.py``), so the front loop's candidates and
picks are the same.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from .._jit import njit
from ..steps.candidates import GivenRanks
from ..steps.relevance import LearnedQueries, LearnedTables, no_learned_tables
from .tables import Offsets, Snapshot
from .working_set import starts as _starts


class Rows(NamedTuple):
    """The snapshot's tables :func:`_assemble` reads (global rows)."""

    unit_thread: np.ndarray
    nbr: np.ndarray
    nbw: np.ndarray
    rel_idx: np.ndarray
    """``[units, 3]``, or ``[1, 3]`` when no query of the call reads the learned tables."""
    temporal: np.ndarray
    words: np.ndarray


class Place(NamedTuple):
    """Where a query's bank lies in the snapshot and what its front reads."""

    uo: int
    """The bank's first global unit ..."""
    g0: int
    """... and first global thread."""
    J: int
    """Threads of the bank."""
    hops: int
    n_seeds: int
    learned: bool


def front_args(snap: Snapshot, bidx: np.ndarray, shorts: list, lq, learned: bool, hops, n_seeds):
    """``(spaces, (FrontTables fields, Offsets, cos, coff, tok_ptr, tok_ids, GivenRanks,
    LearnedTables, LearnedQueries))``: ``shortlist.thread_space`` of each query as an ``(ids, nbr,
    nbw)`` tuple and ``shortlist.compact``'s tuple, equal to theirs. ``shorts``: ranked already
    (``shortlist.ranked``); ``hops`` / ``n_seeds``: per query."""
    n = snap.np
    Q = len(shorts)
    rel = n["rel_idx"] if learned else np.zeros((1, 3), np.int32)
    rows = Rows(n["unit_thread"], n["nbr"], n["nbw"], rel, n["temporal"], n["rel_words"] if learned else np.zeros(1))
    level = levels(int(snap.off.nt[bidx].max()) if Q else 0)
    try:
        parts = [_assemble(rows, np.ascontiguousarray(sh.units, dtype=np.int64), sh.bm,
                           Place(int(snap.off.uo[b]), int(snap.off.to[b]), int(snap.off.nt[b]), int(hops[q]),
                                 int(n_seeds[q]), learned), level)
                 for q, (sh, b) in enumerate(zip(shorts, bidx.tolist()))]
    except BaseException:
        drop_levels()  # a call cut short may leave entries set: the next one starts afresh
        raise
    spaces = [p[:3] for p in parts]
    nu = np.array([len(sh.units) for sh in shorts], dtype=np.int64)
    nt = np.array([len(sp[0]) for sp in spaces], dtype=np.int64)
    uo, to = _starts(nu)[:-1], _starts(nt)[:-1]
    cat = _cat if Q != 1 else _one
    cos = cat([sh.cos for sh in shorts], np.float64)
    ranks = GivenRanks(cat([sh.ranks[0] for sh in shorts], np.float64), cat([sh.ranks[1] for sh in shorts], np.float64))
    bpos = [p[4] for p in parts]
    bptr = _starts(np.array([len(p) for p in bpos], dtype=np.int64))
    nbr, nbw = padded([sp[1] for sp in spaces], -1, n["nbr"].dtype), padded([sp[2] for sp in spaces], 0, n["nbw"].dtype)
    tables = (cat([p[3] for p in parts], np.int64), nbr, nbw, cat([p[5] for p in parts], np.float32),
              cat(bpos, np.int64), bptr)
    zeros = np.zeros(Q, np.int64)
    off = Offsets(uo, to, zeros, zeros, zeros, zeros, nu, nt, zeros)
    tptr, tids = np.arange(Q + 1, dtype=np.int64), np.arange(Q, dtype=np.int64)
    if not learned:
        return spaces, (tables, off, cos, uo, tptr, tids, ranks, no_learned_tables(), lq)
    ltab = LearnedTables(cat([p[6] for p in parts], n["rel_idx"].dtype, (0, 3)),
                         cat([p[7] for p in parts], n["temporal"].dtype), cat([p[8] for p in parts], n["rel_words"].dtype))
    return spaces, (tables, off, cos, uo, tptr, tids, ranks, ltab, _dated(lq, shorts))


SCRATCH = True
""":func:`_assemble`'s per-thread array of the bank's threads is kept by each calling thread, all -1
between calls (:func:`levels`), instead of allocated and filled per call (1 MB at 10^6 units, two
calls a query); False: a new one per call (the same arrays out)."""
_SCRATCH = threading.local()


def levels(J: int) -> np.ndarray:
    """An int64 array of at least ``J`` entries, all -1, for :func:`_assemble` (which leaves it so):
    this thread's (:data:`SCRATCH`, grown when a larger bank asks), or a new one."""
    if not SCRATCH:
        return np.full(max(J, 1), -1, np.int64)
    got = getattr(_SCRATCH, "level", None)
    if got is None or len(got) < J:
        got = _SCRATCH.level = np.full(max(J, 1), -1, np.int64)
    return got


def drop_levels() -> None:
    """Forget this thread's :func:`levels` array (a call cut short may have left entries set)."""
    _SCRATCH.level = None


def padded(rows: list, fill, dtype) -> np.ndarray:
    """The queries' ``[n_q, width_q]`` neighbour rows stacked as ``dtype``, each padded with ``fill``
    to the widest (the query's own array when there is one; ``[0, 1]`` when there is none)."""
    if len(rows) == 1 and rows[0].dtype == dtype:
        return rows[0]
    width = max([1] + [r.shape[1] for r in rows])
    out = np.full((sum(len(r) for r in rows), width), fill, dtype=dtype)
    k = 0
    for r in rows:
        out[k:k + len(r), :r.shape[1]] = r
        k += len(r)
    return out


@njit(cache=True, nogil=True)
def packed_length(nbr, row):  # pragma: no cover - compiled
    """The neighbours of ``nbr[row]``: its columns before the first -1. The thread table's rows are
    packed (``bank_tables._neighbours`` writes a thread's neighbours first, then -1 to the table's
    width, and every write of a row writes it whole; ``tests/select/test_assembly.py`` checks built,
    appended and purged tables), so no neighbour lies past it."""
    k = 0
    while k < nbr.shape[1] and nbr[row, k] >= 0:
        k += 1
    return k


def _cat(xs: list, dtype, empty: tuple = (0,)) -> np.ndarray:
    return np.concatenate(xs).astype(dtype, copy=False) if xs else np.zeros(empty, dtype)


def _one(xs: list, dtype, empty: tuple = (0,)) -> np.ndarray:
    """The one query's array itself (no copy; ``_cat`` of one)."""
    return np.asarray(xs[0], dtype=dtype)


def _dated(lq, shorts: list) -> LearnedQueries:
    """``lq`` with each dated query's date match read at its working set's units (``shortlist._learned``)."""
    dm, dm_off, k = [], [], 0
    for q, sh in enumerate(shorts):
        if lq.dm_off[q] >= 0:
            dm_off.append(k)
            dm.append(lq.dm[lq.dm_off[q] + sh.units])
            k += len(sh.units)
        else:
            dm_off.append(-1)
    return LearnedQueries(lq.named, lq.named_off, lq.z_temp, np.concatenate(dm) if dm else np.zeros(0),
                          np.asarray(dm_off, np.int64), lq.w, lq.rrf_k)


@njit(cache=True, nogil=True)
def _assemble(rows, W, bm, at, level):  # pragma: no cover - compiled
    """One query's ``(ids, local nbr, local nbw, ult, BM25 positions, BM25 scores, rel, temporal,
    words)`` over its working set ``W`` (module docstring; ``at``: a :class:`Place`; ``level``: at
    least ``at.J`` entries, all -1, left so: :func:`levels`)."""
    m = len(W)
    J = at.J
    got = np.empty(max(16, 2 * m), np.int64)
    n = 0
    for i in range(m):  # the working set's own threads, once each
        t = rows.unit_thread[at.uo + W[i]]
        if level[t] < 0:
            level[t] = 0
            got[n] = t
            n += 1
    own = n
    pad = min(J, at.n_seeds + own) if own < at.n_seeds else 0
    got, n = _walk(rows.nbr, at.g0, level, got, n, at.hops, pad, True)
    ids, local, w = _renumbered(rows.nbr, rows.nbw, at.g0, level, got[:n], at.hops)
    H = at.hops + 1
    ult = np.empty(m, np.int64)
    for i in range(m):
        ult[i] = level[rows.unit_thread[at.uo + W[i]]] // H
    nz = 0
    for i in range(m):
        nz += bm[i] != 0
    bpos = np.empty(nz, np.int64)
    bval = np.empty(nz, np.float32)
    k = 0
    for i in range(m):
        if bm[i] != 0:
            bpos[k], bval[k] = i, bm[i]
            k += 1
    rel, temp, words = _learned_rows(rows, W, at)
    for i in range(n):  # the array back to all -1 for the next call
        level[ids[i]] = -1
    return ids, local, w, ult, bpos, bval, rel, temp, words


@njit(cache=True, nogil=True)
def _renumbered(nbr, nbw, g0, level, got, hops):  # pragma: no cover - compiled
    """``(ids, local nbr, local nbw)`` of the space ``got`` (bank-local threads, each with its
    ``level`` from :func:`_walk`): the threads ascending, the rows of those fewer than ``hops``
    levels out renumbered as positions in it (the others' are never read: -1 and 0), as many
    columns as the longest of those rows. Each thread's ``level`` entry becomes ``level + (hops +
    1) * position`` (level: ``code % (hops + 1)``, position: ``code // (hops + 1)``): its position
    shares the one ``J``-sized array (a second one, written at random, cost 0.4 ms a call at 10^6
    units, its pages touched afresh every call); the caller sets them back to -1."""
    ids = np.sort(got)
    n = len(ids)
    H = hops + 1
    width = 1
    for i in range(n):
        lv = level[ids[i]]
        level[ids[i]] = lv + H * i
        if lv < hops:
            width = max(width, packed_length(nbr, g0 + ids[i]))
    local = np.full((n, width), -1, nbr.dtype)
    w = np.zeros((n, width), nbw.dtype)
    for i in range(n):
        t = ids[i]
        if level[t] % H < hops:
            for e in range(packed_length(nbr, g0 + t)):
                k = nbr[g0 + t, e]
                if k >= 0 and level[k] >= 0:
                    local[i, e] = level[k] // H
                    w[i, e] = nbw[g0 + t, e]
    return ids, local, w


@njit(cache=True, nogil=True)
def _walk(nbr, g0, level, got, n, hops, pad, packed):  # pragma: no cover - compiled
    """``shortlist._space``'s breadth-first walk: ``hops`` levels from the ``n`` threads in ``got``
    (level 0), then the bank's lowest ``pad`` threads not reached (level ``hops``); ``(got, n)``.
    ``packed``: a row's neighbours end at its first -1 (:func:`packed_length`); else every column is read."""
    lo = 0
    for h in range(hops):
        hi = n
        for i in range(lo, hi):
            for e in range(nbr.shape[1]):
                k = nbr[g0 + got[i], e]
                if k < 0 and packed:
                    break
                if k >= 0 and level[k] < 0:
                    if n == len(got):
                        got = _bigger(got, n)
                    level[k] = h + 1
                    got[n] = k
                    n += 1
        if n == hi:
            break
        lo = hi
    for t in range(pad):
        if level[t] < 0:
            if n == len(got):
                got = _bigger(got, n)
            level[t] = hops
            got[n] = t
            n += 1
    return got, n


@njit(cache=True, nogil=True)
def _bigger(got, n):  # pragma: no cover - compiled
    out = np.empty(2 * n, np.int64)
    out[:n] = got[:n]
    return out


@njit(cache=True, nogil=True)
def _learned_rows(rows, W, at):  # pragma: no cover - compiled
    """``(rel, temporal, words)`` of ``W``'s units: ``rel_idx`` rows with columns 1 and 2 (previous,
    next unit) as positions in ``W`` (-1 outside it); empty when ``at.learned`` is off."""
    m = len(W) if at.learned else 0
    rel = np.empty((m, 3), rows.rel_idx.dtype)
    temp = np.empty(m, rows.temporal.dtype)
    words = np.empty(m, rows.words.dtype)
    for i in range(m):
        g = at.uo + W[i]
        rel[i, 0] = rows.rel_idx[g, 0]
        for c in (1, 2):  # W[i]'s previous / next unit: most often W[i - 1] / W[i + 1] (whole threads
            u = rows.rel_idx[g, c]  # with their context), looked at before a binary search (0.1 ms a call at 10^6)
            if u < 0:
                rel[i, c] = -1
            elif i > 0 and W[i - 1] == u:
                rel[i, c] = i - 1
            elif i + 1 < m and W[i + 1] == u:
                rel[i, c] = i + 1
            else:
                p = np.searchsorted(W, u)
                rel[i, c] = p if p < m and W[p] == u else -1
        temp[i] = rows.temporal[g]
        words[i] = rows.words[g]
    return rel, temp, words

