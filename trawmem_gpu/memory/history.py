"""A history per memory unit (``Memory.history``, ``GET /v1/banks/{id}/units/{uid}/history``): what
happened to a turn, a fact or a profile section, when and why.

Events (:data:`EVENTS`), each a JSON object with ``unit`` (its id), ``event``, ``time`` (ISO UTC)
and ``cause``, plus ``by`` for ``superseded`` (the fact that replaced it) and ``supersedes`` for
the ``added`` event of a fact that replaced another:

* ``added``: stored by an add (``cause: "add"``), or a fact that ``supersedes`` another; for a
  turn the bank holds, read with its two times: ``event_time`` (when it was said) and
  ``stored_at`` (when it was stored, ``Turn.stored_at``; null for a turn stored before that was
  kept), taken from the bank, never written to the history file;
* ``superseded``: a fact replaced by a newer one about the same subject and attribute (``by``;
  ``cause``: ``rule`` when their keys matched, ``llm`` when the extractor proposed it);
* ``re-embedded``: its stored vector was recomputed (a profile section rewritten, a unit whose
  vector a rebuild changed);
* ``forgotten``: erased by a forget (``cause: "forget"``), or dropped with the turn it cites.

* ``reinstated``: a fact that holds again because the fact that superseded it was forgotten
  (``cause``: ``successor forgotten``); a fact whose successor was forgotten but which a later
  fact of the chain still supersedes gets ``superseded`` with that fact as ``by`` instead.

**No content, and no forgotten id.** An event holds ids, times and causes, never a unit's text or
vector. An id can itself be the secret (an email, a phone number), so a forget rewrites the
bank's history file: every id the bank no longer holds (a forgotten turn, a fact or profile
section that went with it; as ``unit``, ``by`` or ``supersedes``) is replaced by its keyed digest
(HMAC-SHA256 under the collection's random key ``.history/key``, with the bank id). The forgotten
unit's history is still found by its id (the caller who knows it), and a ``by`` or
``supersedes`` naming a forgotten fact reads :data:`FORGOTTEN`; nothing in the files names it.
A bank forgotten whole (or whose last turn is forgotten) has its history file removed: a bank
created later under the same id starts with no history. The no-trace tests search the history
files too, for the texts and the ids.

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
import hmac
import json
import os
import secrets
from pathlib import Path

import numpy as np

from ..errors import loads_json
from ..store.records import utc_now
from ..store.turn_columns import common_prefix

EVENTS = ("added", "superseded", "re-embedded", "forgotten", "reinstated")
HISTORY_DIR = ".history"
FORGOTTEN = "(forgotten)"
"""What ``by`` / ``supersedes`` read when they name a forgotten unit."""
ID_FIELDS = ("unit", "by", "supersedes")
"""The fields of a stored event that hold a unit id (``<field>_digest`` once it is forgotten)."""


def event(unit: str, kind: str, cause: str, time: str | None = None, **extra) -> dict:
    """One event (see the module docstring); ``extra``: ``by`` / ``supersedes``."""
    if kind not in EVENTS:
        raise ValueError(f"unknown history event {kind!r}")
    return {"unit": unit, "event": kind, "time": time or utc_now(), "cause": cause,
            **{k: v for k, v in extra.items() if v is not None}}


def _units(bank) -> dict[str, np.ndarray]:
    """Unit id -> its vector, for the items of the bank's layers (``store.layers``)."""
    from ..store.layers import unit_vectors

    return {} if bank is None else unit_vectors(bank)


def write_events(old, new, cause: str, *, sessions=None, gone_cause: str | None = None) -> list[dict]:
    """The events of going from bank ``old`` to bank ``new`` (either may be None): units added,
    units gone (``forgotten``, with ``gone_cause``), units kept whose vector changed
    (``re-embedded``). Turn vectors are compared only in ``sessions`` (the sessions the write
    rebuilt; None: every session), so an append to a large bank compares what it touched."""
    t = utc_now()
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


def held_units(bank) -> set[str]:
    """Every unit id ``bank`` holds: its turns' and its layers' items' (facts, profile sections)."""
    return {t.turn_id for t in bank.turns} | set(_units(bank))


def _appended(old, new) -> int | None:
    """``len(old.turns)`` when ``new``'s turns begin with ``old``'s very objects (an append, which
    keeps them), else None."""
    if old is None or new is None or len(new.turns) < len(old.turns):
        return None
    n = len(old.turns)
    return n if common_prefix(old.turns, new.turns) == n else None  # the very turns (or column rows)


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
    t = utc_now()
    out = [event(u, "forgotten", "forget", t) for u in dict.fromkeys(turn_ids)]
    lo, ln = _units(old), _units(new)
    out += [event(u, "forgotten", "cites a forgotten turn", t) for u in lo if u not in ln]
    return out + _successor_events(old, new, t)


def _successor_events(old, new, t: str) -> list[dict]:
    """What a forget did to the items it kept besides dropping others (each layer's ``changes``:
    a fact whose successor went is ``reinstated``, or ``superseded`` by the next fact of its chain)."""
    from ..store.layers import LAYERS

    if old is None or new is None:
        return []
    return [event(u, kind, "successor forgotten", t, by=by) for x in LAYERS if x.changes is not None
            for u, kind, by in x.changes(x.items(old), x.items(new))]


