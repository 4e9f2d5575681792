"""Stage 2, step 7 (design note): maximize J greedily. The optimizers live here, the objective in
``objective.py`` (apricot style): every optimizer gets J's data and weights, calls the
objective's gain functions and owns only the order of evaluation.

Optimizers, side by side: NumPy per query (:func:`plain_greedy`, :func:`lazy_greedy`: the
reference), torch over a padded batch (:func:`greedy_select_torch`: plain, one full sweep per
step; :func:`greedy_lazy_torch`: lazy), the Triton plain kernel behind :func:`greedy_select`, and
the compiled per-query lazy greedy :func:`lazy_greedy_one`. All pick exactly what plain greedy
picks, ties to the lowest candidate index; the float32 paths (torch float32, Triton) may break a
near-tie (gains within float32 rounding) differently.

Budget and stop rule. Each optimizer asks one :class:`StopRule` two things, at one place each:
how many picks a query may make (:func:`pick_limit`: ``min(B_q, live units, max_steps)``) and,
after each pick, whether to stop (:func:`coverage_reached`: information coverage
``sum_v pi(v) c(v) >= stop_coverage``). A different budget (e.g. a knapsack on workspace tokens,
with a cost-aware greedy) is a new rule and a new key at those places; no gain formula moves.
"""
from __future__ import annotations

import heapq
from typing import Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._jit import njit
from ..objective import CoverageWeights, Objective, combine_gain, combine_gain_compiled, coverage_gain_row, \
    coverage_gains_torch, role_gain_row
from .priority import kernels, per_query, use_triton

Impl = Literal["auto", "torch", "triton"]


# ----------------------------------------------------------------------------------------------
# the budget / stop rule
# ----------------------------------------------------------------------------------------------
class StopRule(NamedTuple):
    """When a greedy stops: after ``min(budget, live units, max_steps)`` picks, or as soon as the
    information coverage reaches ``stop_coverage`` (> 1 never stops early, as pi sums to 1)."""

    budget: object
    """B_q: an int (one query) or ``[Q]`` ints (NumPy or torch)."""
    stop_coverage: float = 1.01
    max_steps: int | None = None
    """Most picks of any query (the width of the batched outputs); None = no extra bound."""


def pick_limit(rule: StopRule, n_live):
    """``min(budget, n_live, max_steps)``, at least 0 (ints, NumPy arrays or torch tensors)."""
    cap = rule.max_steps
    if isinstance(n_live, Tensor):
        lim = torch.minimum(torch.as_tensor(rule.budget, device=n_live.device).to(n_live.dtype), n_live)
        return lim.clamp(min=0, max=cap).to(torch.int64) if cap is not None else lim.clamp(min=0).to(torch.int64)
    lim = np.minimum(rule.budget, n_live)
    lim = np.clip(lim, 0, cap) if cap is not None else np.maximum(lim, 0)
    return int(lim) if np.ndim(lim) == 0 else lim.astype(np.int64)


def coverage_reached(rule: StopRule, covered):
    """Whether a query stops after a pick that brought its information coverage to ``covered``."""
    return covered >= rule.stop_coverage


coverage_reached_compiled = njit(cache=True, inline="always")(coverage_reached)
"""The same test inside the compiled optimizer."""


# ----------------------------------------------------------------------------------------------
# NumPy, one query (the reference)
# ----------------------------------------------------------------------------------------------
def plain_greedy(obj: Objective, rule: StopRule) -> tuple[list[int], list[float]]:
    """Add the unit of largest marginal gain (lowest index on ties) until the rule stops."""
    obj.reset()
    chosen, gains = [], []
    free = np.ones(obj.n, dtype=bool)
    for _ in range(pick_limit(rule, obj.n)):
        best, bg = -1, -np.inf
        for u in range(obj.n):
            if free[u]:
                g = obj.gain(u)
                if g > bg:
                    best, bg = u, g
        obj.add(best)
        free[best] = False
        chosen.append(best)
        gains.append(bg)
        if coverage_reached(rule, obj.coverage()):
            break
    return chosen, gains


