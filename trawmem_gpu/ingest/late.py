"""Late turns: turns dated before a bank's last turn, stored at their place in time (issue 45 item 1).

**Order.** A bank's turns are kept in time order: by event time, then by arrival (a stable sort,
so turns of equal time keep the order they arrived in). An undated turn takes the time of the
turn it arrived after, so it stays behind that turn. A turn is *late* when it is dated before
a turn the bank (or its request) already holds; every other turn is an append at the end.

**Sessions.** A late turn that names its ``session`` keeps it. One that does not (sessions
counted by calendar day, ``data.jsonl.turn_from_record``) joins the session it falls inside
(between two turns of one session), else the session of the turn before it on the same calendar
day, else that of the turn after it on the same day, else it opens a session of its own and the
sessions after it are renumbered one up, as an in-order append of the same turns would number them.

**Cost.** The bank is rebuilt over the merged turns as ``build_banks`` would build them in time
order, from the stored unit vectors (only the late turns' text is encoded) and the stored head
vectors (a head whose text is unchanged keeps its vector). The sessions before the first one the
late turns change keep their threads and heads, as an append keeps those before its session,
unless the late turns move the bank's burst gap (a statistic of every session: then every
session is segmented again); every session from there on is re-segmented, its heads
re-extracted, and the nearest-head table updated for the new threads. The bank is written whole,
not as a segment. So a late insert costs O(bank after the late turn) to compute and O(bank) to
write, where an append at the end costs O(last session); ``benchmarks/bench_late_insert.py``
measures it.

**One path.** :func:`add_turns` is what ``Memory.add`` (``memory.banks``) and ``trawmem build
--update`` (``cli.build``) call with a bank's new turns and the ids of the late ones
(:func:`late_ids`, or ``memory.turns.screen`` per item): an append at the end, or a late insert.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from .config import BuildConfig
from ..data.bursts import burst_gap, session_gaps
from ..data.fields import next_session
from ..data.types import Conversation, Turn
from ..encode.base import Encoder
from ..errors import InputError
from ..store.bank import Bank
from ..store.bursts import SESSION_GAPS, held_session_gaps
from .builder import _Work, _encode_units, _finish, _heads, _segment, update_bank


def time_order(turns: list[Turn]) -> list[Turn]:
    """``turns`` (in arrival order) stably sorted by event time; an undated one keeps the time
    of the turn it arrived after (see the module docstring)."""
    keys, last = [], None
    for t in turns:
        last = t.time if t.time is not None else last
        keys.append(last)
    floor = min((k for k in keys if k is not None), default=None)
    order = sorted(range(len(turns)), key=lambda i: keys[i] if keys[i] is not None else floor)
    return [turns[i] for i in order]


def late_ids(old: list[Turn], new: list[Turn]) -> set[str]:
    """The ids of ``new`` (a bank's new turns, in arrival order) that are late: dated before the
    latest time of ``old`` (the bank's turns) or of a turn of ``new`` before it that is not late
    (the rule ``memory.turns.screen`` applies per item)."""
    latest = next((t.time for t in reversed(old) if t.time is not None), None)
    out: set[str] = set()
    for t in new:
        if t.time is not None and latest is not None and t.time < latest:
            out.add(t.turn_id)
        elif t.time is not None:
            latest = t.time
    return out


def add_turns(bank: Bank, new: list[Turn], late: set[str], derived: bool, cfg: BuildConfig, encoder: Encoder,
              llm=None) -> tuple[Bank, dict]:
    """``bank`` with ``new`` (arrival order; ``late``: the ids of those dated before a held turn,
    ``derived``: their sessions are counted by day) stored: appended at the end
    (``ingest.update_bank``) when none is late, else every turn at its place in time
    (:func:`place`, :func:`insert_bank`)."""
    if not late:
        return update_bank(bank, new, cfg, encoder, llm)
    return insert_bank(bank, place(bank.turns, new, late, derived, f"bank {bank.bank_id!r}"), cfg, encoder, llm)


def _day(t: Turn):
    return None if t.time is None else t.time.date()


def place(old: list[Turn], new: list[Turn], late: set[str], derived: bool, where: str = "turns") -> list[Turn]:
    """The turns of a bank holding ``old`` (in time order) and ``new`` (a request's, in arrival
    order; ``late`` the ids of those dated before a held turn), in time order, with the sessions
    of late turns counted by day when ``derived`` (the request gave none): see the module docstring."""
    merged = time_order(list(old) + list(new))
    if not derived:
        return merged
    nxt: list[Turn | None] = [None] * len(merged)
    after = None
    for i in range(len(merged) - 1, -1, -1):
        nxt[i] = after
        if merged[i].turn_id not in late:
            after = merged[i]
    out: list[Turn] = []
    shift = 0
    for i, t in enumerate(merged):
        if t.turn_id not in late:
            out.append(replace(t, session=t.session + shift) if shift else t)
            continue
        prev, n = (out[-1] if out else None), nxt[i]
        ns = None if n is None else n.session + shift
        if prev is not None and ns is not None and prev.session == ns:
            s = ns
        elif prev is not None and _day(prev) == _day(t):
            s = prev.session
        elif n is not None and _day(n) == _day(t):
            s = ns
        else:
            s = next_session(prev.session, f"{where}: turn {t.turn_id!r}") if prev is not None else ns
            if ns is not None and ns <= s:
                shift += s - ns + 1
        out.append(replace(t, session=s))
    top = max(out, key=lambda t: t.session)
    next_session(top.session - 1, f"{where}: turn {top.turn_id!r}")  # past MAX_SESSION: refused
    return out


def _resessioned(facts: tuple, bank: Bank, turns: list[Turn]) -> tuple:
    """``facts`` with the session of each that names its first source turn's (``Fact.session``, as
    ``memory.facts`` and the extraction set it) following that turn where a late turn renumbered
    the sessions after it (``turns``: ``bank``'s turns and the new ones, placed), as a build of the
    turns in time order would number it. The facts themselves when no session moved."""
    if not facts:
        return facts
    was = {t.turn_id: t.session for t in bank.turns}
    now = {t.turn_id: t.session for t in turns}
    out = []
    for f in facts:
        src = f.source_turns[0]
        if f.session is not None and src in was and now.get(src, was[src]) != was[src] and f.session == str(was[src]):
            f = replace(f, session=str(now[src]))
        out.append(f)
    return facts if all(map(lambda a, b: a is b, out, facts)) else tuple(out)


def _kept_prefix(bank: Bank, turns: list[Turn], gaps: np.ndarray) -> tuple[int, int]:
    """``(first unit, threads kept)``: the sessions before the first one the late turns change
    (the bank's turns up to there are ``turns``' own, with the same sessions) keep their threads
    and heads, as an append keeps those before its session, when the burst gap of ``turns``
    (``data.bursts.burst_gap``, a statistic of the whole bank) is the bank's, so a build of
    ``turns`` would segment them alike; else ``(0, 0)``: everything is segmented again."""
    old = bank.turns
    n = min(len(old), len(turns))
    i = 0
    while i < n and old[i].turn_id == turns[i].turn_id and old[i].session == turns[i].session:
        i += 1
    while 0 < i < len(old) and old[i - 1].session == old[i].session:  # back to a session start of both
        i -= 1
    while 0 < i and turns[i - 1].session == turns[i].session:
        i -= 1
    held = held_session_gaps(bank)
    if i == 0 or burst_gap(session_gaps(old) if held is None else held) != burst_gap(gaps):
        return 0, 0
    keep = int(np.searchsorted(bank.thread_offsets, i))
    return (i, keep) if keep < bank.n_threads and int(bank.thread_offsets[keep]) == i else (0, 0)


def insert_bank(bank: Bank, turns: list[Turn], cfg: BuildConfig, encoder: Encoder, llm=None) -> tuple[Bank, dict]:
    """``bank`` rebuilt over ``turns`` (its own turns and new ones, in time order: :func:`place`),
    equal to ``build_banks`` over them; stored unit and head vectors are reused, only new text is
    encoded. Layers (facts, profiles) carry over as an append's do: they cite turn ids (a fact's
    session follows its source turn's: :func:`_resessioned`)."""
    if encoder.id != bank.encoder_id:
        raise InputError(f"bank {bank.bank_id!r} was built with encoder {bank.encoder_id!r}, not {encoder.id!r}")
    row = {t.turn_id: i for i, t in enumerate(bank.turns)}
    fresh = [t for t in turns if t.turn_id not in row]
    stats: dict = {"n_new_units": len(fresh), "resegmented_units": len(turns), "kept_threads": 0, "late": True}
    t0 = time.perf_counter()
    nv = _encode_units([Conversation(bank.bank_id, fresh)], encoder, cfg, False)[0] if fresh else None
    vecs = np.empty((len(turns), bank.unit_vecs.shape[1]), dtype=bank.unit_vecs.dtype)
    k = 0
    for i, t in enumerate(turns):
        j = row.get(t.turn_id)
        if j is None:
            vecs[i] = nv[k]
            k += 1
        else:
            vecs[i] = bank.unit_vecs[j]
    stats["encode_units_s"] = time.perf_counter() - t0
    gaps = session_gaps(turns)
    first, keep = _kept_prefix(bank, turns, gaps)
    stats.update(resegmented_units=len(turns) - first, kept_threads=keep)
    w = _Work(Conversation(bank.bank_id, turns), vecs, [int(s) for s in bank.thread_offsets[:keep]],
              list(bank.heads[:keep]), list(bank.head_kind[:keep]), keep, gaps=gaps)
    t0 = time.perf_counter()
    _segment([w], cfg, llm, stats, [first])
    _heads([w], cfg, llm, stats, encoder)
    stats["segment_heads_s"] = time.perf_counter() - t0
    reuse = {h: bank.head_vecs[j] for j, h in enumerate(bank.heads)}
    graph = None
    if keep and bank.knn_ids is not None and bank.knn_ids.shape[1] == cfg.knn:  # the kept rows updated
        J = bank.n_threads
        graph = (bank, np.where(np.arange(J) < keep, np.arange(J), -1), np.arange(keep, len(w.heads), dtype=np.int64))
    (out,), _ = _finish([w], encoder, cfg, False, stats, [bank.head_vecs], [graph], [reuse])
    out = replace(out, facts=_resessioned(bank.facts, bank, turns), fact_vecs=bank.fact_vecs, profiles=bank.profiles,
                  profile_vecs=bank.profile_vecs, layer_sources=dict(bank.layer_sources))
    out.validate()
    out.__dict__[SESSION_GAPS] = gaps  # the next append extends them, as a build's (``ingest.builder``)
    return out, stats
