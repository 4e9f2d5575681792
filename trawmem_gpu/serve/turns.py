"""Turns sent to ``POST /v1/banks/{bank_id}/turns``: validated as JSONL history records are.

A request's turns are checked in full before anything is written (a rejected append leaves
the bank unchanged). Records carry the JSONL fields (``turn_id``, ``speaker``, ``text``,
``timestamp``, optional ``caption`` and ``session``) without ``bank_id``, which the URL gives.
Sessions: either every turn of a request names its ``session`` or none does; without them
the first turn continues the bank's last session when it falls on the same calendar day and
opens the next session otherwise, and later turns open a new session whenever the day
changes (the JSONL loader's rule, continued across appends).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import replace

from ..data.jsonl import load_jsonl
from ..data.types import Turn
from ..errors import InputError


def parse_turns(bank_id: str, records: list[dict], last: Turn | None) -> list[Turn]:
    """Turns for ``bank_id`` from request records; ``last`` is the bank's last turn (None if new).

    Raises ``InputError`` naming ``turns[i]`` and the field.
    """
    if not records:
        raise InputError("turns: give at least one turn")
    with_session = ["session" in r and r["session"] is not None for r in records]
    if any(with_session) and not all(with_session):
        raise InputError("turns: give 'session' on every turn of a request or on none")
    turns = _validate(bank_id, records)
    if all(with_session) or last is None:
        return turns
    # load_jsonl numbered sessions from 1 by calendar day; continue the bank's numbering instead.
    first = turns[0]
    same_day = last.time is not None and first.time is not None and last.time.date() == first.time.date()
    base = last.session if same_day else last.session + 1
    return [replace(t, session=base + t.session - 1) for t in turns]


def _validate(bank_id: str, records: list[dict]) -> list[Turn]:
    # TEMPORARY until data/jsonl.py exposes its per-record validator: run the JSONL loader itself
    # on the records (one per line) so turns are checked exactly as `trawmem build` checks them,
    # and report its `FILE:LINE:` locations as `turns[i]:`.
    fd, name = tempfile.mkstemp(prefix="trawmem-turns-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps({**r, "bank_id": bank_id}, ensure_ascii=False) + "\n")
        try:
            convs = load_jsonl(name)
        except InputError as e:
            msg = re.sub(rf"^{re.escape(name)}:(\d+):",
                         lambda m: f"turns[{int(m.group(1)) - 1}]:", str(e))
            raise InputError(msg.replace(name, "turns")) from None
    finally:
        os.unlink(name)
    (conv,) = convs
    return conv.turns
