"""Filters inside selection: a per-query boolean mask on the bank's units, applied *before*
selection, and the bank it stands for. One home: the mask of a filter over a bank
(:func:`unit_mask`), the restricted bank that defines what a mask means (:func:`restrict`), and
the rule that hides a thread's head once one of its units fails (``workspace.partial_threads``, the
rendering's).

**What a filter means.** Selecting with a mask equals selecting over the bank *restricted* to the
passing units, and :func:`restrict` builds that bank; the reference (``select_reference(...,
keep=)``) and the baselines select over it, and every fast path of the engine is tested to pick
the same unit ids (``tests/select/agreement/test_masks.py``). The restricted bank is the bank as
*built*, less the failing units; what the build fixed stays, what a query computes is computed over
the passing units only:

* **units**: the passing units, in order. A failing unit is never a seed, a candidate, a pick, a
  BM25 hit or a context neighbour of the ``learned`` affinity (its slot counts as none), and no
  rank or maximum of the affinity (``rrf``, ``learned``, ``fused``'s BM25 maximum) sees it;
* **threads**: a thread with at least one passing unit keeps those units, its head vector and its
  head kind (the head summarizes the thread as built: head seeds read it, and the thread graph was
  built from it). Its head *text* is hidden (empty) once one of its units fails, so no heading
  gist and no ``threads`` entry of a response shows a head that may quote a failing turn. A
  thread whose units all fail is gone, with its edges: the thread graph is the subgraph the kept
  threads induce (edge weights as built), so propagation never passes through it and it never
  takes a place of the neighbourhood cap;
* **build-time statistics stay the bank's**: BM25's corpus statistics (idf, average length over
  every unit), each unit's position in its thread, in-thread distance ``d_in`` and cosine to its
  head, its temporal flag and date, its restatement group; the token costs of units and headings
  and the heading runs (an upper bound of the rendered workspace either way); a unit view's
  support links among kept units. A search engine does not re-index per filter either: these are
  properties of the bank, and recomputing them per query would leak nothing less and cost a
  build;
* **everything the method computes per query** is over the passing units: affinity ranks and
  normalizations, best-unit seeds, propagation and the cap, the candidates U_q, the bridge feature
  (best cosine to a candidate of another thread), B_q = min(B, |U_q|), K, J, the greedy and the
  token knapsack. The budget is spent on passing units only: never filled, then cut.

A derived unit of a unit view (a fact, a profile section: ``store.view.LayerUnit``) has no
metadata of its own: it passes when every turn behind it (``cited_turns``) passes, so a fact
never shows what a failing turn said.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..data.filters import Filter, MetaColumns, parse_filter
from ..store.bank import Bank
from ..store.turn_columns import TurnColumns, field_of
from .context import BankContext
from .lexical import BM25Index
from .steps.relevance import RelevanceStatic
from .workspace import partial_threads


# ----------------------------------------------------------------------------------------------
# masks
# ----------------------------------------------------------------------------------------------
def meta_columns(bank: Bank) -> MetaColumns:
    """The metadata of ``bank``'s turns as filter columns (derived units of a view: none)."""
    t = bank.turns
    if isinstance(t, TurnColumns):  # its rows are plain turns: their metadata read from the columns
        return MetaColumns(field_of(t[:t.n_rows], "metadata") + [
            getattr(x, "metadata", None) if getattr(x, "layer", "turns") == "turns" else None for x in t.tail])
    return MetaColumns([getattr(t, "metadata", None) if getattr(t, "layer", "turns") == "turns" else None
                        for t in bank.turns])


def unit_mask(bank: Bank, where, cols: MetaColumns | None = None) -> np.ndarray | None:
    """``[N]`` bool: the units of ``bank`` that pass the filter ``where`` (a :class:`Filter` or its
    JSON; ``cols``: :func:`meta_columns` of ``bank`` when the caller keeps them), or None when there
    is no filter. A fact or profile section of a view passes when all the turns behind it pass
    (one with none behind it: when empty metadata passes)."""
    flt = parse_filter(where)
    if flt is None:
        return None
    m = flt.mask(cols if cols is not None else meta_columns(bank))
    t = bank.turns
    layered = [t.n_rows + i for i, x in enumerate(t.tail) if getattr(x, "layer", "turns") != "turns"] \
        if isinstance(t, TurnColumns) else [i for i, x in enumerate(t) if getattr(x, "layer", "turns") != "turns"]
    if layered:
        passed = {t.turn_id for t, ok in zip(bank.turns, m) if ok and getattr(t, "layer", "turns") == "turns"}
        empty = flt.matches(None)
        for i in layered:
            behind = bank.turns[i].cited_turns
            m[i] = all(c in passed for c in behind) if behind else empty
    return m


