"""Parsing of session and question dates, through python-dateutil.

Real exports write dates in many ways: LoCoMo's ``"2:14 pm on 9 May, 2031"``, LongMemEval's
``"2031/05/13 (Tue) 04:17"``, messaging exports' ``"29.12.2023, 00:51:12"``, ISO 8601. A hand
list of ``strptime`` formats rejects most of them, so everything that is not ISO 8601 goes to
``dateutil.parser`` (a maintained parser with an explicit day-first switch), in strict mode:

* a parenthesized weekday such as ``(Sat)`` is dropped, after checking that it names the
  weekday of the date (a mismatch is an error, not a guess);
* the year, month and day must all be written: dateutil silently fills missing fields from
  today's date, so the text is parsed against two different defaults and any field that
  differs between the two parses was not in the text (``"5"`` or ``"May 2023"`` are rejected);
* ``dayfirst`` applies only where day and month are ambiguous: it decides ``01.02.2031``
  (1 February when True, January 2 when False) and ``05/06/31``. A date that starts with its
  four-digit year (LongMemEval's ``2031/05/13``, ``2031.03.02``, ``20310302``, ISO 8601) is
  always read year, month, day, whatever ``dayfirst`` says: no export writes year, day, month,
  and dateutil would read ``2031/03/02`` as 3 February with ``dayfirst=True``. A date whose day
  is above 12 or whose month is a word reads the same either way.

**Time zones**: a date that carries an offset or zone (``2024-03-03T10:00:00+05:00``,
``...Z``) is converted to UTC and returned *naive* (``2024-03-03 05:00:00``), so every parsed
date compares with every other; a date without one is taken as written (read as UTC). The
source's text is kept verbatim beside it (``Turn.timestamp``); calendar days (counted sessions,
date headings) are UTC days. :func:`naive_utc` is that rule for a ``datetime`` a caller passes.

Every input path (``build``, ``eval``, ``score --data`` and ``--questions``, ``train-head``,
``train-affinity``, ``sweep``) reads its dates through :func:`parse_date` with the command's
``--dayfirst``; the server has no such flag and reads ambiguous dates month first.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone

from .types import MAX_DATE_CHARS

_WEEKDAY = re.compile(r"\(\s*(mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)[a-z]*\.?\s*\)", re.I)
_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_YEAR_FIRST = re.compile(r"^(?:\d{4}|\d{8})(?!\d)")
"""A date that opens with its year (``2031/05/13``, ``2031.03.02``, ``20310302``): read Y, M, D."""
_DEFAULTS = (datetime(1904, 1, 1), datetime(1905, 2, 2))  # any two dates differing in y, m and d


def naive_utc(d: datetime, label: str | None = None) -> datetime:
    """``d`` when naive; an aware ``d`` converted to UTC, without its tzinfo. Raises ``ValueError``
    (naming ``label``, else ``d``) when UTC falls outside the years datetime can hold."""
    if d.tzinfo is None or d.utcoffset() is None:
        return d.replace(tzinfo=None)
    try:
        return d.astimezone(timezone.utc).replace(tzinfo=None)
    except (OverflowError, ValueError):
        raise ValueError(f"date {label if label is not None else d.isoformat()!r} is out of range once "
                         "converted to UTC") from None


def parse_date(text: str, dayfirst: bool = False) -> datetime:
    """Parse a date or date-time; raises ``ValueError`` naming the text when it cannot.

    :param text: the date as the source wrote it (ISO 8601, LoCoMo, LongMemEval, ``d.m.Y``, ...)
    :param dayfirst: read an ambiguous ``01.02.2031`` as day first (the ``--dayfirst`` flag); never
        applied to a date that starts with its year (see the module docstring)
    :returns: a naive datetime; one written with an offset or zone, converted to UTC

    A text over ``MAX_DATE_CHARS`` (64) characters is refused before it is parsed, at every door
    (dateutil's time is quadratic in the text: a 10 MB ``as_of`` ran for minutes); the message
    gives its length, not the text.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty or non-string date {text[:MAX_DATE_CHARS] if isinstance(text, str) else text!r}")
    if len(text) > MAX_DATE_CHARS:
        raise ValueError(f"date is {len(text)} characters; the limit is {MAX_DATE_CHARS} "
                         f"(it begins {text[:20]!r})")
    s = " ".join(text.strip().split())
    try:
        iso = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        iso = None
    if iso is not None:
        return naive_utc(iso, text)
    from dateutil import parser

    weekday = None
    m = _WEEKDAY.search(s)
    if m:
        weekday = _WEEKDAYS.index(m.group(1).lower()[:3])
        s = (s[:m.start()] + " " + s[m.end():]).strip()
    if _YEAR_FIRST.match(s):
        dayfirst = False  # year first is year, month, day: dateutil would read Y/D/M under dayfirst
    try:
        a, b = (parser.parse(s, default=d, dayfirst=dayfirst) for d in _DEFAULTS)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"unparseable date {text!r} ({e}); expected e.g. ISO 8601, '2:14 pm on 9 May, 2031' "
                         f"or '2031/05/13 (Tue) 04:17'") from None
    missing = [name for name in ("year", "month", "day") if getattr(a, name) != getattr(b, name)]
    if missing:
        raise ValueError(f"incomplete date {text!r}: no {' or '.join(missing)} in it")
    if weekday is not None and a.weekday() != weekday:
        raise ValueError(f"date {text!r} names the wrong weekday ({a:%Y-%m-%d} is a {a:%A})")
    return naive_utc(a, text)
