"""Group affinity, ``sum_g max_{u in S, u in g} alpha(u)``: a restatement group's affinity (a fact
and the turns it restates) counts once, as its best picked unit's; optional, and no fused pieces."""
from __future__ import annotations

from ..unit_inputs import GROUP
from .base import CoverageTerm
from .registry import register


@register("group_affinity", "w_grp", position=60, optional=True,
          formula="sum_g max_{u in S, u in g} alpha(u)",
          bound="gain(u | S) = max(0, alpha(u) - max_{s in S, s in g(u)} alpha(s)) for u in a group g(u), "
                "else 0; <= alpha(u)")
class GroupAffinity(CoverageTerm):
    """``sum_g max_{u in S, u in g} alpha(u)`` over the restatement groups g (column ``group`` of
    ``terms.unit_attributes``: a fact and the turns it restates): a fact beside its source turn adds
    only what its affinity exceeds the turn's by; units of no group gain nothing here (their affinity
    stays modular). State: each group's best alpha (NumPy: a dict; torch: ``[Q, G + 1]``, column 0 = none)."""

    reads_attrs = True

    def _g(self, d, u) -> int:
        return -1 if d.attrs is None or d.alpha is None else int(d.attrs[u, GROUP])  # no data: no groups

    def init(self, d):
        return {}

    def gain(self, d, best, u):
        g = self._g(d, u)
        return max(0.0, float(d.alpha[u]) - best.get(g, 0.0)) if g >= 0 else 0.0

    def add(self, d, best, u):
        g = self._g(d, u)
        if g >= 0:
            best[g] = max(best.get(g, 0.0), float(d.alpha[u]))

    def total(self, d, best):
        return float(sum(best.values()))

    @staticmethod
    def _col(d):
        if d.attrs is None or d.alpha is None:  # no data: no groups (every unit in column 0)
            return d.thread * 0
        return (d.attrs[..., GROUP] + 1).long()

    def init_t(self, d):
        import torch
        return torch.zeros(d.pi.shape[0], int(self._col(d).max()) + 1, dtype=d.pi.dtype, device=d.pi.device)

    def gains_t(self, d, best, pick):
        import torch
        col = pick.units(self._col(d))
        a = pick.units(d.alpha if d.alpha is not None else d.pi)
        g = (a - torch.gather(pick.query(best), 1, col)).clamp_min(0)
        return torch.where(col > 0, g, torch.zeros((), dtype=g.dtype, device=g.device))

    def add_t(self, d, best, rows, active):
        import torch
        col = rows(self._col(d))[:, None]
        cur = torch.gather(best, 1, col)
        a = rows(d.alpha if d.alpha is not None else d.pi)[:, None]
        new = best.scatter(1, col, torch.where(active[:, None], torch.maximum(cur, a), cur))
        new[:, 0] = 0.0
        return new