def as_mask(keep, n: int, where: str = "mask") -> np.ndarray | None:
    """``keep`` as a ``[n]`` bool array, or None when it is None or keeps every unit (no mask:
    the unmasked path); ``ValueError`` for another length."""
    if keep is None:
        return None
    k = np.asarray(keep, dtype=bool)
    if k.shape != (n,):
        raise ValueError(f"{where}: a unit mask of shape {k.shape} for a bank of {n} units")
    return None if k.all() else k


# ----------------------------------------------------------------------------------------------
# the restricted bank
# ----------------------------------------------------------------------------------------------
class _SlicedBM25:
    """The bank's BM25 (its corpus statistics) read at the kept units."""

    def __init__(self, full: BM25Index, units: np.ndarray):
        self.full, self.units = full, units
        self.vocab, self.n = full.vocab, len(units)

    def scores(self, query: str) -> np.ndarray:
        return self.full.scores(query)[self.units]


@dataclass
class RestrictedContext(BankContext):
    """A :class:`BankContext` over the restricted bank (module docstring) whose build-time
    statistics are the full bank's (``full``) at the kept units (``units``, their full indices)."""

    full: BankContext = field(default=None, repr=False, compare=False)
    units: np.ndarray = field(default=None, repr=False, compare=False)
    threads: np.ndarray = field(default=None, repr=False, compare=False)
    """The kept threads' full indices."""

    def token_costs(self, headings: str = "date"):
        from .workspace import TokenCosts

        if headings not in self._token_costs:
            c = self.full.token_costs(headings)
            run = None
            if c.heading_run is not None:  # a run's first kept thread stands for it (same heading cost)
                full_run = c.heading_run[self.threads]
                _, first = np.unique(full_run, return_index=True)
                rep = dict(zip(full_run[first].tolist(), first.tolist()))
                run = np.array([rep[r] for r in full_run.tolist()], dtype=np.int64)
            self._token_costs[headings] = TokenCosts(c.unit[self.units], c.heading[self.threads], c.headings,
                                                     c.bounded, run)
        return self._token_costs[headings]

    def support_floor(self, cand: np.ndarray, cfg) -> np.ndarray | None:
        return self.full.support_floor(self.units[cand], cfg)

    def in_thread_dist(self, units: np.ndarray, c_head: float, c_step: float) -> np.ndarray:
        return self.full.in_thread_dist(self.units[np.asarray(units, dtype=np.int64)], c_head, c_step)


def restrict_bank(bank: Bank, keep: np.ndarray) -> tuple[Bank, np.ndarray, np.ndarray]:
    """``(restricted bank, kept units, kept threads)`` (full indices, ascending) of the module
    docstring; ``ValueError`` when no unit passes (there is no bank then)."""
    keep = np.asarray(keep, dtype=bool)
    units = np.flatnonzero(keep)
    if not len(units):
        raise ValueError(f"bank {bank.bank_id!r}: no unit passes the filter")
    ut = bank.unit_thread
    per = np.bincount(ut[units], minlength=bank.n_threads)
    threads = np.flatnonzero(per)
    partial = per[threads] < np.diff(bank.thread_offsets)[threads]
    tmap = np.full(bank.n_threads, -1, dtype=np.int64)
    tmap[threads] = np.arange(len(threads))
    e = (tmap[bank.edge_src] >= 0) & (tmap[bank.edge_dst] >= 0)
    sup_src = sup_dst = None
    if bank.support_src is not None:
        umap = np.full(bank.n_units, -1, dtype=np.int64)
        umap[units] = np.arange(len(units))
        s = (umap[bank.support_src] >= 0) & (umap[bank.support_dst] >= 0)
        sup_src, sup_dst = umap[bank.support_src[s]], umap[bank.support_dst[s]]
    sub = Bank(bank.bank_id, [bank.turns[i] for i in units.tolist()],
               np.concatenate([[0], np.cumsum(per[threads])]).astype(np.int64),
               ["" if p else bank.heads[j] for j, p in zip(threads.tolist(), partial.tolist())],
               [bank.head_kind[j] for j in threads.tolist()], bank.unit_vecs[units], bank.head_vecs[threads],
               tmap[bank.edge_src[e]], tmap[bank.edge_dst[e]], bank.edge_w[e], bank.edge_kind[e], bank.encoder_id,
               build_config=bank.build_config, units=bank.units, support_src=sup_src, support_dst=sup_dst)
    return sub, units, threads


