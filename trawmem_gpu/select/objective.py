"""Stage 2, step 7 (design note): the objective J, defined once.

For a set S of candidate units of one query::

    J(S) = sum_{u in S} m(u)                               modular part
         + w_cov  * sum_v pi(v) max_{u in S} K(u, v)        information coverage
         + w_role * sum_r delta_r max_{u in S} rho_r(u)     role coverage
         + w_thr  * sum_j [S hits L_j] * mass_j             thread coverage (mass_j = sum of pi over L_j)
         + w_grp  * sum_g max_{u in S, u in g} alpha(u)     group affinity (g: a fact and its source turns)
    m(u) = sum over the modular terms k of w_k * value_k(u)   (affinity: alpha(u); w_grp > 0: 0 in a group)

:data:`TERMS` lists the terms in the one order every weight vector uses (:data:`WEIGHTS`,
then the priority weights of steps 5-6: :data:`QUERY_WEIGHTS`, the columns of every per-query
weight matrix). Each term states its marginal gain and the upper bound the lazy greedies start
from. Every term is monotone submodular for non-negative weights, so lazy greedy is exact.

The modular part is one per-unit vector, computed by :func:`modular_gain` and nothing else:
every backend (the NumPy reference, torch, numba, Triton, the head's training surrogate) takes
that vector, so a new modular term is a :class:`Term` with a ``value`` function, plus its weight
in ``SelectConfig``. Its per-unit inputs beyond alpha are columns of :func:`unit_attributes` and
the query's date (:func:`date_seconds`, both in ``unit_inputs.py``).

A coverage term is a :class:`CoverageTerm`: one object that owns its state, its marginal gain
and its update when a unit enters S, in NumPy (one query, the specification) and torch (a padded
batch). :class:`Objective` (the NumPy reference) and the torch greedies compose them without
naming any, and :func:`combine_gain` sums the terms in one order. :data:`TERMS` is the registry
every backend reads: a term declares there whether a learned head sets its weight (``learned``:
the head's :data:`LEARNED_WEIGHTS`) and which fused greedies hold its pieces (``fused``: ``numba``,
``steps/greedy/compiled.py``; ``triton``, ``kernels/greedy.py``; pieces named ``<term>_gain`` and
``<term>_add`` there). The fused lists (:func:`fused_terms`) are derived from it, and the dispatcher
(``engine/plan.py``) runs a fused greedy only while every coverage term with a weight has its pieces
there. So a new coverage term is a subclass here, its entry in :data:`TERMS` and its weight in
``SelectConfig``; ``tests/select/agreement/test_objective.py`` runs every optimizer with one term on at a time.

The information coverage's K is :func:`support_kernel`: the clip formula (:func:`support_from_cosine`) once.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from collections import namedtuple
from typing import Callable, Mapping, NamedTuple

import numpy as np

from ._jit import salt_cache
from .support import (_is_torch, clip01, restatement_groups, support_floor, support_from_cosine, support_links,  # noqa: F401
                      support_from_cosine_compiled, support_kernel)
from .unit_inputs import GROUP, UNIT_ATTRIBUTES, ModularInputs, date_seconds, unit_attributes  # noqa: F401


# ----------------------------------------------------------------------------------------------
# the terms
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    """One term of J: its weight, formula and the bound a lazy greedy may start from. A modular term
    states a per-unit ``value``; a coverage term (:class:`CoverageTerm`) its gain and state update."""

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
    learned: bool = False
    """A learned head sets this weight per query (:data:`LEARNED_WEIGHTS`, the head's file format)."""
    fused: tuple[str, ...] = ()
    """Coverage terms: the fused greedies (of :data:`FUSED_BACKENDS`) that hold its pieces."""
    optional: bool = False
    """Coverage terms: its weight may be left out of :data:`CoverageWeights` (0, the term off)."""


class CoverageData(NamedTuple):
    """What the coverage terms read: one query (NumPy: ``pi [U]``, ``K [U, U]``, ``rho [U, R]``,
    ``delta [R]``, ``thread [U]`` local thread or -1, ``mass [T]``) or a padded batch (torch: a
    leading ``[Q]`` axis; ``thread`` holds thread column + 1, 0 = none, and ``mass`` a leading 0
    column; padding has zero ``pi`` and ``K``)."""

    pi: object
    K: object
    rho: object
    delta: object
    thread: object
    mass: object
    attrs: object = None
    """The candidates' rows of :func:`unit_attributes` (``[U, A]`` / ``[Q, U, A]``), given when a
    term reads them (:attr:`CoverageTerm.reads_attrs`), else None."""
    alpha: object = None
    """The candidates' affinity (``[U]`` / ``[Q, U]``, 0 on padding), read by :class:`GroupAffinity`."""


class Pick(NamedTuple):
    """The units whose gains a torch greedy asks for: ``units(x)`` gathers a per-unit tensor
    ``x [Q, U, ...]`` at them (``[Q', k, ...]``), ``query(x)`` takes a per-query tensor's rows."""
    units: Callable
    query: Callable


class CoverageTerm(Term):
    """A coverage term: a max over S, monotone submodular. Each subclass states, once per array
    style, its state (``init``), the marginal gain of a unit (``gain``) and the update when a unit
    enters S (``add``): NumPy for one query (the specification), torch for a padded batch. The
    optimizers call these and never name a term; a fused greedy's pieces restate them."""

    reads_attrs = False
    """Whether the term reads the candidates' unit attributes (``CoverageData.attrs``)."""

    # NumPy, one query: the state, the gain of unit u against it, the update when u enters S
    def init(self, d: CoverageData): raise NotImplementedError  # noqa: E704

    def gain(self, d: CoverageData, st, u: int) -> float: raise NotImplementedError  # noqa: E704

    def add(self, d: CoverageData, st, u: int) -> None: raise NotImplementedError  # noqa: E704

    def total(self, d: CoverageData, st) -> float: raise NotImplementedError  # noqa: E704

    def value_of(self, d: CoverageData, S: list[int]) -> float:
        """The term's value on the set ``S`` from scratch (for tests)."""
        st = self.init(d)
        for u in S:
            self.add(d, st, u)
        return self.total(d, st)

    # torch, a padded batch: the same three; ``add_t`` gets ``rows(x)`` (per-unit tensor ``x [Q, U,
    # ...]`` at each query's new unit) and changes only queries ``active [Q]``, returning the new
    # state without updating a float tensor in place (autograd-safe)
    def init_t(self, d: CoverageData): raise NotImplementedError  # noqa: E704

    def gains_t(self, d: CoverageData, st, pick: Pick): raise NotImplementedError  # noqa: E704

    def add_t(self, d: CoverageData, st, rows, active): raise NotImplementedError  # noqa: E704


def _keep(active, new, old):
    import torch
    return torch.where(active.view(-1, *([1] * (new.dim() - 1))), new, old)


@dataclass(frozen=True)
class MaxCoverage(CoverageTerm):
    """``sum_i a_i max_{u in S} X[u, i]``: a weighted max coverage, ``a`` and ``X`` two fields of
    :class:`CoverageData` (the information coverage: ``pi`` and ``K``, over the units; the role
    coverage: ``delta`` and ``rho``, over the roles). State: each column's best value so far."""

    a: str = "pi"
    x: str = "K"

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
        return _keep(active, torch.maximum(c, rows(getattr(d, self.x))), c)


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


class GroupAffinity(CoverageTerm):
    """``sum_g max_{u in S, u in g} alpha(u)`` over the restatement groups g (column ``group`` of
    :func:`unit_attributes`: a fact and the turns it restates): a fact beside its source turn adds
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


FUSED_BACKENDS = ("numba", "triton")
"""The fused greedies: ``numba`` (``steps/greedy/compiled.py``), ``triton`` (``kernels/greedy.py``)."""
TERMS: tuple[Term, ...] = (
    MaxCoverage("information_coverage", "w_cov", "coverage", "sum_v pi(v) max_{u in S} K(u, v)",
                "gain(u | S) = sum_v pi(v) max(0, K(u, v) - c(v)), c(v) = max_{s in S} K(s, v); "
                "<= gain(u | {}) = sum_v pi(v) K(u, v) <= sum_j mass_j max_{v in L_j} K(u, v)",
                learned=True, fused=FUSED_BACKENDS, a="pi", x="K"),
    MaxCoverage("role_coverage", "w_role", "coverage", "sum_r delta_r max_{u in S} rho_r(u)",
                "gain(u | S) = sum_r delta_r max(0, rho_r(u) - m_r), m_r = max_{s in S} rho_r(s); <= delta . rho(u)",
                learned=True, fused=FUSED_BACKENDS, a="delta", x="rho"),
    Term("affinity", "w_aff", "modular", "sum_{u in S} alpha(u) (with w_grp > 0: over units of no group)",
         "gain(u | S) = alpha(u)", value=lambda x, cfg: affinity_value(x, cfg), learned=True),
    ThreadCoverage("thread_coverage", "w_thr", "coverage", "sum_j [S hits L_j] mass_j",
                   "gain(u | S) = mass_{thread(u)} if no unit of S is in thread(u), else 0; <= mass_{thread(u)}",
                   learned=True, fused=FUSED_BACKENDS),
    Term("recency", "w_rec", "modular", "sum_{u in S} 2^(-age(u) / half-life)", "gain(u | S) = the bonus of u",
         value=lambda x, cfg: recency(x, cfg.recency_half_life_days)),
    GroupAffinity("group_affinity", "w_grp", "coverage", "sum_g max_{u in S, u in g} alpha(u)",
                  "gain(u | S) = max(0, alpha(u) - max_{s in S, s in g(u)} alpha(s)) for u in a group g(u), "
                  "else 0; <= alpha(u)", optional=True),
)
"""The registry: J's terms, in the one order of every weight vector. The names below derive from it."""
PRIORITY_WEIGHTS = ("lambda_m", "lambda_r", "tau")
"""Steps 5-6 weights (costs and priorities); a learned head sets them per query too."""


def _derive() -> None:
    """Set the views of :data:`TERMS`: the terms by kind; ``WEIGHTS`` (J's), ``QUERY_WEIGHTS`` (+ the
    :data:`PRIORITY_WEIGHTS`: columns ``COL`` of every weight matrix) and ``LEARNED_WEIGHTS`` (those a
    learned head sets), in order; ``INFORMATION`` (whose state the early stop reads); ``CoverageWeights``."""
    global TERM_BY_NAME, MODULAR_TERMS, COVERAGE_TERMS, WEIGHTS, QUERY_WEIGHTS, COL, LAMBDA_M, LAMBDA_R, TAU, \
        LEARNED_WEIGHTS, INFORMATION, CoverageWeights
    TERM_BY_NAME = {t.name: t for t in TERMS}
    MODULAR_TERMS = tuple(t for t in TERMS if t.kind == "modular")
    COVERAGE_TERMS = tuple(t for t in TERMS if t.kind == "coverage")
    WEIGHTS = tuple(t.weight for t in TERMS)
    QUERY_WEIGHTS = WEIGHTS + PRIORITY_WEIGHTS
    COL = {name: i for i, name in enumerate(QUERY_WEIGHTS)}
    LAMBDA_M, LAMBDA_R, TAU = COL["lambda_m"], COL["lambda_r"], COL["tau"]
    LEARNED_WEIGHTS = tuple(t.weight for t in TERMS if t.learned) + PRIORITY_WEIGHTS
    INFORMATION = COVERAGE_TERMS.index(TERM_BY_NAME["information_coverage"])
    n_opt = len(COVERAGE_TERMS) - sum(not t.optional for t in COVERAGE_TERMS)
    if any(not t.optional for t in COVERAGE_TERMS[len(COVERAGE_TERMS) - n_opt:]):
        raise ValueError("optional coverage terms must come after every required one")
    CoverageWeights = namedtuple("CoverageWeights", [t.weight for t in COVERAGE_TERMS], defaults=(0.0,) * n_opt)
    CoverageWeights.__doc__ = """Weights of the coverage terms, in ``COVERAGE_TERMS`` order: floats or per-query
    ``[Q, 1]`` arrays / tensors; the trailing ``optional`` ones may be left out (0: those terms off)."""
    bad = [t.name for t in TERMS if not set(t.fused) <= set(FUSED_BACKENDS if t.kind == "coverage" else ())]
    if bad:
        raise ValueError(f"terms {bad}: only coverage terms have fused pieces, in {FUSED_BACKENDS}")


_derive()


def fused_terms(backend: str) -> tuple[str, ...]:
    """The coverage terms whose pieces the fused greedy ``backend`` holds, in ``COVERAGE_TERMS`` order."""
    if backend not in FUSED_BACKENDS:
        raise ValueError(f"no fused greedy {backend!r} (one of {FUSED_BACKENDS})")
    return tuple(t.name for t in COVERAGE_TERMS if backend in t.fused)


def register_term(term: Term) -> None:
    """Append ``term`` to :data:`TERMS` (a term defined outside this file: a test's, an experiment's)
    and derive the views again; compiled code caches apart (``_jit.salt_cache``). The engine, the
    head and the fused greedies read the views when imported, so this refuses once one holds them."""
    global TERMS
    views = (TERMS, TERM_BY_NAME, COVERAGE_TERMS, WEIGHTS, QUERY_WEIGHTS, COL, LEARNED_WEIGHTS, CoverageWeights)
    held = sorted(n for n, m in list(sys.modules.items()) if n.startswith("trawmem_gpu") and m is not None
                  and n != __name__ and any(x is v for x in vars(m).values() for v in views))
    if held:
        raise RuntimeError(f"register the term {term.name!r} before importing {held}: they hold the term lists")
    TERMS = TERMS + (term,)
    _derive()
    salt_cache(repr([(t.name, t.weight, t.kind) for t in TERMS]))


def affinity_value(x: ModularInputs, cfg):
    """The modular affinity of each unit: alpha, or (``w_grp > 0``) alpha for units of no restatement
    group and 0 for grouped ones, whose affinity :class:`GroupAffinity` counts once per group."""
    if cfg.w_grp == 0:
        return x.alpha
    return x.alpha * (x.attrs[..., GROUP] < 0)


def recency(x: ModularInputs, half_life_days: float):
    """Recency bonus ``2^(-age / half_life)`` of each unit, ``age`` = days from the unit's date to the
    query's (0 for a unit dated after it); 0 when either date is missing. In [0, 1]."""
    age = ((x.now - x.attrs[..., 0]) / 86400.0).clip(min=0.0)
    bonus = 0.5 ** (age / half_life_days)
    if _is_torch(bonus):
        import torch
        return torch.where(bonus == bonus, bonus, 0.0)  # NaN (no date) -> 0
    return np.where(bonus == bonus, bonus, 0.0)


# ----------------------------------------------------------------------------------------------
# weights and the modular part
# ----------------------------------------------------------------------------------------------
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


def coverage_weights(w: Mapping[str, object]) -> tuple:
    """The coverage terms' weights from ``w`` (weight name -> float or ``[Q, 1]``), in
    :data:`COVERAGE_TERMS` order: the sequence every composing optimizer takes."""
    return tuple(w[t.weight] for t in COVERAGE_TERMS)


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


def combine_gain(gains, modular, weights):
    """A unit's marginal gain from its coverage terms' ``gains`` (in :data:`COVERAGE_TERMS` order)
    and the modular part, summed in :data:`TERMS` order (the modular part where the first modular
    term stands), left to right: every backend sums in this order (floats, arrays, tensors)."""
    out = None
    k = 0
    for t in TERMS:
        if t.kind == "coverage":
            v = weights[k] * gains[k]
            k += 1
        elif t is MODULAR_TERMS[0]:
            v = modular
        else:
            continue
        out = v if out is None else out + v
    return out


# ----------------------------------------------------------------------------------------------
# J of one query (NumPy): the terms composed, with the greedy's running state
# ----------------------------------------------------------------------------------------------
class Objective:
    """J of one query in NumPy float64, with the greedy's running state.

    :param pi: ``[U]`` priorities; ``K``: ``[U, U]``, ``K[u, v]`` = support of v by u
    :param rho: ``[U, R]`` role weights; ``delta``: ``[R]`` role demand
    :param modular: ``[U]`` the modular part m(u) (:func:`modular_gain`)
    :param thread: ``[U]`` local thread of each unit (< 0: no thread term for the unit)
    :param weights: the coverage terms' weights (:data:`CoverageWeights`; default all 1)
    :param thread_mass: ``[T]`` mass_j; default the sum of ``pi`` over each thread's units
    :param attrs: ``[U, A]`` the units' rows of :func:`unit_attributes` (read by terms that need them)
    :param alpha: ``[U]`` the units' affinity (read by :class:`GroupAffinity`)
    """

    def __init__(self, pi, K, rho, delta, modular, thread, weights=None, thread_mass=None, attrs=None, alpha=None):
        pi = np.asarray(pi, dtype=np.float64)
        delta = np.asarray(delta, dtype=np.float64)
        thread = np.asarray(thread, dtype=np.int64)
        U = len(pi)
        if thread_mass is None:
            T = int(thread.max()) + 1 if U else 0
            own = thread >= 0
            thread_mass = np.bincount(thread[own], weights=pi[own], minlength=T) if U else np.zeros(0)
        self.data = CoverageData(pi, np.asarray(K, dtype=np.float64),
                                 np.asarray(rho, dtype=np.float64).reshape(U, len(delta)), delta, thread,
                                 np.asarray(thread_mass, dtype=np.float64), None if attrs is None else np.asarray(attrs),
                                 None if alpha is None else np.asarray(alpha, dtype=np.float64))
        self.modular = np.asarray(modular, dtype=np.float64)
        n = len(COVERAGE_TERMS)
        weights = tuple(weights) if weights is not None else (1.0,) * n
        if not n - len(CoverageWeights._field_defaults) <= len(weights) <= n:
            raise ValueError(f"{n} coverage weights expected, got {len(weights)}")
        self.w = tuple(float(x) for x in CoverageWeights(*weights))
        self.reset()

    @property
    def n(self) -> int:
        return len(self.data.pi)

    @property
    def thread(self) -> np.ndarray:
        return self.data.thread

    def reset(self) -> None:
        """Empty S. A term whose weight is 0 is skipped (gain 0.0: it would add exactly +0.0), but for
        the information coverage, whose state the early stop reads."""
        self.state = [t.init(self.data) if (w != 0 or k == INFORMATION) else None
                      for k, (t, w) in enumerate(zip(COVERAGE_TERMS, self.w))]

    def term_gains(self, u: int) -> tuple[float, ...]:
        """The unweighted coverage gains of ``u`` (:data:`COVERAGE_TERMS` order)."""
        return tuple(0.0 if st is None else t.gain(self.data, st, u) for t, st in zip(COVERAGE_TERMS, self.state))

    def gain(self, u: int) -> float:
        """Marginal gain of adding ``u`` to the current set."""
        return combine_gain(self.term_gains(u), float(self.modular[u]), self.w)

    def add(self, u: int) -> None:
        for t, st in zip(COVERAGE_TERMS, self.state):
            if st is not None:
                t.add(self.data, st, u)

    def coverage(self) -> float:
        """Information coverage ``sum_v pi(v) c(v)`` of the current set (the early-stop test)."""
        return COVERAGE_TERMS[INFORMATION].total(self.data, self.state[INFORMATION])

    def value(self, S) -> float:
        """J(S) from scratch (for tests)."""
        S = list(S)
        if not S:
            return 0.0
        return combine_gain(tuple(t.value_of(self.data, S) if w != 0 else 0.0 for t, w in zip(COVERAGE_TERMS, self.w)),
                            float(self.modular[S].sum()), self.w)
