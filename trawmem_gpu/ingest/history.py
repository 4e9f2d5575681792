"""What an ``--update`` adds: the input's turns that a stored bank does not hold yet.

The input for a bank may be

* **its whole history** (the stored turns, then new ones),
* **a tail of it** (some last stored turns repeated, then new ones: an export of "recent
  messages" that overlaps the previous one), or
* **only new turns** (an append-only file: no turn id of it is stored).

Repeated turns must equal the stored ones field by field (id, speaker, text, session, date as
written and as read, caption); any difference, a stored turn missing from the middle of the
repeated run, or a stored id reappearing among the new turns is a conflicting history and an
``InputError`` that names the bank, the turn and the field.

**Late turns.** A new turn dated before a turn the bank holds (or before a new turn ahead of it
in the input) is *late* (``ingest.late.late_ids``, the rule of ``Memory.add``): it is stored at
its place in time, by the same code as ``Memory.add`` (``ingest.late.add_turns``), not refused.

Sessions counted by calendar day (JSONL without ``session``) are numbered from 1 at the top of
each file, so they are counted again to continue the bank, as ``Memory.add`` counts them: a new
turn on the day of the turn before it (the bank's last, or the last new one that is not late)
joins its session, a later day opens the next one; a late turn's session is counted among its
neighbours by ``ingest.late.place``. Sessions the input gives explicitly are taken as they are
(``update_bank`` refuses ones that go back). A counted session past ``MAX_SESSION`` is refused.
"""
from __future__ import annotations

from dataclasses import replace

from ..data.dates import parse_date
from ..data.fields import next_session, session_field
from ..data.types import Conversation, Turn
from ..errors import InputError
from ..store.bank import Bank
from .late import late_ids

_FIELDS = ("speaker", "text", "session", "timestamp", "time", "caption")


def _check_dayfirst(bank: Bank, dayfirst: bool, sample: int = 200) -> None:
    """Refuse to append when the stored dates read differently with this ``dayfirst`` (checked on
    up to ``sample`` distinct timestamps spread over the bank: one ambiguous date suffices)."""
    distinct = list({t.timestamp: t for t in bank.turns}.items())
    step = max(1, len(distinct) // sample)
    for ts, t in distinct[::step]:
        try:
            again = parse_date(ts, dayfirst=dayfirst)
        except ValueError:
            continue
        if t.time is not None and again.replace(tzinfo=None) != t.time.replace(tzinfo=None):
            flag = "without `dayfirst`" if dayfirst else "with `dayfirst`"
            raise InputError(f"`update`: bank {bank.bank_id!r} was built {flag} (its date {ts!r} reads "
                             f"{t.time:%Y-%m-%d}, now {again:%Y-%m-%d}); run the update {flag} too")


def new_turns(bank: Bank, conv: Conversation, *, dayfirst: bool = False) -> tuple[list[Turn], set[str], bool]:
    """The turns of ``conv`` to add to ``bank`` (see the module docstring), in input order, the ids
    of the late ones among them, and whether their sessions are counted by day (the arguments of
    ``ingest.late.add_turns``); raises ``InputError``."""
    _check_dayfirst(bank, dayfirst)
    stored = bank.turns
    pos = {t.turn_id: i for i, t in enumerate(stored)}
    inp = conv.turns
    where = f"`update`: bank {bank.bank_id!r}"
    if inp[0].turn_id in pos:  # the input repeats stored turns from position k on
        k = pos[inp[0].turn_id]
        m = min(len(inp), len(stored) - k)
        shift = stored[k].session - inp[0].session if conv.session_source == "calendar_day" else 0
        for i in range(m):
            a, b = stored[k + i], replace(inp[i], session=inp[i].session + shift)
            if a.turn_id != b.turn_id:
                raise InputError(f"{where}: the input repeats the stored history from turn {stored[k].turn_id!r} "
                                 f"on, but has turn {b.turn_id!r} where the bank has {a.turn_id!r}; the histories "
                                 f"conflict: rebuild the bank without `update`")
            diff = [f for f in _FIELDS if getattr(a, f) != getattr(b, f)]
            if diff:
                raise InputError(f"{where}: turn {a.turn_id!r} differs between the input and the stored bank "
                                 f"(field {diff[0]!r}: {getattr(b, diff[0])!r} vs {getattr(a, diff[0])!r}); the "
                                 f"histories conflict: rebuild the bank without `update`")
        fresh = list(inp[m:])
    else:
        fresh = list(inp)
    again = [t.turn_id for t in fresh if t.turn_id in pos]
    if again:
        raise InputError(f"{where}: turn {again[0]!r} is already stored but appears among the new turns "
                         f"(out of order?); the histories conflict: rebuild the bank without `update`")
    late = late_ids(stored, fresh)
    derived = conv.session_source == "calendar_day"
    if derived:
        fresh = _counted(stored[-1], fresh, late, where)
    for t in fresh:  # the rules of every append: sessions within bounds
        session_field(t.session, "session", f"{where}: turn {t.turn_id!r}")
    return fresh, late, derived


def _counted(prev: Turn, fresh: list[Turn], late: set[str], where: str) -> list[Turn]:
    """``fresh`` with the sessions of those not ``late`` counted by calendar day from ``prev`` (the
    bank's last turn), as ``Memory.add`` counts them (``data.jsonl.turn_from_record``); late ones
    are left for ``ingest.late.place``."""
    out = []
    for t in fresh:
        if t.turn_id not in late:
            same = prev.time is not None and t.time is not None and t.time.date() == prev.time.date()
            t = replace(t, session=prev.session if same else next_session(prev.session, f"{where}: turn {t.turn_id!r}"))
            prev = t
        out.append(t)
    return out
