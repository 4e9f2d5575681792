"""``Memory.add_facts``: facts given by the caller, added to a bank's facts layer with their key,
and superseding by rule (``ingest.layers.supersede.by_rule``) the current facts of the same
subject and attribute; no LLM is called.

A fact record: ``text`` and ``source_turns`` (ids of turns the bank holds), optional ``id``
(kept when free; else ``F:<session>:<n>``), ``subject`` and ``attribute`` (the key, together or
not at all), ``valid_from`` / ``date`` (ISO; default: the first source turn's date), ``persons``
(default: the source turns' speakers), ``locations``, ``keywords``, ``entities``. The records are
checked whole (an ``InputError`` naming ``facts[i]`` and the field; nothing is added), encoded
with the bank's encoder and written with the bank, under its lock, as an add writes turns; the
history gets ``added`` for each new fact and ``superseded`` (with ``by``) for each fact it replaced.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ..errors import InputError, UnknownBank
from ..store.facts import TIME_FIELDS, Fact

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
    bad = next((s for s in src if s not in turns), None)
    if bad is not None:
        raise InputError(f"{where}: field 'source_turns': the bank holds no turn {str(bad)[:64]!r}")
    first = turns[src[0]]
    day = first.time.date().isoformat() if first.time else None
    try:
        return Fact(str(rec.get("id") or f"F:new:{i}"), rec["text"], tuple(src),
                    rec.get("persons") or tuple(dict.fromkeys(turns[s].speaker for s in src)),
                    rec.get("locations", ()), rec.get("keywords", ()), rec.get("entities", ()),
                    rec.get("date") or day, str(first.session), rec.get("subject"), rec.get("attribute"),
                    rec.get("valid_from"))
    except ValueError as e:
        raise InputError(f"{where}: {e}") from None


def add_facts(registry, bank_id: str, records, encoder) -> dict:
    """Add ``records`` to bank ``bank_id`` (module docstring); returns ``{"bank", "added": [ids],
    "superseded": [{"old", "new", "cause"}]}``."""
    from ..ingest.layers.facts import _renumber, with_facts
    from ..ingest.layers.supersede import supersede
    from .history import event, write_events

    if isinstance(records, Mapping) or isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
        raise InputError(f"facts: expected a list of fact records, got {type(records).__name__}")
    records = list(records)
    if not records:
        raise InputError("facts: give at least one fact")
    done: dict = {}

    def add(old):
        if old is None:
            raise UnknownBank(bank_id)
        turns = {t.turn_id: t for t in old.turns}
        given = [fact_of(r, i, turns) for i, r in enumerate(records)]
        taken = {f.fact_id for f in old.facts} | set(turns)
        named = [i for i, r in enumerate(records) if r.get("id")]
        for i in named:
            if given[i].fact_id in taken:
                raise InputError(f"facts[{i}]: field 'id': the bank holds a fact or turn {given[i].fact_id!r} already")
            taken.add(given[i].fact_id)
        unnamed = [i for i in range(len(given)) if i not in set(named)]
        probe = replace(old, facts=tuple(old.facts) + tuple(given[i] for i in named))
        for i, f in zip(unnamed, _renumber(probe, [given[i] for i in unnamed], turns)):
            given[i] = f
        fresh = given
        source = old.layer_sources.get("facts", "api")
        nb = with_facts(old, fresh, encoder, source)
        res = supersede(old.facts, nb.facts[len(old.facts):])
        nb = replace(nb, facts=res.facts)
        nb.validate()
        done.update(old=old, new=nb, added=[f.fact_id for f in fresh], pairs=res.pairs)
        return nb

    if bank_id in registry.quarantined or registry.get(bank_id) is None:
        raise registry.absent(bank_id)
    with registry._bank_lock(bank_id):
        bank = registry.coll.update(bank_id, add)
        with registry._lock:
            registry._banks[bank_id] = bank
            registry.version += 1
        events = write_events(done["old"], bank, "add_facts", sessions=set())
        by_new = {p.new: p.old for p in done["pairs"]}
        for e in events:
            if e["event"] == "added" and e["unit"] in by_new:
                e["supersedes"] = by_new[e["unit"]]
        events += [event(p.old, "superseded", p.cause, by=p.new) for p in done["pairs"]]
        registry._record(bank_id, events)
    return {"bank": bank, "added": done["added"],
            "superseded": [{"old": p.old, "new": p.new, "cause": p.cause} for p in done["pairs"]]}
