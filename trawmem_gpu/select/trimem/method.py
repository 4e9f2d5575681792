"""``--method trimem`` in the harnesses (query, eval, score, sweep, serve): plans, ranks, and the
units of the bank's unit view that the workspace shows.

A :class:`TriMemRanker` holds one bank's retrieval index (``select.trimem.retrieve``) and its unit view
(``store.view.unit_view`` over the turns, the facts and, when the bank has them, the profiles),
so that the workspace is the view's, rendered like every baseline's (``headings="none"``: each
line with its id and date; a fact with the turns it cites). :func:`trimem_select` serves a batch
of questions: the plans in two batched LLM calls (none without an LLM), every extra search
encoded in one call, then per question the priority ids mapped to view units and taken as a
baseline takes its ranking: the first B at a unit budget, or under a token budget T
(``select.baselines.take_within_tokens``, then ``select.workspace.fit_to_tokens``), at most B units when
B is also given. A B above what is listed (``--budget 4096``) shows everything: the K facts,
their turns and the sections, the paper's setting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ...errors import ConfigError
from ...store.bursts import unit_members
from ...store.view import unit_view
from ..baselines import take_within_tokens
from ..context import BankContext
from ...store.bank import Bank
from .plan import QueryPlan, check_plans, plain_plan, plan_queries
from ...ingest.layers.prompts import PromptSet
from .retrieve import TOP_K, TriMemIndex, priority_ids

HEADINGS = "none"
"""How a TriMem workspace is rendered (like the baselines: no thread headings)."""


def trimem_units_of(bank: Bank) -> tuple[str, ...]:
    """The layers a TriMem view of ``bank`` takes: turns and facts, and profiles when it has them."""
    if bank.is_view:
        raise ConfigError(f"method trimem: bank {bank.bank_id!r} is already a unit view; give the stored bank")
    if not bank.facts:
        source = bank.layer_sources.get("facts")
        if source is None:
            raise ConfigError(f"method trimem: bank {bank.bank_id!r} has no facts (build the bank with `facts` "
                              f"locomo or llm)")
        whys = ((bank.stats or {}).get("llm_fallbacks") or {}).get("facts") or {}
        why = "; ".join(f"{n} x {w}" for w, n in sorted(whys.items(), key=lambda x: -x[1])[:3])
        raise ConfigError(f"method trimem: bank {bank.bank_id!r} has no facts: its `facts` {source} layer kept none"
                          + (f" (refused or failed: {why}; `trawmem info` lists them)" if why else "")
                          + "; use another method, or rebuild the facts with a stronger model")
    return ("turns", "facts", "profiles") if bank.profiles else ("turns", "facts")


@dataclass
class TriMemRanker:
    """One bank ready for TriMem retrieval."""

    bank: Bank
    view: Bank
    ctx: BankContext
    index: TriMemIndex
    pos: dict

    @classmethod
    def of(cls, bank: Bank) -> "TriMemRanker":
        view = unit_view(bank, trimem_units_of(bank))
        idx = TriMemIndex.of(bank.facts, bank.fact_vecs, bank.turns, bank.profiles)
        pos = {m: i for i, t in enumerate(view.turns) for m in unit_members(t)}  # a burst: each member names it
        return cls(bank, view, BankContext.of(view), idx, pos)

    def plain_units(self, question: str, z: np.ndarray, params=None) -> list[int]:
        """:meth:`units` without planning: the question (vector ``z``) is the only search."""
        return self.units(plain_plan(question), np.asarray(z)[None, :], params)

    def units(self, plan: QueryPlan, query_vecs: np.ndarray, params=None, k: int = TOP_K,
              keep: np.ndarray | None = None) -> list[int]:
        """View unit indices shown for ``plan`` (its searches' vectors ``query_vecs``), in priority
        order; ``keep``: a filter's unit mask over the view (``select.restrict.unit_mask``): only
        passing facts are ranked, only passing units shown."""
        from ..params import QueryParams
        from ..workspace import fit_to_tokens

        qp = params or QueryParams()
        ids = None if keep is None else {m for t, ok in zip(self.view.turns, keep) if ok for m in unit_members(t)}
        order = list(dict.fromkeys(self.pos[i] for i in priority_ids(self.index, plan, query_vecs, k=k, keep=ids)
                                   if i in self.pos and (ids is None or i in ids)))
        if qp.token_budget is None:
            return order[:qp.budget]
        costs = self.ctx.token_costs(HEADINGS)
        units = take_within_tokens(order, costs, self.view.unit_thread, qp.token_budget, qp.fill, qp.budget)
        return fit_to_tokens(self.view, units, qp.token_budget, HEADINGS, costs=costs)


class TriMemRankers(dict):
    """bank id -> :class:`TriMemRanker`, made on first use from ``banks`` (a dict of stored banks)."""

    def __init__(self, banks: dict):
        super().__init__()
        self.banks = banks

    def __missing__(self, bank_id: str) -> TriMemRanker:
        r = self[bank_id] = TriMemRanker.of(self.banks[bank_id])
        return r

    @classmethod
    def prepared(cls, banks: dict) -> "TriMemRankers":
        """Rankers of every bank made now, token costs counted (setup outside any query's timing)."""
        out = cls(banks)
        for bid in banks:
            out[bid].ctx.token_costs(HEADINGS)
        return out


@dataclass
class TriMemPick:
    """One question's TriMem result: the view to render and its units."""

    view: Bank
    units: list[int]
    plan: QueryPlan


def trimem_select(rankers: TriMemRankers, items: Sequence[tuple[str, str]], Z: np.ndarray, params=None, *,
                  encode: Callable[[list[str]], np.ndarray], llm=None, prompts: Optional[PromptSet] = None,
                  plans: Optional[Sequence[QueryPlan]] = None, masks=None) -> list[TriMemPick]:
    """TriMem's workspace units for ``items`` (``(bank_id, question)``; ``Z`` their question
    vectors); ``encode(texts)`` gives query vectors for the extra searches (module docstring);
    ``masks``: each item's unit mask over its bank's view (a filter's) or None."""
    qs = [q for _, q in items]
    if plans is None:
        plans = plan_queries(qs, llm, prompts) if llm is not None else [plain_plan(q) for q in qs]
    else:
        plans = check_plans(plans, qs)
    extra = list(dict.fromkeys(s for p in plans for s in p.queries[1:]))
    V = encode(extra) if extra else np.zeros((0, Z.shape[1]), np.float32)
    vec_of = {s: V[i] for i, s in enumerate(extra)}
    out = []
    for (bid, _), z, p, keep in zip(items, Z, plans, masks or [None] * len(items)):
        r = rankers[bid]
        qv = np.stack([z] + [vec_of[s] for s in p.queries[1:]])
        out.append(TriMemPick(r.view, r.units(p, qv, params, keep=keep), p))
    return out


class TriMemEngine:
    """The selection engine's serving interface (``select_units``, ``prepare_bank``,
    ``replace_bank``, ``remove_bank``, ``purge``, ``wipe``, ``nbytes``) over TriMem rankers, for ``serve
    --method trimem``: stored banks in, view units out (the question is the only search; a
    server has no planning LLM). :meth:`view` is the bank the picks index, which the workspace is
    assembled from. Writers are serialized by the caller (the service's batch worker)."""

    threads = 1
    device = "cpu"

    def __init__(self, banks: Sequence[Bank], cfg=None):
        self.rankers = TriMemRankers.prepared({b.bank_id: b for b in banks})

    @property
    def bank_ids(self) -> list[str]:
        return list(self.rankers)

    def prepare_bank(self, bank: Bank) -> TriMemRanker:
        r = TriMemRanker.of(bank)
        r.ctx.token_costs(HEADINGS)
        return r

    def replace_bank(self, bank: Bank, prepared: Optional[TriMemRanker] = None) -> None:
        self.rankers.banks[bank.bank_id] = bank
        self.rankers[bank.bank_id] = prepared if prepared is not None and prepared.bank is bank \
            else self.prepare_bank(bank)

    def remove_bank(self, bank_id: str) -> None:
        del self.rankers[bank_id]
        del self.rankers.banks[bank_id]

    def purge(self) -> None:
        """Nothing to purge: a replaced bank's ranker is dropped whole."""

    def wipe(self) -> None:
        """Nothing to wipe: the rankers hold no preallocated table buffers."""

    def view(self, bank_id: str) -> Bank:
        return self.rankers[bank_id].view

    def select_units(self, bank_ids: list[str], questions: list[str], Z, dates=None, params=None,
                     masks=None) -> list[list[int]]:
        from ..params import QueryParams

        ps = params if isinstance(params, (list, tuple)) else [params or QueryParams()] * len(bank_ids)
        for b in bank_ids:
            if b not in self.rankers.banks:
                raise KeyError(b)
        Z = np.asarray(Z, dtype=np.float32)
        ks = masks or [None] * len(bank_ids)
        return [self.rankers[b].units(plain_plan(q), np.asarray(z)[None, :], p, keep=k)
                for b, q, z, p, k in zip(bank_ids, questions, Z, ps, ks)]

    def masks_of(self, bank_ids: list[str], where=None, masks=None) -> list | None:
        """Each query's unit mask over its bank's view from ``where`` (``SelectionEngine.masks_of``)."""
        from ..restrict import filter_masks

        if where is None and masks is None:
            return None
        if masks is not None:
            raise ValueError("masks: give the TriMem engine a filter (where), not unit masks")
        out = filter_masks([self.view(b) for b in bank_ids], where)
        return None if all(m is None for m in out) else out

    def nbytes(self) -> int:
        return int(sum(r.view.unit_vecs.nbytes + r.index.fact_vecs.nbytes for r in self.rankers.values()))
