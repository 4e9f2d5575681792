"""Stage 2, step 7 (design note): the objective J, defined once.

For a set S of candidate units of one query::

    J(S) = sum_{u in S} m(u)                               modular part
         + w_cov  * sum_v pi(v) max_{u in S} K(u, v)        information coverage
         + w_role * sum_r delta_r max_{u in S} rho_r(u)     role coverage
         + w_thr  * sum_j [S hits L_j] * mass_j             thread coverage (mass_j = sum of pi over L_j)

    m(u) = sum over the modular terms k of w_k * value_k(u)   (affinity: value = alpha(u))

:data:`TERMS` lists the terms in the one order every weight vector uses (:data:`WEIGHTS`,
then the priority weights of steps 5-6: :data:`QUERY_WEIGHTS`, the columns of every per-query
weight matrix). Each term states its marginal gain and the upper bound the lazy greedies start
from. Every term is monotone submodular for non-negative weights, so lazy greedy is exact.

The modular part is one per-unit vector, computed by :func:`modular_gain` and nothing else:
every backend (the NumPy reference, torch, numba, Triton, the head's training surrogate) takes
that vector, so a new modular term (for example a recency bonus) is a new :class:`Term` with a
``value`` function, plus its weight in ``SelectConfig``. Per-unit inputs a modular term needs
beyond alpha are columns of :func:`unit_attributes` (query-independent, stored per bank) and
the query's date (:func:`date_seconds`). The three coverage terms have a gain in each style
below (NumPy per unit, torch batched, compiled loops), side by side; ``tests/test_objective.py``
runs every optimizer with one term switched on at a time and names the term that differs.

The support kernel K of the information coverage is :func:`support_from_cosine` (the clip
formula, once) applied by :func:`support_kernel`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Mapping, NamedTuple

import numpy as np

from ._jit import njit, numba


# ----------------------------------------------------------------------------------------------
# the terms
# ----------------------------------------------------------------------------------------------
class ModularInputs:
    """What the modular terms read, per candidate (NumPy arrays or torch tensors).

    :param alpha: ``[..., U]`` affinity (step 3)
    :param attrs: ``[..., U, len(UNIT_ATTRIBUTES)]`` the candidates' rows of :func:`unit_attributes`,
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


@dataclass(frozen=True)
class Term:
    """One term of J."""

    name: str
    weight: str
    """Its weight: a ``SelectConfig`` field (and a column of the per-query weight matrix)."""
    kind: str
    """``modular`` (a per-unit value, summed over S) or ``coverage`` (a max over S)."""
    formula: str
    bound: str
    """The term's marginal gain and the upper bound a lazy greedy may start from."""
    value: Callable[[ModularInputs, object], object] | None = None
    """Modular terms: ``value(inputs, cfg) -> [..., U]``, finite and >= 0 (0 where the term has
    nothing to add): J stays monotone, and the lazy greedies' bounds stay upper bounds."""


TERMS: tuple[Term, ...] = (
    Term("information_coverage", "w_cov", "coverage", "sum_v pi(v) max_{u in S} K(u, v)",
         "gain(u | S) = sum_v pi(v) max(0, K(u, v) - c(v)), c(v) = max_{s in S} K(s, v); "
         "<= gain(u | {}) = sum_v pi(v) K(u, v) <= sum_j mass_j max_{v in L_j} K(u, v)"),
    Term("role_coverage", "w_role", "coverage", "sum_r delta_r max_{u in S} rho_r(u)",
         "gain(u | S) = sum_r delta_r max(0, rho_r(u) - m_r), m_r = max_{s in S} rho_r(s); <= delta . rho(u)"),
    Term("affinity", "w_aff", "modular", "sum_{u in S} alpha(u)", "gain(u | S) = alpha(u)",
         value=lambda x, cfg: x.alpha),
    Term("thread_coverage", "w_thr", "coverage", "sum_j [S hits L_j] mass_j",
         "gain(u | S) = mass_{thread(u)} if no unit of S is in thread(u), else 0; <= mass_{thread(u)}"),
    Term("recency", "w_rec", "modular", "sum_{u in S} 2^(-age(u) / half-life)", "gain(u | S) = the bonus of u",
         value=lambda x, cfg: recency(x, cfg.recency_half_life_days)),
)
TERM_BY_NAME = {t.name: t for t in TERMS}
MODULAR_TERMS = tuple(t for t in TERMS if t.kind == "modular")
COVERAGE_TERMS = tuple(t for t in TERMS if t.kind == "coverage")
WEIGHTS = tuple(t.weight for t in TERMS)
"""J's weights, in the order of :data:`TERMS`."""
PRIORITY_WEIGHTS = ("lambda_m", "lambda_r", "tau")
"""Steps 5-6 weights (costs and priorities) a learned head may also set per query."""
QUERY_WEIGHTS = WEIGHTS + PRIORITY_WEIGHTS
"""Columns of every per-query weight matrix (:func:`weight_matrix`)."""
COL = {name: i for i, name in enumerate(QUERY_WEIGHTS)}
W_COV, W_ROLE, W_THR = COL["w_cov"], COL["w_role"], COL["w_thr"]
LAMBDA_M, LAMBDA_R, TAU = COL["lambda_m"], COL["lambda_r"], COL["tau"]