def lazy_greedy(obj: Objective, rule: StopRule) -> tuple[list[int], list[float]]:
    """Lazy greedy (Minoux): a heap of stale upper bounds keyed (-bound, index).

    The popped unit's gain is recomputed; it is taken when that gain beats the next bound, or
    equals it while the popped index is lower (the plain greedy tie rule); otherwise it goes
    back with its fresh bound. Every gain term is non-increasing as S grows, in floating point
    too (``max(0, a - c)`` is monotone in ``c`` under rounding, products with non-negative weights
    and sums in a fixed order keep it), so stale bounds are valid and the picks equal
    :func:`plain_greedy`'s exactly.
    """
    obj.reset()
    heap = [(-obj.gain(u), u) for u in range(obj.n)]
    heapq.heapify(heap)
    chosen, gains = [], []
    fresh_at = np.zeros(obj.n, dtype=np.int64)  # step at which each bound was computed
    limit = pick_limit(rule, obj.n)
    while heap and len(chosen) < limit:
        nb, u = heapq.heappop(heap)
        if fresh_at[u] == len(chosen):
            g = -nb
        else:
            g = obj.gain(u)
            fresh_at[u] = len(chosen)
        if heap:
            nb2, u2 = heap[0]
            if not (g > -nb2 or (g == -nb2 and u < u2)):
                heapq.heappush(heap, (-g, u))
                continue
        obj.add(u)
        chosen.append(u)
        gains.append(g)
        if coverage_reached(rule, obj.coverage()):
            break
    return chosen, gains


class GreedyProblem(NamedTuple):
    """J's data for a padded batch of ``Q`` queries with at most ``U`` candidates (torch tensors
    or NumPy arrays). A unit is live iff ``valid``; padding is never picked and its ``pi`` and
    ``K`` rows / columns count as 0; a live unit whose ``thread`` is outside ``[0, T)`` has no
    thread-coverage term."""

    pi: object
    """[Q, U] priorities."""
    K: object
    """[Q, U, U] support, ``K[q, u, v]`` = how much u supports v; None = the identity."""
    rho: object
    """[Q, U, R] role weights."""
    delta: object
    """[Q, R] role demand."""
    modular: object
    """[Q, U] the modular part of J (``objective.modular_gain``)."""
    thread: object
    """[Q, U] int64 local thread (-1 = padding)."""
    thread_mass: object
    """[Q, T] mass_j."""
    valid: object
    """[Q, U] bool."""


def greedy_reference_np(p: GreedyProblem, w: CoverageWeights, rule: StopRule, lazy: bool = False):
    """The NumPy reference over a padded batch, one query after another (for tests):
    ``(sel [Q, max_steps] int64 (-1 pad), gains [Q, max_steps] float64, n_sel [Q] int64)``."""
    a = {k: (v.detach().cpu().numpy() if isinstance(v, Tensor) else v) for k, v in p._asdict().items()}
    wq = [np.broadcast_to(np.asarray(x.cpu() if isinstance(x, Tensor) else x, dtype=np.float64).reshape(-1),
                          (len(a["pi"]),)) for x in w]
    budget = np.broadcast_to(np.asarray(rule.budget.cpu() if isinstance(rule.budget, Tensor) else rule.budget),
                             (len(a["pi"]),))
    Q, U = a["pi"].shape
    S = rule.max_steps
    sel = np.full((Q, S), -1, dtype=np.int64)
    gains = np.zeros((Q, S))
    n_sel = np.zeros(Q, dtype=np.int64)
    for q in range(Q):
        live = np.flatnonzero(a["valid"][q])
        K = np.eye(U) if a["K"] is None else np.asarray(a["K"][q], dtype=np.float64)
        obj = Objective(a["pi"][q][live], K[np.ix_(live, live)], a["rho"][q][live], a["delta"][q],
                        a["modular"][q][live], a["thread"][q][live], CoverageWeights(*(x[q] for x in wq)),
                        thread_mass=a["thread_mass"][q])
        s, g = (lazy_greedy if lazy else plain_greedy)(obj, rule._replace(budget=int(budget[q])))
        sel[q, :len(s)] = live[s]
        gains[q, :len(g)] = g
        n_sel[q] = len(s)
    return sel, gains, n_sel


