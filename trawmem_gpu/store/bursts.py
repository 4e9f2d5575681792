"""A bank's burst view: each burst of messages (``data.bursts``) as one unit (issue 36).

The bank stores messages, one unit each (forgets and appends work on messages); selection takes
the burst view, where the messages of one burst are one :class:`BurstUnit`:

* its text: the messages' texts joined by a space (a workspace shows them on one line under one
  ``[id] speaker:`` label, ``select.workspace.unit_line``: a line per message would cost about 10
  tokens more each, its own id, date and speaker; a line break between them 2); its image captions
  joined with `` | ``; its id, speaker, session, timestamp and time: its first message's;
* its vector: the normalized mean of its messages' vectors (the encoder is not called: a view is
  computed from the stored bank alone);
* its **members**: its messages' ids. A workspace that shows the unit shows them all, so its
  ``unit_ids`` list them all, and evidence on any member is evidence the unit holds (evidence
  recall counts each gold message the workspace shows: ``select.workspace.Workspace.unit_ids``);
* a burst never crosses a thread: where a thread starts inside one (a bank segmented before the
  rule, or by an LLM) the burst is cut there; nor a change of turn metadata (``data.metadata``): a
  burst's messages share one metadata map, which is the unit's, so a ``where=`` filter keeps or
  drops a burst exactly as it keeps or drops each of its messages. Threads, heads, head vectors
  and the thread graph are the bank's.

A bank without a burst of two or more messages is its own view (the same object), so sets of
long messages (LoCoMo, LongMemEval) select exactly as before. A view is never stored.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import numpy as np

from ..data.bursts import appended_session_gaps, burst_gap, burst_starts, burst_vectors, session_gaps
from ..data.types import Turn
from .bank import Bank
from .segments import Extension


@dataclass(frozen=True)
class BurstUnit(Turn):
    """A burst of messages as one unit of a view (a ``Turn``: what the engines read)."""

    members: tuple[str, ...] = ()
    """The ids of its messages, in order (the first is the unit's ``turn_id``)."""


def unit_members(t: Turn) -> tuple[str, ...]:
    """The message ids a unit shows: a burst's members, else the unit's own id."""
    return getattr(t, "members", None) or (t.turn_id,)


def bank_bursts(bank: Bank) -> np.ndarray:
    """``[B + 1]`` offsets of the bank's bursts over its units (``data.bursts.burst_starts``, cut at
    every thread start and every change of metadata). Kept on the bank object with the gaps they
    come from, so that a bank appended to it (``extends``) recomputes only the sessions the
    append touches while the burst gap stays what it was (:func:`_appended_bursts`)."""
    got = bank.__dict__.get("_bursts") or _appended_bursts(bank)
    if got is None:
        gaps = held_session_gaps(bank)
        gaps = session_gaps(bank.turns) if gaps is None else gaps
        tau = burst_gap(gaps)
        got = (gaps, tau, _bursts_from(bank, 0, tau, []), None)
    bank.__dict__["_bursts"] = got  # a bank's turns never change: neither do its bursts
    return got[2]


SESSION_GAPS = "_session_gaps"
"""Where a bank object keeps its turns' session gaps (``data.bursts.session_gaps``) once its build
or append computed them (``ingest.builder``): a bank's turns never change."""


def held_session_gaps(bank: Bank) -> np.ndarray | None:
    """The session gaps a bank object keeps (its build's or append's, or its burst view's), or None."""
    got = bank.__dict__.get(SESSION_GAPS)
    if got is None and bank.__dict__.get("_bursts") is not None:
        got = bank.__dict__["_bursts"][0]
    return got


def _bursts_from(bank: Bank, lo: int, tau: float, before: list) -> np.ndarray:
    """The burst offsets: ``before`` (the starts below ``lo``), then the starts from ``lo`` on."""
    turns, th = bank.turns, bank.thread_offsets[:-1]
    starts = set(burst_starts(turns, lo, None, tau)) | set(th[th >= lo].tolist())
    base = max(lo - 1, 0)
    meta = [t.metadata or None for t in turns[base:]]
    starts |= {i for i in range(max(lo, 1), bank.n_units) if meta[i - base] != meta[i - 1 - base]}
    return np.array(list(before) + sorted(starts) + [bank.n_units], dtype=np.int64)


def _appended_bursts(bank: Bank):
    """``(gaps, tau, offsets, lo)`` of ``bank`` from those kept on the bank it extends (an append,
    ``store.segments.Extension``: that bank's turns, then new ones), or None (compute them whole).
    The new gaps are those the new turns open; where the burst gap ``tau`` they give is the old
    one, no earlier session's bursts change: only the sessions from the last old one on are
    recomputed (from unit ``lo``). Where it moves, every burst may: None."""
    ext = getattr(bank, "extends", None)
    base = getattr(ext, "base", None)
    got = None if base is None else base.__dict__.get("_bursts")
    n0, turns = getattr(ext, "base_units", 0), bank.turns
    if got is None or not 0 < n0 <= len(turns) or base.n_units != n0:
        return None
    gaps0, tau0, off0, _ = got
    gaps = appended_session_gaps(gaps0, n0, turns)
    tau = burst_gap(gaps)
    if tau != tau0:
        return None
    lo = n0
    while lo > 0 and n0 < len(turns) and turns[lo - 1].session == turns[n0].session:
        lo -= 1  # the last old session, which the new turns continue: recomputed
    return gaps, tau, _bursts_from(bank, lo, tau, off0[off0 < lo].tolist()), lo


def _burst(turns: list[Turn]) -> BurstUnit:
    first = turns[0]
    caps = [t.caption for t in turns if t.caption]
    return BurstUnit(first.turn_id, first.speaker, " ".join(t.text for t in turns if t.text), first.session,
                     first.timestamp, first.time, " | ".join(caps) if caps else None, metadata=first.metadata,
                     members=tuple(t.turn_id for t in turns))


def burst_view(bank: Bank) -> Bank:
    """``bank`` with each burst as one unit (see the module docstring); ``bank`` itself when no burst
    holds two or more messages. The view of a bank appended to another (``extends``) whose bursts
    below the append's first session were kept (:func:`_appended_bursts`) takes the units and vectors
    of that bank's view up to there and extends it (``extends``: what an engine refresh reads,
    ``select.engine.extend``); any other view extends nothing. A bank's view is made once while
    something holds it."""
    off = bank_bursts(bank)
    if len(off) - 1 == bank.n_units:
        return bank
    held = bank.__dict__.get("_view")
    if held is not None and held() is not None:
        return held()  # the view made before, still held somewhere
    old = _old_view(bank)
    b0 = 0 if old is None else int(np.searchsorted(off, bank.__dict__["_bursts"][3], side="left"))
    span = zip(off[b0:-1], off[b0 + 1:])
    turns = [bank.turns[int(lo)] if hi - lo == 1 else _burst(bank.turns[int(lo):int(hi)]) for lo, hi in span]
    part = off[b0:] - off[b0]
    vecs = burst_vectors(bank.unit_vecs[off[b0]:], part)
    single = np.diff(part) == 1  # a message alone keeps its stored vector, bit for bit
    vecs[single] = bank.unit_vecs[off[b0:-1][single]]
    if b0:
        turns, vecs = old.turns[:b0] + turns, np.concatenate([old.unit_vecs[:b0], vecs])
    thread_offsets = np.searchsorted(off, bank.thread_offsets).astype(np.int64)
    ext = bank.extends
    view = replace(bank, turns=turns, unit_vecs=vecs, thread_offsets=thread_offsets,
                   extends=None if old is None else Extension.of(old, ext.keep_threads, ext.knn_rows))
    view.validate((b0, int(np.searchsorted(thread_offsets, b0, side="right")) - 1) if b0 else (0, 0))
    bank.__dict__["_view"] = weakref.ref(view)
    return view


def _old_view(bank: Bank) -> Bank | None:
    """The view of the bank ``bank`` extends, where ``bank``'s bursts below the append's first
    session are that bank's (kept: ``_appended_bursts``) and the view is still held; else None."""
    got, ext = bank.__dict__.get("_bursts"), bank.extends
    base = getattr(ext, "base", None)
    if got is None or got[3] is None or base is None or base.__dict__.get("_bursts") is None:
        return None
    if len(base.__dict__["_bursts"][2]) - 1 == base.n_units:
        return base  # its view is the bank itself
    ref = base.__dict__.get("_view")
    return None if ref is None else ref()
