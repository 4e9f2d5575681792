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
``sum_v pi(v) c(v) >= stop_coverage``). A token budget (:class:`TokenBudget`, a knapsack on the
workspace's tokens) adds two more, again at one place each: which units still fit
(:func:`marginal_cost` against the room left) and the key a greedy ranks them by
(:func:`greedy_key`: the gain, or the gain per token); :func:`best_of_two` then keeps the better
of the two greedies (the cost-aware greedy, see :class:`TokenBudget` for its guarantee). No gain
formula moves: every optimizer still gets its gains from ``objective.py``.
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
from .priority import effective_budget, kernels, per_query, use_triton

Impl = Literal["auto", "torch", "triton"]


# ----------------------------------------------------------------------------------------------
# the budget / stop rule
# ----------------------------------------------------------------------------------------------
class TokenBudget(NamedTuple):
    """A knapsack on workspace tokens: a set S fits when ``sum_{u in S} unit_cost[u] +
    sum_{threads j hit by S} head_cost[j] <= capacity`` (``workspace.TokenCosts``: a thread's
    heading is paid when its first unit enters). The marginal cost of ``u`` given S is therefore
    ``unit_cost[u]``, plus ``head_cost[thread(u)]`` while no unit of its thread is in S
    (:func:`marginal_cost`).

    **The cost-aware greedy** (:func:`best_of_two`): run the greedy twice, each run adding only
    units that still fit, one ranked by gain (``ratio=False``), one by gain per marginal token
    (``ratio=True``), and keep the set of larger J. For modular costs (every unit pays its own
    cost, nothing shared) and no other limit, the better of the two is within ``(1 - 1/e) / 2``
    (~0.316) of the optimum (Leskovec et al. 2007, "Cost-effective outbreak detection in
    networks", after Khuller, Moss & Naor 1999 on budgeted maximum coverage): J is monotone
    submodular (``objective.py``).

    With heading costs the constraint is no longer modular (the cost of S is a modular part
    plus a coverage of threads: submodular), and the bound above does not carry over as such: a
    set that packs many units under few headings can beat the guarantee's reference. What does
    carry over, by the same proof (every marginal cost is at most the pessimistic cost
    ``unit_cost[u] + head_cost[thread(u)]``, so the ratio run's recurrence holds against any set
    that fits under pessimistic costs): the result is within ``(1 - 1/e) / 2`` of the best set
    that fits when every unit pays its heading in full. Every returned set fits the constraint
    exactly (integer costs, exact sums). Not covered by either statement: a unit cap
    (``StopRule.budget``) together with T, the early stop on coverage, and the caller's final
    check against the rendering (``workspace.fit_to_tokens``), each of which may end a run
    earlier.
    """

    capacity: object
    """T: a number (one query) or ``[Q]`` (NumPy or torch)."""
    unit_cost: object
    """``[U]`` (one query) or ``[Q, U]``: each candidate's own token cost, > 0."""
    head_cost: object
    """``[T]`` (one query) or ``[Q, T]``: each local thread's heading cost, >= 0."""
    ratio: bool | None = None
    """Rank by gain per marginal token (True) or by gain (False); None = both, the better kept
    (:func:`best_of_two`; ``SelectConfig.knapsack``)."""


class StopRule(NamedTuple):
    """When a greedy stops: after ``min(budget, live units, max_steps)`` picks, or as soon as the
    information coverage reaches ``stop_coverage`` (> 1 never stops early, as pi sums to 1), or,
    with a token budget, when no unit still fits."""

    budget: object
    """B_q: an int (one query) or ``[Q]`` ints (NumPy or torch)."""
    stop_coverage: float = 1.01
    max_steps: int | None = None
    """Most picks of any query (the width of the batched outputs); None = no extra bound."""
    tokens: TokenBudget | None = None
    """A knapsack on workspace tokens; None = the unit budget alone."""


def config_rule(cfg, budget, n_cand, max_steps: int | None = None, tokens: TokenBudget | None = None) -> StopRule:
    """The rule of a resolved ``SelectConfig`` for queries of ``n_cand`` candidates (int, NumPy or
    torch) whose unit cap is ``budget`` (``QueryParams.budget``: an int, None = no cap, or per query
    ``[Q]`` ints with 0 = no cap): B_q = max(1, min(B, |U_q|)), or |U_q| without a cap;
    ``max_steps`` (the batched output width) defaults to an int ``budget``."""
    scalar = budget is not None and not isinstance(budget, Tensor) and np.ndim(budget) == 0
    if budget is None:
        cap = n_cand
    elif scalar:
        cap = effective_budget(int(budget), n_cand)
        max_steps = int(budget) if max_steps is None else max_steps
    else:
        capped = budget > 0
        cap = effective_budget(budget, n_cand) * capped + n_cand * ~capped
    return StopRule(cap, cfg.stop_coverage, max_steps, tokens)


def marginal_cost(unit_cost, head_cost, hit):
    """Tokens a unit adds to S: its own cost, plus its thread's heading while ``hit`` (its thread
    already has a unit in S) is false (floats, NumPy arrays, torch tensors; compiled as
    :func:`marginal_cost_compiled`)."""
    return unit_cost + head_cost * (hit == 0)


marginal_cost_compiled = njit(cache=True, inline="always")(marginal_cost)


def greedy_key(gain, cost, ratio: bool):
    """What a greedy ranks units by: the gain, or the gain per marginal token (``ratio``). IEEE
    division is monotone, so a stale gain over a cost that can only fall since stays an upper
    bound of the key (the lazy greedies' invariant)."""
    return gain / cost if ratio else gain


greedy_key_compiled = njit(cache=True, inline="always")(greedy_key)


def j_value(gains) -> float:
    """J of a greedy's set: its pick gains summed in pick order from 0.0 (J({}) = 0), one float
    addition at a time: the order every backend sums in, so they compare the same totals."""
    total = 0.0
    for g in gains:
        total += g
    return total


def best_of_two(run, rule: StopRule):
    """The cost-aware greedy (see :class:`TokenBudget`): ``run(rule)`` with the gain key and with
    the gain-per-token key; the result of larger J (:func:`j_value`), the ratio run's when J ties
    or both runs chose the same set (its J then differs only by summation order, which must not
    decide the pick order a backend reports). ``run`` returns ``(picks, gains)`` (one query).
    Without a token budget, or with one key chosen (``tokens.ratio`` not None): ``run(rule)``."""
    if rule.tokens is None or rule.tokens.ratio is not None:
        return run(rule)
    plain = run(rule._replace(tokens=rule.tokens._replace(ratio=False)))
    ratio = run(rule._replace(tokens=rule.tokens._replace(ratio=True)))
    better = set(plain[0]) != set(ratio[0]) and j_value(plain[1]) > j_value(ratio[1])
    return plain if better else ratio


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
class _Room:
    """The token room of one query's greedy (NumPy): marginal costs, what fits, the key. Without
    a token budget every unit fits and the key is the gain."""

    def __init__(self, obj: Objective, tokens: TokenBudget | None):
        self.tb = tokens
        self.ratio = bool(tokens is not None and tokens.ratio)
        if tokens is not None:
            self.uc = np.asarray(tokens.unit_cost, dtype=np.float64).reshape(obj.n)
            self.hc = np.asarray(tokens.head_cost, dtype=np.float64).reshape(-1)
            self.left = float(tokens.capacity)
            self.th = np.asarray(obj.thread, dtype=np.int64)
            self.paid = np.zeros(len(self.hc), dtype=bool)

    def cost(self, u: int) -> float:
        if self.tb is None:
            return 1.0
        t = int(self.th[u])
        own = 0 <= t < len(self.hc)
        return float(marginal_cost(self.uc[u], self.hc[t] if own else 0.0, self.paid[t] if own else True))

    def fits(self, cost: float) -> bool:
        return self.tb is None or cost <= self.left

    def add(self, u: int, cost: float) -> bool:
        """Pay for ``u``; True when that paid its thread's heading (the thread was not hit)."""
        if self.tb is None:
            return False
        self.left -= cost
        t = int(self.th[u])
        if 0 <= t < len(self.hc) and not self.paid[t]:
            self.paid[t] = True
            return True
        return False


def plain_greedy(obj: Objective, rule: StopRule) -> tuple[list[int], list[float]]:
    """Add the unit of largest key (:func:`greedy_key`; lowest index on ties) among those that
    still fit (:func:`marginal_cost`) until the rule stops."""
    obj.reset()
    room = _Room(obj, rule.tokens)
    chosen, gains = [], []
    free = np.ones(obj.n, dtype=bool)
    for _ in range(pick_limit(rule, obj.n)):
        best, bk, bg, bc = -1, -np.inf, 0.0, 0.0
        for u in range(obj.n):
            if free[u]:
                c = room.cost(u)
                if not room.fits(c):
                    continue
                g = obj.gain(u)
                k = greedy_key(g, c, room.ratio)
                if k > bk:
                    best, bk, bg, bc = u, k, g, c
        if best < 0:  # nothing fits any more
            break
        obj.add(best)
        room.add(best, bc)
        free[best] = False
        chosen.append(best)
        gains.append(bg)
        if coverage_reached(rule, obj.coverage()):
            break
    return chosen, gains


def lazy_greedy(obj: Objective, rule: StopRule) -> tuple[list[int], list[float]]:
    """Lazy greedy (Minoux): a heap of stale upper bounds of the keys, keyed (-bound, index).

    The popped unit's gain is recomputed; it is taken when its key beats the next bound, or
    equals it while the popped index is lower (the plain greedy tie rule); otherwise it goes
    back with its fresh key. Every gain term is non-increasing as S grows, in floating point
    too (``max(0, a - c)`` is monotone in ``c`` under rounding, products with non-negative weights
    and sums in a fixed order keep it), so stale bounds are valid and the picks equal
    :func:`plain_greedy`'s exactly.

    Under a token budget: a popped unit that no longer fits is dropped for good (the room only
    shrinks, and a unit's marginal cost falls only when a unit of its thread enters, which costs
    at least the heading it saves); by the gain-per-token key, a unit's key *rises* when its
    thread gets hit (its heading is paid), so the units of a newly hit thread are re-keyed with
    their last gain over the lower cost, which keeps every key an upper bound.
    """
    obj.reset()
    room = _Room(obj, rule.tokens)
    last = np.array([obj.gain(u) for u in range(obj.n)])  # each unit's latest computed gain
    heap = [(-greedy_key(last[u], room.cost(u), room.ratio), u) for u in range(obj.n)]
    heapq.heapify(heap)
    chosen, gains = [], []
    fresh_at = np.zeros(obj.n, dtype=np.int64)  # step at which each gain was computed
    limit = pick_limit(rule, obj.n)
    while heap and len(chosen) < limit:
        nb, u = heapq.heappop(heap)
        c = room.cost(u)
        if not room.fits(c):
            continue
        if fresh_at[u] == len(chosen):
            k = -nb
        else:
            last[u] = obj.gain(u)
            k = greedy_key(last[u], c, room.ratio)
            fresh_at[u] = len(chosen)
        if heap:
            nb2, u2 = heap[0]
            if not (k > -nb2 or (k == -nb2 and u < u2)):
                heapq.heappush(heap, (-k, u))
                continue
        obj.add(u)
        chosen.append(u)
        gains.append(float(last[u]))
        if room.add(u, c) and room.ratio:  # the thread's heading is paid: its units' keys rise
            t = room.th[u]
            heap = [(-greedy_key(last[v], room.cost(v), True), v) if room.th[v] == t else (b, v) for b, v in heap]
            heapq.heapify(heap)
        if coverage_reached(rule, obj.coverage()):
            break
    return chosen, gains


def cost_aware_greedy(obj: Objective, rule: StopRule, lazy: bool = True) -> tuple[list[int], list[float]]:
    """The reference maximizer of J under ``rule``: :func:`lazy_greedy` or :func:`plain_greedy`,
    and with a token budget the better of their two keys (:func:`best_of_two`)."""
    run = lazy_greedy if lazy else plain_greedy
    return best_of_two(lambda r: run(obj, r), rule)


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
    np_ = lambda x: x.detach().cpu().numpy() if isinstance(x, Tensor) else x  # noqa: E731
    a = {k: np_(v) for k, v in p._asdict().items()}
    Q, U = a["pi"].shape
    wq = [np.broadcast_to(np.asarray(np_(x), dtype=np.float64).reshape(-1), (Q,)) for x in w]
    budget = np.broadcast_to(np.asarray(np_(rule.budget)), (Q,))
    tb = rule.tokens
    if tb is not None:
        cap = np.broadcast_to(np.asarray(np_(tb.capacity), dtype=np.float64), (Q,))
        uc, hc = np.asarray(np_(tb.unit_cost), dtype=np.float64), np.asarray(np_(tb.head_cost), dtype=np.float64)
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
        tq = None if tb is None else TokenBudget(cap[q], uc[q][live], hc[q], tb.ratio)
        s, g = cost_aware_greedy(obj, rule._replace(budget=int(budget[q]), tokens=tq), lazy=lazy)
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
        tb = rule.tokens
        self.ratio = bool(tb is not None and tb.ratio)
        if tb is not None:  # the token room: own costs, heading costs by thread column (0: none)
            self.ucost = torch.where(valid, torch.as_tensor(tb.unit_cost, device=dev).to(dtype), 1.0)
            self.hcost = torch.cat([torch.zeros(Q, 1, dtype=dtype, device=dev),
                                    torch.as_tensor(tb.head_cost, device=dev).to(dtype)], dim=1)
            self.left = torch.as_tensor(tb.capacity, device=dev).to(dtype).reshape(-1).expand(Q).clone()
        self.tokens = tb is not None

    def costs(self) -> Tensor:
        """``[Q, U]`` marginal token cost of every unit (:func:`marginal_cost`)."""
        return marginal_cost(self.ucost, torch.gather(self.hcost, 1, self.tcol), torch.gather(self.hit, 1, self.tcol))

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
    """Plain greedy over a padded batch: the Triton kernel when the tensors are on CUDA and triton
    imports (``impl="auto"``) or when forced (``impl="triton"``; on CPU only under
    ``TRITON_INTERPRET=1``), else :func:`greedy_select_torch`. Same returns.

    A token budget always runs :func:`greedy_select_torch`: the kernel implements the unit
    budget only (one argmax of the gain per step); the fit test, the gain-per-token key and the
    second run of the cost-aware greedy are not in it, and the torch ops run them on the same
    device with the same picks."""
    if rule.tokens is not None or not use_triton(impl, p.pi):
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
    """``budget`` = this query's pick limit (``pick_limit``); its ``tokens`` are not read here."""
    uc: np.ndarray = np.ones(0)
    """[n] the candidates' own token costs (:class:`TokenBudget`; unread without a token budget)."""
    hc: np.ndarray = np.zeros(0)
    """[T] heading token cost of each local thread."""
    room: float = np.inf
    """The token capacity T; ``inf`` = no token budget."""
    ratio: bool = False
    """Rank by gain per marginal token (:func:`greedy_key`)."""


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
    last: np.ndarray
    """[U] each unit's latest gain (or step-0 bound): re-keys units whose thread got hit."""


def greedy_scratch(U: int, R: int, T: int) -> GreedyScratch:
    U, R, T = max(U, 1), max(R, 1), max(T, 1)
    return GreedyScratch(np.empty(U * U), np.empty(U), np.empty(R), np.empty(U), np.empty(U, np.int64),
                         np.empty(U, np.int64), np.zeros(U, np.bool_), np.zeros(T, np.bool_), np.empty(U))


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
    writes the picks (candidate slots) to ``sel`` and returns their number (``s.last`` then holds
    each pick's gain).

    The heap starts from upper bounds of the step-0 gains that need no K row (``g.bound`` for the
    information coverage, the exact step-0 role and thread gains, m(u)), padded by a relative
    1e-6 for rounding (every term is >= 0). Keys order by (bound descending, index ascending); the
    top is taken once its value is fresh for the step, else it is evaluated (its K row gathered on
    first use) and sifted down: the plain greedy's pick, ties to the lowest index. Gains are
    computed at one site (coverage by ``objective.coverage_gain_row``, one summation order per
    query), so a computed gain never grows as the set grows and stale values are true bounds.

    With a token budget (``g.room`` finite) the keys are :func:`greedy_key` of those gains and
    the marginal costs (:func:`marginal_cost`), a popped unit that does not fit is dropped for good
    (see :func:`lazy_greedy`), and by the gain-per-token key the units of a newly hit thread are
    re-keyed with their last gain over their lower cost (the heap is rebuilt: at most once per
    thread).
    """
    n = g.pq.shape[0]
    Kc, c, m, hk, hi, fresh, loaded, hit, last = s.Kc, s.c, s.m, s.hk, s.hi, s.fresh, s.loaded, s.hit, s.last
    R = g.delta.shape[0]
    tokens = g.room < np.inf
    room = g.room
    for u in range(n):
        hit[g.lt[u]] = False
    for u in range(n):
        role = 0.0
        for r in range(R):
            role += g.delta[r] * g.rho[u, r]
        b0 = combine_gain_compiled(g.bound[u], role, g.modular[u], g.um[u], g.w.w_cov, g.w.w_role,
                                   g.w.w_thr) * (1.0 + 1e-6)
        last[u] = b0
        hk[u] = greedy_key_compiled(b0, marginal_cost_compiled(g.uc[u], g.hc[g.lt[u]], False), g.ratio) \
            if tokens else b0
        hi[u] = u
        c[u] = 0.0
        fresh[u] = -1
        loaded[u] = False
    for i in range(n // 2 - 1, -1, -1):
        sift_down(hk, hi, n, i)
    for r in range(R):
        m[r] = 0.0
    size = n
    n_sel = 0
    for step in range(min(g.rule.budget, n)):
        best = -1
        cost = 0.0
        while size > 0:
            u = hi[0]
            if tokens:
                cost = marginal_cost_compiled(g.uc[u], g.hc[g.lt[u]], hit[g.lt[u]])
                if cost > room:  # never fits again: out of the heap
                    size -= 1
                    hk[0] = hk[size]
                    hi[0] = hi[size]
                    sift_down(hk, hi, size, 0)
                    continue
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
            last[u] = gu
            hk[0] = greedy_key_compiled(gu, cost, g.ratio) if tokens else gu
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
        tb = g.lt[best]
        if tokens:
            room -= cost
            if g.ratio and not hit[tb]:  # its heading is now paid: its units' keys rise
                for i in range(size):
                    v = hi[i]
                    if g.lt[v] == tb:
                        hk[i] = greedy_key_compiled(last[v], marginal_cost_compiled(g.uc[v], g.hc[tb], True), True)
                for i in range(size // 2 - 1, -1, -1):
                    sift_down(hk, hi, size, i)
        hit[tb] = True
        if coverage_reached_compiled(g.rule, covered):
            break
    return n_sel


@njit(cache=True, inline="always")
def best_of_two_compiled(g_plain, g_ratio, s, sel, other, mark):  # pragma: no cover - compiled
    """:func:`best_of_two` of one query with :func:`lazy_greedy_one`: ``g_plain`` / ``g_ratio``
    differ only in ``ratio``; the chosen picks end in ``sel`` (``other``: scratch of the same
    width, ``mark``: ``[n]`` False, left False); returns their number."""
    na = lazy_greedy_one(g_plain, s, other)
    ja = 0.0  # j_value: the pick gains in pick order
    for i in range(na):
        ja += s.last[other[i]]
    nb = lazy_greedy_one(g_ratio, s, sel)
    jb = 0.0
    for i in range(nb):
        jb += s.last[sel[i]]
    same = na == nb
    if same:
        for i in range(nb):
            mark[sel[i]] = True
        for i in range(na):
            if not mark[other[i]]:
                same = False
        for i in range(nb):
            mark[sel[i]] = False
    if not same and ja > jb:
        for i in range(na):
            sel[i] = other[i]
        for i in range(na, nb):
            sel[i] = -1
        return na
    return nb
