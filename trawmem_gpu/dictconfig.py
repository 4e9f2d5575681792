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
