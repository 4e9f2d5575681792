"""An append request's items, checked one by one: the ``turns`` (``TurnIn``) or chat ``messages``
(``MessageIn``) of ``POST /v1/banks/{bank_id}/turns`` and of MCP ``add_turns``.

Each item is validated against its model on its own, with the fixed bounds of ``serve.models``:
an item that fails (or is not an object) is refused alone, naming its field
(``turns[3].timestamp: Field required``),
and the others go on to the Memory core (``memory.turns.screen``), which answers every item; with
``atomic`` the first refusal refuses the request (422), as before per-item answers existed.
"""
from __future__ import annotations

from pydantic import ValidationError

from ..errors import InputError
from ..memory.messages import DEFAULT_ROLES, check_roles, check_speakers, message_record
from ..memory.turns import AppendBatch, Assign, refused
from .models import MessageIn, TurnIn


def _first_error(e: ValidationError, where: str) -> str:
    """``where.field[i]: reason`` of the first error (the field, then list indices only: pydantic's
    union member tags such as ``constrained-str`` are left out); never the value."""
    err = e.errors(include_url=False, include_input=False)[0]
    loc = err["loc"]
    path = "".join([f".{loc[0]}" if loc else "", *(f"[{p}]" for p in loc[1:] if isinstance(p, int))])
    return f"{where}{path}: {err['msg']}"


def append_batch(turns, messages, *, speakers=None, roles=None, atomic: bool = False) -> AppendBatch:
    """The :class:`~trawmem_gpu.memory.turns.AppendBatch` of a request's raw ``turns`` or
    ``messages`` (lists of dicts; exactly one given). ``InputError`` for a request of the wrong
    shape (both or neither, ``speakers`` / ``roles`` with turns, an unknown role)."""
    if (turns is None) == (messages is None):
        raise InputError("give either `turns` or `messages` (chat messages), not " +
                         ("both" if turns is not None else "neither"))
    if messages is None and (speakers is not None or roles is not None):
        raise InputError("`speakers` and `roles` apply to chat messages (`messages`), not to `turns`")
    where, items = ("turns", turns) if turns is not None else ("messages", messages)
    model = TurnIn if turns is not None else MessageIn
    roles = check_roles(DEFAULT_ROLES if roles is None else roles)
    speakers = check_speakers(speakers)
    entries: list = []
    for i, raw in enumerate(items):
        if not isinstance(raw, dict):  # refused alone by the Memory core, in the Python door's words
            entries.append(raw if turns is not None else message_record(raw, i, roles, speakers))
            continue
        try:
            rec = model.model_validate(raw).model_dump(exclude_none=True)
        except ValidationError as e:
            tid = raw.get("turn_id", raw.get("id")) if isinstance(raw, dict) else None
            entries.append(refused(i, where, InputError(_first_error(e, f"{where}[{i}]")), tid))
            continue
        entries.append(rec if turns is not None else message_record(rec, i, roles, speakers))
    assign = None
    if messages is not None:
        from datetime import datetime, timezone

        assign = Assign(datetime.now(timezone.utc).replace(microsecond=0, tzinfo=None))
    return AppendBatch(entries, atomic, assign, where)
