"""Reference TrawMem selection for one query over one bank: Section 4.2 step by step, NumPy.

This is the statement of the math that the batched engine must reproduce. Steps:
seeds (r0) -> H-hop propagation (r~) with a neighbourhood cap -> candidates U_q -> affinity
alpha -> task demand delta and role weights rho, role fit phi -> shortest-path costs C ->
capped priorities w, pi -> greedy maximization of J with the early stop.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import SelectConfig
from .context import BankContext
from .greedy import Objective, lazy_greedy, plain_greedy
from .text_features import demand_features


@dataclass
class Selection:
    """One query's selection: unit indices into the bank, in pick order, plus the internals."""

    bank_id: str
    units: list[int]
    gains: list[float]
    threads: list[int] = field(default_factory=list)
    """Neighbourhood H_q (bank thread ids, ascending)."""
    candidates: np.ndarray | None = None
    """U_q (bank unit ids, ascending)."""
    r_tilde: dict | None = None
    pi: np.ndarray | None = None
    rho: np.ndarray | None = None
    delta: np.ndarray | None = None


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def unit_affinity(ctx: BankContext, z: np.ndarray, question: str, cfg: SelectConfig) -> np.ndarray:
    """[N] alpha(v) over the whole bank (see ``SelectConfig.affinity``)."""
    if cfg.affinity == "rrf":
        from .baselines import rrf_scores

        s = rrf_scores(ctx, question, z, cfg.rrf_k)
        return s / s.max()
    alpha = (1.0 + ctx.bank.unit_vecs.astype(np.float64) @ z) / 2.0
    lexical_weight = cfg.lexical_weight
    if cfg.affinity == "fused" and lexical_weight > 0:
        s = ctx.bm25.scores(question)
        mx = s.max()
        lex = s / mx if mx > 0 else np.zeros_like(s)
        alpha = (1.0 - lexical_weight) * alpha + lexical_weight * lex
    return alpha


def seed_scores(ctx: BankContext, z: np.ndarray, alpha_all: np.ndarray, cfg: SelectConfig) -> np.ndarray:
    """[J] r0 per thread."""
    bank = ctx.bank
    cos_h = bank.head_vecs.astype(np.float64) @ z
    d = np.sqrt(np.maximum(0.0, 2.0 - 2.0 * cos_h)) if cfg.d_idx == "l2" else 1.0 - cos_h
    r_head = 1.0 / (1.0 + d)
    if cfg.seed_score == "head":
        return r_head
    r_unit = np.maximum.reduceat(alpha_all, bank.thread_offsets[:-1])
    return r_unit if cfg.seed_score == "best_unit" else np.maximum(r_head, r_unit)


def neighbourhood(ctx: BankContext, r0: np.ndarray, cfg: SelectConfig) -> dict[int, float]:
    """Seeds and their best neighbours within H hops: thread -> r~ (max over paths)."""
    order = sorted(range(len(r0)), key=lambda j: (-r0[j], j))
    seeds = order[:cfg.n_seeds]
    r = {j: float(r0[j]) for j in seeds}
    frontier = list(seeds)
    g = cfg.gamma
    for _ in range(cfg.hops):
        nxt = []
        for j in frontier:
            for k, w in ctx.neighbours(j, cfg.semantic_edges):
                val = g * r[j] + (1 - g) * w if cfg.propagation == "paper" else r[j] * (g + (1 - g) * w)
                if val > r.get(k, -np.inf):
                    r[k] = val
                    nxt.append(k)
        frontier = sorted(set(nxt))
    seed_set = set(seeds)
    rest = sorted((k for k in r if k not in seed_set), key=lambda k: (-r[k], k))
    keep = seeds + rest[:max(0, cfg.neighborhood_cap - len(seeds))]
    return {k: r[k] for k in sorted(keep)}


