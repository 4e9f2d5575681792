"""Dict round trips of the dataclass configs (``BuildConfig``, ``SelectConfig``, ``QueryParams``)."""
from __future__ import annotations

from dataclasses import asdict, fields

from .errors import ConfigError


class DictFields:
    """``to_dict`` / ``from_dict`` for a dataclass: a field the class does not have is a
    ``ConfigError`` naming it, but for the ``LEGACY`` names, which older versions wrote and
    ``from_dict`` accepts and ignores."""

    KIND = "config"
    """How errors call the dict's fields (``unknown build config fields [...]``)."""
    LEGACY: frozenset = frozenset()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known - cls.LEGACY
        if unknown:
            raise ConfigError(f"unknown {cls.KIND} fields {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k in known})


def with_keywords(fn: str, cls, options, kw: dict):
    """``options`` (an instance of the dataclass ``cls``, or None: its defaults) with the fields
    ``kw`` names set: how a call takes a grouped options object and the same fields as keywords
    (``fn(..., options=None, **kw)``). A keyword ``cls`` lacks is the ``TypeError`` Python gives
    an unknown keyword argument of ``fn``."""
    from dataclasses import replace

    if options is not None and not isinstance(options, cls):
        raise TypeError(f"{fn}() options: expected a {cls.__name__}, got {type(options).__name__}")
    names = {f.name for f in fields(cls)}
    bad = next((k for k in kw if k not in names), None)
    if bad is not None:
        raise TypeError(f"{fn}() got an unexpected keyword argument {bad!r}")
    return replace(options or cls(), **kw)
