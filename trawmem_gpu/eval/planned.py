"""Planned TrawMem: bridge retrieval by planning, TrawMem's selection over an LLM's searches.

A multi-hop question's second piece of evidence is often far from the question itself (by
cosine and by BM25); a search that names it is not. Planned TrawMem asks TriMem's planner
(``select.trimem.plan``: the target-query step, the question always first, fallbacks per question) for
one to three searches per question and lets the selection engine pick a workspace for each:

* **Stage 1.** Every plan's extra searches are encoded in one encoder call, and the engine runs
  once over all the searches of the batch (the question's own vector is the caller's). Each
  question's picks are merged into one workspace by :func:`merge_picks`: round robin over its
  searches in pick order (each round the question's own pick first), a unit taken once, and
  only while the workspace still fits the query's B and T as the engine pays them (a unit that
  would overflow T is skipped, the merge goes on; the costs are the engine's own
  ``select.workspace.TokenCosts`` under its headings, read by ``TokenCosts.cost``); the merged
  workspace is checked against the rendering (``select.workspace.fit_to_tokens``) as the engine's is.
  With a single search per question (no LLM, or the planner fell back) the merge is exactly the
  engine's own workspace.
* **Stage 2** (``follow_up=True``): "follow-up from the anchors". One more structured LLM call
  per question with the question and the text of its stage-1 workspace asks for at most two
  searches for evidence the workspace still lacks (``select.trimem.plan.follow_up_queries``, the prompt
  ``PromptSet.follow_up``); they are encoded in one call and selected by one more engine call,
  and their picks fill what the first stage left: stage 1 stops at ``1 - follow_up_share`` of B
  and T, the follow-ups' picks (round robin) fill up to the full B and T, then stage 1's picks
  fill what is still left. A question without follow-ups (the model named none, or its reply
  was malformed after one retry: counted in :attr:`PlannedPick.follow_up_fallback`) keeps its
  stage-1 workspace at the full budget.

Nothing here was measured with a real model (docs/method.md, "Planned TrawMem").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ..dictconfig import with_keywords
from ..errors import ConfigError
from ..select.client import run
from ..select.trimem.plan import QueryPlan, check_plans, follow_up_queries, plain_plan, plan_queries
from ..select.workspace import assemble, fit_to_tokens
from ..select.params import QueryParams

FOLLOW_UP_SHARE = 0.25
"""Share of B and T that stage 1 leaves to the follow-up searches (stage 2 on only)."""


@dataclass(frozen=True)
class PlannedPick:
    """One question's planned workspace."""

    units: list[int]
    """Unit indices into the engine's bank (its unit view), in merge order."""
    plan: QueryPlan
    """The planner's searches (the question first) and fallbacks."""
    follow_ups: tuple[str, ...] = ()
    """Stage 2's searches (empty without stage 2, or when the model named none)."""
    follow_up_fallback: bool = False
    """Stage 2 was asked and its reply was still malformed after one retry (or failed)."""
    sources: tuple[int, ...] = ()
    """Per unit, the search whose picks brought it in: an index into :attr:`searches`."""

    @property
    def searches(self) -> tuple[str, ...]:
        """Every search made: the plan's, then the follow-ups."""
        return self.plan.queries + self.follow_ups

    def to_dict(self) -> dict:
        """The plan as result files record it (``plan`` of a query's JSON, of an eval record)."""
        return {**self.plan.to_dict(), "follow_ups": list(self.follow_ups),
                "follow_up_fallback": self.follow_up_fallback, "sources": list(self.sources)}


def merge_picks(lists: Sequence[Sequence[int]], costs, unit_thread: np.ndarray, budget: Optional[int],
                token_budget: Optional[int], start: Sequence[int] = (), start_sources: Sequence[int] = (),
                first_source: int = 0) -> tuple[list[int], list[int]]:
    """``(units, sources)``: ``start`` (already in the workspace, with ``start_sources``) and then the
    units of ``lists`` (per search, in pick order) round robin, each once, while at most ``budget``
    units (None: no cap) and, with a ``token_budget``, ``costs.cost(units) <= token_budget``
    (``costs`` a ``select.workspace.TokenCosts``; a unit that would overflow is skipped). ``sources`` holds
    each new unit's list index plus ``first_source``."""
    units, src = [int(u) for u in start], [int(s) for s in start_sources]
    have = set(units)
    for rnd in range(max((len(x) for x in lists), default=0)):
        for k, picks in enumerate(lists):
            if budget is not None and len(units) >= budget:
                return units, src
            if rnd >= len(picks) or int(picks[rnd]) in have:
                continue
            u = int(picks[rnd])
            if token_budget is not None and costs.cost(units + [u], unit_thread) > token_budget:
                continue
            units.append(u)
            src.append(k + first_source)
            have.add(u)
    return units, src


