"""A history per memory unit (``Memory.history``, ``GET /v1/banks/{id}/units/{uid}/history``): what
happened to a turn, a fact or a profile section, when and why.

Events (:data:`EVENTS`), each a JSON object with ``unit`` (its id), ``event``, ``time`` (ISO UTC)
and ``cause``, plus ``by`` for ``superseded`` (the fact that replaced it) and ``supersedes`` for
the ``added`` event of a fact that replaced another:

* ``added``: stored by an add (``cause: "add"``), or a fact that ``supersedes`` another;
* ``superseded``: a fact replaced by a newer one about the same subject and attribute (``by``;
  ``cause``: ``rule`` when their keys matched, ``llm`` when the extractor proposed it);
* ``re-embedded``: its stored vector was recomputed (a profile section rewritten, a unit whose
  vector a rebuild changed);
* ``forgotten``: erased by a forget (``cause: "forget"``), or dropped with the turn it cites.

**No content.** An event holds ids, times and causes, never a unit's text or vector: after a
forget the history keeps only that the unit was forgotten, and erasure leaves no trace of the
text (the no-trace tests search the history files too).

**Storage.** One file per bank, ``DIR/.history/<sha1 of the bank id>.jsonl``, beside the banks (a
bank directory is replaced whole on every write; its history is appended to, never rewritten):
each operation's events go in one ``write`` of whole lines, fsynced, under the bank's lock (the
registry's and the collection's file lock, as the bank write). A write cut short by a crash leaves
a torn last line, which reading skips and the next write fences off with a new line. The events of
an operation are written just after its bank; a crash between the two leaves units without their
``added`` event, which :meth:`HistoryStore.read` reports as ``added`` with ``time`` null
(``cause: "build"``, as for a bank made by ``trawmem build``, which keeps no history).
"""
from __future__ import annotations

import hashlib
import json
import operator
import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

EVENTS = ("added", "superseded", "re-embedded", "forgotten")
HISTORY_DIR = ".history"


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat()


def event(unit: str, kind: str, cause: str, time: str | None = None, **extra) -> dict:
    """One event (see the module docstring); ``extra``: ``by`` / ``supersedes``."""
    if kind not in EVENTS:
        raise ValueError(f"unknown history event {kind!r}")
    return {"unit": unit, "event": kind, "time": time or now_iso(), "cause": cause,
            **{k: v for k, v in extra.items() if v is not None}}


def _units(bank) -> dict[str, np.ndarray]:
    """Unit id -> its vector, for the bank's facts and profile sections."""
    out: dict[str, np.ndarray] = {}
    if bank is None:
        return out
    for items, vecs, key in ((bank.facts, bank.fact_vecs, lambda f: f.fact_id),
                             (bank.profiles, bank.profile_vecs, lambda p: p.unit_id)):
        if items and vecs is not None:
            out.update({key(x): v for x, v in zip(items, vecs)})
    return out


def write_events(old, new, cause: str, *, sessions=None, gone_cause: str | None = None) -> list[dict]:
    """The events of going from bank ``old`` to bank ``new`` (either may be None): units added,
    units gone (``forgotten``, with ``gone_cause``), units kept whose vector changed
    (``re-embedded``). Turn vectors are compared only in ``sessions`` (the sessions the write
    rebuilt; None: every session), so an append to a large bank compares what it touched."""
    t = now_iso()
    n = _appended(old, new) if sessions is not None else None
    if n is not None:
        out = _append_turn_events(old, new, n, sessions, cause, t)
    else:
        out = _turn_events(old, new, cause, t, sessions, gone_cause)
    lo, ln = _units(old), _units(new)
    out += [event(u, "added", cause, t) for u in ln if u not in lo]
    out += [event(u, "forgotten", gone_cause or cause, t) for u in lo if u not in ln]
    out += [event(u, "re-embedded", cause, t) for u in ln if u in lo and not np.array_equal(ln[u], lo[u])]
    return out


def _appended(old, new) -> int | None:
    """``len(old.turns)`` when ``new``'s turns begin with ``old``'s very objects (an append, which
    keeps them), else None."""
    if old is None or new is None or len(new.turns) < len(old.turns):
        return None
    n = len(old.turns)
    return n if all(map(operator.is_, old.turns, new.turns[:n])) else None


def _append_turn_events(old, new, n: int, sessions, cause: str, t: str) -> list[dict]:
    """:func:`_turn_events` of an append (``new`` keeps ``old``'s ``n`` turns and adds after them):
    its new turns are added, none is forgotten, and the kept turns it compares are the run of
    ``sessions`` that ends ``old`` (an append rebuilds the sessions from the last old one on), so
    the work is the append's, not the bank's."""
    out = [event(x.turn_id, "added", cause, t) for x in new.turns[n:]]
    lo = n
    while lo > 0 and old.turns[lo - 1].session in sessions:
        lo -= 1
    if lo < n:
        d = np.any(old.unit_vecs[lo:n] != new.unit_vecs[lo:n], axis=1)
        out += [event(old.turns[lo + int(i)].turn_id, "re-embedded", cause, t) for i in np.flatnonzero(d)]
    return out


