"""Information coverage, ``sum_v pi(v) max_{u in S} K(u, v)``: how much of the candidates' priority
mass the selection supports (K: ``support.support_kernel``). Its state is what the early stop reads
(``terms.INFORMATION``); both fused greedies hold its pieces."""
from __future__ import annotations

from .max_coverage import MaxCoverage
from .registry import FUSED_BACKENDS, register


@register("information_coverage", "w_cov", position=10, learned=True, fused=FUSED_BACKENDS,
          formula="sum_v pi(v) max_{u in S} K(u, v)",
          bound="gain(u | S) = sum_v pi(v) max(0, K(u, v) - c(v)), c(v) = max_{s in S} K(s, v); "
                "<= gain(u | {}) = sum_v pi(v) K(u, v) <= sum_j mass_j max_{v in L_j} K(u, v)")
class InformationCoverage(MaxCoverage):
    """The max coverage of ``pi`` over the units by the support kernel ``K`` (state: ``c [U]``)."""

    a = "pi"
    x = "K"
