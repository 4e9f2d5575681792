"""The budget and stop rule of every greedy, and the token knapsack.

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

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..._jit import njit
from ..priority import effective_budget


class TokenBudget(NamedTuple):
    """A knapsack on workspace tokens: a set S fits when ``sum_{u in S} unit_cost[u] +
    sum_{threads j hit by S} head_cost[j] <= capacity`` (``workspace.TokenCosts``: a thread's
    heading is paid when its first unit enters; threads of one heading run share one heading,
    ``unit_key``). The marginal cost of ``u`` given S is therefore ``unit_cost[u]``, plus
    ``head_cost[key(u)]`` while no unit of its key is in S (:func:`marginal_cost`).

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
    unit_key: object = None
    """``[U]`` / ``[Q, U]``: each candidate's heading key, the local thread whose ``head_cost`` it
    pays (threads of one heading run share the key of their first: one heading, paid once,
    ``workspace.TokenCosts.heading_run``); None = its own local thread."""


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
