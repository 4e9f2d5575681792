"""Stage 2, step 3 (design note): the affinity alpha(v) of every unit of a query's bank, NumPy
reference (one query): dense, fused, reciprocal-rank fusion (:func:`rrf_scores`, also the
hybrid baseline's ranking) and the ``learned`` affinity (``relevance.py``). The torch and compiled
variants sit beside their parts in ``candidates.py`` and ``relevance.py``."""
from __future__ import annotations

import numpy as np

from .relevance import learned_affinity


def rrf_scores(ctx, question: str, z: np.ndarray, k_rrf: int = 60) -> np.ndarray:
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


def unit_affinity(ctx, z: np.ndarray, question: str, cfg, now: float = float("nan")) -> np.ndarray:
    """``[N]`` alpha(v) over the whole bank (see ``SelectConfig.affinity``; ``now``: the query's date
    in POSIX seconds, NaN if none, read by the ``learned`` affinity)."""
    if cfg.affinity == "learned":
        cos = ctx.bank.unit_vecs.astype(np.float64) @ z
        return learned_affinity(ctx.relevance, cos, ctx.bm25.scores(question), question, now, cfg)
    if cfg.affinity == "rrf":
        s = rrf_scores(ctx, question, z, cfg.rrf_k)
        return s / s.max()
    alpha = (1.0 + ctx.bank.unit_vecs.astype(np.float64) @ z) / 2.0
    if cfg.affinity == "fused" and cfg.lexical_weight > 0:
        s = ctx.bm25.scores(question)
        mx = s.max()
        lex = s / mx if mx > 0 else np.zeros_like(s)
        alpha = (1.0 - cfg.lexical_weight) * alpha + cfg.lexical_weight * lex
    return alpha
