"""``Memory.add_facts``: facts given by the caller, added to a bank's facts layer with their key,
and superseding by rule (``ingest.layers.supersede.by_rule``) the current facts of the same
subject and attribute; no LLM is called.

A fact record: ``text`` and ``source_turns`` (ids of turns the bank holds), optional ``id``
(kept when free; else ``F:<session>:<n>``), ``subject`` and ``attribute`` (the key, together or
not at all), ``valid_from`` / ``date`` (default: the first source turn's date), ``persons``
(default: the source turns' speakers), ``locations``, ``keywords``, ``entities``. The records are
checked whole, before anything is written (an ``InputError`` naming ``facts[i]`` and the field;
nothing is added), by the turns' rules and the one fact schema (``store.facts``): ids as turn ids,
texts and names length-capped, and ``date`` / ``valid_from`` read as a turn's timestamp is (at
most ``MAX_DATE_CHARS``, through ``data.dates.parse_date``: an offset or zone converted to UTC)
and kept as their UTC ISO text (``store.facts.utc_text``). Then they are encoded with the bank's
encoder and written with the bank, under its lock, as an add writes turns; the history gets
``added`` for each new fact and ``superseded`` (with ``by``) for each fact it replaced.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ..data.dates import parse_date
from ..data.fields import id_field, str_field
from ..data.types import MAX_DATE_CHARS
from ..errors import InputError, UnknownBank
from ..store.facts import MAX_FACT_SOURCES, TIME_FIELDS, Fact, fact_time, utc_text

FACT_FIELDS = ("id", "text", "source_turns", "persons", "locations", "keywords", "entities", "date", *TIME_FIELDS)
GIVEN = ("id", "text", "source_turns", "persons", "locations", "keywords", "entities", "date", "subject",
         "attribute", "valid_from")
"""What a caller may give (``valid_to`` and ``superseded_by`` are the store's to set)."""


def fact_of(rec, i: int, turns: dict) -> Fact:
    """Fact record ``i`` as a :class:`Fact` of a bank whose turns are ``turns`` (id -> turn)."""
    where = f"facts[{i}]"
    if not isinstance(rec, Mapping):
        raise InputError(f"{where}: expected a fact (an object with text and source_turns), got {type(rec).__name__}")
    extra = [k for k in rec if k not in GIVEN]
    if extra:
        raise InputError(f"{where}: unknown field {str(extra[0])[:64]!r} (a fact's fields are {', '.join(GIVEN)})")
    for k in ("text", "source_turns"):
        if k not in rec:
            raise InputError(f"{where}: missing field {k!r}")
    src = rec["source_turns"]
    src = [src] if isinstance(src, str) else src
    if not isinstance(src, (list, tuple)) or not src:
        raise InputError(f"{where}: field 'source_turns' must be a non-empty list of turn ids")
    if len(src) > MAX_FACT_SOURCES:
        raise InputError(f"{where}: field 'source_turns' holds {len(src)} ids; the limit is {MAX_FACT_SOURCES}")
    src = tuple(dict.fromkeys(id_field(s, "source_turns", where) for s in src))
    bad = next((s for s in src if s not in turns), None)
    if bad is not None:
        raise InputError(f"{where}: field 'source_turns': the bank holds no turn {str(bad)[:64]!r}")
    fid = f"F:new:{i}" if rec.get("id") is None else id_field(rec["id"], "id", where)
    first = turns[src[0]]
    day = first.time.date().isoformat() if first.time else None
    dates = {k: fact_date(rec[k], k, where) for k in ("date", "valid_from") if rec.get(k) is not None}
    try:
        return Fact(fid, rec["text"], src,
                    rec.get("persons") or tuple(dict.fromkeys(turns[s].speaker for s in src)),
                    rec.get("locations", ()), rec.get("keywords", ()), rec.get("entities", ()),
                    dates.get("date") or day, str(first.session), rec.get("subject"), rec.get("attribute"),
                    dates.get("valid_from"))
    except ValueError as e:
        raise InputError(f"{where}: {e}") from None


def fact_date(v, name: str, where: str) -> str:
    """A caller's ``date`` / ``valid_from`` as the fact keeps it (module docstring)."""
    str_field(v, name, where, empty_ok=False, limit=MAX_DATE_CHARS)
    try:
        t = fact_time(v, name)  # ISO 8601, YYYY and YYYY-MM included
        return v if len(v) in (4, 7) else utc_text(t)  # a year or a month stays one
    except ValueError:
        pass
    try:
        return utc_text(parse_date(v))
    except ValueError as e:
        raise InputError(f"{where}: field {name!r}: {e}") from None


def extend_facts(old, records: list, encoder, done: dict):
    """``old`` (a bank) with fact ``records`` added (module docstring), superseding by rule; ``done``
    gets ``old``, ``new``, ``added`` (ids) and ``pairs`` (the supersessions). The step of
    :func:`add_facts`, and of an import that writes a bank's turns and facts in one commit."""
    from ..ingest.layers.facts import _renumber, with_facts
    from ..ingest.layers.supersede import supersede

    turns = {t.turn_id: t for t in old.turns}
    given = [fact_of(r, i, turns) for i, r in enumerate(records)]
    taken = {f.fact_id for f in old.facts} | set(turns)
    named = [i for i, r in enumerate(records) if r.get("id") is not None]
    for i in named:
        if given[i].fact_id in taken:
            raise InputError(f"facts[{i}]: field 'id': the bank holds a fact or turn {given[i].fact_id!r} already")
        taken.add(given[i].fact_id)
    unnamed = [i for i in range(len(given)) if i not in set(named)]
    probe = replace(old, facts=tuple(old.facts) + tuple(given[i] for i in named))
    for i, f in zip(unnamed, _renumber(probe, [given[i] for i in unnamed], turns)):
        given[i] = f
    source = old.layer_sources.get("facts", "api")
    nb = with_facts(old, given, encoder, source)
    res = supersede(old.facts, nb.facts[len(old.facts):])
    nb = replace(nb, facts=res.facts)
    nb.validate()
    done.update(old=old, new=nb, added=[f.fact_id for f in given], pairs=res.pairs)
    return nb


def fact_events(events: list[dict], pairs) -> list[dict]:
    """``events`` (a write's) with each added fact's ``supersedes`` set, and a ``superseded`` event
    (with ``by``) per pair of ``pairs`` (``ingest.layers.supersede``)."""
    from .history import event

    by_new = {p.new: p.old for p in pairs}
    for e in events:
        if e["event"] == "added" and e["unit"] in by_new:
            e["supersedes"] = by_new[e["unit"]]
    return events + [event(p.old, "superseded", p.cause, by=p.new) for p in pairs]


def add_facts(registry, bank_id: str, records, encoder) -> dict:
    """Add ``records`` to bank ``bank_id`` (module docstring); returns ``{"bank", "added": [ids],
    "superseded": [{"old", "new", "cause"}]}``."""
    from .history import write_events

    if isinstance(records, Mapping) or isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
        raise InputError(f"facts: expected a list of fact records, got {type(records).__name__}")
    records = list(records)
    if not records:
        raise InputError("facts: give at least one fact")
    done: dict = {}

    def add(old):
        if old is None:
            raise UnknownBank(bank_id)
        return extend_facts(old, records, encoder, done)

    if bank_id in registry.quarantined or registry.get(bank_id) is None:
        raise registry.absent(bank_id)
    bank = registry.rewrite(bank_id, add, lambda old, new: fact_events(
        write_events(old, new, "add_facts", sessions=set()), done["pairs"]))
    return {"bank": bank, "added": done["added"],
            "superseded": [{"old": p.old, "new": p.new, "cause": p.cause} for p in done["pairs"]]}
