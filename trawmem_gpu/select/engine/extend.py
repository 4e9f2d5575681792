"""A grown bank's engine tables from the tables of the bank it grew from: only the new part computed.

An append (``ingest.update_bank``) keeps the old bank's first ``keep_threads`` threads as they are
(their units, heads and vectors; ``store.segments.Extension``) and re-segments the rest, which
starts at a session start. Every per-unit and per-thread table of
:func:`~trawmem_gpu.select.engine.bank_tables.build_bank` but the thread graph's is a function of the
unit's own thread (its units, head, texts and dates) or, for the few that look across threads
(a date heading merged with the thread before it, a unit's speaker index, the session neighbours),
of what came before; so the kept threads' rows are the old bank's, and only the new threads' rows
are computed, over the tail of the bank alone (:func:`tail_bank`), then placed after them:

* unit features, in-thread distances, unit attributes (dates), the ``learned`` affinity's inputs
  (speaker indices in the whole bank's first-occurrence order, session neighbours shifted), the
  units' and headings' token costs (a date heading run continuing from the last kept thread);
* BM25 from the old index with the new texts (``BM25Index.appended``: the same index, value for
  value, as one built over all the texts);
* the thread graph's neighbour lists, the K and bridge tables (a small bank's, ``N^2``) and the
  long-thread counts are built whole (they are not local to a thread; the neighbour lists of the
  threads whose edges did not change are not written again: ``engine/publish.py``).

Where that does not hold (a unit view built anew, another build, a bank that is not an append of
the very bank the engine holds, ``gist`` headings whose old costs were not bounded), the bank is
built whole. ``tests/select/test_engine_extend.py`` compares both on random appends.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...store.bank import Bank
from ...store.layers import empty_fields
from ...store.turn_columns import common_prefix, embed_texts
from ..context import unit_features
from ..terms import unit_attributes
from ..steps.priority import in_thread_distances
from ..steps.relevance import relevance_static
from ..workspace import TokenCosts, date_label, token_costs


EXTENDED = ("head_sim", "temporal", "position", "d_in", "attrs", "rel_idx", "rel_words")
"""The per-unit arrays :func:`extend_arrays` takes the kept units' rows of (kept on ``BankInfo.arrays``)."""


def kept_prefix(old: Bank | None, new: Bank) -> tuple[int, int] | None:
    """``(units, threads)`` of ``old`` that ``new`` keeps as they are, where ``new`` is an append
    (``update_bank``'s ``extends``) to the very bank ``old`` and neither is a unit view over more
    layers; None otherwise. The kept units end at a session start (or the bank's end)."""
    ext = getattr(new, "extends", None)
    if old is None or getattr(ext, "base", None) is not old or new.is_view or old.is_view:
        return None
    k = min(int(ext.keep_threads), old.n_threads)
    u = int(old.thread_offsets[k])
    if u > new.n_units or (0 < u < new.n_units and new.turns[u].session == new.turns[u - 1].session):
        return None
    return u, k


def tail_bank(bank: Bank, u0: int, k0: int) -> Bank:
    """``bank``'s threads from ``k0`` on (its units from ``u0``) as a bank of their own, without
    edges (what the per-thread tables read)."""
    e = np.zeros(0, dtype=np.int64)
    return replace(bank, turns=bank.turns[u0:], thread_offsets=bank.thread_offsets[k0:] - u0,
                   heads=bank.heads[k0:], head_kind=bank.head_kind[k0:], unit_vecs=bank.unit_vecs[u0:],
                   head_vecs=bank.head_vecs[k0:], edge_src=e, edge_dst=e, edge_w=e.astype(np.float32),
                   edge_kind=e.astype(np.int8), knn_sims=None, knn_ids=None, extends=None, support_src=None,
                   support_dst=None, **empty_fields())


def tail_costs(bank: Bank, tail: Bank, prev, k0: int, headings: str):
    """The whole bank's ``TokenCosts`` from ``prev`` (the old bank's, whose first ``k0`` threads
    ``bank`` keeps) and the ``tail``'s own; None where they cannot be joined (``gist`` headings
    whose old costs were not bounded: which thread made them so is not known)."""
    if prev is None or prev.headings != headings or (headings != "date" and not prev.bounded):
        return None
    t = token_costs(tail, headings)
    u0 = int(bank.thread_offsets[k0])
    unit = np.concatenate([prev.unit[:u0], t.unit])
    heading = np.concatenate([prev.heading[:k0], t.heading])
    if t.heading_run is None and prev.heading_run is None:
        return TokenCosts(unit, heading, headings, bool(prev.bounded and t.bounded))
    run = np.arange(bank.n_threads, dtype=np.int64)
    run[:k0] = prev.runs(np.arange(k0))
    tr = t.runs(np.arange(tail.n_threads)) + k0
    if headings == "date" and k0 and tail.n_threads:  # the first new thread may continue the last kept one's run
        labels = lambda j: list(dict.fromkeys(date_label(bank.turns[int(i)]) for i in bank.thread_units(j)))  # noqa: E731
        v = labels(k0)
        if len(v) == 1 and labels(k0 - 1) == v:
            tr[tr == k0] = run[k0 - 1]
    run[k0:] = tr
    return TokenCosts(unit, heading, headings, bool(prev.bounded and t.bounded), run)


