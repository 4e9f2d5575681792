"""Loader for users' own histories: JSON Lines, one turn per line.

Fields per line: ``bank_id``, ``turn_id``, ``speaker``, ``text``, ``timestamp`` (any date
:func:`~trawmem_gpu.data.dates.parse_date` reads; one with an offset is read as its UTC time),
optional ``caption``, optional integer ``session`` (0..2**31 - 1) and optional ``metadata`` (a flat
map of keys to strings, numbers, booleans or ISO dates: :mod:`trawmem_gpu.data.metadata`). Any other field is an
error naming it (a misspelled ``sesion`` would otherwise be dropped unseen). Within one bank
either every line carries ``session`` or none does; without it, a new session starts whenever
the calendar day of ``timestamp`` changes. Lines of a bank keep their file order. Blank lines
are skipped. Field rules (types, bounds, empty turns, Unicode) are those of
:mod:`trawmem_gpu.data.fields`, shared with the LoCoMo loader and every append.

A JSON array of such objects is not JSONL: the loaders say so (``turns are JSON Lines``).

Lines are split on ``\\n`` only: U+2028 / U+2029 and other separators are legal inside JSON
strings. Each line is decoded as UTF-8 on its own, so a bad byte is reported with its line.

:func:`turn_from_record` checks one record; a server that appends turns uses it directly.
:func:`record_of` is the other way: a turn as such a record carries it (without ``bank_id``), what
``Memory.add`` and the HTTP client send.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..errors import InputError, loads_json
from .fields import EmptyTurn, id_field, make_turn, next_session, session_field
from .metadata import metadata_field
from .types import Conversation, Turn

REQUIRED = ("bank_id", "turn_id", "speaker", "text", "timestamp")
TURN_FIELDS = ("turn_id", "speaker", "text", "timestamp", "session", "caption", "metadata")
"""The fields of a record that describe the turn (all but ``bank_id``)."""
RECORD_FIELDS = ("bank_id", *TURN_FIELDS)
"""Every field a record may carry; any other is refused."""
JSONL_HINT = ("the turns format is JSON Lines: one JSON object per line, in a .jsonl file (not a JSON array); "
              "see docs/cli.md")


def record_of(t, where: str = "turn", bank_id: str | None = None) -> dict:
    """A turn as a record carries it, without ``bank_id``: a dict as given (a ``bank_id`` in it must
    be ``bank_id`` and is dropped), or a :class:`Turn` or any object with the turn's fields as
    attributes (those that are set; an empty caption is left out). The fields themselves are
    checked where the record is read (:func:`turn_from_record`).

    :raises InputError: not a dict nor an object with turn fields, or a dict for another bank
    """
    if isinstance(t, dict):
        if "bank_id" in t and bank_id is not None and t["bank_id"] != bank_id:
            raise InputError(f"{where}.bank_id: {t['bank_id']!r} is not the bank the turns are added to ({bank_id!r})")
        return {k: v for k, v in t.items() if k != "bank_id"}
    got = {k: getattr(t, k, None) for k in TURN_FIELDS}
    rec = {k: v for k, v in got.items() if v is not None and (v != "" or k == "text")}  # "" text: a caption-only turn
    if not {"turn_id", "speaker"} & rec.keys():
        raise InputError(f"{where}: expected a dict or an object with turn_id, speaker, text and timestamp, "
                         f"got {type(t).__name__}")
    return rec


def turn_from_record(rec, where: str = "record", *, prev: Turn | None = None,
                     dayfirst: bool = False) -> tuple[str, Turn]:
    """One JSONL record (a dict) -> ``(bank id, Turn)``, with the loader's checks and messages.

    The session is the record's ``session`` (an integer, not below ``prev.session``), else it is
    counted by calendar day: the session of ``prev`` when the turn falls on the same day, the
    next one on another day, 1 without ``prev``. A server appending to a bank passes the bank's
    last turn as ``prev``.

    :raises InputError: a missing or malformed field (the message names ``where`` and the field)
    :raises EmptyTurn: empty text and no caption (an ``InputError``; the file loader skips these)
    """
    if not isinstance(rec, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    extra = [k for k in rec if k not in RECORD_FIELDS]
    if "stored_at" in extra:
        raise InputError(f"{where}: field 'stored_at': set by the store when a turn is stored, never given "
                         f"(a turn's time is its 'timestamp')")
    if extra:
        raise InputError(f"{where}: unknown field {str(extra[0])[:64]!r} (a turn's fields are "
                         f"{', '.join(RECORD_FIELDS)})")
    for f in REQUIRED:
        if f not in rec:
            raise InputError(f"{where}: missing field {f!r}")
    bank = id_field(rec["bank_id"], "bank_id", where)
    sess = rec.get("session")
    if sess is not None:
        session_field(sess, "session", where)
        if prev is not None and sess < prev.session:
            raise InputError(f"{where}: field 'session' goes backwards ({sess} after {prev.session})")
    turn = make_turn(where, turn_id=rec["turn_id"], speaker=rec["speaker"], text=rec["text"],
                     timestamp=rec["timestamp"], caption=rec.get("caption"), session=sess or 0, dayfirst=dayfirst)
    meta = metadata_field(rec.get("metadata"), where)
    if meta is not None:
        turn = replace(turn, metadata=meta)
    if sess is None:
        if prev is None:
            sess = 1
        elif prev.time is not None and turn.time.date() == prev.time.date():
            sess = prev.session
        else:
            sess = next_session(prev.session, where)
        turn = replace(turn, session=sess)
    return bank, turn


def _lines(path: Path):
    """``(line number, text)`` of each non-blank line, split on ``\\n`` only, decoded one by one."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    for ln, b in enumerate(raw.split(b"\n"), 1):
        if ln == 1 and b.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
            b = b[3:]
        try:
            line = b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{path}:{ln}: not UTF-8 (byte 0x{b[e.start]:02x} at column {e.start + 1})") from None
        if line.strip():
            yield ln, line