UNIT_ATTRIBUTES: tuple[str, ...] = ("time",)
"""Query-independent per-unit inputs of the modular terms (columns of :func:`unit_attributes`):
``time``, the unit's date (POSIX seconds, NaN when the source gave none)."""


def unit_attributes(bank) -> np.ndarray:
    """``[N, len(UNIT_ATTRIBUTES)]`` float64: the per-unit columns the modular terms read."""
    return np.array([[date_seconds(t.time)] for t in bank.turns], dtype=np.float64).reshape(bank.n_units, 1)


def recency(x: ModularInputs, half_life_days: float):
    """Recency bonus ``2^(-age / half_life)`` of each unit, ``age`` = days from the unit's date to the
    query's (0 for a unit dated after it); 0 when either date is missing. In [0, 1]."""
    age = ((x.now - x.attrs[..., 0]) / 86400.0).clip(min=0.0)
    bonus = 0.5 ** (age / half_life_days)
    return (_torch_where if _is_torch(bonus) else np.where)(bonus == bonus, bonus, 0.0)  # NaN (no date) -> 0


def _torch_where(cond, x, y):
    import torch

    return torch.where(cond, x, y)


def date_seconds(when: datetime | None) -> float:
    """A query's or unit's date as POSIX seconds (naive dates are taken as UTC), NaN for None."""
    if when is None:
        return math.nan
    if not isinstance(when, datetime):
        raise TypeError(f"a date must be a datetime or None (got {type(when).__name__})")
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


# ----------------------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------------------
class CoverageWeights(NamedTuple):
    """Weights of the coverage terms: floats, or per-query ``[Q, 1]`` arrays / tensors."""

    w_cov: object
    w_role: object
    w_thr: object


