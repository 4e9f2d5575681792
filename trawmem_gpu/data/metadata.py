"""Turn metadata: a flat map of keys to strings, numbers, booleans or ISO dates, checked once for
every door (``Memory.add``, ``POST /v1/banks/{id}/turns``, MCP ``add_turns``, JSONL input to
``trawmem build``) through :func:`metadata_field`, and its values' kinds, read the same way by the
filter language (:mod:`trawmem_gpu.data.filters`).

A turn's ``metadata`` scopes it (``user_id``, ``agent_id``, ``run_id``: :data:`SCOPE_KEYS`) and
describes it (``topic``, ``importance``, ``source``, ...); a selection's ``where`` filter reads it
(docs/python-api.md). It never reaches the encoder, BM25 or a rendered workspace: the same turn
with other metadata has the same vector and the same line.

Rules (an ``InputError`` naming ``metadata.KEY`` and the reason otherwise):

* **the map**: a JSON object (a ``dict``), at most :data:`MAX_METADATA_KEYS` keys; null or ``{}``
  is no metadata;
* **keys**: 1 to :data:`MAX_KEY_CHARS` characters: an ASCII letter, digit or ``_`` first, then
  letters, digits, ``_ . : -`` (no spaces, no Unicode look-alikes); ``and``, ``or`` and ``not``
  (any case) are the filter language's words and are refused;
* **values**: a string (at most :data:`MAX_VALUE_CHARS` characters, valid Unicode, no control
  characters), a boolean, a finite number (an integer within +-2**53, which every JSON client
  carries exactly), or in Python a ``datetime`` / ``date`` (stored as its ISO 8601 text; an aware
  time as its naive UTC time). Null, lists and objects are refused: the map is flat;
* **dates**: a string written in ISO 8601 (``2024-03-01``, ``2024-03-01T10:30:00``, with
  ``Z`` or an offset) *is* a date (:func:`iso_date`): filters compare it as a time, read as UTC
  (a date alone is its midnight). Any other string is a string. The text is kept as written.
"""
from __future__ import annotations

import math
import re
from datetime import date as _date, datetime, timezone

from ..errors import InputError

SCOPE_KEYS: tuple[str, ...] = ("user_id", "agent_id", "run_id")
"""The scoping keys agent frameworks use (mem0's ``user_id`` / ``agent_id`` / ``run_id``): ordinary
keys here, named so every door documents them alike."""
MAX_METADATA_KEYS = 64
"""Most keys in one turn's metadata."""
MAX_KEY_CHARS = 64
"""Longest metadata key."""
MAX_VALUE_CHARS = 1024
"""Longest string value."""
MAX_EXACT_INT = 2 ** 53
"""Largest integer magnitude a value may have (JSON numbers are doubles for most clients)."""
RESERVED_KEYS = frozenset({"and", "or", "not"})
"""Keys the filter language reads as its operators (compared case-insensitively)."""

_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?)?(?:Z|[+-]\d{2}:?\d{2})?")
"""The ISO 8601 calendar date (and time) forms that make a string a date."""
_EPOCH = datetime(1970, 1, 1)


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"the number {v!r}"
    return {"dict": "an object", "list": "a list", "tuple": "a list", "str": "a string"}.get(
        type(v).__name__, type(v).__name__)


def iso_date(s: str) -> datetime | None:
    """The naive UTC time a string value names when it is an ISO 8601 date (see the module
    docstring), else None."""
    if not isinstance(s, str) or not _ISO.fullmatch(s):
        return None
    try:
        d = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    if d.tzinfo is not None:
        try:
            d = d.astimezone(timezone.utc).replace(tzinfo=None)
        except (OverflowError, ValueError):
            return None
    return d


def micros(d: datetime) -> int:
    """A naive UTC time as whole microseconds since 1970 (exact for every datetime)."""
    delta = d - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def date_text(d, where: str, name: str) -> str:
    """A Python ``datetime`` / ``date`` as the ISO text a metadata value or a filter operand
    stores (an aware time as its naive UTC time)."""
    if isinstance(d, datetime):
        if d.tzinfo is not None and d.utcoffset() is not None:
            try:
                d = d.astimezone(timezone.utc).replace(tzinfo=None)
            except (OverflowError, ValueError):
                raise InputError(f"{where}: field {name!r}: the date {d.isoformat()} is out of range in UTC") from None
        return d.replace(tzinfo=None).isoformat()
    return d.isoformat()


