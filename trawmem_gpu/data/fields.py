"""One rule for every input format: how a turn's fields are checked and made into a ``Turn``.

The LoCoMo and JSONL loaders (and callers that append single turns, such as a server) build
every turn through :func:`make_turn`, so the same input gives the same result, or the same
error, whatever the file format:

* **ids** (bank id, turn id): a non-empty string, or an integer taken as its decimal text;
  no control characters (ids end up in messages, directory names and workspaces), no invisible
  or bidirectional-control characters (zero-width spaces and joiners, the BOM, direction marks,
  embeddings, overrides and isolates), and in Unicode NFC form, so two ids that look the same
  are the same string;
* **speaker**: a non-empty string;
* **text**: a string. Numbers are an error (``3.5`` is not a message text);
* **caption**: a string or null; an empty string counts as no caption; anything else is an error;
* **empty turns**: empty (or whitespace) text with no caption carries nothing to remember.
  :func:`make_turn` raises :class:`EmptyTurn`; the file loaders skip such turns and count them
  in ``Conversation.skipped_empty`` (real exports hold a few: deleted messages, stickers);
* **Unicode**: every string must be encodable as UTF-8. A lone surrogate, which JSON can
  spell as ``"\\ud800"``, is an error naming the field;
* **timestamp**: a string that :func:`~trawmem_gpu.data.dates.parse_date` reads, with the
  chosen ``dayfirst``; one with an offset or zone (``2024-03-03T10:00:00+05:00``, ``...Z``) is
  kept verbatim and read as its UTC time (``Turn.time`` is naive UTC, so every turn's time
  compares with every other);
* **session**: an integer in ``0..MAX_SESSION`` (2**31 - 1); booleans and numbers with a
  fraction are errors. A session counted by calendar day that would pass ``MAX_SESSION`` is an
  error too (:func:`next_session`);
* **metadata** (a JSONL record's, so every door's but LoCoMo's, which has none): null or a flat
  map of keys to strings, numbers, booleans or ISO dates
  (:func:`~trawmem_gpu.data.metadata.metadata_field`: key and value rules, at most 64 keys);
* **lengths**: at most ``MAX_ID_CHARS`` (256) characters for an id, ``MAX_SPEAKER_CHARS`` (256)
  for ``speaker``, ``MAX_TEXT_CHARS`` (131,072) for ``text``, ``MAX_CAPTION_CHARS`` (8,192) for
  ``caption`` and ``MAX_DATE_CHARS`` (64) for ``timestamp``: the HTTP API's bounds
  (``serve.models`` imports these constants from :mod:`trawmem_gpu.data.types`), so a turn that
  one door accepts every door accepts.

Every door that stores turns (``build --input`` and ``--update``, ``Memory.add`` and so MCP
``add_turns``, ``POST /v1/banks/{id}/turns``, ``score --data``) reads them through these rules,
for every turn of the input or request, before anything is stored.

Control and bidirectional-override characters inside texts are kept as the source wrote them
(provenance); rendering strips them (``trawmem_gpu.select.workspace``).
"""
from __future__ import annotations

import re
import unicodedata
from datetime import datetime
from typing import Mapping