def load_jsonl(path: str | Path, *, dayfirst: bool = False) -> list[Conversation]:
    """Load a JSONL history; one ``Conversation`` per ``bank_id``, in order of first appearance."""
    path = Path(path)
    banks: dict[str, list[Turn]] = {}
    seen: dict[str, set[str]] = {}
    explicit: dict[str, tuple[bool, int]] = {}  # bank -> (has session, first line)
    skipped: dict[str, int] = {}
    for ln, line in _lines(path):
        where = f"{path}:{ln}"
        try:
            rec = loads_json(line)
        except json.JSONDecodeError as e:
            hint = f" ({JSONL_HINT})" if line.lstrip().startswith("[") else ""
            raise InputError(f"{where}: bad JSON at column {e.colno}: {e.msg}{hint}") from None
        except ValueError as e:  # an integer of more digits than Python converts; nested too deeply
            raise InputError(f"{where}: bad JSON: {e}") from None
        if not isinstance(rec, dict):
            hint = f" ({JSONL_HINT})" if isinstance(rec, list) else ""
            raise InputError(f"{where}: expected a JSON object per line{hint}")
        bank = id_field(rec.get("bank_id"), "bank_id", where) if "bank_id" in rec else None
        prev = banks.get(bank, [None])[-1] if bank is not None else None
        try:
            bank, turn = turn_from_record(rec, where, prev=prev, dayfirst=dayfirst)
        except EmptyTurn:
            skipped[bank] = skipped.get(bank, 0) + 1
            continue
        has = "session" in rec and rec["session"] is not None
        first = explicit.setdefault(bank, (has, ln))
        if first[0] != has:
            raise InputError(f"{where}: field 'session' is {'given' if has else 'missing'} here but "
                             f"{'given' if first[0] else 'missing'} on line {first[1]} of bank {bank!r}; "
                             f"give it on every line of a bank or on none")
        if turn.turn_id in seen.setdefault(bank, set()):
            raise InputError(f"{where}: duplicate turn id {turn.turn_id!r} in field 'turn_id' of bank {bank!r}")
        seen[bank].add(turn.turn_id)
        banks.setdefault(bank, []).append(turn)
    if not banks:
        extra = f" ({sum(skipped.values())} turns with empty text skipped)" if skipped else ""
        raise InputError(f"{path}: empty conversation file (no turns){extra}")
    return [Conversation(b, ts, tuple(dict.fromkeys(t.speaker for t in ts)),
                         session_source="explicit" if explicit[b][0] else "calendar_day",
                         skipped_empty=skipped.get(b, 0)) for b, ts in banks.items()]
