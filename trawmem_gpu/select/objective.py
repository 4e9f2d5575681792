"""Stage 2, step 7 (design note): the objective J, composed from its terms.

For a set S of candidate units of one query::

    J(S) = sum_{u in S} m(u)                               modular part
         + w_cov  * sum_v pi(v) max_{u in S} K(u, v)        information coverage
         + w_role * sum_r delta_r max_{u in S} rho_r(u)     role coverage
         + w_thr  * sum_j [S hits L_j] * mass_j             thread coverage (mass_j = sum of pi over L_j)
         + w_grp  * sum_g max_{u in S, u in g} alpha(u)     group affinity (g: a fact and its source turns)
    m(u) = sum over the modular terms k of w_k * value_k(u)   (affinity: alpha(u); w_grp > 0: 0 in a group)

Each term is one module of the ``terms`` package (its formula, its marginal gain and the upper bound
the lazy greedies start from; a coverage term its NumPy and torch state, gain and update), registered
there; ``terms.TERMS`` is the registry's one order, which every weight vector uses. Every term is
monotone submodular for non-negative weights, so lazy greedy is exact. This module composes them:

* the per-query weights (:func:`weight_matrix`, :func:`weight_columns`, :func:`coverage_weights`,
  :class:`CoverageWeights`);
* the modular part, one per-unit vector computed by :func:`modular_gain` and nothing else: every
  backend (the NumPy reference, torch, numba, Triton, the head's training surrogate) takes that
  vector; its per-unit inputs beyond alpha are columns of ``terms.unit_attributes`` and the query's
  date (:func:`date_seconds`);
* :func:`combine_gain`, which sums a unit's gains in ``TERMS`` order (every backend sums in it), and
  :class:`Objective`, J of one query in NumPy, the specification the optimizers are checked against.

The optimizers compose the coverage terms without naming any; the fused greedies (numba,
``steps/greedy/compiled.py``; Triton, ``kernels/greedy.py``) restate the pieces of the terms that
declare them (``terms.fused_terms``). ``docs/method.md`` says how to add a term;
``tests/select/agreement/test_objective.py`` runs every optimizer with one term on at a time.

The information coverage's K is :func:`support_kernel`: the clip formula (:func:`support_from_cosine`) once.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .support import (_is_torch, clip01, restatement_groups, support_floor, support_from_cosine, support_links,  # noqa: F401
                      support_from_cosine_compiled, support_kernel)
from .terms import COVERAGE_TERMS, INFORMATION, MODULAR_TERMS, QUERY_WEIGHTS, TERMS, CoverageData
from .unit_inputs import GROUP, ModularInputs, date_seconds  # noqa: F401


class CoverageWeights(tuple):
    """Weights of the coverage terms, in ``COVERAGE_TERMS`` order: floats or per-query ``[Q, 1]``
    arrays / tensors, given in that order or by weight name (``CoverageWeights(w_cov=1.0, ...)``);
    the trailing ``optional`` terms' weights may be left out (0.0: those terms off). A tuple: the
    optimizers iterate it; ``w.w_cov`` reads one weight by its name."""

    __slots__ = ()

    def __new__(cls, *weights, **by_name):
        names = [t.weight for t in COVERAGE_TERMS]
        if len(weights) > len(names):
            raise ValueError(f"{len(names)} coverage weights expected, got {len(weights)}")
        given = dict(zip(names, weights))
        for k, v in by_name.items():
            if k in given:
                raise ValueError(f"coverage weight {k!r} given twice")
            if k not in names:
                raise ValueError(f"coverage weight {k!r} unknown (one of {names})")
            given[k] = v
        missing = [t.weight for t in COVERAGE_TERMS if t.weight not in given and not t.optional]
        if missing:
            raise ValueError(f"{len(names)} coverage weights expected, {missing} missing")
        return super().__new__(cls, tuple(given.get(n, 0.0) for n in names))

    def __getattr__(self, name):
        for t, w in zip(COVERAGE_TERMS, self):
            if t.weight == name:
                return w
        raise AttributeError(f"no coverage weight {name!r}")

    def __repr__(self) -> str:
        return "CoverageWeights(" + ", ".join(f"{t.weight}={w!r}" for t, w in zip(COVERAGE_TERMS, self)) + ")"


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
    ``COVERAGE_TERMS`` order: the sequence every composing optimizer takes."""
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
    :param weights: the coverage terms' weights (:class:`CoverageWeights`; default all 1)
    :param thread_mass: ``[T]`` mass_j; default the sum of ``pi`` over each thread's units
    :param attrs: ``[U, A]`` the units' rows of ``terms.unit_attributes`` (read by terms that need them)
    :param alpha: ``[U]`` the units' affinity (read by the group affinity)
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
        weights = tuple(weights) if weights is not None else (1.0,) * len(COVERAGE_TERMS)
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
