"""Exact BM25 of a large bank's query, compiled: every posting of the query's columns added into a
dense per-thread accumulator, the ``M`` best units kept in a heap, and the BM25 rank of any unit
counted over every unit of positive score (``lexical_shortlist.lexical`` for queries whose columns
hold more than ``EXACT_POSTINGS`` postings). With ``lexical_shortlist.MERGED`` (the default) the
scores, top and table come from ``lexical_merge`` (the same arrays, fewer passes), which reads the
ranks with :func:`table_ranks` and falls back to :func:`rank_table` past its distinct scores; the
rest here is the plain reference it is tested against.

The math, as the plain reference (``lexical_shortlist.bm25_sparse`` then ranks by ``np.lexsort``)
states it: a unit's score is the float32 sum of its postings in the query's columns, added in
token order (as bm25s adds them); its rank is ``1 + #{v : s_v > s_u or (s_v == s_u and v < u)}``
over the units of positive score (descending, ties to the lower unit). Here:

* :func:`accumulate` adds column after column into a float32 array of the bank's length (each
  unit's postings in token order: the same float32 sums), lists the units in the order first
  touched, reads their scores and clears what it touched (the array stays zero between queries);
* :func:`top_units`: the ``M`` best of them by ``(score descending, unit ascending)``, one pass
  with a bounded heap;
* :func:`rank_table` (once per query) and :func:`table_ranks` (per front round): the touched
  units' keys ``(score descending, unit ascending)`` sorted by a radix sort (four or five
  cache-friendly passes), so any unit's rank is ``1 +`` the keys before its own (a binary search).
  The rounds of a query read the same table: each working-set unit costs ``O(log T)``, never
  another pass over the touched units;
* :func:`counted_ranks`: the ranks of a few units by one pass over the touched units (each one
  counted into a bucket of its float32 bits, and one falling into a bucket that holds requested
  keys compared with them), the reading before the table (``lexical_shortlist.RANK_TABLE`` off).

Cost: ``O(P)`` for ``P`` postings of the query's columns, plus ``O(T)`` once per query for the
rank table of its ``T`` touched units (a radix sort) and ``O(m log T)`` per ``m`` ranked ones. At 10^6 units of the synthetic
banks a query's columns hold ~10^5 postings.
"""
from __future__ import annotations

import threading

import numpy as np

from .._jit import njit

_SCRATCH = threading.local()


def scratch(n: int) -> np.ndarray:
    """This thread's zeroed float32 accumulator of at least ``n`` entries (:func:`accumulate` leaves
    it zero again)."""
    acc = getattr(_SCRATCH, "acc", None)
    if acc is None or len(acc) < n:
        acc = _SCRATCH.acc = np.zeros(n, np.float32)
    return acc


def radix_scratch(n: int) -> np.ndarray:
    """This thread's int64 scratch of at least ``n`` entries (:func:`rank_table`)."""
    got = getattr(_SCRATCH, "radix", None)
    if got is None or len(got) < n:
        got = _SCRATCH.radix = np.empty(n, np.int64)
    return got


