"""The thread graph's nearest-head table: the batched table against a plain per-row reference,
its incremental update against the full table (threads removed, renumbered and added, as
appends and forgets do), and the edges against the plain loop that defines them. Random heads
with exact duplicates (ties) and fewer heads than ``k``."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.store.graph import ADJACENT, SEMANTIC, edges_from_knn, knn_table, similarities, update_knn


def _heads(rng, J, d=12, dups=True):
    H = rng.standard_normal((J, d)).astype(np.float32)
    if dups and J > 4:
        H[J // 2] = H[1]  # exact ties
        H[J - 1] = H[1]
    return (H / np.linalg.norm(H, axis=1, keepdims=True)).astype(np.float32)


def _reference_knn(H, k):
    """Each row's k nearest other heads: sort by (-similarity, id), the rule's definition."""
    S = similarities(H, H)
    ids = np.full((len(H), k), -1, dtype=np.int64)
    for r in range(len(H)):
        best = sorted((-float(S[r, j]), j) for j in range(len(H)) if j != r)[:k]
        ids[r, :len(best)] = [j for _, j in best]
    return ids


def _reference_edges(sims, ids, threshold):
    """The loop the edges are defined by (the first writer of a pair wins, adjacent first)."""
    J = len(ids)
    pairs = {(j, j + 1): (1.0, ADJACENT) for j in range(J - 1)}
    for j in range(J):
        for s, i in zip(sims[j], ids[j]):
            if i < 0 or s < threshold:
                continue
            a, b = (j, int(i)) if j < i else (int(i), j)
            pairs.setdefault((a, b), (float(min(max(s, 0.0), 1.0)), SEMANTIC))
    items = sorted(list(pairs.items()) + [((b, a), v) for (a, b), v in pairs.items()])
    return (np.array([p[0][0] for p in items], dtype=np.int64), np.array([p[0][1] for p in items], dtype=np.int64),
            np.array([p[1][0] for p in items], dtype=np.float32), np.array([p[1][1] for p in items], dtype=np.int8))


@pytest.mark.parametrize("J,k", [(0, 5), (1, 5), (2, 5), (4, 5), (6, 5), (40, 5), (97, 3), (60, 0)])
def test_the_table_is_the_reference(J, k):
    rng = np.random.default_rng(J * 10 + k)
    H = _heads(rng, J)
    sims, ids = knn_table(H, k)
    np.testing.assert_array_equal(ids, _reference_knn(H, k))
    assert sims.shape == ids.shape == (J, k)
    for got, want in zip(edges_from_knn(sims, ids, 0.1), _reference_edges(sims, ids, 0.1)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(40))
def test_an_update_equals_the_full_table_of_the_new_heads(seed):
    rng = np.random.default_rng(seed)
    J, k = int(rng.integers(1, 30)), int(rng.integers(1, 6))
    H = _heads(rng, J)
    sims, ids = knn_table(H, k)
    gone = rng.random(J) < rng.choice([0.0, 0.1, 0.4])
    seq = [("kept", j) for j in range(J) if not gone[j]]
    for _ in range(int(rng.integers(0, 5))):  # new heads anywhere (a forget re-segments a session mid-bank)
        v = H[int(rng.integers(J))] if rng.random() < 0.3 else _heads(rng, 1, dups=False)[0]
        seq.insert(int(rng.integers(0, len(seq) + 1)), ("fresh", v))
    if not seq:
        return
    keep = np.full(J, -1, dtype=np.int64)
    new_h, fresh = [], []
    for kind, x in seq:
        if kind == "kept":
            keep[x] = len(new_h)
            new_h.append(H[x])
        else:
            fresh.append(len(new_h))
            new_h.append(x)
    new_h = np.array(new_h, dtype=np.float32)
    s2, i2, changed = update_knn(sims, ids, keep, new_h, np.array(fresh, dtype=np.int64))
    s3, i3 = knn_table(new_h, k)
    np.testing.assert_array_equal(i2, i3)
    np.testing.assert_array_equal(s2, s3)
    # every row left out of ``changed`` is the old row of its thread
    for j in range(J):
        if keep[j] >= 0 and keep[j] not in set(changed.tolist()):
            np.testing.assert_array_equal(np.where(ids[j] >= 0, keep[np.maximum(ids[j], 0)], -1), i2[keep[j]])