def head_distances(ctx: BankContext, threads: list[int], cfg: SelectConfig) -> np.ndarray:
    """[T, T] shortest head-to-head cost inside the neighbourhood (Floyd-Warshall).

    Edge cost c_hop + (1 - w_H) for G_H edges between neighbourhood threads; without
    cross-thread support every off-diagonal entry is infinite.
    """
    T = len(threads)
    D = np.full((T, T), np.inf)
    np.fill_diagonal(D, 0.0)
    if not cfg.cross_thread:
        return D
    pos = {t: i for i, t in enumerate(threads)}
    for i, j in enumerate(threads):
        for k, w in ctx.neighbours(j, cfg.semantic_edges):
            if k in pos:
                D[i, pos[k]] = min(D[i, pos[k]], cfg.c_hop + (1.0 - w))
    for m in range(T):
        D = np.minimum(D, D[:, m:m + 1] + D[m:m + 1, :])
    return D


def support_kernel(E: np.ndarray, thread: np.ndarray, cfg: SelectConfig) -> np.ndarray:
    """[U, U] K(u, v) in [0, 1] with K(v, v) = 1."""
    U = len(E)
    if cfg.kernel == "identity":
        return np.eye(U)
    S = E @ E.T
    K = np.clip((S - cfg.k_shift) / (1.0 - cfg.k_shift), 0.0, 1.0)
    if not cfg.cross_thread:
        K = np.where(thread[:, None] == thread[None, :], K, 0.0)
    np.fill_diagonal(K, 1.0)
    return K


