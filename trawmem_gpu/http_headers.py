"""HTTP header values the package reads on both of its client sides (the LLM client, ``llm/openai_http.py``,
and the memory server's client, ``client/``)."""
from __future__ import annotations

import email.utils
import time


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header in seconds: a number of seconds, or an HTTP date (from ``now``,
    epoch seconds; default the current time); None when it is missing or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
