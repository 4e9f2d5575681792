"""A front round's arguments over the working sets, compiled (``shortlist.py``, step 3; the plain
form is ``shortlist.thread_space`` + ``shortlist.compact``, :data:`shortlist.ASSEMBLY` off).

Each front round of a query over its working set ``W`` (bank-local units, ascending) reads:

* its :class:`shortlist.ThreadSpace`: the threads of ``W``'s units, every thread within the
  query's ``hops`` of them and, when ``W`` has fewer threads than seeds, the bank's lowest
  (``shortlist._space``), renumbered ``0 ..`` in bank order, with the edges among them;
* each unit's thread as a position in that space (``ult``);
* ``W``'s BM25 as one sparse column (the positions of its nonzero scores and the scores);
* for the learned affinity, each unit's ``rel_idx`` row with its previous / next unit as a
  position in ``W`` (-1 outside ``W``), and its temporal flag and ``words`` feature.

:func:`front_args` builds them with one compiled call per query (:func:`_assemble`: the walk of
``_space``, a position table over the space instead of ``np.searchsorted``, binary searches in
``W`` for the neighbours) and lays the queries out as ``shortlist.compact`` does; the arrays are
equal, dtypes included (``tests/select/test_assembly.py``), so the front loop's candidates and
picks are the same.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._jit import njit
from ..steps.candidates import GivenRanks
from ..steps.relevance import LearnedQueries, LearnedTables, no_learned_tables
from .tables import Offsets, Snapshot


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
    parts = [_assemble(rows, np.ascontiguousarray(sh.units, dtype=np.int64), sh.bm,
                       Place(int(snap.off.uo[b]), int(snap.off.to[b]), int(snap.off.nt[b]), int(hops[q]),
                             int(n_seeds[q]), learned))
             for q, (sh, b) in enumerate(zip(shorts, bidx.tolist()))]
    spaces = [p[:3] for p in parts]
    nu = np.array([len(sh.units) for sh in shorts], dtype=np.int64)
    nt = np.array([len(sp[0]) for sp in spaces], dtype=np.int64)
    uo = np.concatenate([[0], np.cumsum(nu)[:-1]]).astype(np.int64)
    to = np.concatenate([[0], np.cumsum(nt)[:-1]]).astype(np.int64)
    cat = _cat if Q != 1 else _one
    cos = cat([sh.cos for sh in shorts], np.float64)
    ranks = GivenRanks(cat([sh.ranks[0] for sh in shorts], np.float64), cat([sh.ranks[1] for sh in shorts], np.float64))
    bpos = [p[4] for p in parts]
    bptr = np.concatenate([[0], np.cumsum([len(p) for p in bpos])]).astype(np.int64)
    width = n["nbr"].shape[1]
    nbr = cat([sp[1] for sp in spaces], n["nbr"].dtype, (0, width))
    nbw = cat([sp[2] for sp in spaces], n["nbw"].dtype, (0, width))
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
def _assemble(rows, W, bm, at):  # pragma: no cover - compiled
    """One query's ``(ids, local nbr, local nbw, ult, BM25 positions, BM25 scores, rel, temporal,
    words)`` over its working set ``W`` (module docstring; ``at``: a :class:`Place`)."""
    m = len(W)
    J = at.J
    level = np.full(J, -1, np.int64)
    D = rows.nbr.shape[1]
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
    got, n = _walk(rows.nbr, at.g0, level, got, n, at.hops, pad)
    ids = np.sort(got[:n])
    pos = np.empty(J, np.int64)  # read only where level >= 0
    for i in range(n):
        pos[ids[i]] = i
    local = np.full((n, D), -1, rows.nbr.dtype)
    w = np.zeros((n, D), rows.nbw.dtype)
    for i in range(n):
        t = ids[i]
        if level[t] < at.hops:
            for e in range(D):
                k = rows.nbr[at.g0 + t, e]
                if k >= 0 and level[k] >= 0:
                    local[i, e] = pos[k]
                    w[i, e] = rows.nbw[at.g0 + t, e]
    ult = np.empty(m, np.int64)
    for i in range(m):
        ult[i] = pos[rows.unit_thread[at.uo + W[i]]]
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
    return ids, local, w, ult, bpos, bval, rel, temp, words


@njit(cache=True, nogil=True)
def _walk(nbr, g0, level, got, n, hops, pad):  # pragma: no cover - compiled
    """``shortlist._space``'s breadth-first walk: ``hops`` levels from the ``n`` threads in ``got``
    (level 0), then the bank's lowest ``pad`` threads not reached (level ``hops``); ``(got, n)``."""
    D = nbr.shape[1]
    lo = 0
    for h in range(hops):
        hi = n
        for i in range(lo, hi):
            for e in range(D):
                k = nbr[g0 + got[i], e]
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
        for c in (1, 2):
            u = rows.rel_idx[g, c]
            p = np.searchsorted(W, u) if u >= 0 else m
            rel[i, c] = p if p < m and W[p] == u else -1
        temp[i] = rows.temporal[g]
        words[i] = rows.words[g]
    return rel, temp, words
