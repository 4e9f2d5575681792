"""The facts layer: atomic facts (``store.facts.Fact``) citing the turns they restate.

In a unit view each session's facts are one thread after that session's turn threads (a thread
never crosses a session), so a workspace shows them under the date heading of their turns; a
fact's unit has its first person as its speaker (the ``learned`` affinity's ``speaker_named``
feature sees who it is about; its line shows no speaker: ``select.workspace.unit_line``), its
first source turn's date and session. Only the facts that hold are units (:func:`facts_at`). A
forget drops the facts citing a forgotten turn, and a kept fact whose successor went is
superseded by the next kept fact of its chain or holds again (:func:`_successor_kept`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone

from ...data.types import Turn
from ..facts import Fact, fact_from_record
from .base import Layer, LayerUnit, ViewThread, register

FACT_SPEAKER = "fact"


def fact_embed_text(fact: Fact, timestamp: str) -> str:
    """What the encoder sees of a fact: its session date, then its text (as ``Turn.embed_text``)."""
    return f"[{timestamp}] {fact.text}"


def fact_session(fact: Fact, turn_by_id: dict[str, Turn]) -> int:
    """The session a fact's unit sits in: its first source turn's (a thread never crosses a session)."""
    return turn_by_id[fact.source_turns[0]].session


def facts_at(bank, as_of: str | None = None):
    """``bank`` with the facts that hold (``Fact.valid_at``, in UTC): the current ones (``as_of``
    None: not superseded and started by now, the later of the clock's and the newest turn's
    time), or those valid at ``as_of`` (an ISO date: the end
    of that day; a date-time: that instant); profile lines keep the ids of the facts kept. The
    bank itself when every fact holds."""
    if not bank.facts:
        return bank
    now = None
    if as_of is None:  # the later of the clock's now and the bank's newest turn (``store.facts``)
        now = max([datetime.now(timezone.utc).replace(tzinfo=None), *(t.time for t in bank.turns if t.time)])
    keep = [i for i, f in enumerate(bank.facts) if f.valid_at(as_of, now)]
    if len(keep) == len(bank.facts):
        return bank
    ids = {bank.facts[i].fact_id for i in keep}
    profiles = tuple(replace(p, lines=tuple(replace(ln, fact_ids=tuple(x for x in ln.fact_ids if x in ids))
                                            for ln in p.lines)) for p in bank.profiles)
    return replace(bank, facts=tuple(bank.facts[i] for i in keep),
                   fact_vecs=bank.fact_vecs[keep] if keep else None, profiles=profiles)


def _view(facts, ctx) -> list[ViewThread]:
    """One thread per session holding facts, its facts in the bank's order."""
    by_session: dict[int, list[int]] = {}
    for i, f in enumerate(facts):
        by_session.setdefault(fact_session(f, ctx.turn_by_id), []).append(i)
    out = []
    for session, rows in by_session.items():
        units = []
        for i in rows:
            f = facts[i]
            src = ctx.turn_by_id[f.source_turns[0]]
            units.append(LayerUnit(f.fact_id, f.persons[0] if f.persons else FACT_SPEAKER, f.text, session,
                                   src.timestamp, src.time, None, layer="facts", cites=f.source_turns,
                                   cited_turns=ctx.turns_behind(f.source_turns)))
        out.append(ViewThread(tuple(units), tuple(rows), f"[{units[0].timestamp}] facts of session {session}",
                              session))
    return out


def _check(bank, facts, ids) -> None:
    """Unique ids; a successor the bank holds."""
    if len(set(ids)) != len(ids):
        dup = next(i for i, c in Counter(ids).items() if c > 1)
        raise ValueError(f"bank {bank.bank_id!r}: duplicate fact id {dup!r}")
    fset = set(ids)
    bad = next((f for f in facts if f.superseded_by is not None and f.superseded_by not in fset), None)
    if bad is not None:
        raise ValueError(f"bank {bank.bank_id!r}: fact {bad.fact_id!r} is superseded by {bad.superseded_by!r}, "
                         f"which the bank does not hold")


def _forget(facts, gone: set):
    """The facts citing no unit of ``gone``; a kept fact whose successor went is superseded by the
    next kept fact of its chain, or holds again."""
    keep = [k for k, f in enumerate(facts) if not set(f.source_turns) & gone]
    kept = {facts[k].fact_id for k in keep}
    by_id = {f.fact_id: f for f in facts}
    return keep, [_successor_kept(facts[k], by_id, kept) for k in keep]


def _successor_kept(f, by_id: dict, kept: set):
    """Fact ``f`` once the facts not in ``kept`` went: superseded by the first kept fact down its
    chain of successors (``valid_to`` that fact's start), or holding again when none is left, as
    if the forgotten successors had never been told (``memory.history`` records either)."""
    nxt, seen = getattr(f, "superseded_by", None), set()
    while nxt is not None and nxt not in kept and nxt in by_id and nxt not in seen:
        seen.add(nxt)
        nxt = by_id[nxt].superseded_by
    if nxt == getattr(f, "superseded_by", None) and (nxt is None or nxt in kept):
        return f
    if nxt is None or nxt not in kept:
        return replace(f, valid_to=None, superseded_by=None)
    return replace(f, valid_to=by_id[nxt].start or f.valid_to, superseded_by=nxt)


def _changes(old, new) -> list[tuple]:
    """The kept facts whose successor a forget took: ``reinstated`` when the fact holds again,
    ``superseded`` by the next fact of its chain else."""
    was = {f.fact_id: f.superseded_by for f in old}
    out = []
    for f in new:
        if f.fact_id in was and was[f.fact_id] is not None and f.superseded_by != was[f.fact_id]:
            out.append((f.fact_id, "reinstated", None) if f.superseded_by is None
                       else (f.fact_id, "superseded", f.superseded_by))
    return out


FACTS = register(Layer(
    name="facts", record=Fact, position=10, noun="fact", unit_id=lambda f: f.fact_id,
    cites=lambda f: f.source_turns, to_record=Fact.to_record, from_record=fact_from_record, view=_view,
    tensor="fact_vecs", text=lambda f: f.text, field="facts", vecs_field="fact_vecs", always=True, forget=_forget, dated=facts_at,
    check=_check, changes=_changes))