def _engine_picks(engine, bank_ids: Sequence[str], searches: Sequence[Sequence[str]], first_vecs, encode, qp,
                  dates, masks=None) -> list[list[list[int]]]:
    """Per question, the engine's picks of each of its searches: the searches not given a vector
    (``first_vecs[i]`` is search 0's of question ``i`` when given) encoded in one call, then one
    engine call over them all (each search with its question's unit mask, ``masks[i]``)."""
    skip = 0 if first_vecs is None else 1
    extra = list(dict.fromkeys(s for ss in searches for s in ss[skip:]))
    vec = {}
    if extra:
        V = np.asarray(encode(extra), dtype=np.float32)
        if V.shape[0] != len(extra):
            raise ValueError(f"encode gave {V.shape[0]} vectors for {len(extra)} searches")
        vec = {s: V[j] for j, s in enumerate(extra)}
    ids, texts, rows, ds, owner, ms = [], [], [], [], [], []
    for i, ss in enumerate(searches):
        for k, s in enumerate(ss):
            ids.append(bank_ids[i])
            texts.append(s)
            rows.append(first_vecs[i] if k < skip else vec[s])
            ds.append(None if dates is None else dates[i])
            ms.append(None if masks is None else masks[i])
            owner.append(i)
    out: list[list[list[int]]] = [[] for _ in searches]
    if not ids:
        return out
    picks = run(engine, ids, texts, np.stack(rows).astype(np.float32), qp, ds, None if masks is None else ms)
    for i, p in zip(owner, picks):
        out[i].append(p)
    return out


def _shrunk(qp: QueryParams, share: float) -> tuple[Optional[int], Optional[int]]:
    """Stage 1's (B, T) when ``share`` of them is left to the follow-ups (each at least 1)."""
    b = None if qp.budget is None else max(1, qp.budget - round(qp.budget * share))
    t = None if qp.token_budget is None else max(1, qp.token_budget - round(qp.token_budget * share))
    return b, t


@dataclass(frozen=True)
class PlanOptions:
    """How :func:`planned_select` plans its searches and runs its second stage."""

    llm: object = None
    """The planner LLM (None: the question is the only search, unless ``plans`` are given)."""
    prompts: object = None
    """The planner's ``ingest.layers.prompts.PromptSet`` (None: the default prompts)."""
    follow_up: bool = False
    """Run stage 2: one more LLM call per question asks for the evidence still missing (needs ``llm``)."""
    follow_up_share: float = FOLLOW_UP_SHARE
    """The share of B and T left to stage 2's searches, in [0, 1)."""


