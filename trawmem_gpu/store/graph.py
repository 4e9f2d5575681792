"""The thread graph: adjacent-thread edges and semantic k-nearest-head edges (faiss)."""
from __future__ import annotations

import numpy as np

ADJACENT, SEMANTIC, LAYER = 0, 1, 2
"""Edge kinds: adjacent threads, semantic nearest heads, and (in a unit view only, ``store.view``) a
layer edge between a fact or profile thread and the threads of the units it restates."""


def knn_heads(head_vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[J, d] unit vectors -> (sims [J, k], ids [J, k]) of each head's k nearest *other* heads.

    Exact inner-product search (faiss ``IndexFlatIP``); missing neighbours are id -1.
    Ties are broken by the lower id so results do not depend on faiss internals.
    """
    import faiss

    J = len(head_vecs)
    k_eff = min(k, max(J - 1, 0))
    sims = np.full((J, k), -np.inf, dtype=np.float32)
    ids = np.full((J, k), -1, dtype=np.int64)
    if J == 0 or k_eff == 0:
        return sims, ids
    index = faiss.IndexFlatIP(head_vecs.shape[1])
    index.add(np.ascontiguousarray(head_vecs, dtype=np.float32))
    D, I = index.search(np.ascontiguousarray(head_vecs, dtype=np.float32), min(J, k_eff + 1))
    for j in range(J):
        cand = [(float(d), int(i)) for d, i in zip(D[j], I[j]) if i >= 0 and i != j]
        cand.sort(key=lambda x: (-x[0], x[1]))
        for r, (d, i) in enumerate(cand[:k_eff]):
            sims[j, r], ids[j, r] = d, i
    return sims, ids


def build_edges(head_vecs: np.ndarray, *, knn: int, threshold: float, semantic: bool = True):
    """Undirected edges, stored in both directions and sorted by (src, dst).

    Adjacent threads (j, j+1) get weight 1 and kind ADJACENT; a head's k nearest heads with
    cosine >= ``threshold`` get weight = cosine (clipped to [0, 1]) and kind SEMANTIC; a pair
    that is both keeps the adjacent edge. Returns (src, dst, weight, kind) arrays.
    """
    J = len(head_vecs)
    pairs: dict[tuple[int, int], tuple[float, int]] = {}
    for j in range(J - 1):
        pairs[(j, j + 1)] = (1.0, ADJACENT)
    if semantic and knn > 0 and J > 1:
        sims, ids = knn_heads(head_vecs, knn)
        for j in range(J):
            for s, i in zip(sims[j], ids[j]):
                if i < 0 or s < threshold:
                    continue
                a, b = (j, int(i)) if j < i else (int(i), j)
                if (a, b) not in pairs:
                    pairs[(a, b)] = (float(min(max(s, 0.0), 1.0)), SEMANTIC)
    items = sorted([((a, b), v) for (a, b), v in pairs.items()] + [((b, a), v) for (a, b), v in pairs.items()])
    src = np.array([p[0][0] for p in items], dtype=np.int64)
    dst = np.array([p[0][1] for p in items], dtype=np.int64)
    w = np.array([p[1][0] for p in items], dtype=np.float32)
    kind = np.array([p[1][1] for p in items], dtype=np.int8)
    return src, dst, w, kind
