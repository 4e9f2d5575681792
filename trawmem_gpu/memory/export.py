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


def _snapshot(mem, bank_id: str):
    """Bank ``bank_id`` and its history events, read together under the bank's lock (an append or
    forget publishes a new bank object and writes its events under it): one revision, which the
    export's lines are made from however long they take to send."""
    from .history import HistoryStore

    reg = mem._core.registry
    for _ in range(8):  # a lazy bank let go between the load and the lock is loaded again
        if reg.get(bank_id) is None:
            raise reg.absent(bank_id)
        with reg._bank_lock(bank_id):
            bank = reg._banks.get(bank_id)
            if bank is not None:
                return bank, [e for e in HistoryStore(mem.path)._stored(bank_id) if "unit" in e]
    raise reg.absent(bank_id)


def _bank_lines(mem, bank_id: str, snap, where, vectors: bool, counts: dict):
    """The lines of one bank's revision ``snap`` (:func:`_snapshot`)."""
    from .export_vectors import text_key, vec_text

    bank, events = snap
    keep = _where(where)
    idx = [i for i, t in enumerate(bank.turns) if keep(t)]
    held = {bank.turns[i].turn_id for i in idx}
    facts = [(k, f) for k, f in enumerate(bank.facts or ()) if set(f.source_turns) <= held]
    kept = {f.fact_id for _, f in facts}
    profiles = [p for p in (bank.profiles or ()) if set(p.fact_ids) <= kept]
    events = events if where is None else []
    counts_line = {"n_turns": len(idx), "n_facts": len(facts), **({"n_profiles": len(profiles)} if profiles else {})}
    yield _line({"type": "bank", "bank_id": bank_id, **counts_line})
    heads = {int(o): j for j, o in enumerate(bank.thread_offsets[:-1])} if vectors else {}
    for i in idx:
        t, rec = bank.turns[i], _turn_rec(bank_id, bank.turns[i])
        if vectors:
            rec.update(vector=vec_text(bank.unit_vecs[i]), vector_of=text_key(t.embed_text()))
            j = heads.get(i)
            if j is not None:
                rec.update(head_vector=vec_text(bank.head_vecs[j]), head_vector_of=text_key(bank.heads[j]))
        yield _line(rec)
    if facts and vectors:
        from ..store.view import fact_embed_text

        stamp = {t.turn_id: t.timestamp for t in bank.turns}
    for k, f in facts:
        rec = _fact_rec(bank_id, f)
        if vectors and bank.fact_vecs is not None:
            rec.update(vector=vec_text(bank.fact_vecs[k]),
                       vector_of=text_key(fact_embed_text(f, stamp[f.source_turns[0]])))
        yield _line(rec)
    for p in profiles:
        yield _line({"type": "profile", "bank_id": bank_id, **p.to_record()})
    for e in events:
        yield _line({"type": "event", "bank_id": bank_id, **e})
    counts["profiles"] = counts.get("profiles", 0) + len(profiles)
    counts["banks"] += 1
    counts["turns"] += len(idx)
    counts["facts"] += len(facts)
    counts["events"] += len(events)


