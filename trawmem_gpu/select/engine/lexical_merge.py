"""Exact BM25 of a large bank's query with its touched units ascending (``lexical_shortlist.MERGED``):
the same float32 scores, top and ranks as ``lexical_dense``'s accumulation, heap and radix-sorted
rank table, read in fewer passes over memory.

The math is ``lexical_dense``'s (its plain reference: ``lexical_shortlist.bm25_sparse`` then
``np.lexsort``): a unit's score is the float32 sum of its postings in the query's columns, added
in column (token) order starting from 0 (a posting of 0 touches nothing); its rank is ``1 +
#{v : s_v > s_u or (s_v == s_u and v < u)}`` over the units of positive score. Here:

* :func:`blocked_scores`: the bank's units are taken in blocks of :data:`BLOCK` (a float32
  accumulator of 256 KB, which stays in a core's L2); each column's postings are ascending by unit
  (the store's order), so each block adds the part of every column that falls in it, column after
  column (the same float32 sums), marking each touched unit in a bitmap, and reads its touched
  units out of the bitmap ascending, clearing both. ``lexical_dense.accumulate`` swept an
  accumulator of the bank's length (4 MB at 10^6) once per column, mostly from L3;
* :func:`score_table`: ``lexical_dense.rank_table``'s ``(keys, units, runs)``, the keys sorted by
  one counting pass over the distinct scores when there are at most :data:`FEW_SCORES` of them
  (BM25 of a few terms ties a lot: the synthetic 10^6 bank's queries hold 24-665 distinct scores
  over 42,000-221,000 touched units), found by a small open-addressing hash of the score's bits
  in the pass that counts them; past that many (real text's longer queries), ``rank_table``'s radix
  sort. Both are stable sorts by score descending of the positions: the same keys;
* :func:`table_top`: the top ``M`` units are the table's first ``M`` keys (positions ascend with the
  units here, so the keys order score descending, unit ascending), with no heap;
* :func:`scores_in`: a unit's score by a search in the ascending units (the working set's BM25
  without a binary search in each column, ``lexical_shortlist.scores_at``), galloping from the
  last unit's place (the working set is ascending: 1,800 units among 42,000-221,000 at 10^6).
"""
from __future__ import annotations

import threading

import numpy as np

from .._jit import njit
from . import lexical_dense

FEW_SCORES = 2048
"""Most distinct scores :func:`score_table` sorts by counting (its hash holds twice as many slots);
past this many it takes ``lexical_dense.rank_table``'s radix sort."""
_SLOTS = 4096


BLOCK = 1 << 16
"""Units per block of :func:`dense_scores` (its float32 accumulator: 256 KB, within a core's L2;
2^12 - 2^18 measured 0.54-0.67 ms a query, no trend: ``bm25_probe``)."""
_DEBRUIJN = np.int64(0x03F79D71B4CB0A89)
_DB_TABLE = np.zeros(64, np.int64)
"""A power of two times :data:`_DEBRUIJN`'s top 6 bits (mod 2^64) -> its exponent."""
for _i in range(64):
    _DB_TABLE[((((1 << _i) * 0x03F79D71B4CB0A89) % (1 << 64)) >> 58) & 63] = _i
_SCRATCH = threading.local()


