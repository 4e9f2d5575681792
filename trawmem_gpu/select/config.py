"""Selection configuration: every Stage-2 choice in one dataclass, one docstring per field.

``SelectConfig()`` is the measured default; ``SelectConfig.paper()`` is the method exactly as
Section 4.2 writes it (head-vector seeds, additive propagation, dense affinity, objective
weights of 1). The six ablations of Section 5.2 are switches (``ablation=...``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Literal

from ..errors import ConfigError

ABLATIONS = ("none", "fixed_segmentation", "no_cross_edges", "seed_only", "no_role_conditioning", "identity_k",
             "no_multi_thread")

# Roles (anchor, bridge, context) x demand features (1, z_temp, z_rel, z_len).
DEFAULT_A = ((1.0, 0.0, 0.0, 0.0),
             (0.2, 0.0, 1.0, 0.5),
             (0.2, 1.0, 0.0, 0.2))
# Roles x unit features (1, alpha, thread score, bridge, head sim, temporal, position).
DEFAULT_M = ((0.0, 4.0, 1.0, 0.0, 0.0, 0.0, 0.0),
             (0.0, 1.0, 0.5, 4.0, 0.0, 0.0, 0.0),
             (0.0, 1.0, 1.0, 0.0, 2.0, 2.0, 0.0))
UNIT_FEATURES = ("bias", "alpha", "thread_score", "bridge", "head_sim", "temporal", "position")
DEMAND_FEATURES = ("bias", "z_temp", "z_rel", "z_len")


@dataclass
class SelectConfig:
    """How one query's workspace is selected from one bank."""

    budget: int = 16
    """B: at most this many units per workspace (B_q = max(1, min(B, |U_q|)))."""
    hops: int = 1
    """H: propagation hops over the thread graph (0 = seeds only)."""
    n_seeds: int | None = None
    """Seed threads taken by initial score before propagation; None = max(2, round(B / 2)),
    so the candidate pool grows with the budget (8 at B = 16)."""
    neighborhood_cap: int | None = None
    """Most threads in the neighborhood H_q (seeds first, then the best-scored neighbours);
    None = max(n_seeds, round(3 B / 4)) (12 at B = 16)."""
    gamma: float = 0.7
    """Propagation: r~(T_k) = gamma * r(T_j) + (1 - gamma) * w_H(T_j, T_k) (max over paths)."""
    propagation: Literal["paper", "damped"] = "damped"
    """``paper`` applies Eq. 4 as written (a neighbour of a weak seed can outscore the seed);
    ``damped`` uses r(T_j) * (gamma + (1 - gamma) * w), never above its source."""
    d_idx: Literal["l2", "cosine"] = "l2"
    """Seed distance for r0 = 1 / (1 + d_idx(z, h)): L2 between unit vectors, or 1 - cos."""
    seed_score: Literal["head", "best_unit", "max"] = "best_unit"
    """r0 of a thread: from its head vector (paper), from its best unit's affinity, or the max."""
    affinity: Literal["dense", "fused", "rrf"] = "rrf"
    """alpha(v): ``dense`` = (1 + cos(z, e_v)) / 2 (the paper); ``fused`` = (1 - w) * dense +
    w * bm25 / max_bank(bm25) with w = ``lexical_weight``; ``rrf`` = reciprocal-rank fusion of
    cosine and BM25 over the bank (k = ``rrf_k``), divided by its bank maximum."""
    lexical_weight: float = 0.5
    """Weight of BM25 in the ``fused`` affinity."""
    rrf_k: int = 60
    """k of the reciprocal-rank fusion in the ``rrf`` affinity."""
    lambda_m: float = 1.25
    """Cost weight of query mismatch (1 - alpha) (the paper's best value)."""
    lambda_r: float = 0.5
    """Cost weight of role misfit (1 - phi)."""
    tau: float = 0.25
    """Temperature of exp(-C / tau) in the priorities."""
    T_R: float = 0.5
    """Role softmax temperature."""
    A: tuple = DEFAULT_A
    """Roles x demand features: delta = A x / 1^T A x."""
    M: tuple = DEFAULT_M
    """Roles x unit features; M(delta) = M * (1 + delta) row-wise."""
    c_head: float = 1.0
    """Local graph: cost of the unit-head edge is c_head * (1 - cos(h_j, e_v))."""
    c_step: float = 0.25
    """Local graph: cost between adjacent units of a thread."""
    c_hop: float = 0.5
    """Local graph: cost of a head-head edge is c_hop + (1 - w_H)."""
    kernel: Literal["cosine", "identity"] = "cosine"
    """K(u, v): clip((cos - k_shift) / (1 - k_shift), 0, 1) with K(v, v) = 1, or the identity."""
    k_shift: float = 0.3
    """Cosine below which a unit supports another not at all (0 = plain clipped cosine)."""
    w_cov: float = 1.0
    """Weight of the information-coverage term of J."""
    w_role: float = 1.0
    """Weight of the role-coverage term of J."""
    w_aff: float = 1.0
    """Weight of the affinity sum of J."""
    w_thr: float = 1.0
    """Weight of the thread-coverage term of J."""
    stop_coverage: float = 1.01
    """Greedy stops once sum_v pi(v) max_S K >= this (> 1 never stops early)."""
    greedy: Literal["lazy", "plain"] = "lazy"
    """Lazy greedy (stale upper bounds) picks exactly what plain greedy picks."""
    cross_thread: bool = True
    """Cross-thread support (K across threads, priorities from other heads); off for No Multi-thread."""
    semantic_edges: bool = True
    """Use semantic (k-nearest-head) edges of G_H; off for No Cross-Edge."""
    ablation: str = "none"
    """One of ABLATIONS; applied by ``resolved()``. ``fixed_segmentation`` is a build switch."""

    def __post_init__(self):
        if self.budget < 1:
            raise ConfigError(f"{self.budget=} must be >= 1")
        if self.hops < 0:
            raise ConfigError(f"{self.hops=} must be >= 0")
        if self.n_seeds is not None and self.n_seeds < 1:
            raise ConfigError(f"{self.n_seeds=} must be >= 1")
        if self.neighborhood_cap is not None and self.neighborhood_cap < (self.n_seeds or 1):
            raise ConfigError(f"need {self.neighborhood_cap=} >= {self.n_seeds=}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"{self.gamma=} must lie in [0, 1]")
        if not 0.0 <= self.lexical_weight <= 1.0:
            raise ConfigError(f"{self.lexical_weight=} must lie in [0, 1]")
        for name in ("tau", "T_R"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be > 0")
        for name in ("lambda_m", "lambda_r", "c_head", "c_step", "c_hop", "w_cov", "w_role", "w_aff", "w_thr"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        if not 0.0 <= self.k_shift < 1.0:
            raise ConfigError(f"{self.k_shift=} must lie in [0, 1)")
        if self.ablation not in ABLATIONS:
            raise ConfigError(f"{self.ablation=} must be one of {ABLATIONS}")
        if self.rrf_k < 1:
            raise ConfigError(f"{self.rrf_k=} must be >= 1")
        for name, val in (("affinity", self.affinity), ("propagation", self.propagation), ("d_idx", self.d_idx), ("seed_score", self.seed_score),
                          ("kernel", self.kernel), ("greedy", self.greedy)):
            allowed = self.__dataclass_fields__[name].type
            if f"'{val}'" not in str(allowed) and f'"{val}"' not in str(allowed):
                raise ConfigError(f"{name}={val!r} is not one of {allowed}")
        self.A = tuple(tuple(float(x) for x in r) for r in self.A)
        self.M = tuple(tuple(float(x) for x in r) for r in self.M)
        if len(self.A) != 3 or any(len(r) != len(DEMAND_FEATURES) for r in self.A):
            raise ConfigError(f"A must be 3 x {len(DEMAND_FEATURES)}")
        if len(self.M) != 3 or any(len(r) != len(UNIT_FEATURES) for r in self.M):
            raise ConfigError(f"M must be 3 x {len(UNIT_FEATURES)}")

    @classmethod
    def paper(cls, **kw) -> "SelectConfig":
        """Section 4.2 as written: head seeds, Eq. 4 propagation, dense affinity, unit weights."""
        base = dict(seed_score="head", propagation="paper", affinity="dense", k_shift=0.0, w_cov=1.0, w_role=1.0,
                    w_aff=1.0, w_thr=1.0, hops=2)
        base.update(kw)
        return cls(**base)

    def resolved(self) -> "SelectConfig":
        """The config with budget-derived sizes filled in and its ablation applied (idempotent)."""
        if self.n_seeds is None or self.neighborhood_cap is None:
            ns = self.n_seeds if self.n_seeds is not None else max(2, round(self.budget / 2))
            cap = self.neighborhood_cap if self.neighborhood_cap is not None else max(ns, round(3 * self.budget / 4))
            return replace(self, n_seeds=ns, neighborhood_cap=cap).resolved()
        a = self.ablation
        if a == "no_cross_edges":
            return replace(self, semantic_edges=False)
        if a == "seed_only":
            return replace(self, hops=0)
        if a == "no_role_conditioning":
            return replace(self, lambda_r=0.0, w_role=0.0)
        if a == "identity_k":
            return replace(self, kernel="identity")
        if a == "no_multi_thread":
            return replace(self, cross_thread=False, w_thr=0.0)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SelectConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown selection config fields {sorted(unknown)}")
        return cls(**d)
