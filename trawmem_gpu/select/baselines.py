"""Reference retrieval methods in the same harness: cosine, BM25, RRF hybrid, full context.

Each ranks the bank's units (full context: in source order) and takes them from the top: the
first B at a unit budget, or under a token budget T (``QueryParams.token_budget``) every unit
that still fits, in rank order (``fill="skip"``: a unit that would overflow is skipped and the
ranking goes on; ``fill="stop"``: the first one that would overflow ends the workspace), at most
B of them when B is also set. Costs are the workspace's own (``select.workspace.TokenCosts`` without
heads), and the workspace is checked against T (``select.workspace.fit_to_tokens``).
:func:`baseline_units` is the one entry point every harness calls.
"""
from __future__ import annotations

import numpy as np

from .context import BankContext
from .steps.affinity import rrf_scores

BASELINES = ("cosine", "bm25", "hybrid", "full")


def _order(scores: np.ndarray) -> np.ndarray:
    """All indices by score, descending; ties to the lower index."""
    return np.lexsort((np.arange(len(scores)), -scores))


def _top(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the k largest scores; ties to the lower index."""
    return [int(i) for i in _order(scores)[:k]]


def cosine_topk(ctx: BankContext, z: np.ndarray, k: int) -> list[int]:
    return _top(ctx.bank.unit_vecs.astype(np.float64) @ z, k)


def bm25_topk(ctx: BankContext, question: str, k: int) -> list[int]:
    return _top(ctx.bm25.scores(question), k)


def hybrid_topk(ctx: BankContext, question: str, z: np.ndarray, k: int, k_rrf: int = 60) -> list[int]:
    return _top(rrf_scores(ctx, question, z, k_rrf), k)


def full_context(ctx: BankContext) -> list[int]:
    return list(range(ctx.bank.n_units))


def ranking(method: str, ctx: BankContext, question: str, z: np.ndarray, k_rrf: int = 60) -> np.ndarray:
    """Every unit of the bank in ``method``'s order (full context: source order)."""
    if method == "cosine":
        return _order(ctx.bank.unit_vecs.astype(np.float64) @ z)
    if method == "bm25":
        return _order(ctx.bm25.scores(question))
    if method == "hybrid":
        return _order(rrf_scores(ctx, question, z, k_rrf))
    if method == "full":
        return np.arange(ctx.bank.n_units)
    raise ValueError(f"unknown baseline {method!r}; choose from {', '.join(BASELINES)}")


def take_within_tokens(order, costs, unit_thread: np.ndarray, token_budget: int, fill: str = "skip",
                       cap: int | None = None) -> list[int]:
    """Units of ``order`` (ranked) while they fit ``token_budget`` under the additive ``costs``
    (``select.workspace.TokenCosts``; a thread's heading, if any, paid with its first unit): a unit
    that would overflow is skipped (``fill="skip"``) or ends the list (``"stop"``); at most
    ``cap`` units (None: no cap)."""
    from .steps.greedy import marginal_cost

    if fill not in ("skip", "stop"):
        raise ValueError(f"fill must be 'skip' or 'stop' (got {fill!r})")
    room = float(token_budget)
    paid: set[int] = set()
    out: list[int] = []
    for u in order:
        if cap is not None and len(out) >= cap:
            break
        u = int(u)
        t = int(unit_thread[u])
        c = float(marginal_cost(costs.unit[u], costs.heading[t], t in paid))
        if c <= room:
            out.append(u)
            room -= c
            paid.add(t)
        elif fill == "stop":
            break
    return out


def baseline_units(method: str, ctx: BankContext, question: str, z: np.ndarray, cfg, params=None,
                   keep: np.ndarray | None = None) -> list[int]:
    """The units ``method`` (one of :data:`BASELINES`) gives for a query with ``params`` (a
    ``QueryParams``: its ``budget``, ``token_budget`` and ``fill``; None = the defaults), in rank
    order; see the module docstring. ``cfg`` (the method) is not read: the rankings use their
    standard constants.
    Full context without a token budget is the whole bank.

    ``keep``: a ``[N]`` bool unit mask (a filter's): the ranking is over the bank restricted to
    the units it keeps (``select.restrict``: the hybrid's ranks among them, BM25 with the bank's
    corpus statistics), so the budget is spent on passing units only; ids are the bank's."""
    from .params import QueryParams

    if keep is not None:
        from .restrict import restrict

        keep = np.asarray(keep, dtype=bool)
        if not keep.any():
            return []
        r = restrict(ctx, keep)
        return [int(r.units[u]) for u in baseline_units(method, r, question, z, cfg, params)]

    qp = params or QueryParams()
    if qp.token_budget is None:
        return full_context(ctx) if method == "full" else [int(u) for u in
                                                           ranking(method, ctx, question, z)[:qp.budget]]
    from .workspace import fit_to_tokens

    order = ranking(method, ctx, question, z)
    costs = ctx.token_costs("none")
    units = take_within_tokens(order, costs, ctx.bank.unit_thread, qp.token_budget, qp.fill, qp.budget)
    return fit_to_tokens(ctx.bank, units, qp.token_budget, "none", costs=costs)
