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

Sessions counted by calendar day (JSONL without ``session``) are numbered from 1 at the top of
each file, so they are shifted to continue the bank: a new turn on the day of the bank's last
turn joins its session, a later day opens the next one. Sessions the input gives explicitly are
taken as they are (``update_bank`` refuses ones that go back). A shifted session past
``MAX_SESSION`` is refused, and so is a new turn dated before the turn it would follow (an
append never goes back in time: ``data.fields.check_order``).
"""
from __future__ import annotations

from dataclasses import replace

from ..data.dates import parse_date
from ..data.fields import check_order, session_field
from ..data.types import Conversation, Turn
from ..errors import InputError
from ..store.bank import Bank

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


def new_turns(bank: Bank, conv: Conversation, *, dayfirst: bool = False) -> list[Turn]:
    """The turns of ``conv`` to append to ``bank`` (see the module docstring); raises ``InputError``."""
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
        fresh = [replace(t, session=t.session + shift) for t in inp[m:]]
    else:
        fresh = list(inp)
        if conv.session_source == "calendar_day" and fresh:
            last = stored[-1]
            same_day = last.time is not None and fresh[0].time is not None and \
                fresh[0].time.date() == last.time.date()
            shift = (last.session if same_day else last.session + 1) - fresh[0].session
            fresh = [replace(t, session=t.session + shift) for t in fresh]
    again = [t.turn_id for t in fresh if t.turn_id in pos]
    if again:
        raise InputError(f"{where}: turn {again[0]!r} is already stored but appears among the new turns "
                         f"(out of order?); the histories conflict: rebuild the bank without `update`")
    prev = stored[-1]
    for t in fresh:  # the rules of every append: sessions within bounds, no going back in time
        w = f"{where}: turn {t.turn_id!r}"
        session_field(t.session, "session", w)
        check_order(t, prev, w)
        prev = t
    return fresh
