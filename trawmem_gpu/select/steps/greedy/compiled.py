"""The compiled optimizer of J (numba, one query at a time): lazy greedy with the coverage terms
whose ``numba`` pieces are here fused inline (:data:`FUSED_TERMS`, from ``terms.TERMS``), K rows
gathered from the bank's support table on first use. Each such term's pieces, ``<term>_gain`` and
``<term>_add``, restate its gain and update; the dispatcher (``engine/plan.py``) uses this greedy
only while every coverage term with a weight is one of them, ``tests/select/agreement/test_objective.py`` checks it
against the terms one at a time and ``tests/select/test_term_registry.py`` that the pieces here are those
the terms declare."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._jit import njit
from ...terms import COL, TERM_BY_NAME, fused_terms
from .rule import StopRule, coverage_reached_compiled, greedy_key_compiled, marginal_cost_compiled

FUSED_TERMS = fused_terms("numba")
"""The coverage terms :func:`lazy_greedy_one` computes inline, in ``COVERAGE_TERMS`` order."""
W_COV, W_ROLE, W_THR = (COL[TERM_BY_NAME[n].weight] for n in FUSED_TERMS)
"""Their weights' columns of a per-query weight matrix (``terms.QUERY_WEIGHTS``)."""
FusedWeights = NamedTuple("FusedWeights", [(TERM_BY_NAME[n].weight, float) for n in FUSED_TERMS])
"""The weights of :data:`FUSED_TERMS` (``w_cov``, ``w_role``, ``w_thr``), as the compiled loops read them."""


@njit(cache=True, inline="always")
def combine_gain_compiled(cov, role, modular, thr, w_cov, w_role, w_thr):  # pragma: no cover - compiled
    """``objective.combine_gain`` for :data:`FUSED_TERMS`, in its order."""
    return w_cov * cov + w_role * role + modular + w_thr * thr


@njit(cache=True, fastmath={"reassoc", "nsz", "contract"})
def information_coverage_gain(krow, pi, c):  # pragma: no cover - compiled
    """Information coverage gain ``sum_v pi[v] max(K(u, v) - c[v], 0)`` of one unit (``krow``:
    its K row). Reassociation lets the sum vectorize; a query's gains all come from this one
    function, so they share one summation order and a stale gain stays an upper bound."""
    cov = 0.0
    for v in range(krow.shape[0]):
        cov += pi[v] * max(krow[v] - c[v], 0.0)
    return cov


@njit(cache=True, inline="always")
def information_coverage_add(krow, c):  # pragma: no cover - compiled
    """``c = max(c, K(u, .))`` when ``u`` (K row ``krow``) enters S."""
    for v in range(krow.shape[0]):
        if krow[v] > c[v]:
            c[v] = krow[v]


@njit(cache=True, inline="always")
def role_coverage_gain(rho, u, m, delta):  # pragma: no cover - compiled
    """Role coverage gain ``sum_r delta_r max(rho[u, r] - m[r], 0)`` of unit ``u``."""
    g = 0.0
    for r in range(m.shape[0]):
        y = rho[u, r] - m[r]
        if y > 0.0:
            g += delta[r] * y
    return g


@njit(cache=True, inline="always")
def role_coverage_add(rho, u, m):  # pragma: no cover - compiled
    """``m = max(m, rho[u])`` when ``u`` enters S."""
    for r in range(m.shape[0]):
        if rho[u, r] > m[r]:
            m[r] = rho[u, r]


@njit(cache=True, inline="always")
def thread_coverage_gain(hit, lt, um, u):  # pragma: no cover - compiled
    """Thread coverage gain of unit ``u``: its thread's mass ``um[u]`` unless the thread is hit."""
    return 0.0 if hit[lt[u]] else um[u]


@njit(cache=True, inline="always")
def thread_coverage_add(hit, lt, u):  # pragma: no cover - compiled
    """Mark the thread of ``u`` hit when ``u`` enters S."""
    hit[lt[u]] = True


class KSource(NamedTuple):
    """Where the compiled greedy reads ``K(u, v)``: ``ktab[kbase + cq[u] * kn + cq[v]]`` (the bank's
    support table; for a plain ``[n, n]`` matrix: ``kbase = 0``, ``kn = n``, ``cq = arange(n)``), or
    the identity. ``local[u]`` (when not empty): u's row is 0 outside its thread, whose candidates
    are the slots ``t0[lt[u]] : t1[lt[u]]``; the row is then those slots' entries and zeros (the
    same row: the bank's table holds +0.0 there, ``support.support_kernel`` without cross-thread
    support for a unit without a support link)."""

    ktab: np.ndarray
    kbase: int
    kn: int
    cq: np.ndarray
    identity: bool
    local: np.ndarray = np.zeros(0, np.bool_)
    t0: np.ndarray = np.zeros(0, np.int64)
    t1: np.ndarray = np.zeros(0, np.int64)


