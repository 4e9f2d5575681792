"""Parsing of session dates: LoCoMo's ``"1:56 pm on 8 May, 2023"`` and ISO 8601."""
from __future__ import annotations

from datetime import datetime

_FORMATS = (
    "%I:%M %p on %d %B, %Y",
    "%I:%M %p on %d %b, %Y",
    "%I:%M %p on %B %d, %Y",
    "%d %B, %Y",
    "%d %B %Y",
    "%B %d, %Y",
)


def parse_date(text: str) -> datetime:
    """Parse a session timestamp; raises ``ValueError`` naming the text when it cannot."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty or non-string date {text!r}")
    s = " ".join(text.strip().split())
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        pass
    for fmt in _FORMATS:
        try:
            return datetime.strptime(s, fmt)
        except ValueError:
            continue
    raise ValueError(f"unparseable date {text!r} (expected ISO 8601 or e.g. '1:56 pm on 8 May, 2023')")
