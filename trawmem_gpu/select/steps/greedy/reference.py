"""The reference optimizers of J (NumPy, one query): plain and lazy greedy, and the cost-aware
greedy under a token budget; also the padded-batch problem every batched optimizer takes and its
reference (:func:`greedy_reference_np`)."""
from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np
from torch import Tensor

from ...objective import CoverageWeights, Objective
from .rule import StopRule, TokenBudget, best_of_two, coverage_reached, greedy_key, marginal_cost, pick_limit


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
            self.th = np.asarray(obj.thread if tokens.unit_key is None else tokens.unit_key, dtype=np.int64)
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
    attrs: object = None
    """[Q, U, A] the candidates' unit attributes (``terms.unit_attributes``), for coverage
    terms that read them (``CoverageTerm.reads_attrs``); None when none does."""
    alpha: object = None
    """[Q, U] the candidates' affinity, for terms that read it (``terms/group_affinity.py``)."""


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
                        a["modular"][q][live], a["thread"][q][live], tuple(x[q] for x in wq),
                        thread_mass=a["thread_mass"][q], attrs=None if a["attrs"] is None else a["attrs"][q][live],
                        alpha=None if a["alpha"] is None else a["alpha"][q][live])
        tq = None if tb is None else TokenBudget(cap[q], uc[q][live], hc[q], tb.ratio,
                                                 None if tb.unit_key is None else np_(tb.unit_key)[q][live])
        s, g = cost_aware_greedy(obj, rule._replace(budget=int(budget[q]), tokens=tq), lazy=lazy)
        sel[q, :len(s)] = live[s]
        gains[q, :len(g)] = g
        n_sel[q] = len(s)
    return sel, gains, n_sel
