"""HTTP header values the package reads on both of its client sides (the LLM client, ``llm/openai_http.py``,
and the memory server's client, ``client/``)."""
from __future__ import annotations

import datetime as dt
import email.utils
import re
import time

MAX_RETRY_AFTER_S = 86_400.0
"""The longest ``Retry-After`` taken as meant (a day); a longer one is treated as unreadable."""

_SECONDS = re.compile(r"\d{1,12}(?:\.\d{1,9})?")


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header in seconds: a number of seconds (digits, optionally a fraction),
    or an HTTP date (from ``now``, epoch seconds; default the current time; a date already past
    is 0). None when it is missing or unreadable: negative, NaN, infinite, another number form
    (``1e3``, ``0x10``), more than :data:`MAX_RETRY_AFTER_S`, or a date that does not parse; the
    caller then waits its own backoff (never 0 because of a bad header)."""
    if not value:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):
        s = float(value)
        return s if s <= MAX_RETRY_AFTER_S else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # "-0000": UTC, says RFC 5322
        when = when.replace(tzinfo=dt.timezone.utc)
    try:
        s = when.timestamp() - (time.time() if now is None else now)
    except (OverflowError, ValueError, OSError):
        return None
    return max(0.0, s) if s <= MAX_RETRY_AFTER_S else None