def planned_select(engine, items: Sequence[tuple[str, str]], Z, params: Optional[QueryParams] = None,
                   options: Optional[PlanOptions] = None, *, encode: Callable[[list[str]], np.ndarray],
                   plans: Optional[Sequence[QueryPlan]] = None, dates=None, masks=None, **kw) -> list[PlannedPick]:
    """Planned TrawMem's workspaces (module docstring) for ``items`` (``(bank_id, question)``; ``Z``
    their question vectors, ``[Q, d]``), each with the one ``params`` (None = the defaults), over a
    ``SelectionEngine`` ``engine``. ``encode(texts)`` gives query vectors for the other searches.
    ``plans`` (one per item, the question first) are used as given, else made by ``llm`` (None:
    the question is the only search, and the result is the engine's own). ``follow_up`` runs stage
    2 (needs ``llm``); ``dates``: each item's "now" (or None), as the engine takes them; ``masks``:
    each item's unit mask (a filter's, ``engine.masks_of``) or None, for every search of it.
    ``options``: :class:`PlanOptions` (``llm``, ``prompts``, ``follow_up``, ``follow_up_share``), or
    its fields as keywords."""
    o = with_keywords("planned_select", PlanOptions, options, kw)
    llm, prompts, follow_up, follow_up_share = o.llm, o.prompts, o.follow_up, o.follow_up_share
    qp = QueryParams() if params is None else params
    if not isinstance(qp, QueryParams):
        raise ConfigError(f"`params` must be one QueryParams (got {type(qp).__name__})")
    if follow_up and llm is None:
        raise ConfigError("`follow_up` needs an `llm` (the planner's)")
    if not 0.0 <= float(follow_up_share) < 1.0:
        raise ConfigError(f"`follow_up_share` must lie in [0, 1) (got {follow_up_share!r})")
    items = list(items)
    Z = np.asarray(Z, dtype=np.float32).reshape(len(items), -1) if len(items) else np.zeros((0, 1), np.float32)
    if dates is not None and len(dates) != len(items):
        raise ConfigError(f"{len(items)} items but {len(dates)} `dates`")
    qs = [q for _, q in items]
    if plans is None:
        plans = plan_queries(qs, llm, prompts, key_info=False) if llm is not None else [plain_plan(q) for q in qs]
    plans = check_plans(plans, qs)
    if not items:
        return []
    bids = [b for b, _ in items]
    snap = engine.snapshot  # the banks (unit views) and token costs the engine pays T with
    info = [snap.infos[snap.bank_index(b)] for b in bids]
    headings = engine.cfg.headings
    first = _engine_picks(engine, bids, [p.queries for p in plans], Z, encode, qp, dates, masks)
    keep = masks or [None] * len(items)

    def merged(i, lists, budget, token_budget, **kw):
        return merge_picks(lists, info[i].costs, info[i].bank.unit_thread, budget, token_budget, **kw)

    full = [merged(i, first[i], qp.budget, qp.token_budget) for i in range(len(items))]
    out = [PlannedPick(u, p, sources=tuple(s)) for (u, s), p in zip(full, plans)]
    if follow_up:
        b1, t1 = _shrunk(qp, float(follow_up_share))
        part = [merged(i, first[i], b1, t1) for i in range(len(items))]
        texts = [assemble(info[i].bank, qs[i], part[i][0], headings, keep[i]).render() for i in range(len(items))]
        fus = follow_up_queries(qs, texts, [p.queries for p in plans], llm, prompts)
        second = _engine_picks(engine, bids, [f or () for f in fus], None, encode, qp, dates, masks)
        for i, (f, p) in enumerate(zip(fus, plans)):
            if not f:
                out[i] = PlannedPick(out[i].units, p, follow_up_fallback=f is None, sources=out[i].sources)
                continue
            u, s = merged(i, second[i], qp.budget, qp.token_budget, start=part[i][0], start_sources=part[i][1],
                          first_source=len(p.queries))
            u, s = merged(i, first[i], qp.budget, qp.token_budget, start=u, start_sources=s)
            out[i] = PlannedPick(u, p, tuple(f), sources=tuple(s))
    if qp.token_budget is not None:  # the check against the rendering, as the engine's own
        for i, pk in enumerate(out):
            kept = fit_to_tokens(info[i].bank, pk.units, qp.token_budget, headings, costs=info[i].costs, keep=keep[i])
            if len(kept) < len(pk.units):
                out[i] = PlannedPick(kept, pk.plan, pk.follow_ups, pk.follow_up_fallback, pk.sources[:len(kept)])
    return out


def planner(**kw) -> Callable:
    """:func:`planned_select` with ``kw`` (``llm``, ``plans``, ``encode``, ``follow_up``, ...) as the
    engine client's ``planner`` (``select.client.select``), which hands it the engine, the
    requests, their vectors, params, dates and masks."""
    def plan(engine, bank_ids, questions, Z, params, dates, masks):
        return planned_select(engine, list(zip(bank_ids, questions)), Z, params, dates=dates, masks=masks, **kw)

    return plan


def plan_summary(picks: Sequence[PlannedPick], llm=None, prompts=None) -> dict:
    """Counts over a batch's plans, for result files: planned, fallbacks, follow-ups."""
    from ..ingest.layers.prompts import PromptSet

    return {"plan_llm": llm.describe() if llm is not None else None,
            "prompts": {k: v for k, v in (prompts or PromptSet()).describe().items()
                        if k in ("target_query", "follow_up")},
            "planned": sum(p.plan.planned for p in picks),
            "plan_fallbacks": sum(bool(p.plan.fallback) for p in picks),
            "follow_ups": sum(bool(p.follow_ups) for p in picks),
            "follow_up_searches": sum(len(p.follow_ups) for p in picks),
            "follow_up_fallbacks": sum(p.follow_up_fallback for p in picks)}
