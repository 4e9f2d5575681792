"""Role coverage, ``sum_r delta_r max_{u in S} rho_r(u)``: the query's role demand ``delta`` met by
the units' role weights ``rho`` (steps 5-6); both fused greedies hold its pieces."""
from __future__ import annotations

from .max_coverage import MaxCoverage
from .registry import FUSED_BACKENDS, register


@register("role_coverage", "w_role", position=20, learned=True, fused=FUSED_BACKENDS,
          formula="sum_r delta_r max_{u in S} rho_r(u)",
          bound="gain(u | S) = sum_r delta_r max(0, rho_r(u) - m_r), m_r = max_{s in S} rho_r(s); <= delta . rho(u)")
class RoleCoverage(MaxCoverage):
    """The max coverage of ``delta`` over the roles by ``rho`` (state: ``m [R]``)."""

    a = "delta"
    x = "rho"
