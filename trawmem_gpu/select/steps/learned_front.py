"""The ``learned`` affinity as the compiled front reads it (``engine.compiled_loops.front_loop``):
the same bits as :func:`relevance.learned_row` followed by ``mask.unit_seeds``, with only the work
those readers need.

The front reads alpha in two places: the best-unit seed of each thread (the largest alpha of a
passing unit there) and the candidates' alpha. :func:`relevance.learned_row` computes
``p = sigmoid(logit)`` for every unit and ``alpha = p / max p``; here

* :func:`learned_logits` computes every unit's logit (the reference's features, in its order and
  with its operations) and no exponential. The rank features ``1 / (k + r)`` and ``1 / (5 + r)``
  are read from tables indexed by rank as the rank sort emits them (``tables[i]`` is
  ``1 / (k + (i + 1))``, the reference's division for rank ``i + 1``), and each is computed once
  (the reference divides for ``rrf_cos + rrf_bm25`` and again for the features);
* :func:`learned_seeds` takes each thread's largest logit and evaluates ``p`` only at the units
  within :data:`SLACK` of it. ``p`` rises with the logit: exactly ``1 / (1 + exp(-s))``, and the
  computed one too wherever two logits differ by more than the relative error of ``exp`` (a few
  1e-16; ``SLACK`` is 1e-6), since ``1 + e`` and ``1 / x`` round monotonically. So the largest
  computed ``p`` of a thread is among those units, and ``max_j (p_j / P) = (max_j p_j) / P`` (a
  correctly rounded division by one positive ``P`` is monotone): the seed's bits;
* :func:`learned_alpha` evaluates ``p / P`` at a candidate (the reference's two operations).

So the exponentials run at the candidates and at about one unit per thread instead of at every
unit (``tests/select/test_learned_front.py`` compares the bits with the reference's).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._jit import njit
from .rank_sort import BUCKETS, order_desc_fast, order_desc_keys
from .relevance import TOP_K

SLACK = 1e-6
"""A unit whose logit is more than this below its thread's largest cannot hold the thread's
largest computed ``p`` (see the module docstring)."""


class LearnedScratch(NamedTuple):
    """Scratch of :func:`learned_logits` / :func:`learned_seeds` for banks of up to ``N`` units
    and ``J`` threads (:func:`learned_scratch`)."""

    tk: np.ndarray
    """[N] ``1 / (k + r)`` for ranks ``r = 1 .. N``."""
    t5: np.ndarray
    """[N] ``1 / (TOP_K + r)``."""
    ak: np.ndarray
    """[N] each unit's ``1 / (k + rank by cosine)``."""
    a5: np.ndarray
    bk: np.ndarray
    """[N] each unit's ``1 / (k + rank by BM25)`` where its BM25 is positive, else 0."""
    b5: np.ndarray
    ctx: np.ndarray
    """[N] ``rrf_cos + rrf_bm25`` of each unit (its neighbours' context feature)."""
    order: np.ndarray
    pos: np.ndarray
    bkt: np.ndarray
    cnt: np.ndarray
    keys: np.ndarray
    sk: np.ndarray
    smax: np.ndarray
    """[J] each thread's largest logit."""
    logit: np.ndarray
    """[N] each unit's logit (:func:`learned_logits`)."""


@njit(cache=True, nogil=True)
def learned_scratch(N, J, k):  # pragma: no cover - compiled
    """A :class:`LearnedScratch` (``k``: ``rrf_k``)."""
    N1 = max(N, 1)
    tk = np.empty(N1)
    t5 = np.empty(N1)
    for i in range(N1):
        r = np.float64(i + 1)
        tk[i] = 1.0 / (k + r)
        t5[i] = 1.0 / (TOP_K + r)
    return LearnedScratch(tk, t5, np.empty(N1), np.empty(N1), np.empty(N1), np.empty(N1), np.empty(N1),
                          np.empty(N1, np.int64), np.empty(N1, np.int64), np.empty(N1, np.int64),
                          np.empty(max(BUCKETS * N1 + 1, 4 * 257), np.int64), np.empty(N1, np.int64),
                          np.empty(N1, np.int64), np.empty(max(J, 1)), np.empty(N1))


