"""Reference TrawMem selection for one query over one bank: Section 4.2 step by step, in NumPy.

This is the statement of the math that the batched engine must reproduce, composed from the
steps' references (``steps/``) and the objective (``objective.py``): affinity alpha over the bank
(step 3, read by the seeds) -> seeds r0 (1) -> propagation and the capped neighbourhood (2) ->
candidates U_q (3) -> demand delta, unit features, rho, phi (4) -> costs C (5) -> B_q and
priorities pi (6) -> J and its greedy maximization with the early stop (7); under a token budget
the cost-aware greedy on the workspace's token costs, then the check against T (``select.workspace.fit_to_tokens``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from .config import SelectConfig
from .context import BankContext
from .params import QueryParams
from .objective import ModularInputs, Objective, coverage_weights, date_seconds, modular_gain, support_kernel
from .steps import affinity as step3a
from .steps import candidates as step3
from .steps import propagation as step2
from .steps import roles as step4
from .steps import seeds as step1
from .steps.greedy import TokenBudget, config_rule, cost_aware_greedy
from .steps.priority import effective_budget, head_distances, priorities
from .steps.roles import demand_mix, role_params  # noqa: F401 - re-exported (head.model, tests)
from .text_features import demand_features
from .workspace import fit_to_tokens


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
    S: np.ndarray
    """[U, U] cosines between the candidates (float64)."""
    x: np.ndarray
    """[4] demand features x_q."""
    f: np.ndarray
    """[U, F] unit features in UNIT_FEATURES order."""
    graph_cost: np.ndarray
    """[T, U] d_q(T_j, v): head-graph distance plus in-thread distance."""
    attrs: np.ndarray
    """[U, A] the candidates' rows of ``terms.unit_attributes``."""


def localize(ctx: BankContext, question: str, z: np.ndarray, cfg: SelectConfig, params: QueryParams,
             now: datetime | None = None) -> Localized:
    """Steps 1-3, the unit features and the graph part of the costs for one query.

    ``cfg`` and ``params`` must already be ``resolved()``; ``now``: the query's date (the
    ``learned`` affinity reads it).
    """
    if not np.all(np.isfinite(z)):
        raise ValueError("query vector holds NaN or inf")
    z = np.asarray(z, dtype=np.float64)
    alpha_all = step3a.unit_affinity(ctx, z, question, cfg, date_seconds(now))
    r0 = step1.seed_scores(ctx, z, alpha_all, cfg)
    r_t = step2.neighbourhood(ctx, r0, cfg, params)
    threads = list(r_t)
    cand, lt = step3.candidates(ctx.bank, threads)
    alpha = alpha_all[cand]
    E = ctx.bank.unit_vecs[cand].astype(np.float64)
    S = E @ E.T
    rvec = np.array([r_t[j] for j in threads])
    f = step4.unit_features(ctx, cand, lt, alpha, rvec, S)
    Dh = head_distances(ctx, threads, cfg)
    d_in = ctx.in_thread_dist(cand, cfg.c_head, cfg.c_step)
    return Localized(threads, r_t, cand, lt, rvec, alpha, S, demand_features(question), f, Dh[:, lt] + d_in[None, :],
                     ctx.attrs[cand])


def select_reference(ctx: BankContext, question: str, z: np.ndarray, cfg: SelectConfig | None = None,
                     params: QueryParams | None = None, *, keep_internals: bool = False, head=None,
                     now: datetime | None = None, keep: np.ndarray | None = None) -> Selection:
    """Select the workspace units for one query (``z``: its unit-norm vector).

    :param cfg: the method (None = ``SelectConfig()``)
    :param params: what the query asks for: B, H, T (None = ``QueryParams()``)
    :param head: optional learned role head (see ``steps.roles.role_params``); None keeps the hand-set A, M
    :param now: the query's date ("now" for it: LongMemEval gives each question one); None = none
    :param keep: ``[N]`` bool unit mask (a filter's, ``select.restrict``): the selection over the bank
        restricted to the units it keeps (``restrict.restrict``, which defines what a mask means),
        its unit and thread ids mapped back to the bank's; None: no mask
    """
    if keep is not None:
        return _select_kept(ctx, question, z, cfg, params, keep_internals, head, now, keep)
    cfg = (cfg or SelectConfig()).resolved()
    qp = (params or QueryParams()).resolved(cfg)
    loc = localize(ctx, question, z, cfg, qp, now)
    delta, M, w = role_params(loc.x, cfg, head)                           # step 4: the query's demand
    rho, phi = step4.role_fit(loc.f, M, delta, cfg.T_R)                   # step 4: rho, phi
    U = len(loc.cand)
    Bq = effective_budget(qp.pool_budget, U)                             # step 6
    pi = priorities(loc.graph_cost, loc.rvec, loc.alpha, phi, Bq, w)      # steps 5-6
    K = support_kernel(loc.S, loc.lt[:, None] == loc.lt[None, :], cfg,    # step 7: J
                       ctx.support_floor(loc.cand, cfg))
    modular = modular_gain(ModularInputs(loc.alpha, loc.attrs, date_seconds(now)), w, cfg)
    obj = Objective(pi, K, rho, delta, modular, loc.lt, coverage_weights(w), attrs=loc.attrs,
                    alpha=loc.alpha)
    tokens = costs = None
    if qp.token_budget is not None:                                       # a knapsack on workspace tokens
        costs = ctx.token_costs(cfg.headings)
        run = costs.runs(loc.threads)  # threads ascending: a heading run's threads are consecutive
        first = np.concatenate([[True], run[1:] != run[:-1]]) if len(run) else np.zeros(0, dtype=bool)
        key = np.maximum.accumulate(np.where(first, np.arange(len(run)), 0)) if len(run) else run
        tokens = TokenBudget(qp.token_budget, costs.unit[loc.cand], costs.heading[loc.threads], cfg.knapsack_ratio,
                             key[loc.lt])
    picks, gains = cost_aware_greedy(obj, config_rule(cfg, qp.budget, U, tokens=tokens), lazy=cfg.greedy == "lazy")
    units = [int(loc.cand[i]) for i in picks]
    if qp.token_budget is not None:                                       # the rendering against T
        units = fit_to_tokens(ctx.bank, units, qp.token_budget, cfg.headings, costs=costs)
        gains = gains[:len(units)]
    sel = Selection(ctx.bank.bank_id, units, gains, loc.threads)
    if keep_internals:
        sel.candidates, sel.r_tilde, sel.pi, sel.rho, sel.delta = loc.cand, loc.r_tilde, pi, rho, delta
    return sel


def _select_kept(ctx, question, z, cfg, params, keep_internals, head, now, keep) -> Selection:
    """:func:`select_reference` with a unit mask: over the restricted bank, ids mapped back."""
    from .restrict import restrict

    keep = np.asarray(keep, dtype=bool)
    if keep.shape != (ctx.bank.n_units,):
        raise ValueError(f"keep: a unit mask of shape {keep.shape} for a bank of {ctx.bank.n_units} units")
    if not keep.any():
        return Selection(ctx.bank.bank_id, [], [], [])
    r = restrict(ctx, keep)
    sel = select_reference(r, question, z, cfg, params, keep_internals=keep_internals, head=head, now=now)
    sel.units = [int(r.units[u]) for u in sel.units]
    sel.threads = [int(r.threads[j]) for j in sel.threads]
    if sel.candidates is not None:
        sel.candidates = r.units[sel.candidates]
        sel.r_tilde = {int(r.threads[j]): v for j, v in sel.r_tilde.items()}
    return sel