class CompiledQuery(NamedTuple):
    """One query's J for :func:`lazy_greedy_one` (arrays over its ``n`` candidates)."""

    pq: np.ndarray
    rho: np.ndarray
    delta: np.ndarray
    modular: np.ndarray
    lt: np.ndarray
    um: np.ndarray
    """[n] mass of each unit's thread."""
    bound: np.ndarray
    """[n] upper bounds of the step-0 information-coverage gains (``terms.TERMS``)."""
    K: KSource
    w: FusedWeights
    rule: StopRule
    """``budget`` = this query's pick limit (``pick_limit``); its ``tokens`` are not read here."""
    uc: np.ndarray = np.ones(0)
    """[n] the candidates' own token costs (:class:`TokenBudget`; unread without a token budget)."""
    hc: np.ndarray = np.zeros(0)
    """[K] heading token cost of each heading key (:attr:`hkey`)."""
    room: float = np.inf
    """The token capacity T; ``inf`` = no token budget."""
    ratio: bool = False
    """Rank by gain per marginal token (:func:`greedy_key`)."""
    hkey: np.ndarray = np.zeros(0, np.int64)
    """[n] each candidate's heading key (``TokenBudget.unit_key``: threads sharing one heading share
    a key, paid once); empty = its local thread."""


class GreedyScratch(NamedTuple):
    """Per-worker scratch of :func:`lazy_greedy_one` for up to ``U`` candidates, ``R`` roles, ``T`` threads."""

    Kc: np.ndarray
    c: np.ndarray
    m: np.ndarray
    hk: np.ndarray
    hi: np.ndarray
    fresh: np.ndarray
    loaded: np.ndarray
    hit: np.ndarray
    last: np.ndarray
    """[U] each unit's latest gain (or step-0 bound): re-keys units whose heading got paid."""
    paid: np.ndarray
    """[T] headings paid (by key), under a token budget."""


def greedy_scratch(U: int, R: int, T: int) -> GreedyScratch:
    U, R, T = max(U, 1), max(R, 1), max(T, 1)
    return GreedyScratch(np.empty(U * U), np.empty(U), np.empty(R), np.empty(U), np.empty(U, np.int64),
                         np.empty(U, np.int64), np.zeros(U, np.bool_), np.zeros(T, np.bool_), np.empty(U),
                         np.zeros(T, np.bool_))


@njit(cache=True)
def sift_down(hk, hi, size, i):  # pragma: no cover - compiled
    """Restore the heap order (key descending, then index ascending) below node ``i``."""
    while True:
        a = 2 * i + 1
        if a >= size:
            return
        b = a + 1
        if b < size and (hk[b] > hk[a] or (hk[b] == hk[a] and hi[b] < hi[a])):
            a = b
        if hk[a] > hk[i] or (hk[a] == hk[i] and hi[a] < hi[i]):
            hk[i], hk[a] = hk[a], hk[i]
            hi[i], hi[a] = hi[a], hi[i]
            i = a
        else:
            return


