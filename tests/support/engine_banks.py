"""Synthetic banks for the engine tests: random unit vectors, a few threads, adjacent and semantic
edges, words from a small vocabulary; the module-scoped ``banks`` / ``queries`` fixtures and the
reference's picks for them."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.data.types import Turn
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.store.bank import Bank
from trawmem_gpu.store.graph import ADJACENT, SEMANTIC


VOCAB = ("dog cat paint music hike paris school art camp book yoga beach trip sister game race garden cook "
         "piano movie friend lake bike sunday").split()

D = 16


def _unit(rng, n, d=D):
    x = rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _edges(pairs: dict[tuple[int, int], tuple[float, int]]):
    """Undirected {(a, b): (w, kind)} -> both directions, sorted by (src, dst)."""
    items = sorted([((a, b), v) for (a, b), v in pairs.items()] + [((b, a), v) for (a, b), v in pairs.items()])
    return (np.array([p[0][0] for p in items], dtype=np.int64), np.array([p[0][1] for p in items], dtype=np.int64),
            np.array([p[1][0] for p in items], dtype=np.float32), np.array([p[1][1] for p in items], dtype=np.int8))


def make_bank(bank_id: str, lens: list[int], seed: int, n_semantic: int = 3, unit_vecs=None, texts=None,
              pairs=None) -> Bank:
    """A bank with threads of ``lens`` units (one session per thread), heads = normalized mean of
    their units, adjacent edges (w = 1) and ``n_semantic`` random semantic edges (w in [0.3, 1))."""
    rng = np.random.default_rng(seed)
    N, J = sum(lens), len(lens)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    E = _unit(rng, N) if unit_vecs is None else np.asarray(unit_vecs, dtype=np.float32)
    H = np.stack([E[off[j]:off[j + 1]].mean(0) for j in range(J)])
    H = (H / np.maximum(np.linalg.norm(H, axis=1, keepdims=True), 1e-9)).astype(np.float32)
    if texts is None:
        texts = [" ".join(rng.choice(VOCAB, size=int(rng.integers(3, 8)))) for _ in range(N)]
        texts = [t + " last week" if i % 5 == 0 else t for i, t in enumerate(texts)]  # temporal flags
    turns = [Turn(f"{bank_id}:D{j}:{i}", "Ann" if i % 2 else "Bob", texts[i], j, "1 May 2023")
             for j in range(J) for i in range(off[j], off[j + 1])]
    if pairs is None:
        pairs = {(j, j + 1): (1.0, ADJACENT) for j in range(J - 1)}
        for _ in range(n_semantic if J > 2 else 0):
            a, b = sorted(rng.choice(J, size=2, replace=False).tolist())
            pairs.setdefault((a, b), (float(rng.uniform(0.3, 1.0)), SEMANTIC))
    src, dst, w, kind = _edges(pairs)
    bank = Bank(bank_id, turns, off, [f"head {j}" for j in range(J)], ["extractive"] * J, E, H, src, dst, w, kind,
                "test-encoder")
    bank.validate()
    return bank


@pytest.fixture(scope="module")
def banks() -> list[Bank]:
    return [
        make_bank("odd", [3, 1, 5, 2, 7, 4, 1, 6, 3], seed=1, n_semantic=5),
        make_bank("single", [4], seed=2),                      # one thread, U (4) < budget
        make_bank("tiny", [1, 2], seed=3),                     # U (3) < budget, one edge
        make_bank("wide", [2, 3, 4, 5] * 8, seed=4, n_semantic=20),  # 32 threads > neighbourhood cap
        make_bank("chain", [5, 5, 5, 5, 5, 5], seed=5, n_semantic=0),
    ]


@pytest.fixture(scope="module")
def queries(banks):
    """(bank ids, questions, Z): per bank, queries near one of its units, plus random ones."""
    rng = np.random.default_rng(7)
    ids, qs, zs = [], [], []
    stems = ["When did", "What do", "Would", "Which", "How long has", "Did Ann and Bob both like"]
    for b in banks:
        for i in range(6):
            if i < 4:
                z = b.unit_vecs[int(rng.integers(b.n_units))] + 0.4 * rng.normal(size=D)
            else:
                z = rng.normal(size=D)
            ids.append(b.bank_id)
            qs.append(f"{stems[i % len(stems)]} " + " ".join(rng.choice(VOCAB, size=3)) + "?")
            zs.append(z / np.linalg.norm(z))
    return ids, qs, np.array(zs, dtype=np.float32)


def reference(banks, cfg, ids, qs, Z, params=None):
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    return [select_reference(ctx[b], q, z, cfg, params).units for b, q, z in zip(ids, qs, Z)]


def queries_of(banks, seed: int = 3, per_bank: int = 4):
    """``per_bank`` questions per bank: (bank ids, texts, ``[Q, D]`` vectors), each vector a random
    unit's of its bank plus noise, normalized (the engine tests' query mix)."""
    rng = np.random.default_rng(seed)
    ids, qs, zs = [], [], []
    for b in banks:
        for i in range(per_bank):
            z = b.unit_vecs[int(rng.integers(b.n_units))] + 0.3 * rng.normal(size=D)
            ids.append(b.bank_id)
            qs.append(f"When did dog {'cat' if i % 2 else 'lake'} happen?")
            zs.append(z / np.linalg.norm(z))
    return ids, qs, np.array(zs, dtype=np.float32)