# ----------------------------------------------------------------------------------------------
# torch, a padded batch
# ----------------------------------------------------------------------------------------------
class _TorchState:
    """Shared set-up of the torch greedies: padding zeroed, the thread table with a dummy column
    0 for units without a thread, per-query weights as ``[Q, 3]``."""

    def __init__(self, p: GreedyProblem, w: CoverageWeights, rule: StopRule):
        valid = p.valid.bool()
        Q, U = p.pi.shape
        dev = p.pi.device
        self.dtype = dtype = torch.promote_types(p.pi.dtype, torch.float32)
        self.Q, self.U, self.dev = Q, U, dev
        K = p.K if p.K is not None else torch.eye(U, dtype=dtype, device=dev).expand(Q, U, U)
        pair = valid[:, :, None] & valid[:, None, :]
        self.K = torch.where(pair, K.to(dtype), torch.zeros((), dtype=dtype, device=dev))
        self.pi = torch.where(valid, p.pi.to(dtype), torch.zeros((), dtype=dtype, device=dev))
        self.rho, self.delta, self.modular = p.rho.to(dtype), p.delta.to(dtype), p.modular.to(dtype)
        T = p.thread_mass.shape[1]
        in_range = valid & (p.thread >= 0) & (p.thread < T)
        self.tcol = torch.where(in_range, p.thread + 1, torch.zeros_like(p.thread))  # column 0 = no thread
        tmass = torch.cat([torch.zeros(Q, 1, dtype=dtype, device=dev), p.thread_mass.to(dtype)], dim=1)
        self.unit_mass = torch.gather(tmass, 1, self.tcol)  # [Q, U]
        self.hit = torch.zeros(Q, T + 1, dtype=torch.bool, device=dev)
        self.W = torch.stack([torch.as_tensor(x, dtype=dtype, device=dev).reshape(-1).expand(Q) for x in w], 1)
        self.limit = pick_limit(rule, valid.sum(dim=1))
        self.S = int(rule.max_steps)
        self.c = torch.zeros(Q, U, dtype=dtype, device=dev)
        self.m = torch.zeros_like(self.delta)
        self.avail = valid.clone()

    def gains(self, rows: Tensor | None = None, cols: Tensor | None = None) -> Tensor:
        """Exact gains (-inf where not available): of units ``cols [Q, k]`` of every query, or
        (cols None) of every unit of queries ``rows`` (None = all)."""
        if cols is not None:
            Q, U = self.Q, self.U
            flat = (torch.arange(Q, device=self.dev)[:, None] * U + cols).flatten()  # row copies beat a gather
            take = lambda x: x.reshape(Q * U, x.shape[2]).index_select(0, flat).view(Q, cols.shape[1], x.shape[2])
            Kc, rc = take(self.K), take(self.rho)
            tc, um, mo, av = (torch.gather(x, 1, cols) for x in (self.tcol, self.unit_mass, self.modular, self.avail))
            pv, cc, dd, mm, hh, ww = self.pi, self.c, self.delta, self.m, self.hit, self.W
        else:
            sub = (lambda x: x) if rows is None else (lambda x: x[rows])
            Kc, rc, tc, um, mo, av = (sub(x) for x in (self.K, self.rho, self.tcol, self.unit_mass, self.modular,
                                                      self.avail))
            pv, cc, dd, mm, hh, ww = (sub(x) for x in (self.pi, self.c, self.delta, self.m, self.hit, self.W))
        cov, role, thr = coverage_gains_torch(Kc, pv, cc, rc, dd, mm, um, torch.gather(hh, 1, tc))
        g = combine_gain(cov, role, mo, thr, ww[:, 0:1], ww[:, 1:2], ww[:, 2:3])
        return torch.where(av, g, float("-inf"))

    def add(self, best: Tensor, active: Tensor) -> Tensor:
        """Add ``best [Q]`` to the queries ``active``; returns their information coverage."""
        Q, U = self.Q, self.U
        qidx = torch.arange(Q, device=self.dev)
        act2 = active[:, None]
        self.avail[qidx, best] &= ~active
        rowsel = qidx * U + best
        self.c = torch.where(act2, torch.maximum(self.c, self.K.reshape(Q * U, U).index_select(0, rowsel)), self.c)
        R = self.rho.shape[-1]
        self.m = torch.where(act2, torch.maximum(self.m, self.rho.reshape(Q * U, R).index_select(0, rowsel)), self.m)
        tb = self.tcol[qidx, best]
        self.hit[qidx, tb] |= active
        self.hit[:, 0] = False
        return (self.pi * self.c).sum(dim=1)