def export_lines(mem, banks=None, where=None, vectors: bool = False, progress: bool = False,
                 counts: dict | None = None, snaps: dict | None = None):
    """The export of Memory ``mem``'s banks (all, or the ids in ``banks``) as an iterator of lines
    (``docs/export.md``), made one at a time: each bank from one revision (:func:`_snapshot`, taken
    when the bank is reached, or given in ``snaps``: bank id -> revision). ``where``: a filter
    (``data.filters``) the exported turns must pass (facts whose source turns are all left out are
    left out too, and the history); ``vectors``: each turn's, fact's and head's vector with the
    encoder named in the header (``memory.export_vectors``); ``counts``: filled as lines are made."""
    from tqdm import tqdm

    from .export_vectors import header

    counts = {"banks": 0, "turns": 0, "facts": 0, "events": 0} if counts is None else counts
    ids = [b["bank_id"] for b in mem.banks()] if banks is None else list(banks)
    head = {"format": FORMAT, "version": VERSION, "encoder": mem.encoder_id,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if vectors:
        head["vectors"] = header(mem._core.encoder)
    yield _line(head)
    for bank_id in tqdm(ids, desc="export", unit="bank", disable=not progress):
        snap = (snaps or {}).get(bank_id) or _snapshot(mem, bank_id)
        yield from _bank_lines(mem, bank_id, snap, where, vectors, counts)


def export(mem, out, banks=None, where=None, progress: bool = False, vectors: bool = False) -> dict:
    """Write :func:`export_lines` to ``out``: a path (written line by line to a temporary sibling,
    fsynced and renamed over it: a kill leaves no half file) or a text stream. Returns
    ``{"banks", "turns", "facts", "events"}``."""
    from ..store.records import write_atomic

    counts = {"banks": 0, "turns": 0, "facts": 0, "events": 0}
    lines = export_lines(mem, banks, where, vectors, progress, counts)
    if isinstance(out, (str, Path)):
        write_atomic(Path(out), lambda f: f.writelines(lines))
    else:
        out.writelines(lines)
    return counts


def _where(where):
    if where is None:
        return lambda t: True
    from ..data.filters import Filter, parse_filter
    from .scope import passes

    f = where if isinstance(where, Filter) else parse_filter(where)
    return lambda t: passes(f, t)


MAX_LINE_BYTES = 2 << 20
"""The longest line an import reads (a turn with every field at its bound fits): a longer one is
refused naming its number, before it is parsed."""
MAX_BANK_LINES = 200_000
"""The most turn and fact lines one bank of an import may hold (its lines are held until the
bank's end, then written in one commit): more is refused naming the line."""


class LineTooLong(InputError):
    """A line over the import's byte bound (the server answers 413)."""


def _lines_of(f, cap: int):
    """The lines of binary file ``f``, each read with at most ``cap + 1`` bytes (a longer line is
    not read whole)."""
    return iter(lambda: f.readline(cap + 1), b"")


class _Reader:
    """The lines of an export (``str`` or UTF-8 ``bytes``), parsed one at a time, with their
    numbers; a line over ``cap`` bytes is a :class:`LineTooLong`."""

    def __init__(self, lines, cap: int = MAX_LINE_BYTES):
        self.lines, self.cap = lines, cap
        self.n = 0

    def __iter__(self):
        for raw in self.lines:
            self.n += 1
            if isinstance(raw, (bytes, bytearray)):
                if len(raw) > self.cap:
                    raise LineTooLong(f"line {self.n}: longer than {self.cap} bytes (the limit of a line)")
                try:
                    raw = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(f"line {self.n}: not UTF-8 (byte {e.start})") from None
            elif len(raw) > self.cap // 4 and len(raw.encode("utf-8")) > self.cap:
                raise LineTooLong(f"line {self.n}: longer than {self.cap} bytes (the limit of a line)")
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


def _header(n: int, rec: dict, encoder) -> None:
    """The header (line ``n``) checked: format, version, and the ``vectors`` field (when the file
    carries vectors) against the importing collection's ``encoder``."""
    if rec.get("format") != FORMAT:
        raise InputError(f"line {n}: field 'format': expected {FORMAT!r}, got {str(rec.get('format'))[:64]!r}")
    if rec.get("version") != VERSION:
        raise InputError(f"line {n}: field 'version': this trawmem reads version {VERSION}, "
                         f"got {str(rec.get('version'))[:32]!r}")
    if rec.get("vectors") is not None:
        from .export_vectors import check_header

        check_header(n, rec["vectors"], encoder)


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
            where=None, max_line_bytes: int = MAX_LINE_BYTES, max_bank_lines: int = MAX_BANK_LINES) -> dict:
    """Import an export (a path or an iterable of lines, ``str`` or ``bytes``) into Memory ``mem``,
    bank by bank; returns ``{"banks": [{"bank_id", "stored", "already_stored", "refused": [{"id",
    "reason"}], "facts"}]}``. The lines are read one at a time (a path: at most ``max_line_bytes``
    + 1 bytes a read); one bank's are held until its end (at most ``max_bank_lines`` turns and
    facts), then its turns and facts are written in one commit. Raises ``InputError`` naming the
    line and field of the first bad line; the bank being read is then not written (banks before it
    are complete). ``bank``: the one bank id the file may hold (the server's import into one bank);
    ``where``: a filter (``data.filters``) each turn must pass, the others refused per item (a key
    bound to a filter), with the facts citing them. Vectors in the file (``--vectors``) are used
    instead of encoding the texts they encode (``memory.export_vectors``)."""
    kw = {"bank": bank, "where": where, "max_line_bytes": max_line_bytes, "max_bank_lines": max_bank_lines}
    if fmt != "trawmem":
        return import_(mem, foreign_lines(fmt, source, mem.encoder_id), progress, **kw)
    if isinstance(source, (str, Path)):
        with open(source, "rb") as f:
            return import_(mem, _lines_of(f, max_line_bytes), progress, **kw)
    from .export_vectors import read_vec

    rd = _Reader(source, max_line_bytes)
    it = iter(rd)
    first = next(it, None)
    if first is None:
        raise InputError("line 1: empty file: expected the export header")
    _header(*first, mem._core.encoder)
    dim = mem._core.encoder.dim if first[1].get("vectors") is not None else None
    done: list[dict] = []
    seen_banks: set[str] = set()
    cur = None
    for n, rec in it:
        kind = rec.get("type")
        if kind == "bank":
            if cur is not None:
                _ended(rd.n, cur)
                done.append(_write(mem, cur, where))
            cur = _bank_start(n, rec, bank, seen_banks)
            continue
        if kind not in ("turn", "fact", "profile", "event"):
            raise InputError(f"line {n}: field 'type': expected bank, turn, fact, profile or event, got {str(kind)[:32]!r}")
        if cur is None:
            raise InputError(f"line {n}: a {kind} line before any bank line")
        if rec.get("bank_id") != cur["bank_id"]:
            raise InputError(f"line {n}: field 'bank_id': {str(rec.get('bank_id'))[:64]!r} is not the bank being "
                             f"read ({cur['bank_id'][:64]!r})")
        if kind != "event" and len(cur["turns"]) + len(cur["facts"]) >= max_bank_lines:
            raise InputError(f"line {n}: field 'type': bank {cur['bank_id'][:64]!r} holds more than "
                             f"{max_bank_lines} turns and facts (the limit of one bank in one import)")
        if kind == "turn":
            t = _turn_dict(n, rec)
            if t["turn_id"] in cur["ids"]:
                raise InputError(f"line {n}: field 'id': duplicate turn id {t['turn_id'][:64]!r}")
            cur["ids"].add(t["turn_id"])
            cur["turns"].append(t)
        elif kind == "fact":
            cur["facts"].append({k: v for k, v in rec.items() if k in FACT_KEEP[:11] and v is not None})
        elif kind == "profile":
            cur["profiles"].append(_profile(n, rec))
        else:
            cur["events"].append(_event(n, rec))
        if dim is not None and kind not in ("event", "profile"):
            read_vec(n, rec, "vector", dim, cur["vectors"])
            read_vec(n, rec, "head_vector", dim, cur["vectors"])
    if cur is not None:
        _ended(rd.n, cur)
        done.append(_write(mem, cur, where))
    return {"banks": done}