def dense_scores(idx: np.ndarray, data: np.ndarray, lo: np.ndarray, hi: np.ndarray, n: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(units ascending, float32 scores)`` of every unit the columns ``[lo[c], hi[c])`` of the store
    touch (bank-local units below ``n``): :func:`blocked_scores` with this thread's scratch."""
    got = getattr(_SCRATCH, "acc", None)
    if got is None:
        got = _SCRATCH.acc = (np.zeros(BLOCK, np.float32), np.zeros(BLOCK // 64, np.int64))
    return blocked_scores(idx, data, np.asarray(lo, np.int64), np.asarray(hi, np.int64), int(n), BLOCK, *got)


def scratch() -> tuple[np.ndarray, np.ndarray]:
    """This thread's ``(accumulator, bits)`` of :func:`dense_scores` (zero between calls), if any."""
    return getattr(_SCRATCH, "acc", (np.zeros(0, np.float32), np.zeros(0, np.int64)))


@njit(cache=True, nogil=True)
def blocked_scores(idx, data, lo, hi, n, block, acc, bits):  # pragma: no cover - compiled
    """``(units ascending, float32 scores)`` of every unit the columns ``[lo[c], hi[c])`` touch (each
    column ascending by unit, bank-local units below ``n``), by blocks of ``block`` units (a
    multiple of 64): each block's postings of every column added into ``acc`` (zero, at least
    ``block`` long), column after column (the same float32 sums), with a bit set per touched unit
    in ``bits`` (zero int64, ``block / 64`` long), then the block's touched units read out ascending
    from the bits (both left zero)."""
    units, scores, cur = _outputs(lo, hi)
    k = 0
    for b0 in range(0, n, block):
        _add_block(idx, data, cur, hi, b0, min(b0 + block, n), acc, bits)
        for w in range((min(b0 + block, n) - b0 + 63) >> 6):
            x = bits[w]
            if x == 0:
                continue
            bits[w] = 0
            while x != 0:
                t = x & -x
                u = (w << 6) + _DB_TABLE[((t * _DEBRUIJN) >> 58) & 63]
                units[k] = b0 + u
                scores[k] = acc[u]
                acc[u] = 0
                k += 1
                x ^= t
    return units[:k], scores[:k]


@njit(cache=True, nogil=True)
def _outputs(lo, hi):  # pragma: no cover - compiled
    """``(units int64, scores float32, cursors)``: room for every posting of the columns, and each
    column's next posting (its first)."""
    total = 0
    for c in range(len(lo)):
        total += hi[c] - lo[c]
    return np.empty(total, np.int64), np.empty(total, np.float32), lo.copy()


@njit(cache=True, nogil=True)
def _add_block(idx, data, cur, hi, b0, b1, acc, bits):  # pragma: no cover - compiled
    """Add every column's postings of units ``[b0, b1)`` (from its cursor ``cur[c]``, moved past
    them) into ``acc[u - b0]``, column after column, setting bit ``u - b0`` of ``bits`` for each
    posting that is not 0."""
    for c in range(len(cur)):
        p, e = cur[c], hi[c]
        while p < e:
            u = idx[p] - b0
            if u >= b1 - b0:
                break
            v = data[p]
            if v != 0:
                acc[u] += v
                bits[u >> 6] |= np.int64(1) << (u & 63)
            p += 1
        cur[c] = p


@njit(cache=True, nogil=True)
def score_table(units, scores, scratch):  # pragma: no cover - compiled
    """``lexical_dense.rank_table(units, scores, scratch)`` (the same ``keys, units, runs``), sorted
    by counting the distinct scores when there are at most :data:`FEW_SCORES`. Scores must be
    positive; positions below 2^31."""
    T = len(units)
    R = 1
    for i in range(1, T):
        R += units[i] < units[i - 1]
    if T == 0 or R > 1:
        return lexical_dense.rank_table(units, scores, scratch)
    keys = np.empty(T, np.int64)
    if not _counted_keys(scores, keys):
        return lexical_dense.rank_table(units, scores, scratch)
    runs = np.empty(2, np.int64)
    runs[0], runs[1] = 0, T
    return keys, units, runs


@njit(cache=True, nogil=True)
def _counted_keys(scores, keys):  # pragma: no cover - compiled
    """Fill ``keys`` with ``(0x7F800000 - bits) << 32 | position`` sorted (score descending,
    position ascending) by one counting pass and one placing pass; False (``keys`` unfilled) when
    the scores hold more than :data:`FEW_SCORES` distinct values."""
    sb = scores.view(np.int32)
    slot = np.empty(len(scores), np.int16)
    ok, hk, hc = _count(sb, slot)
    if ok:
        _place(sb, slot, hk, hc, keys)
    return ok


@njit(cache=True, nogil=True)
def _count(sb, slot):  # pragma: no cover - compiled
    """``(ok, bits per slot, count per slot)``: the distinct score bits ``sb`` hold, counted in
    :func:`_hash`'s slots, ``slot[i]`` the slot of ``sb[i]``; ``ok`` False (stopped) past
    :data:`FEW_SCORES` distinct values."""
    mask = _SLOTS - 1
    hk, hc = _hash()
    D = 0
    for i in range(len(sb)):
        b = sb[i]
        h = ((np.int64(b) * np.int64(2654435761)) >> 20) & mask
        while hk[h] != b:
            if hk[h] < 0:
                D += 1
                if D > FEW_SCORES:
                    return False, hk, hc
                hk[h] = b
                break
            h = (h + 1) & mask
        hc[h] += 1
        slot[i] = h
    return True, hk, hc


def score_ranks(units: np.ndarray, scores: np.ndarray, M: int):
    """``(rank, top)`` of touched ``units`` (ascending) scoring ``scores`` (positive float32), or
    None past :data:`FEW_SCORES` distinct scores: each unit's rank ``1 + #{v : s_v > s_u or (s_v ==
    s_u and v < u)}`` (float64, aligned with ``units``) and the positions of the ``min(M, len)``
    best, best first: :func:`score_table`'s ranks (``lexical_dense.table_ranks``) and
    :func:`table_top` without the table (a counting pass and one pass in unit order, no keys
    written at random; a unit's rank is then one binary search in ``units`` away)."""
    rank = np.empty(len(units))
    top = np.empty(min(M, len(units)), np.int64)
    return (rank, top) if _score_ranks(scores.view(np.int32), rank, top) else None


@njit(cache=True, nogil=True)
def _score_ranks(sb, rank, top):  # pragma: no cover - compiled
    """:func:`score_ranks` into ``rank`` / ``top``; False past :data:`FEW_SCORES` distinct scores."""
    slot = np.empty(len(sb), np.int16)
    ok, hk, hc = _count(sb, slot)
    if not ok:
        return False
    _starts(hk, hc)
    M = len(top)
    for i in range(len(sb)):  # positions ascend with units: each score's units come in rank order
        h = slot[i]
        r = hc[h]
        hc[h] = r + 1
        rank[i] = 1.0 + r
        if r < M:
            top[r] = i
    return True


@njit(cache=True, nogil=True)
def _starts(hk, hc):  # pragma: no cover - compiled
    """Each used slot's count ``hc`` turned into the number of scores above its own (slots ordered
    by score descending: positive float32 scores order like their bits)."""
    used = np.flatnonzero(hk >= 0)
    order = used[np.argsort(-hk[used].astype(np.int64))]  # score descending
    at = 0
    for h in order:
        c = hc[h]
        hc[h] = at
        at += c


@njit(cache=True, nogil=True)
def _hash():  # pragma: no cover - compiled
    """An empty open-addressing hash of score bits: ``(bits per slot, -1 empty; count per slot)``
    (the probe is written out in :func:`_counted_keys`: a compiled call per touched unit cost 4x)."""
    return np.full(_SLOTS, -1, np.int32), np.zeros(_SLOTS, np.int64)


@njit(cache=True, nogil=True)
def _place(sb, slot, hk, hc, keys):  # pragma: no cover - compiled
    """The counting sort's placing pass: slots ordered by score descending, their counts ``hc``
    turned into start offsets, each position's key written at its slot's next offset (stable)."""
    _starts(hk, hc)
    for i in range(len(slot)):
        h = slot[i]
        keys[hc[h]] = ((np.int64(0x7F800000) - sb[i]) << 32) | i
        hc[h] += 1


@njit(cache=True, nogil=True)
def table_top(keys, units, M):  # pragma: no cover - compiled
    """The ``min(M, len(keys))`` best units of a table over ascending ``units``, best first."""
    m = min(M, len(keys))
    out = np.empty(m, np.int64)
    low = np.int64(0xFFFFFFFF)
    for j in range(m):
        out[j] = units[keys[j] & low]
    return out


@njit(cache=True, nogil=True)
def scores_in(units, scores, wu):  # pragma: no cover - compiled
    """``[len(wu)]`` float32 scores of units ``wu`` among ``(units ascending, scores)``, 0 for a unit
    not among them."""
    out = np.zeros(len(wu), np.float32)
    take_in(units, scores, wu, out)
    return out


@njit(cache=True, nogil=True)
def take_in(units, values, wu, out):  # pragma: no cover - compiled
    """``out[j] = values[p]`` where ``units[p] == wu[j]`` (``units`` ascending; ``out[j]`` left as
    it is for a unit not among them), each found by a galloping search from the last one's place."""
    n = len(units)
    a = 0  # every unit before a is below the unit looked for (wu ascending: the walk only moves on)
    for j in range(len(wu)):
        v = wu[j]
        if a > 0 and units[a - 1] >= v:  # not after the last one: from the start
            a = 0
        b, step = a, 1
        while b < n and units[b] < v:  # galloping: the ascending working set's next unit is mostly near
            a = b + 1
            b = a + step - 1
            step *= 2
        b = min(b, n)
        p = a + np.searchsorted(units[a:b], v)
        if p < n and units[p] == v:
            out[j] = values[p]
        a = p