class HistoryStore:
    """The history files of one collection (see the module docstring)."""

    def __init__(self, collection: str | Path):
        self.dir = Path(collection) / HISTORY_DIR

    def path(self, bank_id: str) -> Path:
        return self.dir / f"{hashlib.sha1(bank_id.encode('utf-8', 'surrogatepass')).hexdigest()}.jsonl"

    def _key(self, create: bool = False) -> bytes | None:
        """The collection's history key (module docstring): made once, at the first forget."""
        p = self.dir / "key"
        try:
            return bytes.fromhex(p.read_text())
        except (FileNotFoundError, ValueError):
            if not create:
                return None
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".key.tmp-{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the owner's alone
        try:
            os.write(fd, secrets.token_hex(32).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, p)  # atomic, and never over another process's key
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return bytes.fromhex(p.read_text())

    @staticmethod
    def digest(key: bytes, bank_id: str, unit_id: str) -> str:
        """The keyed digest that stands for forgotten unit ``unit_id`` of bank ``bank_id``."""
        return hmac.new(key, f"{bank_id}\0{unit_id}".encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    @staticmethod
    def _line(bank_id: str, e: dict) -> str:
        return json.dumps({"bank_id": bank_id, **e}, ensure_ascii=False, separators=(",", ":")) + "\n"

    def append(self, bank_id: str, events: list[dict]) -> None:
        """Append ``events`` to the bank's file in one write, fsynced (call under the bank's lock)."""
        if not events:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self.path(bank_id)
        data = "".join(self._line(bank_id, e) for e in events).encode("utf-8")
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and _last_byte(p, size) != b"\n":  # a write a crash cut short: fence it off
                data = b"\n" + data
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def forget(self, bank_id: str, held: set[str] | None, events: list[dict]) -> None:
        """After a forget (call under the bank's lock): the bank's file rewritten whole, atomically,
        with ``events`` after its own and every id not in ``held`` (the unit ids the bank still
        holds) replaced by its keyed digest; with ``held`` None (the bank is gone) the file is
        removed. Leftovers of a rewrite a kill cut short go too."""
        from ..store.records import write_atomic

        p = self.path(bank_id)
        for tmp in self.dir.glob(f".{p.name}.tmp-*"):
            tmp.unlink(missing_ok=True)
        if held is None:
            p.unlink(missing_ok=True)
            return
        key = self._key(create=True)
        lines = []
        for e in [*self._stored(bank_id), *events]:
            for k in ID_FIELDS:
                if k in e and e[k] not in held:
                    e[f"{k}_digest"] = self.digest(key, bank_id, e.pop(k))
            lines.append(self._line(bank_id, e))
        write_atomic(p, lambda f: f.writelines(lines))

    def _stored(self, bank_id: str) -> list[dict]:
        """The bank's stored events as written (``bank_id`` aside); torn or foreign lines skipped."""
        try:
            raw = self.path(bank_id).read_bytes()
        except FileNotFoundError:
            return []
        out = []
        for line in raw.split(b"\n"):
            try:
                e = loads_json(line)
            except ValueError:
                continue
            if isinstance(e, dict) and e.pop("bank_id", None) == bank_id:
                out.append(e)
        return out

    def events(self, bank_id: str, unit_id: str | None = None) -> list[dict]:
        """The bank's events (of ``unit_id`` only, when given: by its id, or by its digest once it
        is forgotten), in the order they were written; torn or foreign lines are skipped."""
        key = self._key() if unit_id is not None else None
        d = self.digest(key, bank_id, unit_id) if key is not None else None
        out = []
        for e in self._stored(bank_id):
            if unit_id is None or e.get("unit") == unit_id or (d is not None and e.get("unit_digest") == d):
                out.append({k.removesuffix("_digest"): (FORGOTTEN if k.endswith("_digest") else v)
                            for k, v in e.items() if k not in ("unit", "unit_digest")})
        return out

    def read(self, bank_id: str, unit_id: str, bank=None) -> list[dict] | None:
        """``unit_id``'s events; a unit ``bank`` holds without an ``added`` event first gets one
        with ``time`` null (``cause: "build"``); None when the unit has neither events nor a place
        in ``bank``."""
        evs = self.events(bank_id, unit_id)
        held = bank is not None and unit_id in held_units(bank)
        if held and not any(e["event"] == "added" for e in evs):
            evs.insert(0, {"event": "added", "time": None, "cause": "build"})
        if held:
            _turn_times(evs, bank.turn_map().get(unit_id))
        return evs if evs else None


def _turn_times(evs: list[dict], turn) -> None:
    """The last ``added`` event of a turn the bank holds gets the turn's two times: ``event_time``
    (when it was said: ``Turn.time``, ISO UTC, or null for an undated turn) and ``stored_at`` (when
    the bank stored it, ``Turn.stored_at``; null for a turn stored before that was kept). They are
    read from the bank, not the history file, so a forgotten turn's are gone with it."""
    if turn is None:
        return
    added = [e for e in evs if e["event"] == "added"]
    if added:
        added[-1]["event_time"] = turn.time.isoformat() if turn.time is not None else None
        added[-1]["stored_at"] = turn.stored_at


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
