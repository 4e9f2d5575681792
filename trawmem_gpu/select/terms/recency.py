"""Recency, ``sum_{u in S} 2^(-age(u) / half-life)``: the modular bonus of recent units (needs the
query's date; ``SelectConfig.recency_half_life_days``)."""
from __future__ import annotations

import numpy as np

from ..support import _is_torch
from .base import ModularTerm
from .registry import register


def recency(x, half_life_days: float):
    """Recency bonus ``2^(-age / half_life)`` of each unit, ``age`` = days from the unit's date to the
    query's (0 for a unit dated after it); 0 when either date is missing. In [0, 1]."""
    age = ((x.now - x.attrs[..., 0]) / 86400.0).clip(min=0.0)
    bonus = 0.5 ** (age / half_life_days)
    if _is_torch(bonus):
        import torch
        return torch.where(bonus == bonus, bonus, 0.0)  # NaN (no date) -> 0
    return np.where(bonus == bonus, bonus, 0.0)


@register("recency", "w_rec", position=50, formula="sum_{u in S} 2^(-age(u) / half-life)",
          bound="gain(u | S) = the bonus of u")
class Recency(ModularTerm):
    """The recency bonus of each unit at the config's half-life (:func:`recency`)."""

    def value(self, x, cfg):
        return recency(x, cfg.recency_half_life_days)
