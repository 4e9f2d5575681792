"""Reference retrieval methods in the same harness: cosine, BM25, RRF hybrid, full context."""
from __future__ import annotations

import numpy as np

from .context import BankContext


def _top(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the k largest scores; ties to the lower index."""
    order = np.lexsort((np.arange(len(scores)), -scores))
    return [int(i) for i in order[:k]]


def cosine_topk(ctx: BankContext, z: np.ndarray, k: int) -> list[int]:
    return _top(ctx.bank.unit_vecs.astype(np.float64) @ z, k)


def bm25_topk(ctx: BankContext, question: str, k: int) -> list[int]:
    return _top(ctx.bm25.scores(question), k)


def rrf_scores(ctx: BankContext, question: str, z: np.ndarray, k_rrf: int = 60) -> np.ndarray:
    """Reciprocal-rank fusion: sum over {cosine, BM25} of 1 / (k + rank), ranks from 1.

    Units with a BM25 score of 0 get no BM25 contribution (BM25 did not retrieve them).
    """
    n = ctx.bank.n_units
    cos = ctx.bank.unit_vecs.astype(np.float64) @ z
    bm = ctx.bm25.scores(question)
    s = np.zeros(n)
    rank = np.empty(n)
    rank[np.lexsort((np.arange(n), -cos))] = np.arange(1, n + 1)
    s += 1.0 / (k_rrf + rank)
    rank[np.lexsort((np.arange(n), -bm))] = np.arange(1, n + 1)
    s += np.where(bm > 0, 1.0 / (k_rrf + rank), 0.0)
    return s


def hybrid_topk(ctx: BankContext, question: str, z: np.ndarray, k: int, k_rrf: int = 60) -> list[int]:
    return _top(rrf_scores(ctx, question, z, k_rrf), k)


def full_context(ctx: BankContext) -> list[int]:
    return list(range(ctx.bank.n_units))