def check_key(k, name: str | None, where: str) -> str:
    """A metadata key (or a filter's key), checked; messages start ``where: field 'name'`` (or
    ``where`` alone when ``name`` is None)."""
    at = f"{where}: field {name!r}:" if name else f"{where}:"
    if not isinstance(k, str):
        raise InputError(f"{at} a key is {_kind(k)}; keys are strings")
    shown = k if len(k) <= MAX_KEY_CHARS else k[:MAX_KEY_CHARS] + "..."
    if not 0 < len(k) <= MAX_KEY_CHARS or not _KEY.fullmatch(k):
        raise InputError(f"{at} key {shown!r} is not a metadata key (1 to {MAX_KEY_CHARS} characters: an ASCII "
                         "letter, digit or _ first, then letters, digits, _ . : -)")
    if k.lower() in RESERVED_KEYS:
        raise InputError(f"{at} key {k!r} is a word of the filter language (and, or, not); name it otherwise")
    return k


def check_value(v, name: str | None, where: str):
    """One metadata value (or a filter operand), checked: the value as stored (a ``datetime`` or
    ``date`` as its ISO text). Messages start ``where: field 'name'`` (``where`` alone when
    ``name`` is None)."""
    at = f"{where}: field {name!r}" if name else f"{where}: the value"
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        if abs(v) > MAX_EXACT_INT:
            raise InputError(f"{at} is an integer beyond +-2**53 (not exact as a JSON number); send it as a string")
        return int(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise InputError(f"{at} is {v!r}; numbers must be finite")
        return float(v)
    if isinstance(v, (datetime, _date)):
        return date_text(v, where, name or "value")
    if isinstance(v, str):
        if len(v) > MAX_VALUE_CHARS:
            raise InputError(f"{at} is {len(v)} characters; the limit is {MAX_VALUE_CHARS}")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"{at} holds a lone surrogate at character {e.start} (not valid Unicode)") from None
        m = _CONTROL.search(v)
        if m:
            raise InputError(f"{at} holds the control character {m.group(0)!r}")
        return v
    if v is None:
        raise InputError(f"{at} is null (leave the key out; a filter's `exists` tells absent keys apart)")
    raise InputError(f"{at} must be a string, a number, a boolean or an ISO date, got {_kind(v)} "
                     "(metadata is a flat map)")


class Metadata(dict):
    """A turn's metadata: a ``dict`` that refuses changes (a ``Turn`` is frozen, and a bank's
    filters read its metadata by key: a change in place would bypass the rules and the bank's
    digest). JSON, ``==`` and pickling treat it as the dict it is."""

    def _frozen(self, *a, **k):
        raise TypeError("turn metadata is read-only; build the turn again with new metadata")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _frozen

    def __reduce__(self):
        return Metadata, (dict(self),)


def metadata_field(v, where: str, name: str = "metadata") -> dict | None:
    """A turn's metadata, checked (see the module docstring): a new read-only :class:`Metadata`
    (keys in the order given), or None for null or an empty map."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise InputError(f"{where}: field {name!r} must be an object (a map of keys to values), got {_kind(v)}")
    if len(v) > MAX_METADATA_KEYS:
        raise InputError(f"{where}: field {name!r} holds {len(v)} keys; the limit is {MAX_METADATA_KEYS}")
    out = {}
    for k, x in v.items():
        check_key(k, name, where)
        out[k] = check_value(x, f"{name}.{k}", where)
    return Metadata(out) if out else None


def same_metadata(a: dict | None, b: dict | None) -> bool:
    """Whether two turns carry the same metadata: the same keys with values of the same JSON kind
    and value (``1``, ``1.0`` and ``true`` differ here, as they do in a filter), key order aside."""
    import json

    canon = lambda m: json.dumps(sorted((m or {}).items()), ensure_ascii=False)  # noqa: E731
    return canon(a) == canon(b)
