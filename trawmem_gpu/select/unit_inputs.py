"""The per-unit inputs of J's terms (``objective`` re-exports these): what the modular terms read
(:class:`ModularInputs`), the base query-independent columns of ``terms.unit_attributes``
(:func:`base_attributes`; a term may add its own) and dates as POSIX seconds (:func:`date_seconds`,
a unit's and a query's)."""
from __future__ import annotations

import math
from datetime import datetime, timezone

import numpy as np

from ..store.turn_columns import field_of
from .support import restatement_groups


class ModularInputs:
    """What the modular terms read, per candidate (NumPy arrays or torch tensors).

    :param alpha: ``[..., U]`` affinity (step 3)
    :param attrs: ``[..., U, len(terms.UNIT_ATTRIBUTES)]`` the candidates' rows of ``terms.unit_attributes``,
        or a function that gathers them (called once, only if a term with a non-zero weight reads them)
    :param now: ``[..., 1]`` (or a scalar) the query's date in POSIX seconds (:func:`date_seconds`), NaN if none
    """

    def __init__(self, alpha, attrs, now):
        self.alpha, self._attrs, self.now = alpha, attrs, now

    @property
    def attrs(self):
        if callable(self._attrs):
            self._attrs = self._attrs()
        return self._attrs


BASE_ATTRIBUTES: tuple[str, ...] = ("time", "group")
"""The first query-independent per-unit inputs of the terms (the first columns of
``terms.unit_attributes``, before those the terms add): ``time``, the unit's date (POSIX seconds,
NaN when the source gave none); ``group``, its restatement group (:func:`restatement_groups`, -1 = none)."""
GROUP = BASE_ATTRIBUTES.index("group")


def base_attributes(bank) -> np.ndarray:
    """``[N, len(BASE_ATTRIBUTES)]`` float64: the per-unit columns of :data:`BASE_ATTRIBUTES`."""
    time = np.array([date_seconds(t) for t in field_of(bank.turns, "time")], dtype=np.float64).reshape(bank.n_units)
    return np.stack([time, restatement_groups(bank).astype(np.float64)], axis=1)


def date_seconds(when: datetime | None) -> float:
    """A query's or unit's date as POSIX seconds (naive dates are taken as UTC), NaN for None."""
    if when is None:
        return math.nan
    if not isinstance(when, datetime):
        raise TypeError(f"a date must be a datetime or None (got {type(when).__name__})")
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()
