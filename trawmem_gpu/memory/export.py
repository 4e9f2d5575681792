"""Export a collection as JSON Lines and import it back (issue 45; the format is ``docs/export.md``).

:func:`export` streams a header line, then per bank a ``bank`` line, its ``turn`` lines, its
``fact`` lines (with validity and supersession) and its ``event`` lines (the bank's history).
:func:`import_` reads such a file line by line; each bank is written through ``Memory.add``
(one atomic store write for its turns) and ``Memory.add_facts``. A turn the collection has
forgotten (its keyed digest is in the bank's history, ``memory.history``) is refused, per item,
and never brought back. Bad input raises ``InputError`` naming the line number and the field.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from ..errors import InputError, loads_json

FORMAT = "trawmem-export"
VERSION = 1
TURN_FIELDS = ("id", "speaker", "text", "date", "session", "caption", "metadata", "stored_at")
FACT_KEEP = ("id", "text", "source_turns", "persons", "locations", "keywords", "entities", "date", "subject",
             "attribute", "valid_from", "valid_to", "superseded_by")


def _line(rec: dict) -> str:
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n"


def _turn_rec(bank_id: str, t) -> dict:
    return {"type": "turn", "bank_id": bank_id, "id": t.turn_id, "speaker": t.speaker, "text": t.text,
            "date": t.timestamp, "session": t.session, "caption": t.caption,
            "metadata": dict(t.metadata) if t.metadata else None, "stored_at": t.stored_at}


def _fact_rec(bank_id: str, f) -> dict:
    d = asdict(f)
    d["id"] = d.pop("fact_id")
    return {"type": "fact", "bank_id": bank_id, **{k: (list(v) if isinstance(v, tuple) else v)
                                                    for k, v in d.items() if k in FACT_KEEP}}


def export(mem, out, banks=None, where=None, progress: bool = False) -> dict:
    """Write the banks of Memory ``mem`` (all, or the ids in ``banks``) to ``out`` (a path or a text
    stream) as JSON Lines; ``where``: a filter (``data.filters``) the exported turns must pass (facts
    whose source turns are all left out are left out too). Returns ``{"banks", "turns", "facts", "events"}``."""
    from tqdm import tqdm

    from .history import HistoryStore

    if isinstance(out, (str, Path)):
        with open(out, "w", encoding="utf-8") as f:
            return export(mem, f, banks, where, progress)
    ids = [b["bank_id"] for b in mem.banks()] if banks is None else list(banks)
    keep = _where(where)
    counts = {"banks": 0, "turns": 0, "facts": 0, "events": 0}
    out.write(_line({"format": FORMAT, "version": VERSION, "encoder": mem.encoder_id,
                     "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
    hist = HistoryStore(mem.path)
    for bank_id in tqdm(ids, desc="export", unit="bank", disable=not progress):
        turns = [t for t in mem.turns(bank_id) if keep(t)]
        bank = mem._core.registry.get(bank_id)
        held = {t.turn_id for t in turns}
        facts = [f for f in (getattr(bank, "facts", None) or ()) if set(f.source_turns) <= held]
        out.write(_line({"type": "bank", "bank_id": bank_id, "n_turns": len(turns), "n_facts": len(facts)}))
        for t in turns:
            out.write(_line(_turn_rec(bank_id, t)))
        for f in facts:
            out.write(_line(_fact_rec(bank_id, f)))
        events = [e for e in hist._stored(bank_id) if "unit" in e] if where is None else []
        for e in events:
            out.write(_line({"type": "event", "bank_id": bank_id, **e}))
        counts["banks"] += 1
        counts["turns"] += len(turns)
        counts["facts"] += len(facts)
        counts["events"] += len(events)
    return counts


def _where(where):
    if where is None:
        return lambda t: True
    from ..data.filters import Filter, parse_filter
    from .scope import passes

    f = where if isinstance(where, Filter) else parse_filter(where)
    return lambda t: passes(f, t)


class _Reader:
    """The lines of an export, parsed one at a time, with their numbers."""

    def __init__(self, lines):
        self.lines = lines
        self.n = 0

    def __iter__(self):
        for raw in self.lines:
            self.n += 1
            if not raw.strip():
                continue
            if not raw.endswith("\n"):
                raise InputError(f"line {self.n}: truncated (no end of line): the file was cut short")
            try:
                rec = loads_json(raw)
            except ValueError as e:
                raise InputError(f"line {self.n}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise InputError(f"line {self.n}: expected an object, got {type(rec).__name__}")
            yield self.n, rec


def _header(n: int, rec: dict, encoder: str) -> None:
    if rec.get("format") != FORMAT:
        raise InputError(f"line {n}: field 'format': expected {FORMAT!r}, got {str(rec.get('format'))[:64]!r}")
    if rec.get("version") != VERSION:
        raise InputError(f"line {n}: field 'version': this trawmem reads version {VERSION}, "
                         f"got {str(rec.get('version'))[:32]!r}")


def _turn_dict(n: int, rec: dict) -> dict:
    for k in ("id", "speaker", "text"):
        if not isinstance(rec.get(k), str):
            raise InputError(f"line {n}: field {k!r}: expected a string")
    d = {"turn_id": rec["id"], "speaker": rec["speaker"], "text": rec["text"],
         "timestamp": rec.get("date") or ""}
    for k in ("session", "caption", "metadata"):
        if rec.get(k) is not None:
            d[k] = rec[k]
    at = rec.get("stored_at")  # taken off before the add: a caller's record never carries it
    if at is not None:
        try:
            when = datetime.fromisoformat(at)
        except (TypeError, ValueError):
            raise InputError(f"line {n}: field 'stored_at': expected an ISO 8601 time or null") from None
        at = (when.astimezone(timezone.utc).replace(tzinfo=None) if when.tzinfo is not None else when).isoformat()
    d["stored_at"] = at  # null or absent: unknown, kept so (an older export round-trips as it was)
    return d


EVENT_FIELDS = ("unit", "event", "time", "cause", "by", "supersedes", "by_digest", "supersedes_digest")
"""The fields of an ``event`` line kept on import (``memory.history``'s stored event)."""


def _event(n: int, rec: dict) -> dict:
    from .history import EVENTS

    if rec.get("event") not in EVENTS:
        raise InputError(f"line {n}: field 'event': expected one of {', '.join(EVENTS)}, "
                         f"got {str(rec.get('event'))[:32]!r}")
    for k in EVENT_FIELDS:
        v = rec.get(k)
        if (k in ("unit", "cause") and not isinstance(v, str)) or (v is not None and not isinstance(v, str)):
            raise InputError(f"line {n}: field {k!r}: expected a string" + ("" if k in ("unit", "cause") else
                                                                             " or null"))
    return {k: rec[k] for k in EVENT_FIELDS if rec.get(k) is not None or k == "time"}


def import_history(mem, bank_id: str, new_units: set[str], events: list[dict]) -> int:
    """The exported ``events`` of the units this import stored (``new_units``) become their history:
    the bank's history file is rewritten atomically, under the bank's lock, with this import's own
    events of those units replaced by the exported ones, and every ``by`` / ``supersedes`` naming a
    unit the bank does not hold keyed as ``memory.history`` keys a forgotten id. Returns the events
    written. (A kill before the rewrite leaves the import's own ``added`` events.)"""
    from ..store.records import write_atomic
    from .history import HistoryStore, held_units

    evs = [dict(e) for e in events if e["unit"] in new_units]
    if not evs:
        return 0
    keep = {e["unit"] for e in evs}
    h = HistoryStore(mem.path)
    with mem._core.registry.coll.bank_lock(bank_id):
        bank = mem._core.registry.get(bank_id)
        held = held_units(bank) if bank is not None else set()
        key = h._key(create=True)
        for e in evs:
            for k in ("by", "supersedes"):
                if k in e and e[k] not in held:
                    e[f"{k}_digest"] = h.digest(key, bank_id, e.pop(k))
        lines = [h._line(bank_id, e) for e in h._stored(bank_id) if e.get("unit") not in keep]
        lines += [h._line(bank_id, e) for e in evs]
        h.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(h.path(bank_id), lambda f: f.writelines(lines))
    return len(evs)


def forgotten_ids(collection, bank_id: str, ids) -> set[str]:
    """Those of ``ids`` the collection forgot from bank ``bank_id`` (their keyed digests are in its history)."""
    from .history import HistoryStore

    h = HistoryStore(collection)
    key = h._key()
    if key is None:
        return set()
    gone = {e.get("unit_digest") for e in h._stored(bank_id) if e.get("event") == "forgotten"}
    return {i for i in ids if h.digest(key, bank_id, i) in gone}


def foreign_lines(fmt: str, path, encoder: str):
    """An export's lines made from file ``path`` in another format (``data.importers``)."""
    from ..data.importers import read_turns

    yield _line({"format": FORMAT, "version": VERSION, "encoder": encoder, "created": None})
    bank = None
    for bank_id, t in read_turns(fmt, path):
        if bank_id != bank:
            bank = bank_id
            yield _line({"type": "bank", "bank_id": bank_id})
        yield _line({"type": "turn", "bank_id": bank_id, **t})


def import_(mem, source, progress: bool = False, fmt: str = "trawmem", bank: str | None = None,
            where=None) -> dict:
    """Import an export (a path or an iterable of lines) into Memory ``mem``, bank by bank; returns
    ``{"banks": [{"bank_id", "stored", "already_stored", "refused": [{"id", "reason"}], "facts"}]}``.
    Raises ``InputError`` naming the line and field of the first bad line; the bank being read is
    then not written (banks before it are complete). ``bank``: the one bank id the file may hold
    (the server's import into one bank); ``where``: a filter (``data.filters``) each turn must pass,
    the others refused per item (a key bound to a filter), with the facts citing them."""
    if fmt != "trawmem":
        return import_(mem, foreign_lines(fmt, source, mem.encoder_id), progress, bank=bank, where=where)
    if isinstance(source, (str, Path)):
        with open(source, encoding="utf-8") as f:
            return import_(mem, f, progress, bank=bank, where=where)
    rd = _Reader(source)
    it = iter(rd)
    first = next(it, None)
    if first is None:
        raise InputError("line 1: empty file: expected the export header")
    _header(*first, mem.encoder_id)
    done: list[dict] = []
    seen_banks: set[str] = set()
    cur = None
    for n, rec in it:
        kind = rec.get("type")
        if kind == "bank":
            if cur is not None:
                done.append(_write(mem, cur, where))
            bid = rec.get("bank_id")
            if not isinstance(bid, str) or not bid:
                raise InputError(f"line {n}: field 'bank_id': expected a bank id string")
            if bank is not None and bid != bank:
                raise InputError(f"line {n}: field 'bank_id': {bid[:64]!r} is not the bank imported into "
                                 f"({bank[:64]!r})")
            if bid in seen_banks:
                raise InputError(f"line {n}: field 'bank_id': bank {bid[:64]!r} appears twice")
            seen_banks.add(bid)
            cur = {"bank_id": bid, "turns": [], "ids": set(), "facts": [], "events": [], "n": rec.get("n_turns")}
            continue
        if kind not in ("turn", "fact", "event"):
            raise InputError(f"line {n}: field 'type': expected bank, turn, fact or event, got {str(kind)[:32]!r}")
        if cur is None:
            raise InputError(f"line {n}: a {kind} line before any bank line")
        if rec.get("bank_id") != cur["bank_id"]:
            raise InputError(f"line {n}: field 'bank_id': {str(rec.get('bank_id'))[:64]!r} is not the bank being "
                             f"read ({cur['bank_id'][:64]!r})")
        if kind == "turn":
            t = _turn_dict(n, rec)
            if t["turn_id"] in cur["ids"]:
                raise InputError(f"line {n}: field 'id': duplicate turn id {t['turn_id'][:64]!r}")
            cur["ids"].add(t["turn_id"])
            cur["turns"].append(t)
        elif kind == "fact":
            cur["facts"].append({k: v for k, v in rec.items() if k in FACT_KEEP[:11] and v is not None})
        else:
            cur["events"].append(_event(n, rec))
    if cur is not None:
        if isinstance(cur["n"], int) and cur["n"] != len(cur["turns"]):
            raise InputError(f"line {rd.n}: field 'n_turns': bank {cur['bank_id'][:64]!r} announced {cur['n']} "
                             f"turns, the file holds {len(cur['turns'])}: the file was cut short")
        done.append(_write(mem, cur, where))
    return {"banks": done}


def _outside(where, turns: list[dict]) -> set[str]:
    """The ids of ``turns`` whose metadata does not pass ``where`` (metadata the turn rules refuse
    is let through: the add refuses it, naming why)."""
    if where is None:
        return set()
    from ..data.filters import Filter, parse_filter
    from ..data.metadata import metadata_field

    f = where if isinstance(where, Filter) else parse_filter(where)
    out = set()
    for t in turns:
        try:
            if not f.matches(metadata_field(t.get("metadata"), "turn")):
                out.add(t["turn_id"])
        except InputError:
            pass
    return out


def _write(mem, cur: dict, where=None) -> dict:
    bid = cur["bank_id"]
    forgot = forgotten_ids(mem.path, bid, cur["ids"])
    outside = _outside(where, cur["turns"]) - forgot
    gone = forgot | outside
    turns = [t for t in cur["turns"] if t["turn_id"] not in gone]
    refused = [{"id": t["turn_id"], "reason": "forgotten by this collection" if t["turn_id"] in forgot else
                "does not pass this key's filter"} for t in cur["turns"] if t["turn_id"] in gone]
    res = {"bank_id": bid, "stored": 0, "already_stored": 0, "refused": refused, "facts": 0}
    new_units: set[str] = set()
    if turns:
        from .messages import request_batch

        kept = {t["turn_id"]: t.pop("stored_at", None) for t in turns}
        batch = request_batch(bid, turns, atomic=True)
        batch.stored_at = kept  # the export's stored_at of each turn, null (unknown) included
        got = mem.add(bid, batch, atomic=True)
        new_units |= {str(i) for i in got.get("stored", [])}
        res["stored"] = len(got.get("stored", []))
        res["already_stored"] = len(got.get("already_stored", []))
    facts = [f for f in cur["facts"] if not set(f.get("source_turns", ())) & gone]
    have = {f.fact_id for f in (getattr(mem._core.registry.get(bid), "facts", None) or ())} if turns else set()
    facts = [f for f in facts if f.get("id") not in have]
    if facts:
        added = mem.add_facts(bid, facts)["added"]
        new_units |= set(added)
        res["facts"] = len(added)
    if where is None:  # a bound key's import keeps its own events (the history names every user's units)
        import_history(mem, bid, new_units, cur["events"])
    return res


class Portable:
    """``Memory.export`` and ``Memory.import_`` (mixed into ``memory.api.Memory``)."""

    def export(self, out, banks=None, *, where=None, progress: bool = False) -> dict:
        """Write banks (all, or the ids in ``banks``) to ``out`` (a path or text stream) as JSON Lines
        (:func:`export`, ``docs/export.md``); ``where``: only turns passing the filter."""
        return export(self, out, banks, where, progress)

    def import_(self, source, *, progress: bool = False, format: str = "trawmem") -> dict:
        """Import an export (a path or lines) bank by bank (:func:`import_`); turns this collection
        forgot are refused per item. :raises InputError: naming the bad line and field"""
        return import_(self, source, progress, format)
