"""Turns sent to ``Memory.add`` / ``POST /v1/banks/{bank_id}/turns``: checked one by one, as JSONL
history records are, and answered per item.

Records carry the JSONL fields (``turn_id``, ``speaker``, ``text``, ``timestamp``, optional
``caption`` and ``session``) without ``bank_id``, which the URL gives; each goes through the JSONL
loader's own per-record rule (:func:`trawmem_gpu.data.jsonl.turn_from_record`), so a turn is
accepted or refused exactly as ``trawmem build`` would. Unlike a file load, a turn with empty
text and no caption is refused, not skipped (a client should know). Sessions: either every turn
of a request names its ``session`` or none does (the first turn accepted decides; a turn that
breaks the rule is refused); without them the first turn continues the bank's last session when
it falls on the same calendar day and opens the next one otherwise, and each later turn does the
same against the turn before it.

Time order: a turn dated before a turn the bank (or the request) holds is *late*; it is stored at
its place in time, not refused (``ingest.late``: order by event time, then arrival; its session,
when the request gives none, counted by day among its neighbours). For a caller bound to a filter
(``AppendBatch.scope``) no refusal names a turn outside it, nor its content or date (``memory.scope``).

**Per item** (:func:`screen`, run under the bank's lock against the bank as stored): every item
of a request gets an :class:`AppendItem`: ``stored``, ``already_stored`` (the bank holds its id
with the same speaker, text, timestamp and caption: a retry), ``refused`` (with the field and the
reason) or, for chat messages, ``skipped`` (a system or tool message not asked for). The valid
ones are stored even when others are refused; ``atomic=True`` refuses the whole request instead
(an ``InputError`` naming the first refused item, or ``DuplicateTurns`` for ids the bank holds
with other content), and nothing is stored. Chat messages become records by
:mod:`.messages`; their missing ids and timestamps are assigned here (:class:`Assign`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from ..data.jsonl import turn_from_record
from ..data.types import Turn
from ..errors import DuplicateTurns, InputError
from .scope import passes

STATUSES = ("stored", "already_stored", "refused", "skipped")
"""What an append did with each item of a request."""
MSG_ID_PREFIX = "msg-"
"""Ids given to chat messages that carry none: ``msg-<n>`` (:class:`Assign`)."""


@dataclass
class AppendItem:
    """What an append did with one item of its request (a turn or a chat message)."""

    index: int
    """The item's position in the request (``turns[index]`` / ``messages[index]``)."""
    status: str
    """One of :data:`STATUSES`."""
    turn_id: str | None = None
    """The turn id it is stored under (assigned for a message without one); None when refused before an id was read."""
    field: str | None = None
    """For a refused or skipped item, the field at fault (``turns[3].timestamp``)."""
    reason: str | None = None
    """Why it was refused or skipped (the message, without the field prefix)."""
    conflict: bool = False
    """Refused because the bank holds its id with other content (``DuplicateTurns`` when atomic)."""
    message: str | None = None
    """The full error message (what ``atomic=True`` raises)."""

    def to_dict(self) -> dict:
        out = {"index": self.index, "status": self.status, "turn_id": self.turn_id}
        if self.status in ("refused", "skipped"):
            out.update(field=self.field, reason=self.reason)
        return out


@dataclass(frozen=True)
class Assign:
    """How a request of chat messages fills what a message lacks: its id (``msg-<n>``, the first
    ``n`` past the bank's turn count and its highest ``msg-<n>`` (a bound caller's: its own turns',
    ``memory.scope``) that neither the bank nor the request holds: deterministic
    for a given bank, never a stored id) and its timestamp (``now``, or the time of the turn it
    follows when that is later, so an append never goes back in time)."""

    now: datetime
    """Naive UTC time given to messages without a timestamp."""


@dataclass
class AppendBatch:
    """One request's items for ``MemoryCore.append``: the records to screen, in request order,
    with the outcomes decided before (a message skipped or refused on conversion) in their place."""

    entries: list
    """Per item: a record (dict) to screen, or an :class:`AppendItem` already decided."""
    atomic: bool = False
    """Refuse the whole request when any item is refused (nothing stored)."""
    assign: Assign | None = None
    """Chat messages: fill missing ids and timestamps (None: turns, a missing field is refused)."""
    where: str = "turns"
    """The request's field, for messages (``turns`` or ``messages``)."""
    scope: object = None
    """The filter (``data.filters.Filter``) of a caller bound to one (a key of ``serve-key
    --where``): refusals name no turn outside it (``memory.scope``); None: a caller who sees all."""
    stored_at: dict | None = None
    """Turn id -> the ``stored_at`` an import restores from an export (``memory.export``); every
    other new turn is stamped with the time of the write (``store.records.stamped``). Never read
    from a caller's records: their ``stored_at`` field is refused."""


