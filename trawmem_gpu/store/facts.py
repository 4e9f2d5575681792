"""The records of a bank's layers: atomic facts and profile sections, frozen and JSON-(de)serializable.

A :class:`Fact` is one lossless restatement in one sentence (pronouns replaced by names, relative
dates resolved), with its persons, locations, keywords and entities, and the ids of the turns it
came from (``source_turns``, turn ids of the bank). A fact may carry a key (``subject``,
``attribute``) and a validity (``valid_from``, ``valid_to``, ``superseded_by``): a newer fact about
the same subject and attribute supersedes it, and it stays, no longer current
(``ingest.layers.supersede``; selection shows current facts, or those valid ``as_of`` a date). Fact ids are bank-unique strings
(``F:<session>:<n>`` by :func:`fact_id`). A :class:`ProfileSection` is one section of one
person's profile (:data:`SECTIONS`); each of its lines keeps the ids of the facts behind it.

``to_record`` / ``*_from_record`` are the JSON forms the bank files hold (``store/files.py``);
reading checks every field and raises ``ValueError`` naming it.

**One schema** (issue 42.6): every :class:`Fact`, whatever made it (``Memory.add_facts``, the LLM
extraction, LoCoMo observations, a bank file read back), is checked by its constructor with the
turns' rules (``data.fields``): the id as a turn id (a string of at most ``MAX_ID_CHARS``, no
control or invisible characters, NFC), ``text`` non-empty and at most ``MAX_TEXT_CHARS``,
``subject``, ``attribute`` and each person, location, keyword and entity at most
``MAX_SPEAKER_CHARS``, at most :data:`MAX_FACT_NAMES` of each and :data:`MAX_FACT_SOURCES` source
turns, and ``date``, ``valid_from``, ``valid_to`` ISO dates (``YYYY``, ``YYYY-MM``,
``YYYY-MM-DD`` or an ISO date-time, at most ``MAX_DATE_CHARS``: :func:`fact_time`).

**Validity in UTC.** A fact's start (``valid_from``, else ``date``) and ``valid_to`` are instants:
a date-time with an offset is read as its UTC time, a bare date as its UTC midnight
(:func:`fact_time`); ``as_of`` is one too (a date alone: the end of that UTC day). A fact holds at
``t`` when it started by then and ``valid_to`` is after it (:meth:`Fact.valid_at`); shown as
current (no ``as_of``) are the facts not superseded whose ``valid_from`` is not after now (a fact
valid only from 2999 is not current; a ``date`` ahead, a coming event's, hides nothing): the
later of the clock's now and the bank's newest turn
(``store.view.facts_at``; a conversation dated ahead of the clock, as the sample's 2031, has its
own now).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone

from ..data.dates import naive_utc
from ..data.fields import id_field, str_field
from ..data.types import MAX_DATE_CHARS, MAX_SPEAKER_CHARS, MAX_TEXT_CHARS

SECTIONS: tuple[str, ...] = ("identity", "personality", "interests", "career", "relationships", "life_events",
                             "preferences")
"""The sections of a person's profile (TriMem's schema), in display order."""


def fact_id(session: int | str | None, n: int) -> str:
    """The id of the ``n``-th fact of ``session`` (``F:3:7``; ``F:-:7`` without a session)."""
    return f"F:{'-' if session is None else session}:{n}"


def profile_id(person: str, section: str) -> str:
    """The unit id of a profile section (``P:<person>:<section>``)."""
    return f"P:{person}:{section}"


MAX_FACT_NAMES = 64
"""Most persons (locations, keywords, entities) of one fact."""
MAX_FACT_SOURCES = 4096
"""Most source turns of one fact."""


def _strs(v, name: str, where: str = "fact", limit: int = MAX_FACT_NAMES) -> tuple[str, ...]:
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"field {name!r} must be a list of strings")
    if len(v) > limit:
        raise ValueError(f"field {name!r} holds {len(v)} items; the limit is {limit}")
    for x in v:
        (id_field if name == "source_turns" else str_field)(x, name, where, **(
            {} if name == "source_turns" else {"empty_ok": False, "limit": MAX_SPEAKER_CHARS}))
    return tuple(v)


def fact_time(v: str, name: str = "date") -> datetime:
    """The naive UTC instant an ISO date of a fact names (module docstring): ``YYYY``,
    ``YYYY-MM`` and ``YYYY-MM-DD`` at their first UTC midnight, a date-time (``T`` or a space,
    ``Z`` or an offset) as its UTC time; ``ValueError`` naming ``name`` for anything else or a
    text over ``MAX_DATE_CHARS`` (nothing is parsed then)."""
    if not isinstance(v, str):
        raise ValueError(f"field {name!r} must be an ISO date string, got {type(v).__name__}")
    if len(v) > MAX_DATE_CHARS:
        raise ValueError(f"field {name!r} is {len(v)} characters; the limit is {MAX_DATE_CHARS}")
    try:
        if len(v) == 4 and v.isdigit():  # YYYY, YYYY-MM: the start of the year or month
            return datetime(int(v), 1, 1)
        if len(v) == 7 and v[:4].isdigit() and v[4] == "-" and v[5:].isdigit():
            return datetime(int(v[:4]), int(v[5:]), 1)
        if len(v) < 10 or not (v[:4].isdigit() and v[4] == "-"):
            raise ValueError
        return naive_utc(datetime.fromisoformat(v.replace("Z", "+00:00")), v)
    except (ValueError, OverflowError):
        raise ValueError(f"field {name!r} must be an ISO date (YYYY-MM-DD, or an ISO date-time), "
                         f"got {v[:40]!r}") from None


def utc_text(d: datetime) -> str:
    """The ISO text a fact's date or an ``as_of`` is kept as, for the naive UTC time ``d`` a door
    parsed: the day (``YYYY-MM-DD``; as an ``as_of``, the end of that day) when ``d`` is a
    midnight, else the date-time."""
    return d.date().isoformat() if d.time() == time() else d.isoformat()


def _at(as_of: str | None, now: datetime | None = None) -> datetime:
    """The instant ``as_of`` names (a day alone: its end; None: ``now``, else the clock's now, UTC)."""
    if as_of is None:
        return now or datetime.now(timezone.utc).replace(tzinfo=None)
    t = fact_time(as_of, "as_of")
    return t + timedelta(days=1) - timedelta.resolution if len(as_of) == 10 else t


def _text(v, name: str, *, empty_ok: bool = False) -> str:
    if not isinstance(v, str) or (not empty_ok and not v.strip()):
        raise ValueError(f"field {name!r} must be a non-empty string")
    return v


def _opt_str(v, name: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise ValueError(f"field {name!r} must be a string or null")
    return v


@dataclass(frozen=True)
class Fact:
    """One atomic fact of a bank, linked to the turns it came from."""

    fact_id: str
    text: str
    source_turns: tuple[str, ...]
    """Turn ids of the bank the fact restates (at least one)."""
    persons: tuple[str, ...] = ()
    locations: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    entities: tuple[str, ...] = ()
    date: str | None = None
    """When it happened or was said, ISO (``2031-05-07``), resolved against the session date; None: unknown."""
    session: str | None = None
    """The session of its source turns (the bank's session number as a string); None: several or unknown."""
    subject: str | None = None
    """What the fact is about (``Ana``), with ``attribute`` its key: a newer fact of the same key
    supersedes it (``ingest.layers.supersede``); None: no key."""
    attribute: str | None = None
    """Which property of the subject it states (``lives in``); None: no key."""
    valid_from: str | None = None
    """ISO date from which it holds (None: its ``date``)."""
    valid_to: str | None = None
    """ISO date until which it held (set when superseded; None: still holds)."""
    superseded_by: str | None = None
    """The id of the fact that replaced it (None: current)."""

    def __post_init__(self):
        """The fact schema (module docstring); ``ValueError`` (an ``InputError`` for the id and
        string rules of ``data.fields``) naming the field."""
        id_field(self.fact_id, "id", "fact")
        where = f"fact {self.fact_id!r}"
        _text(self.text, "text")
        str_field(self.text, "text", where, limit=MAX_TEXT_CHARS)
        for name in ("source_turns", "persons", "locations", "keywords", "entities"):
            object.__setattr__(self, name, _strs(getattr(self, name), name, where,
                                                 MAX_FACT_SOURCES if name == "source_turns" else MAX_FACT_NAMES))
        if not self.source_turns:
            raise ValueError(f"fact {self.fact_id!r}: field 'source_turns' is empty (a fact cites at least one turn)")
        for name in ("date", "session", "subject", "attribute", "valid_from", "valid_to", "superseded_by"):
            _opt_str(getattr(self, name), name)
        for name in ("subject", "attribute"):
            if getattr(self, name) is not None:
                str_field(getattr(self, name), name, where, empty_ok=False, limit=MAX_SPEAKER_CHARS)
        if (self.subject is None) != (self.attribute is None):
            raise ValueError(f"fact {self.fact_id!r}: give 'subject' and 'attribute' together (the fact's key) or "
                             f"neither")
        for name in ("date", "valid_from", "valid_to"):
            if getattr(self, name) is not None:
                fact_time(getattr(self, name), name)

    @property
    def key(self) -> tuple[str, str] | None:
        """``(subject, attribute)``, case and spacing aside; None without a key."""
        if self.subject is None:
            return None
        return (" ".join(self.subject.casefold().split()), " ".join(self.attribute.casefold().split()))

    @property
    def start(self) -> str | None:
        """When it holds from: ``valid_from``, else ``date``."""
        return self.valid_from or self.date

    @property
    def current(self) -> bool:
        return self.superseded_by is None

    @property
    def start_time(self) -> datetime | None:
        """:attr:`start` as a naive UTC instant (:func:`fact_time`)."""
        return None if self.start is None else fact_time(self.start)

    def valid_at(self, as_of: str | None = None, now: datetime | None = None) -> bool:
        """Whether it holds at ``as_of`` (an ISO date: the end of that UTC day; an ISO date-time:
        that instant; None: ``now``, a naive UTC time, by default the clock's, and then only a
        fact not superseded): started by then (a fact with no start always has; for now, its
        ``valid_from`` only: a ``date`` ahead, a coming event's, does not hide a current fact) and
        not superseded before it (``valid_to``, the instant it no longer holds, is after it).
        Compared in UTC (module docstring)."""
        t = _at(as_of, now)
        start = self.start if as_of is not None else self.valid_from  # now: a fact about a coming event holds
        if start is not None and fact_time(start) > t:
            return False
        if self.valid_to is not None:
            return t < fact_time(self.valid_to)
        return as_of is not None or self.current

    def to_record(self) -> dict:
        rec = {"id": self.fact_id, "text": self.text, "source_turns": list(self.source_turns),
               "persons": list(self.persons), "locations": list(self.locations), "keywords": list(self.keywords),
               "entities": list(self.entities), "date": self.date, "session": self.session}
        for name in TIME_FIELDS:  # only when set: a bank without them writes the records it always wrote
            if getattr(self, name) is not None:
                rec[name] = getattr(self, name)
        return rec


TIME_FIELDS = ("subject", "attribute", "valid_from", "valid_to", "superseded_by")
"""A fact's key and validity fields (stored only when set)."""


def fact_from_record(r) -> Fact:
    """A :class:`Fact` from its JSON record (``Fact.to_record``); ``ValueError`` names a bad field."""
    if not isinstance(r, dict):
        raise ValueError(f"a fact record must be an object, got {type(r).__name__}")
    missing = [k for k in ("id", "text", "source_turns") if k not in r]
    if missing:
        raise ValueError(f"fact record misses field {missing[0]!r}")
    return Fact(r["id"], r["text"], r["source_turns"], r.get("persons", ()), r.get("locations", ()),
                r.get("keywords", ()), r.get("entities", ()), r.get("date"), r.get("session"),
                **{k: r.get(k) for k in TIME_FIELDS})


@dataclass(frozen=True)
class ProfileLine:
    """One line of a profile section, with the ids of the facts behind it."""

    text: str
    fact_ids: tuple[str, ...] = ()

    def __post_init__(self):
        _text(self.text, "text")
        object.__setattr__(self, "fact_ids", _strs(self.fact_ids, "fact_ids"))

    def to_record(self) -> dict:
        return {"text": self.text, "fact_ids": list(self.fact_ids)}


@dataclass(frozen=True)
class ProfileSection:
    """One section (:data:`SECTIONS`) of one person's profile: a unit of its own."""

    person: str
    section: str
    lines: tuple[ProfileLine, ...] = ()

    def __post_init__(self):
        _text(self.person, "person")
        if self.section not in SECTIONS:
            raise ValueError(f"field 'section' must be one of {', '.join(SECTIONS)} (got {self.section!r})")
        if not isinstance(self.lines, (list, tuple)) or not all(isinstance(x, ProfileLine) for x in self.lines):
            raise ValueError("field 'lines' must be a list of ProfileLine")
        object.__setattr__(self, "lines", tuple(self.lines))

    @property
    def unit_id(self) -> str:
        return profile_id(self.person, self.section)

    @property
    def fact_ids(self) -> tuple[str, ...]:
        """The facts behind the section's lines, each once, in order."""
        return tuple(dict.fromkeys(f for ln in self.lines for f in ln.fact_ids))

    def text(self) -> str:
        """The section as one text: its lines joined by ``; ``."""
        return "; ".join(ln.text for ln in self.lines)

    def to_record(self) -> dict:
        return {"person": self.person, "section": self.section, "lines": [ln.to_record() for ln in self.lines]}


def profile_from_record(r) -> ProfileSection:
    """A :class:`ProfileSection` from its JSON record; ``ValueError`` names a bad field."""
    if not isinstance(r, dict):
        raise ValueError(f"a profile record must be an object, got {type(r).__name__}")
    for k in ("person", "section", "lines"):
        if k not in r:
            raise ValueError(f"profile record misses field {k!r}")
    if not isinstance(r["lines"], list):
        raise ValueError("field 'lines' must be a list")
    lines = []
    for ln in r["lines"]:
        if not isinstance(ln, dict) or "text" not in ln:
            raise ValueError("a profile line must be an object with field 'text'")
        lines.append(ProfileLine(ln["text"], ln.get("fact_ids", ())))
    return ProfileSection(r["person"], r["section"], tuple(lines))
