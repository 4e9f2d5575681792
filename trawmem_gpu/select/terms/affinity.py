"""Affinity, ``sum_{u in S} alpha(u)``: the modular term of each unit's affinity to the query (step
3); with ``w_grp > 0`` only over units of no restatement group (``group_affinity`` counts those)."""
from __future__ import annotations

from ..unit_inputs import GROUP
from .base import ModularTerm
from .registry import register


@register("affinity", "w_aff", position=30, learned=True,
          formula="sum_{u in S} alpha(u) (with w_grp > 0: over units of no group)", bound="gain(u | S) = alpha(u)")
class Affinity(ModularTerm):
    """The modular affinity of each unit: alpha, or (``w_grp > 0``) alpha for units of no restatement
    group and 0 for grouped ones, whose affinity ``group_affinity`` counts once per group."""

    def value(self, x, cfg):
        if cfg.w_grp == 0:
            return x.alpha
        return x.alpha * (x.attrs[..., GROUP] < 0)