def weight_matrix(cfg, n: int, overrides: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """``[n, len(QUERY_WEIGHTS)]`` float64: the config's weights, per-query ``overrides`` (a learned
    head's, by field name) in place of the config's where given."""
    W = np.empty((n, len(QUERY_WEIGHTS)))
    for k, name in enumerate(QUERY_WEIGHTS):
        W[:, k] = np.asarray(overrides[name], dtype=np.float64) if overrides and name in overrides \
            else float(getattr(cfg, name))
    return W


def weight_columns(W) -> dict[str, object]:
    """``{name: W[:, k, None]}``: a weight matrix as per-query ``[Q, 1]`` columns."""
    return {name: W[:, k, None] for k, name in enumerate(QUERY_WEIGHTS)}


def coverage_weights(w: Mapping[str, object]) -> CoverageWeights:
    return CoverageWeights(w["w_cov"], w["w_role"], w["w_thr"])


# ----------------------------------------------------------------------------------------------
# the modular part
# ----------------------------------------------------------------------------------------------
def modular_gain(x: ModularInputs, weights: Mapping[str, object], cfg) -> object:
    """``m(u) = sum_k w_k value_k(u)`` over :data:`MODULAR_TERMS`, ``[..., U]`` (same array type as
    ``x.alpha``); ``weights`` maps weight names to floats or ``[..., 1]`` per-query columns. A term
    whose weight is 0 for every query is skipped: it would add exactly +0.0 (values are finite)."""
    out = None
    for t in MODULAR_TERMS:
        w = weights[t.weight]
        if _all_zero(w):
            continue
        v = w * t.value(x, cfg)
        out = v if out is None else out + v
    return out if out is not None else x.alpha * 0.0


def _all_zero(w) -> bool:
    return bool((w == 0).all()) if hasattr(w, "all") else w == 0


def combine_gain(cov, role, modular, thr, w_cov, w_role, w_thr):
    """A unit's marginal gain from its terms' gains, always in this order (floats, arrays,
    tensors; compiled as :func:`combine_gain_compiled`)."""
    return w_cov * cov + w_role * role + modular + w_thr * thr


combine_gain_compiled = njit(cache=True, inline="always")(combine_gain)


# ----------------------------------------------------------------------------------------------
# the support kernel K (information coverage)
# ----------------------------------------------------------------------------------------------
def support_from_cosine(cos, k_shift):
    """``K = clip((cos - k_shift) / (1 - k_shift), 0, 1)``: the one statement of the clip formula,
    for floats, NumPy arrays, torch tensors and, compiled, inside numba
    (:func:`support_from_cosine_compiled`). The division is a product with the reciprocal, which a
    compiled loop hoists: one multiplication per entry."""
    return clip01((cos - k_shift) * (1.0 / (1.0 - k_shift)))


def clip01(y):
    """``clip(y, 0, 1)`` of an array, a tensor or a float (numba: ``min(max(y, 0), 1)``)."""
    return y.clip(0.0, 1.0) if hasattr(y, "clip") else min(max(y, 0.0), 1.0)


if numba is not None:
    @numba.extending.overload(clip01)
    def _clip01_compiled(y):  # pragma: no cover - compiled
        if isinstance(y, numba.types.Float):
            return lambda y: min(max(y, 0.0), 1.0)


support_from_cosine_compiled = njit(cache=True, inline="always")(support_from_cosine)


def support_kernel(cos, same_thread, cfg):
    """``K [..., U, U]`` from candidate cosines (NumPy or torch): :func:`support_from_cosine`,
    zero across threads without cross-thread support (``same_thread [..., U, U]`` bool), unit
    diagonal; or the identity (``kernel="identity"``)."""
    U = cos.shape[-1]
    if _is_torch(cos):
        import torch

        eye = torch.eye(U, dtype=torch.bool, device=cos.device)
        if cfg.kernel == "identity":
            return eye.to(cos.dtype).expand(cos.shape).clone()
        K = support_from_cosine(cos, cfg.k_shift)
        if not cfg.cross_thread:
            K = K * same_thread
        return torch.where(eye, torch.ones((), dtype=K.dtype, device=K.device), K)
    if cfg.kernel == "identity":
        return np.broadcast_to(np.eye(U), cos.shape).copy()
    K = support_from_cosine(cos, cfg.k_shift)
    if not cfg.cross_thread:
        K = K * same_thread
    K = np.array(K, dtype=np.float64)
    np.einsum("...ii->...i", K)[...] = 1.0
    return K


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


# ----------------------------------------------------------------------------------------------
# coverage gains: NumPy reference, one query
# ----------------------------------------------------------------------------------------------
class Objective:
    """J of one query in NumPy float64, with the greedy's running state.

    :param pi: ``[U]`` priorities; ``K``: ``[U, U]``, ``K[u, v]`` = support of v by u
    :param rho: ``[U, R]`` role weights; ``delta``: ``[R]`` role demand
    :param modular: ``[U]`` the modular part m(u) (:func:`modular_gain`)
    :param thread: ``[U]`` local thread of each unit (< 0: no thread term for the unit)
    :param weights: the coverage terms' weights
    :param thread_mass: ``[T]`` mass_j; default the sum of ``pi`` over each thread's units
    """

    def __init__(self, pi, K, rho, delta, modular, thread, weights: CoverageWeights = CoverageWeights(1.0, 1.0, 1.0),
                 thread_mass=None):
        self.pi = np.asarray(pi, dtype=np.float64)
        self.K = np.asarray(K, dtype=np.float64)
        self.delta = np.asarray(delta, dtype=np.float64)
        self.rho = np.asarray(rho, dtype=np.float64).reshape(len(self.pi), len(self.delta))
        self.modular = np.asarray(modular, dtype=np.float64)
        self.thread = np.asarray(thread, dtype=np.int64)
        self.w = CoverageWeights(*(float(x) for x in weights))
        U = len(self.pi)
        if thread_mass is None:
            T = int(self.thread.max()) + 1 if U else 0
            own = self.thread >= 0
            thread_mass = np.bincount(self.thread[own], weights=self.pi[own], minlength=T) if U else np.zeros(0)
        self.mass = np.asarray(thread_mass, dtype=np.float64)
        self.reset()

    @property
    def n(self) -> int:
        return len(self.pi)

    def reset(self) -> None:
        self.c = np.zeros(self.n)
        self.m = np.zeros(self.rho.shape[1])
        self.hit = np.zeros(len(self.mass), dtype=bool)

    def _thread_of(self, u: int) -> int:
        t = int(self.thread[u])
        return t if 0 <= t < len(self.mass) else -1

    def term_gains(self, u: int) -> tuple[float, float, float, float]:
        """``(cov, role, modular, thr)``: the unweighted coverage gains and m(u)."""
        cov = float(self.pi @ np.maximum(0.0, self.K[u] - self.c))
        role = float(self.delta @ np.maximum(0.0, self.rho[u] - self.m))
        t = self._thread_of(u)
        thr = float(self.mass[t]) if t >= 0 and not self.hit[t] else 0.0
        return cov, role, float(self.modular[u]), thr

    def gain(self, u: int) -> float:
        """Marginal gain of adding ``u`` to the current set."""
        return combine_gain(*self.term_gains(u), *self.w)

    def add(self, u: int) -> None:
        np.maximum(self.c, self.K[u], out=self.c)
        np.maximum(self.m, self.rho[u], out=self.m)
        t = self._thread_of(u)
        if t >= 0:
            self.hit[t] = True

    def coverage(self) -> float:
        """Information coverage ``sum_v pi(v) c(v)`` of the current set (the early-stop test)."""
        return float(self.pi @ self.c)

    def value(self, S) -> float:
        """J(S) from scratch (for tests)."""
        S = list(S)
        if not S:
            return 0.0
        cov = float(self.pi @ self.K[S].max(axis=0))
        role = float(self.delta @ self.rho[S].max(axis=0))
        ts = {self._thread_of(u) for u in S} - {-1}
        thr = float(sum(self.mass[t] for t in ts))
        return combine_gain(cov, role, float(self.modular[S].sum()), thr, *self.w)


# ----------------------------------------------------------------------------------------------
# coverage gains: torch, a padded batch
# ----------------------------------------------------------------------------------------------
def coverage_gains_torch(K_rows, pi, c, rho_rows, delta, m, unit_mass, hit):
    """Unweighted coverage gains of ``k`` units of each of ``Q`` queries (torch):
    ``(cov [Q, k], role [Q, k], thr [Q, k])``.

    :param K_rows: ``[Q, k, U]`` the units' K rows; ``pi``, ``c``: ``[Q, U]``
    :param rho_rows: ``[Q, k, R]``; ``delta``, ``m``: ``[Q, R]``
    :param unit_mass: ``[Q, k]`` mass of each unit's thread; ``hit``: ``[Q, k]`` bool, thread already hit
    """
    cov = (pi[:, None, :] * (K_rows - c[:, None, :]).clamp_min(0)).sum(-1)
    role = (delta[:, None, :] * (rho_rows - m[:, None, :]).clamp_min(0)).sum(-1)
    thr = unit_mass * ~hit
    return cov, role, thr


# ----------------------------------------------------------------------------------------------
# coverage gains: compiled (numba), one unit of one query
# ----------------------------------------------------------------------------------------------
@njit(cache=True, fastmath={"reassoc", "nsz", "contract"})
def coverage_gain_row(krow, pi, c):  # pragma: no cover - compiled
    """Information coverage gain ``sum_v pi[v] max(K(u, v) - c[v], 0)`` of one unit (``krow``:
    its K row). Reassociation lets the sum vectorize; a query's gains all come from this one
    function, so they share one summation order and a stale gain stays an upper bound."""
    cov = 0.0
    for v in range(krow.shape[0]):
        cov += pi[v] * max(krow[v] - c[v], 0.0)
    return cov


@njit(cache=True, inline="always")
def role_gain_row(rho, u, m, delta):  # pragma: no cover - compiled
    """Role coverage gain ``sum_r delta_r max(rho[u, r] - m[r], 0)`` of unit ``u``."""
    g = 0.0
    for r in range(m.shape[0]):
        y = rho[u, r] - m[r]
        if y > 0.0:
            g += delta[r] * y
    return g
