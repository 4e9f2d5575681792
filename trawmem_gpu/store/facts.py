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
"""
from __future__ import annotations

from dataclasses import dataclass

SECTIONS: tuple[str, ...] = ("identity", "personality", "interests", "career", "relationships", "life_events",
                             "preferences")
"""The sections of a person's profile (TriMem's schema), in display order."""


def fact_id(session: int | str | None, n: int) -> str:
    """The id of the ``n``-th fact of ``session`` (``F:3:7``; ``F:-:7`` without a session)."""
    return f"F:{'-' if session is None else session}:{n}"


def profile_id(person: str, section: str) -> str:
    """The unit id of a profile section (``P:<person>:<section>``)."""
    return f"P:{person}:{section}"


def _strs(v, name: str) -> tuple[str, ...]:
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"field {name!r} must be a list of strings")
    return tuple(v)


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
        _text(self.fact_id, "fact_id")
        _text(self.text, "text")
        for name in ("source_turns", "persons", "locations", "keywords", "entities"):
            object.__setattr__(self, name, _strs(getattr(self, name), name))
        if not self.source_turns:
            raise ValueError(f"fact {self.fact_id!r}: field 'source_turns' is empty (a fact cites at least one turn)")
        for name in ("date", "session", "subject", "attribute", "valid_from", "valid_to", "superseded_by"):
            _opt_str(getattr(self, name), name)
        if (self.subject is None) != (self.attribute is None):
            raise ValueError(f"fact {self.fact_id!r}: give 'subject' and 'attribute' together (the fact's key) or "
                             f"neither")
        for name in ("valid_from", "valid_to"):
            if getattr(self, name) is not None:
                _iso_date(getattr(self, name), name)

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

    def valid_at(self, day: str) -> bool:
        """Whether it held on ``day`` (ISO): started by then (a fact with no start always has) and
        not superseded before it (``valid_to`` is the first day it no longer holds)."""
        d = day[:10]
        return (self.start is None or self.start[:10] <= d) and (self.valid_to is None or d < self.valid_to[:10])

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


def _iso_date(v: str, name: str) -> str:
    """``v`` when it is an ISO date (``YYYY``, ``YYYY-MM``, ``YYYY-MM-DD``, or a date-time)."""
    from datetime import date

    try:
        y, m, d = (v[:10].split("-") + ["01", "01"])[:3]
        date(int(y), int(m), int(d))
        if len(y) != 4 or (len(v) > 10 and v[10] not in "T "):
            raise ValueError
    except ValueError:
        raise ValueError(f"field {name!r} must be an ISO date (YYYY-MM-DD), got {v[:40]!r}") from None
    return v


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