@njit(cache=True, nogil=True, inline="always")
def rank_features(vals, m, bmbits, bm, k, s, given):  # pragma: no cover - compiled
    """``s.ak / s.a5 / s.bk / s.b5`` of the ``m`` units: ``candidates.ranks_of``'s ranks (by
    cosine; by BM25 among the units of positive BM25, else the feature is 0) turned into the
    features ``1 / (k + r)`` and ``1 / (TOP_K + r)``; from ``given`` ranks by division. Also
    ``s.ctx[j] = ak[j] + bk[j]`` (the context feature's ``rrf_cos + rrf_bm25``; where ``bk`` is
    0.0 that sum is ``ak[j]``, positive, so it is stored as is) in the passes that write them, and
    returns the largest positive BM25 as float64 (0.0 for none)."""
    mx = 0.0
    if given.cos.shape[0] > 0:
        for j in range(m):
            rc = given.cos[j]
            s.ak[j] = 1.0 / (k + rc)
            s.a5[j] = 1.0 / (TOP_K + rc)
            s.bk[j] = 0.0
            s.b5[j] = 0.0
            if bm[j] > 0:
                rb = given.bm25[j]
                s.bk[j] = 1.0 / (k + rb)
                s.b5[j] = 1.0 / (TOP_K + rb)
                mx = max(mx, np.float64(bm[j]))
            s.ctx[j] = s.ak[j] + s.bk[j]
        return mx
    order = s.order
    order_desc_fast(vals, m, order, s.bkt, s.cnt, s.ctx)  # ctx: scratch until the ranks are read
    for i in range(m):
        j = order[i]
        s.ak[j] = s.tk[i]
        s.a5[j] = s.t5[i]
    npos = 0
    for j in range(m):  # ctx is free again (the cosine sort's scratch until here)
        s.bk[j] = 0.0
        s.b5[j] = 0.0
        s.ctx[j] = s.ak[j]
        if bm[j] > 0:
            s.pos[npos] = j
            s.keys[npos] = bmbits[j]
            npos += 1
    order_desc_keys(s.keys, npos, order, s.bkt, s.cnt, s.sk, bmbits, s.pos)
    if npos > 0:  # the largest BM25 is the first in the order
        mx = np.float64(bm[s.pos[order[0]]])
    for i in range(npos):
        j = s.pos[order[i]]
        s.bk[j] = s.tk[i]
        s.b5[j] = s.t5[i]
        s.ctx[j] = s.ak[j] + s.tk[i]
    return mx


@njit(cache=True, nogil=True)
def learned_logits(vals, m, bm, u0, tab, lq, q, s, given, live):  # pragma: no cover - compiled
    """``s.logit[j]``: the logit ``w . f_q(j) + b`` of each of one query's ``m`` units, the
    arguments as :func:`relevance.learned_row` takes them (``s``: :class:`LearnedScratch`; ``bm``
    contiguous float32): its features, summed in its order with its operations."""
    bmbits = bm.view(np.int32)  # positive float32 scores order like their bits
    sc = s.logit
    mx = rank_features(vals, m, bmbits, bm, lq.rrf_k, s, given)  # and ctx, the largest BM25
    w = lq.w
    no = lq.named_off[q]
    do = lq.dm_off[q]
    zt = lq.z_temp[q]
    ak, a5, bk, b5, ctx = s.ak, s.a5, s.bk, s.b5, s.ctx
    for j in range(m):
        g = u0 + j
        pv = tab.rel_idx[g, 1]
        nx = tab.rel_idx[g, 2]
        pv = pv if pv >= 0 and live[pv] else -1
        nx = nx if nx >= 0 and live[nx] else -1
        ctx_cos = max(vals[pv] if pv >= 0 else 0.0, vals[nx] if nx >= 0 else 0.0)
        ctx_rrf = max(ctx[pv] if pv >= 0 else 0.0, ctx[nx] if nx >= 0 else 0.0)
        v = vals[j] * w[0]
        v = v + (np.float64(bm[j]) / mx if mx > 0 else 0.0) * w[1]
        v = v + ak[j] * w[2]
        v = v + bk[j] * w[3]
        v = v + a5[j] * w[4]
        v = v + b5[j] * w[5]
        v = v + lq.named[no + tab.rel_idx[g, 0]] * w[6]
        v = v + (zt * tab.temporal[g]) * w[7]
        v = v + ctx_cos * w[8]
        v = v + ctx_rrf * w[9]
        v = v + (lq.dm[do + j] if do >= 0 else 0.0) * w[10]
        v = v + tab.words[g] * w[11]
        sc[j] = v + w[12]


@njit(cache=True, nogil=True, inline="always")
def sigmoid(x):  # pragma: no cover - compiled
    """``p`` of a logit: :func:`relevance.learned_row`'s operations."""
    return 1.0 / (1.0 + math.exp(-x))


@njit(cache=True, nogil=True, inline="always")
def learned_alpha(x, pmax):  # pragma: no cover - compiled
    """alpha of a unit of logit ``x`` (``pmax``: :func:`learned_seeds`)."""
    return sigmoid(x) / pmax


@njit(cache=True, nogil=True)
def learned_seeds(sc, m, ult, u0, live, n, r0, tlive, smax):  # pragma: no cover - compiled
    """``mask.unit_seeds`` of the alpha the logits ``sc`` give (``r0[t]``: the largest alpha of
    a passing unit of thread ``t``, ``-inf`` without one; ``tlive[t]``: the thread holds a passing
    unit), ``p`` evaluated near each thread's largest logit only (the module docstring). Returns
    ``P``, the largest ``p`` of a passing unit (0 for none): a unit's alpha is
    ``learned_alpha(sc[j], P)``."""
    for t in range(n):
        smax[t] = -np.inf
        r0[t] = -np.inf
        tlive[t] = False
    for j in range(m):
        if live[j]:
            t = ult[u0 + j]
            tlive[t] = True
            if sc[j] > smax[t]:
                smax[t] = sc[j]
    for j in range(m):  # r0[t]: the largest p of the thread, first
        if live[j]:
            t = ult[u0 + j]
            if sc[j] >= smax[t] - SLACK:
                p = sigmoid(sc[j])
                if p > r0[t]:
                    r0[t] = p
    pmax = 0.0
    for t in range(n):
        if r0[t] > pmax:
            pmax = r0[t]
    for t in range(n):  # then alpha's: p / P (P = 0, every p underflowed: ZeroDivisionError, as there)
        if r0[t] > -np.inf:
            r0[t] = r0[t] / pmax
    return pmax