def dense_scores(idx: np.ndarray, data: np.ndarray, lo: np.ndarray, hi: np.ndarray, n: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(units, float32 scores)`` of every unit the columns ``[lo[c], hi[c])`` of the store touch
    (bank-local units below ``n``, in the order first touched: :func:`accumulate`)."""
    return accumulate(idx, data, np.asarray(lo, np.int64), np.asarray(hi, np.int64), scratch(n))


@njit(cache=True, nogil=True)
def accumulate(idx, data, lo, hi, acc):  # pragma: no cover - compiled
    """``(units, scores)`` of the units the columns touch; ``acc`` (zero, bank-long) is used as the
    accumulator and left zero. A posting of 0 touches no unit (it adds nothing)."""
    total = 0
    for c in range(len(lo)):
        total += hi[c] - lo[c]
    units = np.empty(total, np.int64)
    k = 0
    for c in range(len(lo)):
        for p in range(lo[c], hi[c]):
            v = data[p]
            if v == 0:
                continue
            u = idx[p]
            if acc[u] == 0:
                units[k] = u
                k += 1
            acc[u] += v
    units = units[:k]
    scores = np.empty(k, np.float32)
    for i in range(k):
        scores[i] = acc[units[i]]
        acc[units[i]] = 0
    return units, scores


@njit(cache=True, nogil=True)
def _worse(s1, u1, s2, u2):  # pragma: no cover - compiled
    """``(s1, u1)`` orders after ``(s2, u2)`` (score descending, unit ascending)."""
    return s1 < s2 or (s1 == s2 and u1 > u2)


@njit(cache=True, nogil=True)
def _best_first(s, u):  # pragma: no cover - compiled
    """The order of ``(s, u)`` by score descending, unit ascending (two stable sorts)."""
    by_unit = np.argsort(u, kind="mergesort")
    return by_unit[np.argsort(-s[by_unit], kind="mergesort")]


@njit(cache=True, nogil=True)
def top_units(units, scores, M):  # pragma: no cover - compiled
    """The ``min(M, len(units))`` best ``units`` by ``(score descending, unit ascending)``, best first:
    a heap whose root is the worst kept."""
    m = min(M, len(units))
    hs = np.empty(m, np.float32)
    hu = np.empty(m, np.int64)
    n = 0
    for i in range(len(units)):
        s, u = scores[i], units[i]
        if n < m:
            j = n
            n += 1
            while j > 0:  # sift up while the new one is worse than its parent
                p = (j - 1) // 2
                if _worse(s, u, hs[p], hu[p]):
                    hs[j], hu[j] = hs[p], hu[p]
                    j = p
                else:
                    break
            hs[j], hu[j] = s, u
        elif m > 0 and _worse(hs[0], hu[0], s, u):
            j = 0
            while True:  # sift down from the root
                a = 2 * j + 1
                if a >= m:
                    break
                if a + 1 < m and _worse(hs[a + 1], hu[a + 1], hs[a], hu[a]):
                    a += 1
                if _worse(hs[a], hu[a], s, u):
                    hs[j], hu[j] = hs[a], hu[a]
                    j = a
                else:
                    break
            hs[j], hu[j] = s, u
    return hu[_best_first(hs, hu)]


@njit(cache=True, nogil=True)
def counted_ranks(units, scores, wu, ws):  # pragma: no cover - compiled
    """``[len(wu)]`` float64 ranks of the units ``wu`` scoring ``ws`` (each of positive score and
    among ``units``, whose scores are positive) among ``(units, scores)``: ``1 +`` the units
    ordering before each.

    Positive float32 scores order as their bit patterns, so a bucket is a bit pattern's top bits
    (at most 2^16 buckets between the smallest and largest key): one pass counts every touched
    unit into its bucket and keeps those falling into a bucket that holds a key; only they are
    compared with the keys of their bucket (a binary search in its run of keys)."""
    m = len(wu)
    out = np.ones(m)
    if m == 0:
        return out
    order = _best_first(ws, wu)
    ks, ku = ws[order], wu[order]  # the keys, best first
    kb = ks.view(np.int32)
    shift = 0
    while (kb[0] >> shift) - (kb[m - 1] >> shift) >= 1 << 16:
        shift += 1
    b0 = kb[m - 1] >> shift
    nb = (kb[0] >> shift) - b0 + 1
    first = np.full(nb, -1, np.int64)  # each bucket's run of keys [first, last)
    last = np.zeros(nb, np.int64)
    for j in range(m):
        b = (kb[j] >> shift) - b0
        if first[b] < 0:
            first[b] = j
        last[b] = j + 1
    count, diff = _bucket_counts(units, scores, ks, ku, shift, b0, first, last)
    above = count[nb]
    b = nb - 1
    j = 0
    while j < m:  # keys best first, bucket by bucket downwards
        bj = (kb[j] >> shift) - b0
        while b > bj:
            above += count[b]
            b -= 1
        run = 0
        e = last[bj]
        for t in range(j, e):
            run += diff[t]
            out[order[t]] = 1.0 + above + run
        j = e
    return out


@njit(cache=True, nogil=True)
def _bucket_counts(units, scores, ks, ku, shift, b0, first, last):  # pragma: no cover - compiled
    """``(count, diff)`` of :func:`counted_ranks`: touched units per bucket (``count[nb]``: above
    every key) and, per key ``j``, the units of its bucket ordering before keys ``j..`` of it."""
    nb = len(first)
    m = len(ks)
    count = np.zeros(nb + 1, np.int64)  # touched units per bucket; count[nb]: above every key
    diff = np.zeros(m + 1, np.int64)  # diff[j]: units of key j's bucket ordering before keys j..
    sb = scores.view(np.int32)
    for i in range(len(units)):
        b = (sb[i] >> shift) - b0
        if b < 0:
            continue
        if b >= nb:
            count[nb] += 1
            continue
        count[b] += 1
        if first[b] < 0:
            continue
        s, u = scores[i], units[i]
        lo, hi = first[b], last[b]  # the first key of the bucket this unit orders before
        if s > ks[lo]:  # before every key of the bucket
            diff[lo] += 1
            continue
        if s < ks[hi - 1]:  # after every one
            continue
        if ks[lo] == ks[hi - 1]:  # the bucket's keys tie with it: by unit
            while lo < hi:
                mid = (lo + hi) // 2
                if ku[mid] > u:
                    hi = mid
                else:
                    lo = mid + 1
            if lo < last[b]:
                diff[lo] += 1
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if _worse(ks[mid], ku[mid], s, u):
                hi = mid
            else:
                lo = mid + 1
        if lo < last[b]:
            diff[lo] += 1
    return count, diff


KEY_UNITS = 1 << 31
"""Most touched units of a rank table (a bank of at most this many units): a key ``(0x7F800000 -
bits) << 32 | position`` holds the position in its low 32 bits, and orders as ``(score
descending, position ascending)`` for positive float32 scores, whose bit patterns order as they do."""


MAX_RUNS = 64
"""Ascending runs of units :func:`rank_table` keeps as they come (the touched units of
:func:`accumulate` are one run per query column); past this many the units are sorted first."""


@njit(cache=True, nogil=True)
def rank_table(units, scores, scratch):  # pragma: no cover - compiled
    """``(keys, units, runs)``: the touched units ordered by ``(score descending, position in
    units)``, as keys ``(0x7F800000 - bits) << 32 | position`` sorted by a least-significant-digit
    radix sort of the score part (11 bits a pass, stable, so the units of one score keep their
    order), with the units (sorted by unit first when they fall into more than :data:`MAX_RUNS`
    ascending runs) and ``runs``, the positions where each ascending run starts (and the end):
    within one score a run's units are ascending (:func:`table_ranks`). ``scratch``: int64, at
    least as long (:func:`radix_scratch`). Scores must be positive; positions below 2^31."""
    T = len(units)
    R = 1
    for i in range(1, T):
        R += units[i] < units[i - 1]
    if R > MAX_RUNS:
        order = np.argsort(units, kind="mergesort")
        units, scores, R = units[order], scores[order], 1
    runs = np.empty(R + 1, np.int64)
    runs[0], runs[R], r = 0, T, 1
    for i in range(1, T):
        if units[i] < units[i - 1]:
            runs[r] = i
            r += 1
    keys = np.empty(T, np.int64)
    if T == 0:
        return keys, units, runs
    sb = scores.view(np.int32)
    lo, hi = sb[0], sb[0]
    for i in range(T):
        keys[i] = ((np.int64(0x7F800000) - sb[i]) << 32) | i
        lo = min(lo, sb[i])
        hi = max(hi, sb[i])
    kmin = np.int64(0x7F800000) - hi  # the score part of the best key
    ns = 1
    while (hi - lo) >> (11 * ns) > 0:
        ns += 1
    count = np.zeros((ns, 2049), np.int64)
    for i in range(T):  # every pass's digit counts in one read
        v = (keys[i] >> 32) - kmin
        for p in range(ns):
            count[p, ((v >> (11 * p)) & 2047) + 1] += 1
    src, dst = keys, scratch[:T]
    for p in range(ns):
        c = count[p]
        for d in range(2048):
            c[d + 1] += c[d]
        _score_pass(src, dst, c, 11 * p, kmin)
        src, dst = dst, src
    if ns % 2 == 1:  # the last pass wrote the scratch
        keys[:] = src
    return keys, units, runs


@njit(cache=True, nogil=True)
def _score_pass(src, dst, c, shift, kmin):  # pragma: no cover - compiled
    """A stable pass of :func:`rank_table` by the digit at ``shift`` of the score part above ``kmin``."""
    for i in range(len(src)):
        d = (((src[i] >> 32) - kmin) >> shift) & 2047
        dst[c[d]] = src[i]
        c[d] += 1


@njit(cache=True, nogil=True)
def table_ranks(keys, units, runs, wu, ws):  # pragma: no cover - compiled
    """``[len(wu)]`` float64 ranks of units ``wu`` scoring ``ws`` (positive) among the units of a
    :func:`rank_table` (a unit need not be one of them): ``1 +`` the units scoring more (the keys
    before its score's) ``+`` those of its score of a lower unit, counted run by run (each run's
    share of the score's keys is a range of positions, ascending by unit: two binary searches)."""
    out = np.empty(len(wu))
    wb = ws.view(np.int32)
    low = np.int64(0xFFFFFFFF)
    for j in range(len(wu)):
        sp = np.int64(0x7F800000) - wb[j]
        a = np.searchsorted(keys, sp << 32)
        e = np.searchsorted(keys, (sp + 1) << 32)
        n = a
        for r in range(len(runs) - 1):
            if a == e:
                break
            start = a + np.searchsorted(keys[a:e], (sp << 32) | runs[r])
            lo, hi = start, a + np.searchsorted(keys[a:e], (sp << 32) | runs[r + 1])
            while lo < hi:  # the run's first unit at or past wu[j]
                mid = (lo + hi) // 2
                if units[keys[mid] & low] < wu[j]:
                    lo = mid + 1
                else:
                    hi = mid
            n += lo - start
        out[j] = 1.0 + n
    return out
