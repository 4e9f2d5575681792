"""Chat messages in (``Memory.add(bank_id, messages=...)``, the HTTP append route's ``messages``,
MCP ``add_turns``): OpenAI-style ``{"role", "content", "name"}`` messages become turn records.

* **Roles.** ``user`` and ``assistant`` messages are stored by default; ``system``,
  ``developer``, ``tool`` and ``function`` messages are skipped (reported per item as
  ``skipped``) unless ``roles`` names them. An assistant message that only calls tools (no text)
  is skipped as a tool call.
* **Speaker.** The message's ``name``; else ``speakers[role]`` (``speakers={"user": "Ana",
  "assistant": "Bot"}``); else the role itself (``user``).
* **Content.** A string, or OpenAI's list of parts: the ``text`` parts (``text``, ``input_text``,
  ``output_text``) are joined by a new line; any other part (``image_url``, ``input_audio``,
  ``file``) is refused, naming ``messages[i].content[j].type``: this memory stores text, and an
  image enters as its ``caption`` (a message may carry one).
* **Ids and times.** A message may carry ``id`` (or ``turn_id``), ``timestamp``, ``caption`` and
  ``session``; an id or timestamp it lacks is assigned under the bank's lock
  (``memory.turns.Assign``): ``msg-<n>`` numbered on past the bank's turn count and its highest
  ``msg-<n>``, never an id the bank or the request holds, and the time of the add. To make a retry safe (``already_stored``),
  give each message an ``id``.
* OpenAI's other message fields (``tool_calls``, ``tool_call_id``, ``function_call``,
  ``audio``, ``refusal``, ``annotations``) are read for nothing else and not stored; an unknown
  field is refused, naming it (a misspelled ``timestamp`` is never dropped unseen).

Each message becomes either a record for ``memory.turns.screen`` or an
:class:`~.turns.AppendItem` decided here (skipped, or refused with its field and reason).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..errors import InputError
from .turns import AppendItem

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""The roles of OpenAI's chat messages."""
DEFAULT_ROLES = ("user", "assistant")
"""The roles stored unless ``roles`` says otherwise."""
TEXT_PARTS = ("text", "input_text", "output_text")
"""Content part types whose ``text`` is stored."""
IGNORED = ("tool_calls", "tool_call_id", "function_call", "audio", "refusal", "annotations")
"""OpenAI message fields that are accepted and not stored."""
CARRIED = {"id": "turn_id", "turn_id": "turn_id", "timestamp": "timestamp", "caption": "caption",
           "session": "session", "metadata": "metadata"}
"""Message field -> the turn record field it fills."""
MESSAGE_FIELDS = ("role", "content", "name", *CARRIED, *IGNORED)


def check_roles(roles) -> tuple[str, ...]:
    """``roles`` as a tuple of known roles (``InputError`` naming ``roles`` otherwise)."""
    if isinstance(roles, str) or not isinstance(roles, Iterable):
        raise InputError(f"roles: expected a list of roles ({', '.join(ROLES)}), got {type(roles).__name__}")
    roles = tuple(roles)
    bad = [r for r in roles if r not in ROLES]
    if bad:
        raise InputError(f"roles: unknown role {str(bad[0])[:40]!r} (the roles are {', '.join(ROLES)})")
    return roles


def check_speakers(speakers) -> dict[str, str]:
    """``speakers`` as a role -> speaker map (``InputError`` naming ``speakers`` otherwise)."""
    if speakers is None:
        return {}
    if not isinstance(speakers, Mapping):
        raise InputError(f"speakers: expected a map of role to speaker name, got {type(speakers).__name__}")
    for k, v in speakers.items():
        if k not in ROLES:
            raise InputError(f"speakers: unknown role {str(k)[:40]!r} (the roles are {', '.join(ROLES)})")
        if not isinstance(v, str) or not v.strip():
            raise InputError(f"speakers.{k}: expected a speaker name (a non-empty string)")
    return dict(speakers)