def demand_mix(A: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``[Q, R]`` rows ``A x`` for ``X [Q, F]``, summed left to right over F in plain float64
    (elementwise IEEE operations, no BLAS): the reference and the batched engine get the same
    bits, one query or a thousand."""
    out = X[:, :1] * A[None, :, 0]
    for k in range(1, A.shape[1]):
        out = out + X[:, k:k + 1] * A[None, :, k]
    return out


def role_params(x: np.ndarray, cfg: SelectConfig, head=None) -> tuple[np.ndarray, np.ndarray, SelectConfig]:
    """(delta [R], M(delta) [R, F], cfg) from the demand features x_q.

    Hand-set: delta = A x / 1^T A x and M(delta) = M * (1 + delta) row-wise. A learned head
    (``head.params(x) -> {"A", "M", "weights"?}``) supplies A and M(delta) instead, and may
    override the objective weights and cost weights (``weights``: a dict of SelectConfig fields).
    """
    if head is None:
        A, M0 = np.array(cfg.A), np.array(cfg.M)
        delta = demand_mix(A, x[None, :])[0]
        delta = delta / delta.sum()
        return delta, M0 * (1.0 + delta)[:, None], cfg
    p = head.params(x)
    delta = demand_mix(np.asarray(p["A"], dtype=np.float64), x[None, :])[0]
    delta = np.maximum(delta, 1e-12)
    delta = delta / delta.sum()
    if p.get("weights"):
        from dataclasses import replace

        cfg = replace(cfg, **p["weights"])
    return delta, np.asarray(p["M"], dtype=np.float64), cfg


@dataclass
class Localized:
    """The head-independent part of one query's selection (steps 1-3 and the unit features)."""

    threads: list[int]
    """Neighbourhood H_q (bank thread ids, ascending)."""
    r_tilde: dict
    cand: np.ndarray
    """U_q: bank unit ids, ascending."""
    lt: np.ndarray
    """[U] local thread index of each candidate."""
    rvec: np.ndarray
    """[T] r~ of the neighbourhood threads."""
    alpha: np.ndarray
    """[U] affinity."""
    E: np.ndarray
    """[U, d] candidate vectors (float64)."""
    x: np.ndarray
    """[4] demand features x_q."""
    f: np.ndarray
    """[U, F] unit features in UNIT_FEATURES order."""
    graph_cost: np.ndarray
    """[T, U] d_q(T_j, v): head-graph distance plus in-thread distance."""


def localize(ctx: BankContext, question: str, z: np.ndarray, cfg: SelectConfig) -> Localized:
    """Seeds, propagation, candidates, affinity, features and graph distances for one query.

    ``cfg`` must already be ``resolved()``.
    """
    if not np.all(np.isfinite(z)):
        raise ValueError("query vector holds NaN or inf")
    bank = ctx.bank
    z = np.asarray(z, dtype=np.float64)
    alpha_all = unit_affinity(ctx, z, question, cfg)
    r0 = seed_scores(ctx, z, alpha_all, cfg)
    r_t = neighbourhood(ctx, r0, cfg)
    threads = list(r_t)
    cand = np.concatenate([np.arange(bank.thread_offsets[j], bank.thread_offsets[j + 1]) for j in threads])
    U = len(cand)
    tpos = {t: i for i, t in enumerate(threads)}
    lt = np.array([tpos[j] for j in ctx.unit_thread[cand]])  # local thread of each candidate
    alpha = alpha_all[cand]
    E = bank.unit_vecs[cand].astype(np.float64)
    # Unit features f: (1, alpha, r~ of its thread, bridge = best cosine to a unit of another
    # neighbourhood thread, cosine to its own head, temporal expression, position in thread).
    S = E @ E.T
    other = lt[:, None] != lt[None, :]
    bridge = np.where(other, S, -np.inf).max(axis=1) if U > 1 else np.zeros(U)
    bridge = np.clip(np.where(np.isfinite(bridge), bridge, 0.0), 0.0, 1.0)
    rvec = np.array([r_t[j] for j in threads])
    f = np.stack([np.ones(U), alpha, rvec[lt], bridge, ctx.head_sim[cand], ctx.temporal[cand], ctx.position[cand]], 1)
    Dh = head_distances(ctx, threads, cfg)
    d_in = ctx.in_thread_dist(cand, cfg.c_head, cfg.c_step)
    return Localized(threads, r_t, cand, lt, rvec, alpha, E, demand_features(question), f, Dh[:, lt] + d_in[None, :])


def select_reference(ctx: BankContext, question: str, z: np.ndarray, cfg: SelectConfig | None = None,
                     keep_internals: bool = False, head=None) -> Selection:
    """Select the workspace units for one query (``z``: its unit-norm vector).

    ``head``: optional learned role head (see ``role_params``); None keeps the hand-set A, M.
    """
    cfg = (cfg or SelectConfig()).resolved()
    loc = localize(ctx, question, z, cfg)
    cand, lt, alpha, f, rvec = loc.cand, loc.lt, loc.alpha, loc.f, loc.rvec
    U = len(cand)
    # Roles: demand delta, rho = softmax(M(delta) f / T_R), role fit phi = delta . rho.
    delta, M, cfg = role_params(loc.x, cfg, head)
    rho = _softmax(f @ M.T / cfg.T_R, axis=1)
    phi = rho @ delta
    # Costs C(T_j, v) = d_q(T_j, v) + lambda_m (1 - alpha) + lambda_r (1 - phi), d_q through the head graph.
    C = loc.graph_cost + cfg.lambda_m * (1.0 - alpha)[None, :] + cfg.lambda_r * (1.0 - phi)[None, :]
    Bq = max(1, min(cfg.budget, U))
    kappa = 1.0 / Bq
    w = np.minimum(kappa, (rvec[:, None] * np.exp(-C / cfg.tau)).sum(axis=0))
    pi = w / w.sum() if w.sum() > 0 else np.zeros(U)
    K = support_kernel(loc.E, lt, cfg)
    obj = Objective(pi, K, rho, delta, alpha, lt, cfg.w_cov, cfg.w_role, cfg.w_aff, cfg.w_thr)
    maximize = lazy_greedy if cfg.greedy == "lazy" else plain_greedy
    picks, gains = maximize(obj, Bq, cfg.stop_coverage)
    sel = Selection(ctx.bank.bank_id, [int(cand[i]) for i in picks], gains, loc.threads)
    if keep_internals:
        sel.candidates, sel.r_tilde, sel.pi, sel.rho, sel.delta = cand, loc.r_tilde, pi, rho, delta
    return sel
