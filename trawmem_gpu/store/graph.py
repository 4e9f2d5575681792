"""The thread graph: adjacent-thread edges and semantic k-nearest-head edges.

The semantic edges derive from one table per bank, each thread's ``k`` nearest other heads
(:func:`knn_table`), by one rule (:func:`edges_from_knn`). An append or a forget changes a few
heads; :func:`update_knn` then recomputes only the rows that can change (the new heads' rows, the
rows that lose a neighbour, and the rows a new head enters), so the cost of a write grows with
``J`` (one product of the new heads with every head), not ``J^2``, and the result equals
:func:`knn_table` over the new heads.

**The similarity rule.** The cosine of two heads is their float32 vectors' inner product summed
in float64 and rounded to float32 (:func:`similarities`). Every path (a full build, an append, a
forget) computes it so, and neighbours are ordered by descending similarity with ties to the
lower thread id, so an incremental table is the full table: the only difference a float64 sum's
order can make is below 2^-40 of the value, which rounding to float32 removes except on a
rounding boundary.
"""
from __future__ import annotations

import numpy as np

ADJACENT, SEMANTIC, LAYER = 0, 1, 2
"""Edge kinds: adjacent threads, semantic nearest heads, and (in a unit view only, ``store.view``) a
layer edge between a fact or profile thread and the threads of the units it restates."""

_BLOCK = 1 << 22
"""Entries of one block of the similarity matrix (float64: 32 MB)."""


def similarities(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[len(a), len(b)]`` float32 cosines of unit vectors by the module's rule (float64 sums)."""
    return (np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64).T).astype(np.float32)


