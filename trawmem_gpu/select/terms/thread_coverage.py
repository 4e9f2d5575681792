"""Thread coverage, ``sum_j [S hits L_j] mass_j``: a thread's priority mass counts once some unit of
it is selected (mass_j = the sum of pi over the thread's candidates); both fused greedies hold its pieces."""
from __future__ import annotations

import numpy as np

from .base import CoverageTerm
from .registry import FUSED_BACKENDS, register


@register("thread_coverage", "w_thr", position=40, learned=True, fused=FUSED_BACKENDS,
          formula="sum_j [S hits L_j] mass_j",
          bound="gain(u | S) = mass_{thread(u)} if no unit of S is in thread(u), else 0; <= mass_{thread(u)}")
class ThreadCoverage(CoverageTerm):
    """``sum_j [S hits L_j] mass_j``; state ``hit [T]`` (torch: ``[Q, T + 1]``, column 0 never hit)."""

    def _t(self, d, u) -> int:
        t = int(d.thread[u])
        return t if 0 <= t < len(d.mass) else -1

    def init(self, d):
        return np.zeros(len(d.mass), dtype=bool)

    def gain(self, d, hit, u):
        t = self._t(d, u)
        return float(d.mass[t]) if t >= 0 and not hit[t] else 0.0

    def add(self, d, hit, u):
        t = self._t(d, u)
        if t >= 0:
            hit[t] = True

    def total(self, d, hit):
        return float(d.mass[hit].sum()) if len(d.mass) else 0.0

    def init_t(self, d):
        return d.mass != d.mass  # all False, [Q, T + 1]

    def gains_t(self, d, hit, pick):
        import torch
        col = pick.units(d.thread)
        return torch.gather(pick.query(d.mass), 1, col) * ~torch.gather(pick.query(hit), 1, col)

    def add_t(self, d, hit, rows, active):
        import torch
        col = rows(d.thread)[:, None]
        new = hit.scatter(1, col, torch.gather(hit, 1, col) | active[:, None])
        new[:, 0] = False
        return new