@dataclass
class Screened:
    """:func:`screen`'s answer: the turns to store, in order, and every item's outcome."""

    turns: list[Turn]
    items: list[AppendItem]
    late: set = field(default_factory=set)
    """Ids of stored turns dated before a turn the bank or the request held (``ingest.late``)."""
    derived: bool = True
    """The request gave no ``session``: late turns' sessions are counted by day (``ingest.late.place``)."""

    @property
    def stored(self) -> list[str]:
        return [i.turn_id for i in self.items if i.status == "stored"]

    @property
    def already_stored(self) -> list[str]:
        return [i.turn_id for i in self.items if i.status == "already_stored"]


_FIELD = re.compile(r"(?:missing |unknown )?field '([^']+)'")


def refused(index: int, where: str, e: Exception, turn_id=None, conflict: bool = False) -> AppendItem:
    """The item for error ``e`` about ``where[index]``: the field the message names (``text`` for an
    empty turn), the reason without the ``where[index]`` prefix."""
    msg = str(e)
    prefix = f"{where}[{index}]"
    name, reason = None, msg
    if msg.startswith(prefix + "."):  # turns[0].timestamp: ..., messages[2].content[1].type: ...
        name, _, reason = msg[len(prefix) + 1:].partition(": ")
    elif msg.startswith(prefix):
        reason = msg[len(prefix):].lstrip(":").strip()
    if name is None:
        m = _FIELD.search(msg)
        name = m.group(1) if m else ("text" if "empty 'text'" in msg else None)
    reason = reason.replace(" (nothing was stored)", "")  # the request's other items may be
    return AppendItem(index, "refused", shown_id(turn_id), f"{prefix}.{name}" if name else prefix, reason,
                      conflict, msg)


def shown_id(tid) -> str | None:
    """``tid`` as an answer may show it: a string id within ``MAX_ID_CHARS`` (or an integer of
    at most as many digits); None for anything else, so a refusal never echoes an oversized or
    malformed value."""
    from ..data.types import MAX_ID_CHARS

    if isinstance(tid, bool) or not isinstance(tid, (str, int)):
        return None
    if isinstance(tid, int):
        return str(tid) if tid.bit_length() <= 800 and len(str(tid)) <= MAX_ID_CHARS else None
    return tid if len(tid) <= MAX_ID_CHARS else None


def same_turn(a: Turn, b: Turn, timestamp: bool = True) -> bool:
    """Whether two turns of one id carry the same content (what a client sent: the session is
    derived, so it is not compared), metadata included (``data.metadata.same_metadata``);
    ``timestamp=False``: ``a``'s timestamp was assigned here, not sent, so it is not compared
    (a chat message sent again without one is a retry, whenever it comes)."""
    from ..data.metadata import same_metadata

    return (a.speaker, a.text, a.caption) == (b.speaker, b.text, b.caption) \
        and (not timestamp or a.timestamp == b.timestamp) and same_metadata(a.metadata, b.metadata)


def _filled(rec: dict, assign: Assign, n_next, prev: Turn | None) -> tuple[dict, bool]:
    """A message record with its id and timestamp filled (see :class:`Assign`), and whether it
    came with its own timestamp (else a retry of it is known by its content alone: :func:`same_turn`)."""
    out = dict(rec)
    if out.get("turn_id") is None:
        out["turn_id"] = n_next()
    stamped = out.get("timestamp") is not None
    if not stamped:
        t = assign.now if prev is None or prev.time is None or prev.time <= assign.now else prev.time
        out["timestamp"] = t.isoformat()
    return out, stamped


def _given_ids(entries: list) -> set[str]:
    """The ids a request's records give, as strings; an oversized or malformed one (refused by the
    screen) as none: ``str()`` of an integer of 5,000 digits raises ``ValueError``."""
    return {x for r in entries if isinstance(r, dict) and (x := shown_id(r.get("turn_id"))) is not None}


def _numbered_past(known: dict, scope) -> int:
    """Where :class:`Assign`'s ``msg-<n>`` ids start: past the turn count and every ``msg-<n>`` of
    ``known`` (turn id -> turn), of a caller bound to ``scope`` its own turns only (``memory.scope``:
    an id never tells it how many turns others hold; one they hold is skipped all the same)."""
    mine = [t for t, turn in known.items() if passes(scope, turn)] if scope is not None else known
    ids = known.ids_with_prefix(MSG_ID_PREFIX) if scope is None and hasattr(known, "ids_with_prefix") else mine
    numbered = [int(t[len(MSG_ID_PREFIX):]) for t in ids if t.startswith(MSG_ID_PREFIX)
                and t[len(MSG_ID_PREFIX):].isdigit() and len(t) < 24]
    return max([len(mine), *numbered])


