"""The rank sorts of the compiled ``learned`` front (``steps/learned_front.py``): the orders of
``candidates.order_desc`` (cosines) and ``candidates.order_desc_bits`` (BM25's float32 bits), the
same permutations with less work.

Both are bucket sorts followed by one insertion sort over the whole array. A key's bucket never
rises as the key grows (IEEE subtraction, multiplication and division round monotonically; the
bits' buckets are taken from the integer key difference the same way), so every key of a bucket
is at least every key of the buckets after it and equal keys share a bucket; entering the
positions in ascending order keeps the ties in index order. A stable insertion sort of the
scattered keys then only moves keys inside their bucket and gives the unique order "key
descending, ties to the lower index" that the references give. The keys travel with the positions
(``sv`` / ``sk``), so the insertion sort reads them contiguously. When a bucket holds more than
``candidates._SMALL_BUCKET`` keys (values bunched by an outlier), the reference runs instead, so
the cost stays bounded as it is there.

``tests/select/test_learned_front.py`` compares the orders with the references' on random keys,
odd sizes, ties, bunched values and the empty row.
"""
from __future__ import annotations

import numpy as np

from .._jit import njit
from .candidates import _SMALL_BUCKET, order_desc, order_desc_bits

BUCKETS = 2
"""Buckets per cosine in :func:`order_desc_fast` (fewer keys share one: less insertion work)."""


@njit(cache=True, nogil=True, inline="always")
def _insertion(keys, order, m):  # pragma: no cover - compiled
    """Stable descending insertion sort of ``keys[:m]``, ``order[:m]`` moved with them."""
    for i in range(1, m):
        x = keys[i]
        if keys[i - 1] < x:
            v = order[i]
            k = i
            while k > 0 and keys[k - 1] < x:
                keys[k] = keys[k - 1]
                order[k] = order[k - 1]
                k -= 1
            keys[k] = x
            order[k] = v


@njit(cache=True, nogil=True)
def order_desc_fast(vals, m, order, bk, cnt, sv):  # pragma: no cover - compiled
    """``candidates.order_desc``'s ``order[:m]`` (positions of ``vals`` by value descending, ties
    to the lower position; finite values), :data:`BUCKETS` buckets a value. Scratch: ``bk [>= m]``
    int64, ``cnt [>= BUCKETS * m + 1]`` int64, ``sv [>= m]`` float64."""
    if m <= 0:
        return
    hi = vals[0]
    lo = vals[0]
    for j in range(1, m):
        x = vals[j]
        hi = max(hi, x)
        lo = min(lo, x)
    span = hi - lo
    if not (span > 0.0 and span < np.inf):  # all equal, or too far apart to bucket
        order_desc(vals, m, order, bk, cnt)
        return
    top = BUCKETS * m - 1
    scale = top / span
    for b in range(top + 2):
        cnt[b] = 0
    for j in range(m):
        b = min(top, int((hi - vals[j]) * scale))
        bk[j] = b
        cnt[b + 1] += 1
    big = 0
    for b in range(top + 1):
        big = max(big, cnt[b + 1])
        cnt[b + 1] += cnt[b]
    if big > _SMALL_BUCKET:
        order_desc(vals, m, order, bk, cnt)
        return
    for j in range(m):  # ascending j: stable inside a bucket
        b = bk[j]
        p = cnt[b]
        order[p] = j
        sv[p] = vals[j]
        cnt[b] = p + 1
    _insertion(sv, order, m)


@njit(cache=True, nogil=True)
def order_desc_keys(keys, m, order, bk, cnt, sk, bits, pos):  # pragma: no cover - compiled
    """``candidates.order_desc_bits(bits, pos, m, ...)``'s ``order[:m]`` (indices ``i`` by
    ``bits[pos[i]]`` descending, ties to the lower ``i``; non-negative int32 keys), from those keys
    copied to ``keys[:m]`` (int64). Buckets ``(max - key) * (m - 1) / (max - min)`` in float64
    (exact integers below 2^53, rounded monotonically). Scratch: ``bk [>= m]``, ``cnt [>= max(m +
    1, 4 * 257)]``, ``sk [>= m]`` int64."""
    if m <= 0:
        return
    hib = keys[0]
    lob = hib
    for i in range(1, m):
        hib = max(hib, keys[i])
        lob = min(lob, keys[i])
    rng = hib - lob
    if rng == 0:
        for i in range(m):
            order[i] = i
        return
    top = m - 1
    scale = np.float64(top) / np.float64(rng)
    for b in range(m + 1):
        cnt[b] = 0
    for i in range(m):
        b = min(top, int(np.float64(hib - keys[i]) * scale))
        bk[i] = b
        cnt[b + 1] += 1
    big = 0
    for b in range(m):
        big = max(big, cnt[b + 1])
        cnt[b + 1] += cnt[b]
    if big > _SMALL_BUCKET:
        order_desc_bits(bits, pos, m, order, bk, cnt)
        return
    for i in range(m):
        b = bk[i]
        p = cnt[b]
        order[p] = i
        sk[p] = keys[i]
        cnt[b] = p + 1
    _insertion(sk, order, m)