def _turn_events(old, new, cause: str, t: str, sessions, gone_cause) -> list[dict]:
    """The turns' events of :func:`write_events`, from every turn id of both banks."""
    old_turns = {x.turn_id: i for i, x in enumerate(old.turns)} if old is not None else {}
    new_turns = {x.turn_id: i for i, x in enumerate(new.turns)} if new is not None else {}
    out = [event(u, "added", cause, t) for u in new_turns if u not in old_turns]
    out += [event(u, "forgotten", gone_cause or cause, t) for u in old_turns if u not in new_turns]
    if old is not None and new is not None:
        common = [u for u in new_turns if u in old_turns and (sessions is None or new.turns[new_turns[u]].session
                                                                in sessions)]
        if common:
            a = old.unit_vecs[[old_turns[u] for u in common]]
            b = new.unit_vecs[[new_turns[u] for u in common]]
            out += [event(u, "re-embedded", cause, t) for u, d in zip(common, np.any(a != b, axis=1)) if d]
    return out


def append_events(old, new, stored) -> list[dict]:
    """The events of an add that stored the turn ids ``stored`` (``new``: the bank after it): the
    sessions it rebuilt are those of the stored turns and the bank's last session before them."""
    ids = set(stored)
    sessions = {t.session for t in new.turns if t.turn_id in ids}
    if old is not None:
        sessions.add(old.turns[-1].session)
    return write_events(old, new, "add", sessions=sessions)


def forget_events(old, new, turn_ids) -> list[dict]:
    """The events of a forget of ``turn_ids`` (``old``: the bank as this process held it, or None;
    ``new``: the bank left, or None): each turn ``forgotten``, and the facts and profile sections
    that went with them."""
    t = now_iso()
    out = [event(u, "forgotten", "forget", t) for u in dict.fromkeys(turn_ids)]
    lo, ln = _units(old), _units(new)
    return out + [event(u, "forgotten", "cites a forgotten turn", t) for u in lo if u not in ln]


class HistoryStore:
    """The history files of one collection (see the module docstring)."""

    def __init__(self, collection: str | Path):
        self.dir = Path(collection) / HISTORY_DIR

    def path(self, bank_id: str) -> Path:
        return self.dir / f"{hashlib.sha1(bank_id.encode('utf-8', 'surrogatepass')).hexdigest()}.jsonl"

    def append(self, bank_id: str, events: list[dict]) -> None:
        """Append ``events`` to the bank's file in one write, fsynced (call under the bank's lock)."""
        if not events:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self.path(bank_id)
        data = "".join(json.dumps({"bank_id": bank_id, **e}, ensure_ascii=False, separators=(",", ":")) + "\n"
                       for e in events).encode("utf-8")
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and _last_byte(p, size) != b"\n":  # a write a crash cut short: fence it off
                data = b"\n" + data
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def events(self, bank_id: str, unit_id: str | None = None) -> list[dict]:
        """The bank's events (of ``unit_id`` only, when given), in the order they were written;
        torn or foreign lines are skipped."""
        p = self.path(bank_id)
        try:
            raw = p.read_bytes()
        except FileNotFoundError:
            return []
        out = []
        for line in raw.split(b"\n"):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and e.get("bank_id") == bank_id and (unit_id is None or e.get("unit") == unit_id):
                out.append({k: v for k, v in e.items() if k not in ("bank_id", "unit")})
        return out

    def read(self, bank_id: str, unit_id: str, bank=None) -> list[dict] | None:
        """``unit_id``'s events; a unit ``bank`` holds without an ``added`` event first gets one
        with ``time`` null (``cause: "build"``); None when the unit has neither events nor a place
        in ``bank``."""
        evs = self.events(bank_id, unit_id)
        held = bank is not None and (any(t.turn_id == unit_id for t in bank.turns) or unit_id in _units(bank))
        if held and not any(e["event"] == "added" for e in evs):
            evs.insert(0, {"event": "added", "time": None, "cause": "build"})
        return evs if evs else None


def _last_byte(p: Path, size: int) -> bytes:
    with open(p, "rb") as f:
        f.seek(size - 1)
        return f.read(1)


def unit_history(registry, bank_id: str, unit_id: str, where=None) -> list[dict] | None:
    """``unit_id``'s events in bank ``bank_id`` of ``registry`` (``memory.banks.BankRegistry``);
    None when the bank neither holds the unit nor has a history of it; ``UnknownBank`` (or
    ``QuarantinedBank``) when there is no such bank and no history of one. ``where``: the filter
    of a caller bound to one, which sees only its own turns' (``memory.scope.scoped_history``)."""
    bank = registry.get(bank_id)
    evs = registry.history.read(bank_id, unit_id, bank)
    if evs is None and bank is None and not registry.history.events(bank_id):
        raise registry.absent(bank_id)
    if where is not None:
        from .scope import scoped_history

        return scoped_history(bank, evs, unit_id, where)
    return evs
