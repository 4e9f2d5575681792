"""Synthetic memory banks for selection benchmarks: any number of banks of any size, fast.

Each bank holds ``units`` unit vectors (``d`` = 384 by default, unit norm) in threads of about
``thread_len`` units. Structure, so that selection has something to find:

* every bank has ``topics`` random topic centres; every thread draws one topic and a direction
  of its own, and its units are ``normalize(centre + 0.7 direction + noise * N(0, I / d))``:
  cosines ~0.7 inside a thread, ~0.45 across threads of a topic, ~0 across topics;
* unit texts are 4-10 words from a small generic vocabulary, half of them from the thread's
  topic words, so BM25 scores are informative and many units share terms;
* heads are the normalized mean of their thread's units; edges are the adjacent-thread edges
  plus the ``knn`` nearest other heads with cosine >= ``threshold``, with the semantics of
  :func:`trawmem_gpu.store.graph.build_edges` (adjacent wins, both directions, sorted).

Everything is vectorized across banks: vectors come from one generator call per block of
banks, the kNN edges from one batched matrix product per group of banks with the same thread
count (``edges="torch"``; ``edges="build_edges"`` calls the project's faiss-based function per
bank instead, for checking). 10,000 banks of 100 units (1M units) take about a minute on 2 CPU
cores, dominated by building the per-unit ``Turn`` objects.

    python -m benchmarks run synthetic_banks --banks 1000 --units 100     # prints timing and sizes

Queries: :func:`make_queries` draws a bank, a unit of it, ``z = normalize(e_unit + noise)``
and a question made of a question stem and some of the unit's words.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from trawmem_gpu.store.graph import ADJACENT, SEMANTIC, build_edges
from trawmem_gpu.data.types import Turn
from trawmem_gpu.store.bank import Bank

VOCAB = tuple(
    "time day week year morning evening home work school family friend friends dog cat garden cook dinner lunch "
    "coffee book books read music song guitar piano paint art museum movie film game games team race run hike trip "
    "beach lake mountain city park travel car bike train plane photo camera phone call message party birthday gift "
    "wedding baby sister brother mother father kids class course exam project job interview office meeting boss "
    "money rent house apartment move plan idea story news health doctor yoga gym swim sport soccer tennis climb "
    "camping fishing festival concert dance volunteer charity church support group community shelter adoption "
    "counseling career study research paper write blog poem journal recipe bake cake bread pizza pasta salad "
    "tea wine market shop clothes shoes dress jacket weather rain snow summer winter spring autumn holiday".split())
STEMS = ("When did", "What did", "Where did", "Why did", "How long has", "Which", "Would", "What kind of",
         "Did both", "How many times did")


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)).astype(np.float32)


def thread_lengths(rng: np.random.Generator, units: int, thread_len: float) -> np.ndarray:
    """Thread sizes (>= 1) summing to ``units``: 1 + Poisson(thread_len - 1), the last cut to fit."""
    n = max(1, int(np.ceil(units / max(thread_len, 1.0) * 1.5)) + 4)
    while True:
        lens = 1 + rng.poisson(max(thread_len - 1.0, 0.0), size=n)
        cs = np.cumsum(lens)
        if cs[-1] >= units:
            k = int(np.searchsorted(cs, units))
            lens = lens[:k + 1].copy()
            lens[-1] -= int(cs[k] - units)
            return lens[lens > 0].astype(np.int64)
        n *= 2


def knn_edges_batched(H: np.ndarray, knn: int, threshold: float):
    """Edges of ``B`` banks with the same thread count ``J`` at once: ``H [B, J, d]`` heads ->
    per bank ``(src, dst, w, kind)`` as :func:`~trawmem_gpu.store.graph.build_edges` defines
    them (kNN by float32 inner product, ties to the lower id)."""
    import torch

    B, J, _ = H.shape
    Ht = torch.from_numpy(H)
    out = []
    k_eff = min(knn, max(J - 1, 0))
    if k_eff > 0:
        S = torch.bmm(Ht, Ht.transpose(1, 2))  # [B, J, J] float32
        S.diagonal(dim1=1, dim2=2).fill_(float("-inf"))
        # ties to the lower id: sort stably by descending similarity
        order = torch.sort(-S, dim=2, stable=True).indices[:, :, :k_eff]
        sims = torch.gather(S, 2, order).numpy()
        ids = order.numpy()
    for b in range(B):
        pairs: dict[tuple[int, int], tuple[float, int]] = {(j, j + 1): (1.0, ADJACENT) for j in range(J - 1)}
        if k_eff > 0:
            keep = sims[b] >= threshold
            src = np.repeat(np.arange(J), k_eff)[keep.ravel()]
            dst = ids[b].ravel()[keep.ravel()]
            ww = sims[b].ravel()[keep.ravel()]
            for s, d, w in zip(src.tolist(), dst.tolist(), ww.tolist()):
                a, c = (s, d) if s < d else (d, s)
                if (a, c) not in pairs:
                    pairs[(a, c)] = (float(min(max(w, 0.0), 1.0)), SEMANTIC)
        items = sorted([(p, v) for p, v in pairs.items()] + [((p[1], p[0]), v) for p, v in pairs.items()])
        out.append((np.array([p[0][0] for p in items], dtype=np.int64), np.array([p[0][1] for p in items], dtype=np.int64),
                    np.array([p[1][0] for p in items], dtype=np.float32), np.array([p[1][1] for p in items], dtype=np.int8)))
    return out


def knn_edges_blocked(H: np.ndarray, knn: int, threshold: float, block: int = 1024):
    """:func:`knn_edges_batched` of one bank with many threads (``H [J, d]``), row block by row block
    (``[block, J]`` similarities at a time instead of ``[J, J]``: a bank of 10^6 units has ~10^5
    threads). Ties to the lower id among the ``k + 8`` best by ``torch.topk``."""
    import torch

    J = len(H)
    k_eff = min(knn, max(J - 1, 0))
    Ht = torch.from_numpy(np.ascontiguousarray(H, dtype=np.float32))
    src_all, dst_all, w_all = [], [], []
    for s in range(0, J if k_eff else 0, block):
        S = Ht[s:s + block] @ Ht.T
        rows = torch.arange(s, min(s + block, J))
        S[rows - s, rows] = float("-inf")
        val, idx = torch.topk(S, min(J, k_eff + 8), dim=1)
        order = np.lexsort((idx.numpy(), -val.numpy()), axis=1)[:, :k_eff]  # by value, then the lower id
        v, i = np.take_along_axis(val.numpy(), order, 1), np.take_along_axis(idx.numpy(), order, 1)
        keep = v >= threshold
        src_all.append(np.repeat(rows.numpy(), k_eff)[keep.ravel()])
        dst_all.append(i.ravel()[keep.ravel()])
        w_all.append(v.ravel()[keep.ravel()])
    pairs: dict[tuple[int, int], tuple[float, int]] = {(j, j + 1): (1.0, ADJACENT) for j in range(J - 1)}
    if src_all:
        for a0, c0, w in zip(np.concatenate(src_all).tolist(), np.concatenate(dst_all).tolist(),
                             np.concatenate(w_all).tolist()):
            a, c = (a0, c0) if a0 < c0 else (c0, a0)
            if (a, c) not in pairs:
                pairs[(a, c)] = (float(min(max(w, 0.0), 1.0)), SEMANTIC)
    items = sorted([(p, v) for p, v in pairs.items()] + [((p[1], p[0]), v) for p, v in pairs.items()])
    return (np.array([p[0][0] for p in items], dtype=np.int64), np.array([p[0][1] for p in items], dtype=np.int64),
            np.array([p[1][0] for p in items], dtype=np.float32), np.array([p[1][1] for p in items], dtype=np.int8))


BLOCKED_THREADS = 4096
"""Banks with more threads get their kNN edges from :func:`knn_edges_blocked` (``edges="torch"``)."""


def make_banks(n_banks: int, units: int = 100, thread_len: float = 8.0, d: int = 384, topics: int = 6,
               noise: float = 0.8, knn: int = 5, threshold: float = 0.5, seed: int = 0, edges: str = "torch",
               prefix: str = "syn", progress: bool = False) -> list[Bank]:
    """``n_banks`` synthetic banks of exactly ``units`` units each (see the module docstring)."""
    if edges not in ("torch", "build_edges"):
        raise ValueError(f"edges must be 'torch' or 'build_edges', got {edges!r}")
    rng = np.random.default_rng(seed)
    V = len(VOCAB)
    lens_all = [thread_lengths(rng, units, thread_len) for _ in range(n_banks)]
    banks: list[Bank | None] = [None] * n_banks
    block = max(1, (1 << 22) // max(1, units * d))  # banks per vector block (~16 MB of float32)
    t0 = time.perf_counter()
    heads_by_bank: list[np.ndarray] = [None] * n_banks  # type: ignore[list-item]
    vecs_by_bank: list[np.ndarray] = [None] * n_banks  # type: ignore[list-item]
    for s in range(0, n_banks, block):
        e = min(n_banks, s + block)
        nb = e - s
        centres = _unit(rng.standard_normal((nb, topics, d), dtype=np.float32))
        for i in range(nb):
            lens = lens_all[s + i]
            J = len(lens)
            topic = rng.integers(0, topics, size=J)
            own = _unit(rng.standard_normal((J, d), dtype=np.float32))  # per-thread direction
            base = np.repeat(centres[i][topic] + 0.7 * own, lens, axis=0)
            E = _unit(base + noise * rng.standard_normal((units, d), dtype=np.float32) / np.float32(np.sqrt(d)))
            off = np.concatenate([[0], np.cumsum(lens)])
            H = _unit(np.add.reduceat(E, off[:-1], axis=0))
            vecs_by_bank[s + i], heads_by_bank[s + i] = E, H
    t_vec = time.perf_counter() - t0
    # edges: group banks by thread count, one batched kNN per group
    edge_by_bank: list = [None] * n_banks
    if edges == "torch":
        by_J: dict[int, list[int]] = {}
        for i, lens in enumerate(lens_all):
            by_J.setdefault(len(lens), []).append(i)
        for J, idx in by_J.items():
            if J > BLOCKED_THREADS:  # one [J, J] product per bank would not fit
                for i in idx:
                    edge_by_bank[i] = knn_edges_blocked(heads_by_bank[i], knn, threshold)
                continue
            for s in range(0, len(idx), 4096):
                part = idx[s:s + 4096]
                res = knn_edges_batched(np.stack([heads_by_bank[i] for i in part]), knn, threshold)
                for i, r in zip(part, res):
                    edge_by_bank[i] = r
    else:
        for i in range(n_banks):
            edge_by_bank[i] = build_edges(heads_by_bank[i], knn=knn, threshold=threshold, semantic=knn > 0)
    t_edges = time.perf_counter() - t0 - t_vec
    # texts and turns
    words_per_topic = 12
    topic_words = rng.integers(0, V, size=(n_banks, topics, words_per_topic))
    for i in range(n_banks):
        lens = lens_all[i]
        J = len(lens)
        topic = rng.integers(0, topics, size=J)
        ut = np.repeat(np.arange(J), lens)
        n_words = rng.integers(4, 11, size=units)
        generic = rng.integers(0, V, size=(units, 10))
        own = topic_words[i][topic[ut]][np.arange(units)[:, None], rng.integers(0, words_per_topic, size=(units, 10))]
        pick = rng.random((units, 10)) < 0.5
        w = np.where(pick, own, generic)
        bid = f"{prefix}{i:05d}"
        turns = [Turn(f"{bid}:D{int(ut[u])}:{u}", "Ann" if u % 2 else "Bob",
                      " ".join(VOCAB[x] for x in w[u, :n_words[u]]), int(ut[u]) + 1, "1 May 2023")
                 for u in range(units)]
        src, dst, ww, kind = edge_by_bank[i]
        banks[i] = Bank(bid, turns, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                        [f"thread {j}" for j in range(J)], ["extractive"] * J, vecs_by_bank[i], heads_by_bank[i],
                        src, dst, ww, kind, "synthetic-384")
        vecs_by_bank[i] = heads_by_bank[i] = None  # type: ignore[call-overload]
        if progress and (i + 1) % 1000 == 0:
            print(f"  {i + 1}/{n_banks} banks", file=sys.stderr, flush=True)
    if progress:
        print(f"  vectors {t_vec:.1f}s, edges {t_edges:.1f}s, total {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return banks  # type: ignore[return-value]


def make_queries(banks: list[Bank], n: int, seed: int = 1, noise: float = 0.5, bank_ids: list[str] | None = None):
    """``(bank_ids, questions, Z [n, d] float32)``: each query near a random unit of a random bank
    (or of ``bank_ids[i]``), with a question built from a stem and some of that unit's words."""
    rng = np.random.default_rng(seed)
    index = {b.bank_id: b for b in banks}
    if bank_ids is None:
        pick = rng.integers(0, len(banks), size=n)
        bank_ids = [banks[i].bank_id for i in pick]
    ids, qs, zs = [], [], []
    for b in bank_ids:
        bank = index[b]
        u = int(rng.integers(bank.n_units))
        words = bank.turns[u].text.split()
        k = int(rng.integers(1, min(4, len(words)) + 1))
        q = f"{STEMS[int(rng.integers(len(STEMS)))]} " + " ".join(rng.choice(words, size=k, replace=False)) + "?"
        z = bank.unit_vecs[u] + noise * rng.standard_normal(bank.unit_vecs.shape[1]).astype(np.float32) / np.sqrt(
            bank.unit_vecs.shape[1])
        ids.append(b)
        qs.append(q)
        zs.append(z / np.linalg.norm(z))
    return ids, qs, np.asarray(zs, dtype=np.float32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--banks", type=int, default=100)
    ap.add_argument("--units", type=int, default=100)
    ap.add_argument("--thread-len", type=float, default=8.0)
    ap.add_argument("--edges", default="torch", choices=("torch", "build_edges"))
    args = ap.parse_args(argv)
    t = time.perf_counter()
    banks = make_banks(args.banks, args.units, args.thread_len, edges=args.edges, progress=True)
    dt = time.perf_counter() - t
    J = [b.n_threads for b in banks]
    E = [len(b.edge_src) for b in banks]
    print(f"{len(banks)} banks, {sum(b.n_units for b in banks)} units, threads/bank mean {np.mean(J):.1f}, "
          f"directed edges/bank mean {np.mean(E):.1f}, built in {dt:.1f}s")
    for b in banks[:3]:
        b.validate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