def _top_k(sims: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``sims`` ``[R, J]`` (its own thread ``rows[r]`` excluded), the ``k`` best columns
    by descending similarity, ties to the lower id; ``(sims [R, k], ids [R, k])``, -1 / -inf padded."""
    R, J = sims.shape
    out_s = np.full((R, k), -np.inf, dtype=np.float32)
    out_i = np.full((R, k), -1, dtype=np.int64)
    if R == 0 or k == 0 or J == 0:
        return out_s, out_i
    s = sims.astype(np.float32, copy=True)
    inside = (rows >= 0) & (rows < J)
    s[np.nonzero(inside)[0], rows[inside]] = -np.inf  # never its own neighbour
    kk = min(k, J)
    # the k-th best value per row; everything at or above it is a candidate (ties included)
    kth = -np.partition(-s, kk - 1, axis=1)[:, kk - 1]
    r_idx, c_idx = np.nonzero((s >= kth[:, None]) & np.isfinite(s))
    order = np.lexsort((c_idx, -s[r_idx, c_idx], r_idx))
    r_idx, c_idx = r_idx[order], c_idx[order]
    starts = np.searchsorted(r_idx, np.arange(R))
    rank = np.arange(len(r_idx)) - starts[r_idx]
    take = rank < k
    out_s[r_idx[take], rank[take]] = s[r_idx[take], c_idx[take]]
    out_i[r_idx[take], rank[take]] = c_idx[take]
    return out_s, out_i


def _rows_knn(head_vecs: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The full-table rows ``rows`` (thread ids), computed against every head, in blocks."""
    J = len(head_vecs)
    sims = np.full((len(rows), k), -np.inf, dtype=np.float32)
    ids = np.full((len(rows), k), -1, dtype=np.int64)
    step = max(1, _BLOCK // max(J, 1))
    # cast once: ``similarities`` would cast every head per block (J / step casts of [J, d]);
    # float32 -> float64 is exact, so the sums are the same
    h64 = np.asarray(head_vecs, dtype=np.float64)
    for a in range(0, len(rows), step):
        r = rows[a:a + step]
        sims[a:a + step], ids[a:a + step] = _top_k(similarities(h64[r], h64), r, k)
    return sims, ids


def knn_table(head_vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``[J, d]`` unit vectors -> ``(sims [J, k] float32, ids [J, k] int64)``: each head's ``k``
    nearest *other* heads by the module's similarity rule, ties to the lower id; missing
    neighbours (``J - 1 < k``) are id -1 with similarity -inf."""
    J = len(head_vecs)
    return _rows_knn(np.asarray(head_vecs, dtype=np.float32), np.arange(J, dtype=np.int64), k)


def knn_heads(head_vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`knn_table` (the name of earlier releases)."""
    return knn_table(head_vecs, k)


def update_knn(sims: np.ndarray, ids: np.ndarray, keep: np.ndarray, head_vecs: np.ndarray,
               fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The :func:`knn_table` of ``head_vecs`` from the table ``(sims, ids)`` of the old heads.

    :param keep: ``[J_old]`` each old thread's id among the new ones, or -1 where it is gone
        (kept threads keep their order)
    :param head_vecs: ``[J_new, d]`` the new heads
    :param fresh: new thread ids whose heads are new (every new thread no old one maps to)
    :returns: ``(sims, ids, changed)``: the new table and the new ids of the rows that differ
        from the old table's row of the same thread (fresh rows included)

    A kept row changes only when it loses a neighbour (recomputed whole, against every head) or
    when a fresh head enters its top ``k`` (merged); the fresh rows are computed whole. Cost:
    ``O((|fresh| + |recomputed|) J d)``, against ``O(J^2 d)`` for the full table.
    """
    J, k = len(head_vecs), ids.shape[1]
    head_vecs = np.asarray(head_vecs, dtype=np.float32)
    fresh = np.asarray(fresh, dtype=np.int64)
    keep = np.asarray(keep, dtype=np.int64)
    new_s = np.full((J, k), -np.inf, dtype=np.float32)
    new_i = np.full((J, k), -1, dtype=np.int64)
    old_rows = np.nonzero(keep >= 0)[0]
    rows = keep[old_rows]
    mapped = np.where(ids[old_rows] >= 0, keep[np.maximum(ids[old_rows], 0)], -1)
    lost = ((ids[old_rows] >= 0) & (mapped < 0)).any(axis=1)
    new_s[rows], new_i[rows] = sims[old_rows], mapped
    changed = np.zeros(J, dtype=bool)
    changed[fresh] = True
    redo = rows[lost]
    changed[redo] = True
    if k and len(fresh):
        S = similarities(head_vecs[fresh], head_vecs)  # [F, J]: the fresh heads against every head
        new_s[fresh], new_i[fresh] = _top_k(S, fresh, k)
        merge = rows[~lost]
        if len(merge):
            cand = S[:, merge].T  # [M, F]: each kept row's similarity to every fresh head
            full = new_i[merge, -1] >= 0
            worst_s, worst_i = new_s[merge, -1], new_i[merge, -1]
            # a fresh head enters a full row when it beats the row's k-th (ties: the lower id)
            beats = (cand > worst_s[:, None]) | ((cand == worst_s[:, None]) & (fresh[None, :] < worst_i[:, None]))
            enter = np.nonzero(~full | beats.any(axis=1))[0]
            if len(enter):
                m = merge[enter]
                s_all = np.concatenate([new_s[m], cand[enter]], axis=1)
                i_all = np.concatenate([new_i[m], np.broadcast_to(fresh, (len(m), len(fresh)))], axis=1)
                s_all = np.where(i_all >= 0, s_all, -np.inf)
                order = np.lexsort((np.where(i_all >= 0, i_all, np.iinfo(np.int64).max), -s_all), axis=1)
                order = order[:, :k]
                new_s[m] = np.take_along_axis(s_all, order, axis=1)
                new_i[m] = np.take_along_axis(i_all, order, axis=1)
                new_i[m] = np.where(np.isfinite(new_s[m]), new_i[m], -1)
                changed[m] = True
    if len(redo):
        new_s[redo], new_i[redo] = _rows_knn(head_vecs, redo, k)
    return new_s, new_i, np.nonzero(changed)[0]


def edges_from_knn(sims: np.ndarray, ids: np.ndarray, threshold: float, semantic: bool = True):
    """Undirected edges from the nearest-head table, stored in both directions and sorted by (src, dst).

    Adjacent threads (j, j+1) get weight 1 and kind ADJACENT; a head's nearest heads with cosine
    >= ``threshold`` get weight = cosine (clipped to [0, 1]) and kind SEMANTIC, the pair's weight
    taken from the lower thread's row when it lists the other (else from the other's); a pair
    that is both keeps the adjacent edge. Returns (src, dst, weight, kind) arrays.
    """
    J = len(ids)
    a_src = np.arange(max(J - 1, 0), dtype=np.int64)
    pa, pb = a_src, a_src + 1
    pw = np.ones(len(pa), dtype=np.float32)
    pk = np.full(len(pa), ADJACENT, dtype=np.int8)
    if semantic and ids.size:
        r, c = np.nonzero((ids >= 0) & (sims >= threshold))
        j, i, s = r.astype(np.int64), ids[r, c], sims[r, c]
        lo, hi = np.minimum(j, i), np.maximum(j, i)
        # first occurrence in the order rows are read (row j ascending, then rank): lower row wins
        order = np.lexsort((c, j, hi, lo))
        lo, hi, s = lo[order], hi[order], s[order]
        first = np.ones(len(lo), dtype=bool)
        first[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
        lo, hi, s = lo[first], hi[first], s[first]
        sem = hi != lo + 1  # an adjacent pair keeps its adjacent edge
        pa = np.concatenate([pa, lo[sem]])
        pb = np.concatenate([pb, hi[sem]])
        pw = np.concatenate([pw, np.clip(s[sem], 0.0, 1.0).astype(np.float32)])
        pk = np.concatenate([pk, np.full(int(sem.sum()), SEMANTIC, dtype=np.int8)])
    src = np.concatenate([pa, pb])
    dst = np.concatenate([pb, pa])
    w = np.concatenate([pw, pw])
    kind = np.concatenate([pk, pk])
    order = np.lexsort((dst, src))
    return src[order], dst[order], w[order].astype(np.float32), kind[order].astype(np.int8)


def build_edges(head_vecs: np.ndarray, *, knn: int, threshold: float, semantic: bool = True):
    """The edges of ``head_vecs``: :func:`edges_from_knn` of :func:`knn_table` (see both)."""
    k = knn if semantic and len(head_vecs) > 1 else 0
    sims, ids = knn_table(head_vecs, max(k, 0))
    return edges_from_knn(sims, ids, threshold, semantic)
