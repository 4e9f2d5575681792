"""The batched optimizers of J (torch, a padded batch of queries): plain greedy (one full gain
sweep per step; the Triton kernel's specification) and lazy greedy, composed from the coverage
terms' torch methods (``terms.CoverageTerm``): they never name a term."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ...objective import CoverageWeights, combine_gain
from ...terms import COVERAGE_TERMS, INFORMATION, CoverageData, Pick, fused_terms
from ..priority import kernels, per_query, use_triton
from .reference import GreedyProblem
from .rule import StopRule, coverage_reached, greedy_key, marginal_cost, pick_limit

Impl = Literal["auto", "torch", "triton"]
TRITON_FUSED_TERMS = fused_terms("triton")
"""The coverage terms whose pieces the Triton greedy kernel (``kernels/greedy.py``) holds, in order."""


class _TorchState:
    """Shared set-up of the torch greedies: padding zeroed, the coverage terms' data
    (``terms.CoverageData``, threads as columns with a dummy column 0 for units without one)
    and states, per-query weights as ``[Q, len(COVERAGE_TERMS)]``."""

    def __init__(self, p: GreedyProblem, w: CoverageWeights, rule: StopRule):
        valid = p.valid.bool()
        Q, U = p.pi.shape
        dev = p.pi.device
        self.dtype = dtype = torch.promote_types(p.pi.dtype, torch.float32)
        self.Q, self.U, self.dev = Q, U, dev
        zero = torch.zeros((), dtype=dtype, device=dev)
        K = p.K if p.K is not None else torch.eye(U, dtype=dtype, device=dev).expand(Q, U, U)
        pair = valid[:, :, None] & valid[:, None, :]
        T = p.thread_mass.shape[1]
        in_range = valid & (p.thread >= 0) & (p.thread < T)
        self.tcol = torch.where(in_range, p.thread + 1, torch.zeros_like(p.thread))  # column 0 = no thread
        tmass = torch.cat([torch.zeros(Q, 1, dtype=dtype, device=dev), p.thread_mass.to(dtype)], dim=1)
        self.data = CoverageData(torch.where(valid, p.pi.to(dtype), zero), torch.where(pair, K.to(dtype), zero),
                                 p.rho.to(dtype), p.delta.to(dtype), self.tcol, tmass, p.attrs,
                                 None if p.alpha is None else torch.where(valid, p.alpha.to(dtype), zero))
        self.modular = p.modular.to(dtype)
        self.W = torch.stack([torch.as_tensor(x, dtype=dtype, device=dev).reshape(-1).expand(Q) for x in w], 1)
        if self.W.shape[1] != len(COVERAGE_TERMS):
            raise ValueError(f"{len(COVERAGE_TERMS)} coverage weights expected, got {self.W.shape[1]}")
        # a term whose weight is 0 for every query is skipped (it would add exactly +0.0), but for the
        # information coverage, whose state the early stop reads
        self.state = [t.init_t(self.data) if (k == INFORMATION or bool((self.W[:, k] != 0).any())) else None
                      for k, t in enumerate(COVERAGE_TERMS)]
        self.limit = pick_limit(rule, valid.sum(dim=1))
        self.S = int(rule.max_steps)
        self.avail = valid.clone()
        tb = rule.tokens
        self.ratio = bool(tb is not None and tb.ratio)
        self.kcol = self.tcol  # each unit's heading key column (0: none): its thread's, or its run's
        if tb is not None and tb.unit_key is not None:
            key = torch.as_tensor(tb.unit_key, device=dev)
            self.kcol = torch.where(in_range & (key >= 0) & (key < T), key + 1, torch.zeros_like(key))
        self.hit = torch.zeros(Q, T + 1, dtype=torch.bool, device=dev)  # heading keys with a unit in S (paid)
        if tb is not None:  # the token room: own costs, heading costs by key column (0: none)
            self.ucost = torch.where(valid, torch.as_tensor(tb.unit_cost, device=dev).to(dtype), 1.0)
            self.hcost = torch.cat([torch.zeros(Q, 1, dtype=dtype, device=dev),
                                    torch.as_tensor(tb.head_cost, device=dev).to(dtype)], dim=1)
            self.left = torch.as_tensor(tb.capacity, device=dev).to(dtype).reshape(-1).expand(Q).clone()
        self.tokens = tb is not None

    def costs(self) -> Tensor:
        """``[Q, U]`` marginal token cost of every unit (:func:`marginal_cost`)."""
        return marginal_cost(self.ucost, torch.gather(self.hcost, 1, self.kcol), torch.gather(self.hit, 1, self.kcol))

    def gains(self, rows: Tensor | None = None, cols: Tensor | None = None) -> Tensor:
        """Exact gains (-inf where not available): of units ``cols [Q, k]`` of every query, or
        (cols None) of every unit of queries ``rows`` (None = all)."""
        if cols is not None:
            Q, U = self.Q, self.U
            flat = (torch.arange(Q, device=self.dev)[:, None] * U + cols).flatten()  # row copies beat a gather

            def units(x):
                if x.dim() == 2:
                    return torch.gather(x, 1, cols)
                return x.reshape(Q * U, *x.shape[2:]).index_select(0, flat).view(Q, cols.shape[1], *x.shape[2:])

            pick, query = Pick(units, lambda x: x), (lambda x: x)
            mo, av, ww = torch.gather(self.modular, 1, cols), torch.gather(self.avail, 1, cols), self.W
        else:
            query = (lambda x: x) if rows is None else (lambda x: x[rows])
            pick = Pick(query, query)
            mo, av, ww = query(self.modular), query(self.avail), query(self.W)
        g = [0.0 if st is None else t.gains_t(self.data, st, pick) for t, st in zip(COVERAGE_TERMS, self.state)]
        out = combine_gain(g, mo, [ww[:, k:k + 1] for k in range(len(COVERAGE_TERMS))])
        return torch.where(av, out, float("-inf"))

    def add(self, best: Tensor, active: Tensor) -> Tensor:
        """Add ``best [Q]`` to the queries ``active``; returns their information coverage."""
        Q, U = self.Q, self.U
        qidx = torch.arange(Q, device=self.dev)
        self.avail[qidx, best] &= ~active
        rowsel = qidx * U + best

        def rows(x):
            return x.reshape(Q * U, *x.shape[2:]).index_select(0, rowsel)

        self.state = [None if st is None else t.add_t(self.data, st, rows, active)
                      for t, st in zip(COVERAGE_TERMS, self.state)]
        tb = self.kcol[qidx, best]
        self.hit[qidx, tb] |= active
        self.hit[:, 0] = False
        return (self.data.pi * self.state[INFORMATION]).sum(dim=1)

    def pay(self, cost: Tensor, active: Tensor) -> None:
        """Take ``cost [Q]`` (the picks' marginal costs) off the room of the queries ``active``."""
        self.left = torch.where(active, self.left - cost, self.left)


def _argbest(g: Tensor, cols: Tensor, U: int) -> tuple[Tensor, Tensor]:
    """Best gain per row and its column, the lowest column among ties."""
    bv = g.max(dim=1).values
    return bv, torch.where(g == bv[:, None], cols, U).min(dim=1).values


def greedy_select_torch(p: GreedyProblem, w: CoverageWeights, rule: StopRule) -> tuple[Tensor, Tensor, Tensor]:
    """Plain greedy for every query at once, one full gain sweep per step (the torch
    specification of the Triton kernel); with a token budget the cost-aware greedy
    (:func:`best_of_two`'s rule, per query). Computes in ``promote(pi.dtype, float32)``; weights
    may be per-query ``[Q, 1]`` tensors. Returns ``sel [Q, max_steps]`` int64 (-1 pad),
    ``gains [Q, max_steps]`` float32 (0 pad), ``n_sel [Q]`` int64."""
    return _best_of_two_torch(lambda r: _run(_TorchState(p, w, r), r, lazy_k=0), rule)


def greedy_lazy_torch(p: GreedyProblem, w: CoverageWeights, rule: StopRule, k: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    """Batched lazy greedy: the picks of :func:`greedy_select_torch` at a fraction of its
    ``Q * U * U`` work per step. Every step after the first evaluates the exact gain of only the
    ``k`` units with the largest stale upper bounds of their keys (``[Q, k, U]`` work); the best
    of them is taken when its key beats the next bound by a margin of a few ulps, which by
    submodularity (gains only shrink, in floating point too, as they are computed by the same
    expression) proves no other unit could win or tie. Queries where that fails (exact or near
    ties included) get a full evaluation for that step, so ties break to the lowest index exactly
    as in plain greedy. Under a token budget the bounds are the stale gains over the current
    marginal costs (recomputed every step, so a unit whose thread was just hit is bounded by its
    lower cost) and units that no longer fit are out."""
    kk = max(1, int(k))
    return _best_of_two_torch(lambda r: _run(_TorchState(p, w, r), r, lazy_k=kk), rule)


def _best_of_two_torch(run, rule: StopRule) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`best_of_two` per query of a batch: ``run(rule)`` returns ``(sel, gains, n_sel, J)``."""
    if rule.tokens is None or rule.tokens.ratio is not None:
        return run(rule)[:3]
    a = run(rule._replace(tokens=rule.tokens._replace(ratio=False)))
    b = run(rule._replace(tokens=rule.tokens._replace(ratio=True)))
    same = (a[2] == b[2]) & (torch.sort(a[0], dim=1).values == torch.sort(b[0], dim=1).values).all(dim=1)
    take_a = ~same & (a[3] > b[3])
    return tuple(torch.where(take_a.view(-1, *([1] * (x.dim() - 1))), x, y) for x, y in zip(a[:3], b[:3]))


def _run(st: _TorchState, rule: StopRule, lazy_k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    Q, U, S, dev, dtype = st.Q, st.U, st.S, st.dev, st.dtype
    sel = torch.full((Q, S), -1, dtype=torch.int64, device=dev)
    gains_out = torch.zeros(Q, S, dtype=dtype, device=dev)
    J = torch.zeros(Q, dtype=dtype, device=dev)  # j_value: pick gains summed in pick order
    n_sel = torch.zeros(Q, dtype=torch.int64, device=dev)
    active = torch.ones(Q, dtype=torch.bool, device=dev)
    ar = torch.arange(U, device=dev)
    margin = 64 * torch.finfo(dtype).eps
    ninf = torch.full((), float("-inf"), dtype=dtype, device=dev)
    ub = st.gains() if (U and lazy_k) else None
    for t in range(S):
        active = active & (t < st.limit)
        if U == 0 or not bool(active.any()):
            break
        cost = fit = None
        if st.tokens:  # the keys of the units that still fit; -inf for the rest
            cost = st.costs()
            fit = cost <= st.left[:, None]
        key = (lambda g, cols=None: g) if cost is None else \
            (lambda g, cols=None: torch.where(fit if cols is None else torch.gather(fit, 1, cols),
                                              greedy_key(g, cost if cols is None else torch.gather(cost, 1, cols),
                                                         st.ratio), ninf))
        if not lazy_k:
            g_all = st.gains()
            bval, best = _argbest(key(g_all), ar.expand(Q, U), U)
            bgain = torch.gather(g_all, 1, best[:, None]).squeeze(1)
        elif t == 0:
            bval, best = _argbest(key(ub), ar.expand(Q, U), U)
            bgain = torch.gather(ub, 1, best[:, None]).squeeze(1)
        else:
            kk = min(lazy_k, U)
            top = torch.topk(key(ub), min(kk + 1, U), dim=1)
            cols = top.indices[:, :kk]
            bound = top.values[:, kk] if U > kk else torch.full((Q,), float("-inf"), dtype=dtype, device=dev)
            g = st.gains(cols=cols)
            ub.scatter_(1, cols, g)
            bval, best = _argbest(key(g, cols), cols, U)
            ok = (bound == float("-inf")) | (bval > bound + margin * (1.0 + bound.abs()))
            redo = (active & ~ok).nonzero().flatten()
            if len(redo):
                full = st.gains(rows=redo)
                ub[redo] = full
                kf = full if cost is None else torch.where(fit[redo], greedy_key(full, cost[redo], st.ratio), ninf)
                bv, bi = _argbest(kf, ar.expand(len(redo), U), U)
                bval, best = bval.clone(), best.clone()
                bval[redo], best[redo] = bv, bi
            bgain = torch.gather(ub, 1, best.clamp(max=U - 1)[:, None]).squeeze(1)
        if cost is not None:  # a query none of whose units fits is done
            active = active & (bval > float("-inf"))
        best = torch.where(active, best, 0).clamp(max=U - 1)
        sel[:, t] = torch.where(active, best, sel[:, t])
        step_gain = torch.where(active, bgain, torch.zeros((), dtype=dtype, device=dev))
        gains_out[:, t] = step_gain
        J = J + step_gain
        n_sel += active.to(torch.int64)
        if ub is not None:
            qidx = torch.arange(Q, device=dev)
            ub[qidx, best] = torch.where(active, float("-inf"), ub[qidx, best])
        if cost is not None:
            st.pay(torch.gather(cost, 1, best[:, None]).squeeze(1), active)
        covered = st.add(best, active)
        active = active & ~coverage_reached(rule, covered)
    return sel, gains_out.to(torch.float32), n_sel, J


def greedy_select(p: GreedyProblem, w: CoverageWeights, rule: StopRule, impl: Impl = "auto"):
    """Plain greedy over a padded batch: the Triton kernel (``impl="triton"``; on CPU only under
    ``TRITON_INTERPRET=1``; ``auto``: when the tensors are on CUDA, triton imports and there is no
    token budget) or :func:`greedy_select_torch` (``torch``). Same returns.

    The kernel implements the unit budget only (one argmax of the gain per step): the fit test, the
    gain-per-token key and the second run of the cost-aware greedy are not in it, so a token budget
    with ``impl="triton"`` is an error (the engine's plan sends those chunks to the torch ops)."""
    if rule.tokens is not None:
        if impl == "triton":
            raise ValueError("the Triton greedy kernel has no token knapsack: run a token budget with impl='torch'")
        return greedy_select_torch(p, w, rule)
    if not use_triton(impl, p.pi):
        return greedy_select_torch(p, w, rule)
    limit = pick_limit(rule, p.valid.bool().sum(dim=1))
    return kernels("greedy", p.pi).greedy_select_triton(p, per_query(w, p.pi.shape[0], p.pi.device), limit,
                                                        float(rule.stop_coverage), int(rule.max_steps))
