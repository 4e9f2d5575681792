"""``sum_i a_i max_{u in S} X[u, i]``: the weighted max coverage that the information coverage and
the role coverage instantiate (a form, not a term: each of them registers a subclass)."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from .base import CoverageTerm, keep


class MaxCoverage(CoverageTerm):
    """``sum_i a_i max_{u in S} X[u, i]``: ``a`` and ``X`` two fields of ``CoverageData`` (the
    information coverage: ``pi`` and ``K``, over the units; the role coverage: ``delta`` and ``rho``,
    over the roles). State: each column's best value so far."""

    a: ClassVar[str] = "pi"
    x: ClassVar[str] = "K"

    def init(self, d):
        return np.zeros(len(getattr(d, self.a)))

    def gain(self, d, c, u):
        return float(getattr(d, self.a) @ np.maximum(0.0, getattr(d, self.x)[u] - c))

    def add(self, d, c, u):
        np.maximum(c, getattr(d, self.x)[u], out=c)

    def total(self, d, c):
        return float(getattr(d, self.a) @ c)

    def init_t(self, d):
        return getattr(d, self.a) * 0.0

    def gains_t(self, d, c, pick):
        a, x = getattr(d, self.a), getattr(d, self.x)
        return (pick.query(a)[:, None, :] * (pick.units(x) - pick.query(c)[:, None, :]).clamp_min(0)).sum(-1)

    def add_t(self, d, c, rows, active):
        import torch
        return keep(active, torch.maximum(c, rows(getattr(d, self.x))), c)
