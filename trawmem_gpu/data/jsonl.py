"""Loader for users' own histories: JSON Lines, one turn per line.

Fields per line: ``bank_id``, ``turn_id``, ``speaker``, ``text``, ``timestamp`` (ISO 8601 or
LoCoMo style), optional ``caption`` and optional integer ``session``. Without ``session``, a
new session starts whenever the calendar day of ``timestamp`` changes. Lines of a bank keep
their file order. Blank lines are skipped.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError
from .dates import parse_date
from .types import Conversation, Turn

REQUIRED = ("bank_id", "turn_id", "speaker", "text", "timestamp")


def load_jsonl(path: str | Path) -> list[Conversation]:
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    banks: dict[str, list[Turn]] = {}
    seen: dict[str, set[str]] = {}
    last_day: dict[str, tuple] = {}
    session_of: dict[str, int] = {}
    for ln, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{ln}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: bad JSON at column {e.colno}: {e.msg}") from None
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected a JSON object per line")
        for f in REQUIRED:
            if f not in rec:
                raise InputError(f"{where}: missing field {f!r}")
            if not isinstance(rec[f], (str, int)) or isinstance(rec[f], bool):
                raise InputError(f"{where}: field {f!r} must be a string")
        bank, tid = str(rec["bank_id"]), str(rec["turn_id"])
        if not str(rec["text"]).strip() and not rec.get("caption"):
            raise InputError(f"{where}: field 'text' is empty")
        if tid in seen.setdefault(bank, set()):
            raise InputError(f"{where}: duplicate turn id {tid!r} in field 'turn_id' of bank {bank!r}")
        seen[bank].add(tid)
        try:
            when = parse_date(str(rec["timestamp"]))
        except ValueError as e:
            raise InputError(f"{where}: field 'timestamp': {e}") from None
        if "session" in rec:
            if not isinstance(rec["session"], int) or isinstance(rec["session"], bool):
                raise InputError(f"{where}: field 'session' must be an integer")
            sess = rec["session"]
            prev = banks.get(bank)
            if prev and sess < prev[-1].session:
                raise InputError(f"{where}: field 'session' goes backwards ({sess} after {prev[-1].session})")
        else:
            day = when.date()
            if bank not in session_of:
                session_of[bank] = 1
            elif last_day[bank] != day:
                session_of[bank] += 1
            last_day[bank] = day
            sess = session_of[bank]
        cap = rec.get("caption")
        if cap is not None and not isinstance(cap, str):
            raise InputError(f"{where}: field 'caption' must be a string")
        banks.setdefault(bank, []).append(
            Turn(tid, str(rec["speaker"]), str(rec["text"]), sess, str(rec["timestamp"]), when, cap or None))
    if not banks:
        raise InputError(f"{path}: empty conversation file (no turns)")
    return [Conversation(b, ts, tuple(dict.fromkeys(t.speaker for t in ts))) for b, ts in banks.items()]