from ..errors import InputError
from .dates import naive_utc, parse_date
from .types import (MAX_CAPTION_CHARS, MAX_DATE_CHARS, MAX_ID_CHARS, MAX_SESSION, MAX_SPEAKER_CHARS,
                    MAX_TEXT_CHARS, Turn)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_INVISIBLE = re.compile(r"[\u200b-\u200f\u061c\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
"""Characters an id must not hide: zero-width spaces and joiners, direction marks, bidirectional
embeddings, overrides and isolates, invisible operators, the BOM."""


class EmptyTurn(InputError):
    """A turn with empty text and no caption (the loaders skip and count these)."""


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return f"number {v!r}"
    return {"dict": "an object", "list": "a list"}.get(type(v).__name__, type(v).__name__)


def valid_unicode(s: str, name: str, where: str) -> str:
    """``s`` when it is encodable as UTF-8; else an ``InputError`` naming ``where``, the field and
    the lone surrogate (the one rule of every reader: turns, benchmark questions, question files)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{where}: field {name!r} holds a lone surrogate {s[e.start]!r} at character {e.start} "
                         f"(not valid Unicode; fix the export)") from None
    return s


def _number(v: int) -> str:
    """An integer for a message: as written when short, else its size (never thousands of digits)."""
    return repr(v) if v.bit_length() <= 64 else f"an integer of {v.bit_length()} bits"


def check_len(v: str, name: str, where: str, limit: int) -> str:
    """``v`` when it has at most ``limit`` characters; else an ``InputError`` naming the field and
    the limit (never echoing the value)."""
    if len(v) > limit:
        raise InputError(f"{where}: field {name!r} is {len(v)} characters; the limit is {limit}")
    return v


def id_field(v, name: str, where: str) -> str:
    """A bank or turn id: non-empty string or integer, at most ``MAX_ID_CHARS`` characters, no
    control characters."""
    if isinstance(v, int) and not isinstance(v, bool):
        if v.bit_length() > 800:  # more digits than any id may hold (and str() of it would be slow)
            raise InputError(f"{where}: field {name!r} is {_number(v)}; the limit is {MAX_ID_CHARS} characters")
        return check_len(str(v), name, where, MAX_ID_CHARS)
    if not isinstance(v, str):
        raise InputError(f"{where}: field {name!r} must be a string or an integer, got {_kind(v)}")
    check_len(v, name, where, MAX_ID_CHARS)
    if not v.strip():
        raise InputError(f"{where}: field {name!r} is empty")
    valid_unicode(v, name, where)
    m = _CONTROL.search(v)
    if m:
        raise InputError(f"{where}: field {name!r} holds the control character {m.group(0)!r}")
    m = _INVISIBLE.search(v)
    if m:
        raise InputError(f"{where}: field {name!r} holds the invisible or bidirectional character "
                         f"U+{ord(m.group(0)):04X}")
    if not unicodedata.is_normalized("NFC", v):
        raise InputError(f"{where}: field {name!r} is not in Unicode NFC form (write it as "
                         f"{unicodedata.normalize('NFC', v)!r})")
    return v


def str_field(v, name: str, where: str, *, empty_ok: bool = True, limit: int | None = None) -> str:
    """A string field (text, speaker, timestamp), of at most ``limit`` characters when given;
    numbers, objects and lists are errors."""
    if not isinstance(v, str):
        raise InputError(f"{where}: field {name!r} must be a string, got {_kind(v)}")
    if limit is not None:
        check_len(v, name, where, limit)
    if not empty_ok and not v.strip():
        raise InputError(f"{where}: field {name!r} is empty")
    return valid_unicode(v, name, where)


def caption_field(v, name: str, where: str) -> str | None:
    """Null or a string of at most ``MAX_CAPTION_CHARS``; ``""`` is no caption."""
    if v is None:
        return None
    return str_field(v, name, where, limit=MAX_CAPTION_CHARS) or None


def session_field(v, name: str, where: str) -> int:
    """A session number: an integer in ``0..MAX_SESSION`` (not a boolean, not ``2.0``)."""
    if not isinstance(v, int) or isinstance(v, bool):
        raise InputError(f"{where}: field {name!r} must be an integer, got {_kind(v)}")
    if not 0 <= v <= MAX_SESSION:
        raise InputError(f"{where}: field {name!r} must lie in 0..{MAX_SESSION} (MAX_SESSION), got {_number(v)}")
    return int(v)


def next_session(prev: int, where: str, name: str = "session") -> int:
    """The session after ``prev`` (a new calendar day); an ``InputError`` when it would pass
    ``MAX_SESSION``."""
    if prev >= MAX_SESSION:
        raise InputError(f"{where}: field {name!r}: this turn opens a new session after session {prev}, beyond "
                         f"the largest session number {MAX_SESSION} (MAX_SESSION); renumber the bank's sessions")
    return prev + 1


JSONL_NAMES = {"turn_id": "turn_id", "speaker": "speaker", "text": "text", "caption": "caption",
               "timestamp": "timestamp", "session": "session", "metadata": "metadata"}
"""Source field names of each Turn field, for error messages (JSONL spelling)."""


def make_turn(where: str, *, turn_id, speaker, text, session: int, timestamp, caption=None,
              when: datetime | None = None, dayfirst: bool = False,
              names: Mapping[str, str] = JSONL_NAMES) -> Turn:
    """Check raw field values and build a ``Turn``; raises ``InputError`` naming ``where`` and the field.

    :param where: prefix of every message (``"file.jsonl:12"``, ``"file.json: sample 0 ..."``)
    :param when: ``timestamp`` already parsed (a LoCoMo session date is parsed once per session)
    :param dayfirst: how to read an ambiguous ``01.02.2023`` (the ``--dayfirst`` flag)
    :param names: the source's name of each field, for messages
    :raises EmptyTurn: empty text and no caption
    """
    tid = id_field(turn_id, names["turn_id"], where)
    spk = str_field(speaker, names["speaker"], where, empty_ok=False, limit=MAX_SPEAKER_CHARS)
    txt = str_field(text, names["text"], where, limit=MAX_TEXT_CHARS)
    cap = caption_field(caption, names["caption"], where)
    ts = str_field(timestamp, names["timestamp"], where, empty_ok=False, limit=MAX_DATE_CHARS)
    sess = session_field(session, names.get("session", "session"), where)
    try:
        when = parse_date(ts, dayfirst=dayfirst) if when is None else naive_utc(when, ts)
    except ValueError as e:
        raise InputError(f"{where}: field {names['timestamp']!r}: {e}") from None
    if not txt.strip() and not cap:
        raise EmptyTurn(f"{where}: turn {tid!r} has empty {names['text']!r} and no {names['caption']!r}")
    return Turn(tid, spk, txt, sess, ts, when, cap)
