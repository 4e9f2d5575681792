"""Exact BM25 of a large bank's query, compiled: every posting of the query's columns added into a
dense per-thread accumulator, the ``M`` best units kept in a heap, and the BM25 rank of any unit
counted over every unit of positive score (``lexical_shortlist.lexical`` for queries whose columns
hold more than ``EXACT_POSTINGS`` postings).

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
  units laid out by buckets of their float32 bits (a counting sort: one pass counts, one places),
  so any unit's rank is the units of higher buckets plus its place in its own bucket (a binary
  search in the bucket, sorted by ``(score descending, unit ascending)`` when first read). The
  rounds of a query read the same table: each working-set unit costs ``O(log b)`` for a bucket
  of ``b`` units, never another pass over the touched units;
* :func:`counted_ranks`: the ranks of a few units by one pass over the touched units (each one
  counted into a bucket of its float32 bits, and one falling into a bucket that holds requested
  keys compared with them), the reading before the table (``lexical_shortlist.RANK_TABLE`` off).

Cost: ``O(P)`` for ``P`` postings of the query's columns, plus ``O(T)`` once per query for the
rank table of its ``T`` touched units and ``O(m log b)`` per ``m`` ranked ones, with no sort of
every touched unit (a bucket is sorted only when a ranked unit falls into it). At 10^6 units of the synthetic
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
"""Units below this fit a rank key's low 32 bits: a key ``(0x7F800000 - bits) << 32 | unit``
orders as ``(score descending, unit ascending)`` for positive float32 scores, whose bit patterns
order as they do."""


@njit(cache=True, nogil=True)
def _by_unit(units, bits):  # pragma: no cover - compiled
    """``(units, bits)`` reordered by unit ascending: a least-significant-digit radix sort, 11
    bits a pass (two passes below 2^22 units)."""
    T = len(units)
    top = 0
    for i in range(T):
        top = max(top, units[i])
    passes = 1
    while top >> (11 * passes) > 0:
        passes += 1
    count = np.zeros((passes, 2049), np.int64)
    for i in range(T):  # every pass's digit counts in one read
        for k in range(passes):
            count[k, ((units[i] >> (11 * k)) & 2047) + 1] += 1
    ua, ba = np.empty(T, np.int64), np.empty(T, np.int32)  # the first pass reads the input, then
    ub, bb = np.empty(T if passes > 1 else 0, np.int64), np.empty(T if passes > 1 else 0, np.int32)
    for k in range(passes):  # ... each pass one buffer pair into the other
        c = count[k]
        for d in range(2048):
            c[d + 1] += c[d]
        shift = 11 * k
        su, sb, du, db = units, bits, ua, ba
        if k % 2 == 1:
            su, sb, du, db = ua, ba, ub, bb
        elif k > 0:
            su, sb = ub, bb
        for i in range(T):
            d = (su[i] >> shift) & 2047
            du[c[d]], db[c[d]] = su[i], sb[i]
            c[d] += 1
    if passes % 2 == 0:
        return ub, bb
    return ua, ba


@njit(cache=True, nogil=True)
def rank_table(units, scores):  # pragma: no cover - compiled
    """``(keys, start, sorted, shift, b0)``: the touched units' rank keys (:data:`KEY_UNITS`) laid
    out by bucket, a bucket being a score's bit pattern ``>> shift`` (about one unit per bucket, at
    most 2^16 buckets), bucket ``b`` (``b0`` subtracted: higher buckets score more) holding
    ``keys[start[b]:start[b + 1]]``. The units are placed in unit order (:func:`_by_unit`, then a
    stable counting sort by bucket), so a bucket of one score (BM25's ties) is sorted by key as
    placed; ``sorted[b]`` marks a bucket checked (and sorted if it held several scores) by a
    :func:`table_ranks` call. Scores must be positive."""
    T = len(units)
    if T == 0:
        return np.zeros(0, np.int64), np.zeros(2, np.int64), np.zeros(1, np.bool_), 0, 0
    u, sb = _by_unit(units, scores.view(np.int32))
    lo, hi = sb[0], sb[0]
    for i in range(T):
        lo = min(lo, sb[i])
        hi = max(hi, sb[i])
    want = 16
    while want < T and want < (1 << 16):
        want *= 2
    shift = 0
    while (hi >> shift) - (lo >> shift) >= want:
        shift += 1
    b0 = lo >> shift
    nb = (hi >> shift) - b0 + 1
    start = np.zeros(nb + 1, np.int64)
    for i in range(T):  # counts, then each bucket's first slot
        start[(sb[i] >> shift) - b0 + 1] += 1
    for b in range(nb):
        start[b + 1] += start[b]
    fill = start[:nb].copy()
    keys = np.empty(T, np.int64)
    for i in range(T):
        b = (sb[i] >> shift) - b0
        keys[fill[b]] = ((np.int64(0x7F800000) - sb[i]) << 32) | u[i]
        fill[b] += 1
    return keys, start, np.zeros(nb, np.bool_), shift, b0


@njit(cache=True, nogil=True)
def table_ranks(keys, start, done, shift, b0, wu, ws):  # pragma: no cover - compiled
    """``[len(wu)]`` float64 ranks of units ``wu`` scoring ``ws`` (positive) among the units of a
    :func:`rank_table` (a unit need not be one of them): ``1 +`` the table's units of higher
    buckets ``+`` those of its own bucket ordering before it (a binary search in the bucket, which
    is checked on its first read and sorted by key if it is not: ``done`` marks it)."""
    nb = len(start) - 1
    total = start[nb]
    out = np.empty(len(wu))
    wb = ws.view(np.int32)
    for j in range(len(wu)):
        b = (wb[j] >> shift) - b0
        if b >= nb:  # above every bucket: only the units scoring more come first
            out[j] = 1.0
            continue
        if b < 0:
            out[j] = 1.0 + total
            continue
        a, e = start[b], start[b + 1]
        if not done[b]:
            for i in range(a + 1, e):
                if keys[i] < keys[i - 1]:
                    keys[a:e] = np.sort(keys[a:e])
                    break
            done[b] = True
        key = ((np.int64(0x7F800000) - wb[j]) << 32) | wu[j]
        out[j] = 1.0 + (total - e) + np.searchsorted(keys[a:e], key)
    return out
