"""The values of a TriMem extraction reply (``ingest.layers.trimem_extract``), read as user input
is: the turn ids a fact cites, its names (persons, locations, keywords, entities) and its date.

Names must be strings of at most ``MAX_NAME_CHARS``, at most ``MAX_NAMES`` a fact; a refused one is
dropped and counted (``bad_values``). A date is normalized to ``YYYY-MM-DD`` / ``YYYY-MM`` /
``YYYY``: ISO forms as they are when they name a real day, a relative date the model left as it was
("last Friday") resolved against the session date (``dateutil.relativedelta``), free absolute
forms through ``data.dates.parse_date`` (python-dateutil); one outside ``DATE_YEARS`` is unreadable.
"""
from __future__ import annotations

import re

from ...data.types import Turn


DATE_YEARS = (1000, 2999)
"""The years a fact's date may fall in; a date outside them counts as unreadable (``bad_dates``)."""
MAX_NAME_CHARS = 200
"""Longest person, location, keyword or entity kept (a longer one is refused: ``bad_values``)."""
MAX_NAMES = 32
"""Most persons (locations, keywords, entities) kept per fact."""

_ISO = re.compile(r"^\d{4}(?:-\d{2}(?:-\d{2})?)?$")


def _ids(x) -> tuple[str, ...]:
    """Turn ids from a reply's ``source_turns`` (a lone one counts as one; a number is read as the
    id it spells, checked against the window's ids); blanks dropped."""
    if isinstance(x, (str, int)) and not isinstance(x, bool):
        x = [x]
    if not isinstance(x, (list, tuple)):
        return ()
    out = dict.fromkeys(" ".join(str(v).split()) for v in x
                        if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip())
    return tuple(out)


def _strings(x, st: "ExtractStats | None" = None) -> tuple[str, ...]:
    """A list of names from a reply field (persons, locations, keywords, entities; a lone string
    counts as one), whitespace collapsed, blanks dropped. A value that is not a string (a number,
    an object), or longer than ``MAX_NAME_CHARS``, is refused: dropped and counted in
    ``st.bad_values``; at most ``MAX_NAMES`` are kept."""
    if x is None:
        return ()
    if isinstance(x, str):
        x = [x]
    if not isinstance(x, (list, tuple)):
        if st is not None:
            st.bad_values += 1
        return ()
    out: dict[str, None] = {}
    for v in x:
        s = " ".join(v.split()) if isinstance(v, str) else None
        if s is None or len(s) > MAX_NAME_CHARS:
            if st is not None:
                st.bad_values += 1
            continue
        if s and len(out) < MAX_NAMES:
            out[s] = None
    return tuple(out)


_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_UNITS = {"day": "days", "week": "weeks", "month": "months", "year": "years"}
_NUM = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "ten": 10}
_AGO = re.compile(r"^(\d+|an?|one|two|three|four|five|six|seven|ten) (day|week|month|year)s? (ago|later|from now)$")
_LAST = re.compile(r"^(last|next|this) (day|week|month|year|" + "|".join(_WEEKDAYS) + r")$")


def resolve_relative(expr: str, anchor) -> str | None:
    """A relative date (``yesterday``, ``last Friday``, ``two weeks ago``, ``next month``) as
    ``YYYY-MM-DD`` / ``YYYY-MM`` / ``YYYY`` against ``anchor`` (the session's ``date``), through
    ``dateutil.relativedelta``; None for anything else. A week resolves to its Monday's date."""
    from dateutil.relativedelta import relativedelta, weekday

    e = " ".join(expr.lower().replace("the ", "").split()).rstrip(".")
    if e in ("today", "tonight", "this morning", "this evening"):
        return anchor.isoformat()
    if e in ("yesterday", "last night"):
        return (anchor - relativedelta(days=1)).isoformat()
    if e == "tomorrow":
        return (anchor + relativedelta(days=1)).isoformat()
    m = _AGO.match(e)
    if m:
        n = int(m.group(1)) if m.group(1).isdigit() else _NUM[m.group(1)]
        d = anchor + (-1 if m.group(3) == "ago" else 1) * relativedelta(**{_UNITS[m.group(2)]: n})
        return d.isoformat()[:{"day": 10, "week": 10, "month": 7, "year": 4}[m.group(2)]]
    m = _LAST.match(e)
    if not m:
        return None
    step = {"last": -1, "next": 1, "this": 0}[m.group(1)]
    what = m.group(2)
    if what in _WEEKDAYS:  # last Friday: the latest Friday before the anchor; next Friday: the first after
        wd = weekday(_WEEKDAYS.index(what))
        d = anchor + relativedelta(days=-1, weekday=wd(-1)) if step < 0 else \
            anchor + relativedelta(days=+1, weekday=wd(+1)) if step > 0 else anchor + relativedelta(weekday=wd)
        return d.isoformat()
    if what == "day":
        return (anchor + relativedelta(days=step)).isoformat()
    if what == "week":
        d = anchor + relativedelta(weeks=step)
        return (d - relativedelta(days=d.weekday())).isoformat()
    if what == "month":
        return (anchor + relativedelta(months=step)).isoformat()[:7]
    return str(anchor.year + step)


def normalize_date(value, anchor=None) -> str | None:
    """``YYYY-MM-DD`` / ``YYYY-MM`` / ``YYYY`` from a reply's date, or None when unreadable: ISO
    forms as they are when they name a real day, month or year, a relative date against ``anchor``
    (:func:`resolve_relative`), other absolute forms through ``data.dates.parse_date`` (python-dateutil).
    A date beyond the calendar or outside ``DATE_YEARS`` is unreadable too (None), never an error."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME_CHARS:
        return None
    try:
        out = _normalize_date(value.strip(), anchor)
    except (ValueError, OverflowError):  # "1000000 days ago": beyond the calendar
        return None
    return out if out is not None and DATE_YEARS[0] <= int(out[:4]) <= DATE_YEARS[1] else None


def _normalize_date(s: str, anchor) -> str | None:
    if _ISO.match(s):
        from datetime import date

        y, m, d = (s.split("-") + ["01", "01"])[:3]
        try:
            date(int(y), int(m), int(d))
        except ValueError:
            return None  # ISO in form only (2031-02-30, 2031-13): no such day
        return s
    if anchor is not None:
        rel = resolve_relative(s, anchor)
        if rel is not None:
            return rel
    from ...data.dates import parse_date

    return parse_date(s).date().isoformat()


def _session_date(t: Turn) -> str | None:
    return t.time.date().isoformat() if t.time else None