def _argbest(g: Tensor, cols: Tensor, U: int) -> tuple[Tensor, Tensor]:
    """Best gain per row and its column, the lowest column among ties."""
    bv = g.max(dim=1).values
    return bv, torch.where(g == bv[:, None], cols, U).min(dim=1).values


def greedy_select_torch(p: GreedyProblem, w: CoverageWeights, rule: StopRule) -> tuple[Tensor, Tensor, Tensor]:
    """Plain greedy for every query at once, one full gain sweep per step (the torch
    specification of the Triton kernel). Computes in ``promote(pi.dtype, float32)``; weights may
    be per-query ``[Q, 1]`` tensors. Returns ``sel [Q, max_steps]`` int64 (-1 pad),
    ``gains [Q, max_steps]`` float32 (0 pad), ``n_sel [Q]`` int64."""
    st = _TorchState(p, w, rule)
    return _run(st, rule, lazy_k=0)


def greedy_lazy_torch(p: GreedyProblem, w: CoverageWeights, rule: StopRule, k: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    """Batched lazy greedy: the picks of :func:`greedy_select_torch` at a fraction of its
    ``Q * U * U`` work per step. Every step after the first evaluates the exact gain of only the
    ``k`` units with the largest stale upper bounds (``[Q, k, U]`` work); the best of them is taken
    when its gain beats the next bound by a margin of a few ulps, which by submodularity (gains
    only shrink, in floating point too, as they are computed by the same expression) proves no
    other unit could win or tie. Queries where that fails (exact or near ties included) get a
    full evaluation for that step, so ties break to the lowest index exactly as in plain greedy."""
    return _run(_TorchState(p, w, rule), rule, lazy_k=max(1, int(k)))


def _run(st: _TorchState, rule: StopRule, lazy_k: int) -> tuple[Tensor, Tensor, Tensor]:
    Q, U, S, dev, dtype = st.Q, st.U, st.S, st.dev, st.dtype
    sel = torch.full((Q, S), -1, dtype=torch.int64, device=dev)
    gains_out = torch.zeros(Q, S, dtype=dtype, device=dev)
    n_sel = torch.zeros(Q, dtype=torch.int64, device=dev)
    active = torch.ones(Q, dtype=torch.bool, device=dev)
    ar = torch.arange(U, device=dev)
    margin = 64 * torch.finfo(dtype).eps
    ub = st.gains() if (U and lazy_k) else None
    for t in range(S):
        active = active & (t < st.limit)
        if U == 0 or not bool(active.any()):
            break
        if not lazy_k:
            bval, best = _argbest(st.gains(), ar.expand(Q, U), U)
        elif t == 0:
            bval, best = _argbest(ub, ar.expand(Q, U), U)
        else:
            kk = min(lazy_k, U)
            top = torch.topk(ub, min(kk + 1, U), dim=1)
            cols = top.indices[:, :kk]
            bound = top.values[:, kk] if U > kk else torch.full((Q,), float("-inf"), dtype=dtype, device=dev)
            g = st.gains(cols=cols)
            ub.scatter_(1, cols, g)
            bval, best = _argbest(g, cols, U)
            ok = (bound == float("-inf")) | (bval > bound + margin * (1.0 + bound.abs()))
            redo = (active & ~ok).nonzero().flatten()
            if len(redo):
                full = st.gains(rows=redo)
                ub[redo] = full
                bv, bi = _argbest(full, ar.expand(len(redo), U), U)
                bval, best = bval.clone(), best.clone()
                bval[redo], best[redo] = bv, bi
        best = torch.where(active, best, 0).clamp(max=U - 1)
        sel[:, t] = torch.where(active, best, sel[:, t])
        gains_out[:, t] = torch.where(active, bval, torch.zeros((), dtype=dtype, device=dev))
        n_sel += active.to(torch.int64)
        if ub is not None:
            qidx = torch.arange(Q, device=dev)
            ub[qidx, best] = torch.where(active, float("-inf"), ub[qidx, best])
        covered = st.add(best, active)
        active = active & ~coverage_reached(rule, covered)
    return sel, gains_out.to(torch.float32), n_sel


def greedy_select(p: GreedyProblem, w: CoverageWeights, rule: StopRule, impl: Impl = "auto"):
    """Plain greedy over a padded batch: the Triton kernel when the tensors are on CUDA and triton
    imports (``impl="auto"``) or when forced (``impl="triton"``; on CPU only under
    ``TRITON_INTERPRET=1``), else :func:`greedy_select_torch`. Same returns."""
    if not use_triton(impl, p.pi):
        return greedy_select_torch(p, w, rule)
    limit = pick_limit(rule, p.valid.bool().sum(dim=1))
    return kernels("greedy", p.pi).greedy_select_triton(p, per_query(w, p.pi.shape[0], p.pi.device), limit,
                                                        float(rule.stop_coverage), int(rule.max_steps))


# ----------------------------------------------------------------------------------------------
# compiled (numba), one query
# ----------------------------------------------------------------------------------------------
class KSource(NamedTuple):
    """Where the compiled greedy reads ``K(u, v)``: ``ktab[kbase + cq[u] * kn + cq[v]]`` (the bank's
    support table; for a plain ``[n, n]`` matrix: ``kbase = 0``, ``kn = n``, ``cq = arange(n)``), or
    the identity."""

    ktab: np.ndarray
    kbase: int
    kn: int
    cq: np.ndarray
    identity: bool


class CompiledQuery(NamedTuple):
    """One query's J for :func:`lazy_greedy_one` (arrays over its ``n`` candidates)."""

    pq: np.ndarray
    rho: np.ndarray
    delta: np.ndarray
    modular: np.ndarray
    lt: np.ndarray
    um: np.ndarray
    """[n] mass of each unit's thread."""
    bound: np.ndarray
    """[n] upper bounds of the step-0 information-coverage gains (``objective.TERMS``)."""
    K: KSource
    w: CoverageWeights
    rule: StopRule
    """``budget`` = this query's pick limit (``pick_limit``)."""


class GreedyScratch(NamedTuple):
    """Per-worker scratch of :func:`lazy_greedy_one` for up to ``U`` candidates, ``R`` roles, ``T`` threads."""

    Kc: np.ndarray
    c: np.ndarray
    m: np.ndarray
    hk: np.ndarray
    hi: np.ndarray
    fresh: np.ndarray
    loaded: np.ndarray
    hit: np.ndarray


def greedy_scratch(U: int, R: int, T: int) -> GreedyScratch:
    U, R, T = max(U, 1), max(R, 1), max(T, 1)
    return GreedyScratch(np.empty(U * U), np.empty(U), np.empty(R), np.empty(U), np.empty(U, np.int64),
                         np.empty(U, np.int64), np.zeros(U, np.bool_), np.zeros(T, np.bool_))


@njit(cache=True)
def sift_down(hk, hi, size, i):  # pragma: no cover - compiled
    """Restore the heap order (key descending, then index ascending) below node ``i``."""
    while True:
        a = 2 * i + 1
        if a >= size:
            return
        b = a + 1
        if b < size and (hk[b] > hk[a] or (hk[b] == hk[a] and hi[b] < hi[a])):
            a = b
        if hk[a] > hk[i] or (hk[a] == hk[i] and hi[a] < hi[i]):
            hk[i], hk[a] = hk[a], hk[i]
            hi[i], hi[a] = hi[a], hi[i]
            i = a
        else:
            return


@njit(cache=True, inline="always")
def lazy_greedy_one(g, s, sel):  # pragma: no cover - compiled
    """Lazy greedy of one query (``g``: :class:`CompiledQuery`, ``s``: :class:`GreedyScratch`);
    writes the picks (candidate slots) to ``sel`` and returns their number.

    The heap starts from upper bounds of the step-0 gains that need no K row (``g.bound`` for the
    information coverage, the exact step-0 role and thread gains, m(u)), padded by a relative
    1e-6 for rounding (every term is >= 0). Keys order by (bound descending, index ascending); the
    top is taken once its value is fresh for the step, else it is evaluated (its K row gathered on
    first use) and sifted down: the plain greedy's pick, ties to the lowest index. Gains are
    computed at one site (coverage by ``objective.coverage_gain_row``, one summation order per
    query), so a computed gain never grows as the set grows and stale values are true bounds.
    """
    n = g.pq.shape[0]
    Kc, c, m, hk, hi, fresh, loaded, hit = s.Kc, s.c, s.m, s.hk, s.hi, s.fresh, s.loaded, s.hit
    R = g.delta.shape[0]
    for u in range(n):
        role = 0.0
        for r in range(R):
            role += g.delta[r] * g.rho[u, r]
        hk[u] = combine_gain_compiled(g.bound[u], role, g.modular[u], g.um[u], g.w.w_cov, g.w.w_role,
                                      g.w.w_thr) * (1.0 + 1e-6)
        hi[u] = u
        c[u] = 0.0
        fresh[u] = -1
        loaded[u] = False
        hit[g.lt[u]] = False
    for i in range(n // 2 - 1, -1, -1):
        sift_down(hk, hi, n, i)
    for r in range(R):
        m[r] = 0.0
    size = n
    n_sel = 0
    for step in range(min(g.rule.budget, n)):
        best = -1
        while size > 0:
            u = hi[0]
            if fresh[u] == step:  # an exact gain of this step on top: the plain greedy's pick
                best = u
                size -= 1
                hk[0] = hk[size]
                hi[0] = hi[size]
                sift_down(hk, hi, size, 0)
                break
            if not loaded[u]:  # K row of u over the candidates, gathered on first use
                dst = Kc[u * n:(u + 1) * n]
                k = g.K
                if k.identity:
                    for v in range(n):
                        dst[v] = 1.0 if u == v else 0.0
                else:
                    o = k.kbase + k.cq[u] * k.kn
                    for v in range(n):
                        dst[v] = k.ktab[o + k.cq[v]]
                loaded[u] = True
            gu = combine_gain_compiled(coverage_gain_row(Kc[u * n:(u + 1) * n], g.pq, c),
                                       role_gain_row(g.rho, u, m, g.delta), g.modular[u],
                                       0.0 if hit[g.lt[u]] else g.um[u], g.w.w_cov, g.w.w_role, g.w.w_thr)
            fresh[u] = step
            hk[0] = gu
            sift_down(hk, hi, size, 0)
        if best < 0:
            break
        sel[step] = best
        n_sel = step + 1
        kb = Kc[best * n:(best + 1) * n]
        for v in range(n):
            if kb[v] > c[v]:
                c[v] = kb[v]
        covered = 0.0
        if g.rule.stop_coverage <= 1.0 + 1e-9:  # above 1 the test never fires (sum pq = 1, c <= 1)
            for v in range(n):
                covered += g.pq[v] * c[v]
        for r in range(R):
            if g.rho[best, r] > m[r]:
                m[r] = g.rho[best, r]
        hit[g.lt[best]] = True
        if coverage_reached_compiled(g.rule, covered):
            break
    return n_sel