def _bank_start(n: int, rec: dict, bank: str | None, seen: set) -> dict:
    """The import's record of the bank a ``bank`` line (line ``n``) starts, or ``InputError``."""
    bid = rec.get("bank_id")
    if not isinstance(bid, str) or not bid:
        raise InputError(f"line {n}: field 'bank_id': expected a bank id string")
    if bank is not None and bid != bank:
        raise InputError(f"line {n}: field 'bank_id': {bid[:64]!r} is not the bank imported into ({bank[:64]!r})")
    if bid in seen:
        raise InputError(f"line {n}: field 'bank_id': bank {bid[:64]!r} appears twice")
    seen.add(bid)
    return {"bank_id": bid, "turns": [], "ids": set(), "facts": [], "events": [], "n": rec.get("n_turns"),
            "vectors": {}, "profiles": [], "n_profiles": rec.get("n_profiles")}


def _ended(n: int, cur: dict) -> None:
    """A bank's lines ended at line ``n``: as many turns and profile sections as its bank line announced."""
    if isinstance(cur["n"], int) and cur["n"] != len(cur["turns"]):
        raise InputError(f"line {n}: field 'n_turns': bank {cur['bank_id'][:64]!r} announced {cur['n']} "
                         f"turns, the file holds {len(cur['turns'])}: the file was cut short")
    if isinstance(cur["n_profiles"], int) and cur["n_profiles"] != len(cur["profiles"]):
        raise InputError(f"line {n}: field 'n_profiles': bank {cur['bank_id'][:64]!r} announced "
                         f"{cur['n_profiles']} profile sections, the file holds {len(cur['profiles'])}: the file was "
                         f"cut short")


