"""Turns sent to ``POST /v1/banks/{bank_id}/turns``: checked as JSONL history records are.

Records carry the JSONL fields (``turn_id``, ``speaker``, ``text``, ``timestamp``, optional
``caption`` and ``session``) without ``bank_id``, which the URL gives; each goes through the JSONL
loader's own per-record rule (:func:`trawmem_gpu.data.jsonl.turn_from_record`), so a turn is
accepted or refused exactly as ``trawmem build`` would. Unlike a file load, a turn with empty
text and no caption is refused, not skipped (a client should know). Sessions: either every turn
of a request names its ``session`` or none does; without them the first turn continues the
bank's last session when it falls on the same calendar day and opens the next one otherwise, and
each later turn does the same against the turn before it.

Time order: an append never goes back in time. A turn dated before the turn it would follow (the
bank's last turn, or the one before it in the request) is refused, naming ``turns[i]`` and its
``timestamp`` (:func:`~trawmem_gpu.data.fields.check_order`, called by ``BankRegistry.append``
once a retry's stored turns are left out); nothing is stored.
"""
from __future__ import annotations

from ..data.jsonl import turn_from_record
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
    turns: list[Turn] = []
    seen: set[str] = set()
    prev = last
    for i, r in enumerate(records):
        _, turn = turn_from_record({**r, "bank_id": bank_id}, f"turns[{i}]", prev=prev)
        if turn.turn_id in seen:
            raise InputError(f"turns[{i}]: duplicate turn id {turn.turn_id!r} in this request")
        seen.add(turn.turn_id)
        turns.append(turn)
        prev = turn
    return turns