def _text_of(content, where: str) -> str:
    """A message's content as text (see the module docstring); ``InputError`` naming the part."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError(f"{where}.content: expected a string or a list of content parts, got "
                         f"{type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise InputError(f"{where}.content[{j}]: expected a content part (an object with 'type'), got "
                             f"{type(part).__name__}")
        kind = part.get("type")
        if kind not in TEXT_PARTS:
            raise InputError(f"{where}.content[{j}].type: a {str(kind)[:40]!r} part cannot be stored; this memory "
                             f"stores text (parts of type {', '.join(TEXT_PARTS)}): send the text, or describe an "
                             f"image in the message's 'caption'")
        if not isinstance(part.get("text"), str):
            raise InputError(f"{where}.content[{j}].text: expected a string")
        texts.append(part["text"])
    return "\n".join(texts)


def message_record(m, i: int, roles: tuple[str, ...], speakers: dict[str, str]):
    """Message ``i`` as a turn record (dict), or the :class:`AppendItem` that skips or refuses it."""
    from .turns import refused, shown_id

    where = f"messages[{i}]"
    try:
        if not isinstance(m, Mapping):
            raise InputError(f"{where}: expected a message (an object with 'role' and 'content'), got "
                             f"{type(m).__name__}")
        extra = [k for k in m if k not in MESSAGE_FIELDS]
        if extra:
            raise InputError(f"{where}: unknown field {str(extra[0])[:64]!r} (a message's fields are role, content, "
                             f"name, id, timestamp, caption, session)")
        role = m.get("role")
        if role not in ROLES:
            raise InputError(f"{where}: field 'role' must be one of {', '.join(ROLES)}, got "
                             f"{str(role)[:40] if isinstance(role, str) else type(role).__name__!r}")
        tid = m.get("id", m.get("turn_id"))
        if role not in roles:
            return AppendItem(i, "skipped", shown_id(tid), f"{where}.role",
                              f"{role} messages are not stored (roles={list(roles)})")
        if m.get("content") is None and m.get("tool_calls") and not m.get("caption"):
            return AppendItem(i, "skipped", shown_id(tid), f"{where}.content", "a tool call without text is not stored")
        rec = {CARRIED[k]: v for k, v in m.items() if k in CARRIED and v is not None}
        rec["text"] = "" if m.get("content") is None else _text_of(m["content"], where)
        name = m.get("name")
        rec["speaker"] = name if name is not None else speakers.get(role, role)
        return rec
    except InputError as e:
        return refused(i, "messages", e, m.get("id", m.get("turn_id")) if isinstance(m, Mapping) else None)


def message_entries(messages, *, roles=DEFAULT_ROLES, speakers=None) -> list:
    """Every message of ``messages`` as a record or a decided :class:`AppendItem` (see the module
    docstring); ``InputError`` when ``messages``, ``roles`` or ``speakers`` is not of its shape."""
    if messages is None or isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise InputError(f"messages: expected a list of chat messages ({{'role', 'content', 'name'}}), got "
                         f"{type(messages).__name__}")
    roles, speakers = check_roles(roles), check_speakers(speakers)
    return [message_record(m, i, roles, speakers) for i, m in enumerate(messages)]


def request_batch(bank_id: str, turns=None, messages=None, *, speakers=None, roles=None,
                  atomic: bool = False, now=None):
    """The :class:`~.turns.AppendBatch` of one add: ``turns`` (dicts or ``Turn`` objects; one alone
    counts as a list) or ``messages`` (chat messages), never both. ``now``: the time given to a
    message without a timestamp (default: the current UTC time, to the second); ``roles`` None:
    :data:`DEFAULT_ROLES`. An :class:`~.turns.AppendBatch` as ``turns`` is the batch (an import
    makes its own, with the ``stored_at`` of its turns: ``memory.export``)."""
    from datetime import datetime, timezone

    from ..data.jsonl import record_of
    from ..data.types import Turn
    from .turns import AppendBatch, Assign, refused

    if not isinstance(atomic, bool):
        raise InputError(f"atomic: expected true or false, got {type(atomic).__name__}")
    if isinstance(turns, AppendBatch) and messages is None:  # made already: an import's (``memory.export``)
        return turns
    if turns is not None and messages is not None:
        raise InputError("turns, messages: give one of them (turns, or chat messages), not both")
    if messages is not None:
        if now is None:
            now = datetime.now(timezone.utc).replace(microsecond=0)
        from ..data.dates import naive_utc

        if not isinstance(now, datetime):
            raise InputError(f"now: expected a datetime, got {type(now).__name__}")
        try:  # an aware time whose UTC falls past year 9999 or before year 1
            now = naive_utc(now, now.isoformat())
        except ValueError as e:
            raise InputError(f"now: {e}") from None
        return AppendBatch(message_entries(messages, roles=DEFAULT_ROLES if roles is None else roles,
                                           speakers=speakers), atomic, Assign(now), "messages")
    if speakers is not None or roles is not None:
        raise InputError("`speakers` and `roles` apply to chat messages (`messages`), not to `turns`")
    if isinstance(turns, (dict, Turn)):
        turns = [turns]
    if turns is None or isinstance(turns, (str, bytes)) or not isinstance(turns, Iterable):
        raise InputError(f"turns: expected a turn (a dict or a Turn) or a list of them (or chat messages in "
                         f"`messages`), got {type(turns).__name__}")
    entries = []
    for i, t in enumerate(turns):
        try:
            entries.append(record_of(t, f"turns[{i}]", bank_id))
        except InputError as e:
            if atomic:
                raise
            entries.append(refused(i, "turns", e, t.get("turn_id") if isinstance(t, dict) else None))
    return AppendBatch(entries, atomic)