def _profile(n: int, rec: dict):
    """A profile line's ``ProfileSection`` (``store.facts.profile_from_record``), or ``InputError``
    naming the line and field."""
    from ..store.facts import profile_from_record

    try:
        return profile_from_record({k: v for k, v in rec.items() if k not in ("type", "bank_id")})
    except (ValueError, TypeError) as e:
        raise InputError(f"line {n}: profile: {e}") from None


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
    from ..store.writes import pause_point
    from .export_commit import add_imported
    from .export_vectors import GivenVectors
    from .messages import request_batch

    bid = cur["bank_id"]
    forgot = forgotten_ids(mem.path, bid, cur["ids"])
    outside = _outside(where, cur["turns"]) - forgot
    gone = forgot | outside
    turns = [t for t in cur["turns"] if t["turn_id"] not in gone]
    refused = [{"id": t["turn_id"], "reason": "forgotten by this collection" if t["turn_id"] in forgot else
                "does not pass this key's filter"} for t in cur["turns"] if t["turn_id"] in gone]
    res = {"bank_id": bid, "stored": 0, "already_stored": 0, "refused": refused, "facts": 0, "profiles": 0}
    new_units: set[str] = set()
    facts = [f for f in cur["facts"] if not set(f.get("source_turns", ())) & gone]
    dropped = {f.get("id") for f in cur["facts"]} - {f.get("id") for f in facts}
    profiles = [p for p in cur.get("profiles", ()) if not set(p.fact_ids) & dropped]
    encoder = mem._import_encoder()
    encoder = GivenVectors(encoder, cur["vectors"]) if cur["vectors"] else encoder
    if turns:
        kept = {t["turn_id"]: t.pop("stored_at", None) for t in turns}
        batch = request_batch(bid, turns, None, atomic=True)
        batch.scope = where
        batch.stored_at = kept  # the export's stored_at of each turn, null (unknown) included
        got, added, sections = add_imported(mem, bid, batch, facts, encoder, getattr(mem, "llm", None), profiles)
        new_units |= {str(i) for i in got.get("stored", [])} | set(added) | set(sections)
        res["stored"] = len(got.get("stored", []))
        res["already_stored"] = len(got.get("already_stored", []))
        res["facts"], res["profiles"] = len(added), len(sections)
    pause_point("import-committed")
    if where is None:  # a bound key's import keeps its own events (the history names every user's units)
        import_history(mem, bid, new_units, cur["events"])
    return res


class Portable:
    """``Memory.export``, ``Memory.export_lines`` and ``Memory.import_`` (mixed into ``memory.api.Memory``)."""

    def export(self, out, banks=None, *, where=None, progress: bool = False, vectors: bool = False) -> dict:
        """Write banks (all, or the ids in ``banks``) to ``out`` (a path, written to a temporary
        sibling then renamed over it, or a text stream) as JSON Lines (:func:`export`,
        ``docs/export.md``); ``where``: only turns passing the filter; ``vectors``: with each
        unit's vector and the encoder named in the header."""
        return export(self, out, banks, where, progress, vectors)

    def export_lines(self, banks=None, *, where=None, vectors: bool = False):
        """The same export as an iterator of lines, made as they are read (:func:`export_lines`:
        each bank from one revision, however long the reader takes)."""
        return export_lines(self, banks, where, vectors)

    def import_(self, source, *, progress: bool = False, format: str = "trawmem") -> dict:
        """Import an export (a path or lines) bank by bank (:func:`import_`: each bank's turns and
        facts in one commit; the file's vectors used when it carries them); turns this collection
        forgot are refused per item. :raises InputError: naming the bad line and field"""
        return import_(self, source, progress, format)

    def _import_encoder(self):
        return self._core.encoder