def restrict(ctx: BankContext, keep: np.ndarray) -> RestrictedContext:
    """The context of the bank restricted to the units ``keep`` passes (module docstring)."""
    sub, units, threads = restrict_bank(ctx.bank, keep)
    umap = np.full(ctx.bank.n_units, -1, dtype=np.int64)
    umap[units] = np.arange(len(units))
    adj: list[list] = [[] for _ in range(sub.n_threads)]
    for s, d, w, k in zip(sub.edge_src, sub.edge_dst, sub.edge_w, sub.edge_kind):
        adj[int(s)].append((int(d), float(w), int(k)))
    st = ctx.relevance
    near = lambda a: np.where(a >= 0, umap[np.maximum(a, 0)], -1)  # noqa: E731 - a failing neighbour is none
    rel = RelevanceStatic(st.speaker[units], st.speakers, near(st.prev[units]), near(st.next[units]),
                          st.temporal[units], st.time[units], st.words[units])
    return RestrictedContext(sub, sub.unit_thread, ctx.position[units], ctx.head_sim[units], ctx.temporal[units],
                             _SlicedBM25(ctx.bm25, units), adj, ctx.attrs[units], rel, full=ctx, units=units,
                             threads=threads)


MASKS_PER_BANK = 64
"""Masks a :func:`filter_masks` cache keeps per bank (the most recently used filters: a key's
bound filter, a user's scope), each ``[N]`` bool."""


def filter_masks(banks: list[Bank], where, cache: dict | None = None) -> list[np.ndarray | None]:
    """Each query's unit mask (:func:`as_mask`: None for no filter or one every unit passes) for
    ``banks[i]`` and ``where`` (None, one filter for all, or one per query). Each distinct filter
    object is parsed once and each (bank, filter) evaluated once per call; ``cache``: a dict the
    caller keeps (per bank object: its metadata columns and its last :data:`MASKS_PER_BANK` masks),
    so a filter that comes back costs a lookup. The masks are read-only (shared between queries)."""
    n = len(banks)
    per_query = isinstance(where, (list, tuple))
    flts = where if per_query else [where] * n
    if len(flts) != n:
        raise ValueError(f"{n} queries but {len(flts)} filters")
    parsed: dict = {}
    memo: dict = {}
    out = []
    for i, (b, f) in enumerate(zip(banks, flts)):
        if id(f) not in parsed:
            parsed[id(f)] = (f, parse_filter(f, f"where[{i}]" if per_query else "where"))
        f = parsed[id(f)][1]
        if f is None:
            out.append(None)
            continue
        key = (id(b), f.key)
        if key not in memo:
            memo[key] = _cached_mask(b, f, cache)
        out.append(memo[key])
    return out


def _cached_mask(b: Bank, f: Filter, cache: dict | None) -> np.ndarray | None:
    if cache is None:
        return as_mask(unit_mask(b, f), b.n_units)
    hit = cache.get(b.bank_id)
    if hit is None or hit[0] is not b:  # a new or replaced bank: new columns, no masks
        hit = cache[b.bank_id] = (b, meta_columns(b), {})
    masks = hit[2]
    if f.key in masks:
        masks[f.key] = m = masks.pop(f.key)  # most recently used last
        return m
    m = as_mask(unit_mask(b, f, hit[1]), b.n_units)
    if m is not None:
        m.setflags(write=False)
    masks[f.key] = m
    while len(masks) > MASKS_PER_BANK:
        masks.pop(next(iter(masks)))
    return m


__all__ = ["Filter", "RestrictedContext", "as_mask", "filter_masks", "meta_columns", "partial_threads", "restrict",
           "restrict_bank", "unit_mask"]