def _mixed_sessions(i: int, where: str, w: str, has: bool, with_session: bool, tid) -> AppendItem:
    """The refusal of a turn that gives ``session`` when the turns before did not, or the reverse."""
    return refused(i, where, InputError(
        f"{w}: field 'session' is {'given' if has else 'missing'} here but "
        f"{'given' if with_session else 'missing'} on the turns before; give 'session' on every turn of a "
        f"request or on none"), tid)


def screen(bank_id: str, batch: AppendBatch, old) -> Screened:
    """Every item of ``batch`` against ``old`` (the bank as stored, or None for a new bank): see
    the module docstring. Raises ``InputError`` for an empty request, and, with ``batch.atomic``,
    for the first refused item (``DuplicateTurns`` when the refusals are ids held with other content)."""
    where = batch.where
    if not batch.entries:
        raise InputError(f"{where}: give at least one {'turn' if where == 'turns' else 'message'}")
    known = old.turn_map() if old is not None else {}
    prev: Turn | None = old.turns[-1] if old is not None else None
    items: list[AppendItem] = []
    turns: list[Turn] = []
    seen: set[str] = set()
    with_session: bool | None = None
    late: set[str] = set()
    latest = next((x.time for x in reversed(old.turns) if x.time is not None), None) if old is not None else None
    counter = [_numbered_past(known, batch.scope)]

    def n_next() -> str:
        while True:
            counter[0] += 1
            tid = f"{MSG_ID_PREFIX}{counter[0]}"
            if tid not in known and tid not in seen and tid not in given:
                return tid

    given = _given_ids(batch.entries)
    for i, r in enumerate(batch.entries):
        if isinstance(r, AppendItem):
            items.append(r)
            continue
        w = f"{where}[{i}]"
        r, stamped = (_filled(r, batch.assign, n_next, prev) if batch.assign is not None and isinstance(r, dict)
                      else (r, True))
        tid = r.get("turn_id") if isinstance(r, dict) else None
        try:
            _, t = turn_from_record({**r, "bank_id": bank_id} if isinstance(r, dict) else r, w)  # its fields alone
        except InputError as e:
            items.append(refused(i, where, e, tid))
            continue
        if t.turn_id in seen:
            items.append(refused(i, where, InputError(f"{w}: field 'turn_id': duplicate turn id {t.turn_id!r} in "
                                                      f"this request"), t.turn_id))
            continue
        if t.turn_id in known:  # held outside a bound caller's filter: "other content", never whose
            if same_turn(t, known[t.turn_id], timestamp=stamped) and passes(batch.scope, known[t.turn_id]):
                seen.add(t.turn_id)
                items.append(AppendItem(i, "already_stored", t.turn_id))
            else:
                items.append(refused(i, where, InputError(
                    f"{w}: field 'turn_id': bank {bank_id!r} already holds turn id {t.turn_id!r} with other "
                    f"content"), t.turn_id, conflict=True))
            continue
        has = r.get("session") is not None
        if with_session is not None and has != with_session:
            items.append(_mixed_sessions(i, where, w, has, with_session, t.turn_id))
            continue
        is_late = t.time is not None and latest is not None and t.time < latest
        try:  # the session, counted on (a late turn's is placed by ``ingest.late.place``)
            _, t = turn_from_record({**r, "bank_id": bank_id}, w, prev=None if is_late else prev)
        except InputError as e:
            items.append(refused(i, where, e, t.turn_id))
            continue
        with_session = has
        seen.add(t.turn_id)
        turns.append(t)
        items.append(AppendItem(i, "stored", t.turn_id))
        if is_late:
            late.add(t.turn_id)
        else:
            prev = t
            latest = t.time if t.time is not None else latest
    if batch.atomic:
        bad = [x for x in items if x.status == "refused"]
        other = [x for x in bad if not x.conflict]
        if other:
            raise InputError(other[0].message)
        if bad:
            dup = [x.turn_id for x in bad]
            raise DuplicateTurns(f"bank {bank_id!r} already holds turn ids {dup[:10]}{' ...' if len(dup) > 10 else ''}"
                                 f" with other content; nothing was appended")
    return Screened(turns, items, late, not with_session)