def tail_relevance(tail: Bank, temporal: np.ndarray, speakers: tuple, u0: int):
    """``(rel_idx [n, 3], rel_words [n], the whole bank's speakers)`` of the tail's units, indexed in
    the whole bank (``speakers``: the kept units' speakers, in first-occurrence order)."""
    st = relevance_static(tail, temporal)
    allsp = tuple(dict.fromkeys((*speakers, *st.speakers)))
    pos = {s: i for i, s in enumerate(allsp)}
    spk = np.array([pos[s] for s in st.speakers], dtype=np.int64)[st.speaker] if len(st.speaker) else st.speaker
    shift = lambda x: np.where(x >= 0, x + u0, -1)  # noqa: E731
    return np.stack([spk, shift(st.prev), shift(st.next)], axis=1), st.words, allsp


def whole_arrays(bank: Bank, cfg, layout):
    """The per-unit and per-thread arrays of a bank built whole (those :func:`extend_arrays` builds
    from an old bank's): ``(arrays, costs, speakers, None)``."""
    N, J = bank.n_units, bank.n_threads
    head_sim, temporal, position = unit_features(bank)
    a = dict(unit_vecs=bank.unit_vecs, unit_thread=bank.unit_thread, head_sim=head_sim, temporal=temporal.astype(np.float32),
             position=position, d_in=in_thread_distances(head_sim, bank.thread_offsets, cfg.c_head, cfg.c_step),
             attrs=unit_attributes(bank), head_vecs=bank.head_vecs if layout.heads else np.zeros((J, 0)))
    speakers = ()
    if layout.relevance:  # speaker, previous and next unit of the session (steps/relevance.py)
        st = relevance_static(bank, temporal)
        speakers = st.speakers
        a["rel_idx"] = np.stack([st.speaker, st.prev, st.next], axis=1).astype(np.int32)  # bank_tables.TABLES
        a["rel_words"] = st.words
    costs = token_costs(bank, cfg.headings) if layout.tokens else None
    if costs is not None:
        a["tok_unit"], a["tok_head"] = costs.unit.astype(np.float64), costs.heading.astype(np.float64)
        a["tok_hrun"] = costs.runs(np.arange(J))  # the first thread of each thread's heading run
    else:
        a["tok_unit"], a["tok_head"], a["tok_hrun"] = np.zeros(N), np.zeros(J), np.arange(J)
    return a, costs, speakers, None


def extend_arrays(bank: Bank, cfg, layout, prev_info, prev: dict, u0: int, k0: int, postings=None):
    """The per-unit and per-thread arrays of :func:`~trawmem_gpu.select.engine.bank_tables.build_bank`
    for ``bank``, from the old bank's (``prev_info``, ``prev``: its arrays; ``postings``: its
    BM25 postings' units where its index is lean) and its tail's; returns
    ``(arrays, costs, speakers, bm25)`` (``bm25`` None: build it whole), or None when the token
    costs cannot be joined."""
    tail = tail_bank(bank, u0, k0)
    costs = None
    if layout.tokens:
        costs = tail_costs(bank, tail, prev_info.costs, k0, cfg.headings)
        if costs is None:
            return None
    head_sim, temporal, position = unit_features(tail)
    cat = lambda name, rows: np.concatenate([prev[name][:u0], rows])  # noqa: E731
    a = dict(unit_vecs=bank.unit_vecs, unit_thread=bank.unit_thread, head_sim=cat("head_sim", head_sim),
             temporal=cat("temporal", temporal).astype(np.float32), position=cat("position", position),
             d_in=cat("d_in", in_thread_distances(head_sim, tail.thread_offsets, cfg.c_head, cfg.c_step)),
             attrs=cat("attrs", unit_attributes(tail)),
             head_vecs=bank.head_vecs if layout.heads else np.zeros((bank.n_threads, 0)))
    speakers = ()
    if layout.relevance:
        seen = int(prev["rel_idx"][:u0, 0].max()) + 1 if u0 else 0  # speakers are numbered by first occurrence
        idx, words, speakers = tail_relevance(tail, temporal, tuple(prev_info.speakers[:seen]), u0)
        a["rel_idx"], a["rel_words"] = cat("rel_idx", idx).astype(np.int32), cat("rel_words", words)
    if costs is not None:
        a["tok_unit"], a["tok_head"] = costs.unit.astype(np.float64), costs.heading.astype(np.float64)
        a["tok_hrun"] = costs.runs(np.arange(bank.n_threads))
    else:
        a["tok_unit"], a["tok_head"], a["tok_hrun"] = np.zeros(bank.n_units), np.zeros(bank.n_threads), \
            np.arange(bank.n_threads)
    bm25 = None  # None: built whole
    if layout.lexical and prev_info.bm25 is not None:
        # the units whose texts are the old ones: the kept, and the same stored turns after them
        m = common_prefix(prev_info.bank.turns, bank.turns, u0)
        bm25 = prev_info.bm25.appended(embed_texts(bank.turns[m:]), m, postings)
    return a, costs, speakers, bm25