@njit(cache=True, inline="always")
def lazy_greedy_one(g, s, sel):  # pragma: no cover - compiled
    """Lazy greedy of one query (``g``: :class:`CompiledQuery`, ``s``: :class:`GreedyScratch`);
    writes the picks (candidate slots) to ``sel`` and returns their number (``s.last`` then holds
    each pick's gain).

    The heap starts from upper bounds of the step-0 gains that need no K row (``g.bound`` for the
    information coverage, the exact step-0 role and thread gains, m(u)), padded by a relative
    1e-6 for rounding (every term is >= 0). Keys order by (bound descending, index ascending); the
    top is taken once its value is fresh for the step, else it is evaluated (its K row gathered on
    first use) and sifted down: the plain greedy's pick, ties to the lowest index. Gains are
    computed at one site (coverage by :func:`information_coverage_gain`, one summation order per
    query), so a computed gain never grows as the set grows and stale values are true bounds.

    With a token budget (``g.room`` finite) the keys are :func:`greedy_key` of those gains and
    the marginal costs (:func:`marginal_cost`), a popped unit that does not fit is dropped for good
    (see :func:`lazy_greedy`), and by the gain-per-token key the units of a newly hit thread are
    re-keyed with their last gain over their lower cost (the heap is rebuilt: at most once per
    thread).
    """
    n = g.pq.shape[0]
    Kc, c, m, hk, hi, fresh, loaded, hit, last = s.Kc, s.c, s.m, s.hk, s.hi, s.fresh, s.loaded, s.hit, s.last
    paid = s.paid
    R = g.delta.shape[0]
    tokens = g.room < np.inf
    room = g.room
    key = g.hkey if g.hkey.shape[0] > 0 else g.lt
    for u in range(n):
        hit[g.lt[u]] = False
        if tokens:
            paid[key[u]] = False
    for r in range(R):
        m[r] = 0.0
    for u in range(n):  # hit and m are empty: the step-0 role and thread gains are exact
        b0 = combine_gain_compiled(g.bound[u], role_coverage_gain(g.rho, u, m, g.delta), g.modular[u],
                                   thread_coverage_gain(hit, g.lt, g.um, u), g.w.w_cov, g.w.w_role,
                                   g.w.w_thr) * (1.0 + 1e-6)
        last[u] = b0
        hk[u] = greedy_key_compiled(b0, marginal_cost_compiled(g.uc[u], g.hc[key[u]], False), g.ratio) \
            if tokens else b0
        hi[u] = u
        c[u] = 0.0
        fresh[u] = -1
        loaded[u] = False
    for i in range(n // 2 - 1, -1, -1):
        sift_down(hk, hi, n, i)
    size = n
    n_sel = 0
    for step in range(min(g.rule.budget, n)):
        best = -1
        cost = 0.0
        while size > 0:
            u = hi[0]
            if tokens:
                cost = marginal_cost_compiled(g.uc[u], g.hc[key[u]], paid[key[u]])
                if cost > room:  # never fits again: out of the heap
                    size -= 1
                    hk[0] = hk[size]
                    hi[0] = hi[size]
                    sift_down(hk, hi, size, 0)
                    continue
            if fresh[u] == step:  # an exact gain of this step on top: the plain greedy's pick
                best = u
                size -= 1
                hk[0] = hk[size]
                hi[0] = hi[size]
                sift_down(hk, hi, size, 0)
                break
            if not loaded[u]:  # K row of u over the candidates, gathered on first use
                dst = Kc[u * n:(u + 1) * n]
                k = g.K
                if k.identity:
                    for v in range(n):
                        dst[v] = 1.0 if u == v else 0.0
                elif k.local.shape[0] > 0 and k.local[u]:  # zeros but for u's thread
                    o = k.kbase + k.cq[u] * k.kn
                    dst[:] = 0.0
                    for v in range(k.t0[g.lt[u]], k.t1[g.lt[u]]):
                        dst[v] = k.ktab[o + k.cq[v]]
                else:
                    o = k.kbase + k.cq[u] * k.kn
                    for v in range(n):
                        dst[v] = k.ktab[o + k.cq[v]]
                loaded[u] = True
            gu = combine_gain_compiled(information_coverage_gain(Kc[u * n:(u + 1) * n], g.pq, c),
                                       role_coverage_gain(g.rho, u, m, g.delta), g.modular[u],
                                       thread_coverage_gain(hit, g.lt, g.um, u), g.w.w_cov, g.w.w_role, g.w.w_thr)
            fresh[u] = step
            last[u] = gu
            hk[0] = greedy_key_compiled(gu, cost, g.ratio) if tokens else gu
            sift_down(hk, hi, size, 0)
        if best < 0:
            break
        sel[step] = best
        n_sel = step + 1
        information_coverage_add(Kc[best * n:(best + 1) * n], c)
        covered = 0.0
        if g.rule.stop_coverage <= 1.0 + 1e-9:  # above 1 the test never fires (sum pq = 1, c <= 1)
            for v in range(n):
                covered += g.pq[v] * c[v]
        role_coverage_add(g.rho, best, m)
        if tokens:
            room -= cost
            kb = key[best]
            if g.ratio and not paid[kb]:  # its heading is now paid: the keys of its units rise
                for i in range(size):
                    v = hi[i]
                    if key[v] == kb:
                        hk[i] = greedy_key_compiled(last[v], marginal_cost_compiled(g.uc[v], g.hc[kb], True), True)
                for i in range(size // 2 - 1, -1, -1):
                    sift_down(hk, hi, size, i)
            paid[kb] = True
        thread_coverage_add(hit, g.lt, best)
        if coverage_reached_compiled(g.rule, covered):
            break
    return n_sel


@njit(cache=True, inline="always")
def best_of_two_compiled(g_plain, g_ratio, s, sel, other, mark):  # pragma: no cover - compiled
    """:func:`best_of_two` of one query with :func:`lazy_greedy_one`: ``g_plain`` / ``g_ratio``
    differ only in ``ratio``; the chosen picks end in ``sel`` (``other``: scratch of the same
    width, ``mark``: ``[n]`` False, left False); returns their number."""
    na = lazy_greedy_one(g_plain, s, other)
    ja = 0.0  # j_value: the pick gains in pick order
    for i in range(na):
        ja += s.last[other[i]]
    nb = lazy_greedy_one(g_ratio, s, sel)
    jb = 0.0
    for i in range(nb):
        jb += s.last[sel[i]]
    same = na == nb
    if same:
        for i in range(nb):
            mark[sel[i]] = True
        for i in range(na):
            if not mark[other[i]]:
                same = False
        for i in range(nb):
            mark[sel[i]] = False
    if not same and ja > jb:
        for i in range(na):
            sel[i] = other[i]
        for i in range(na, nb):
            sel[i] = -1
        return na
    return nb
