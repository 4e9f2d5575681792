"""The compiled ``learned`` front's fast paths against the plain ones they replace, bit for bit
(``steps/learned_front.py``, ``steps/rank_sort.py``):

* the bucket-and-insertion sorts give the references' orders (``candidates.order_desc`` /
  ``order_desc_bits``: a stable descending sort) on random values, exact ties, signed zeros,
  bunched values (the reference runs then), tiny sizes and the empty row;
* the logits, the seeds from the logits and alpha at any unit equal ``relevance.learned_row``'s
  alpha followed by ``mask.unit_seeds`` (random banks of odd sizes, tied cosines and BM25 scores,
  masked units, ranks given as a shortlist's, no BM25, no units; every ``p`` underflowing to 0
  raises in both).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from trawmem_gpu.select._jit import HAS_NUMBA
from trawmem_gpu.select.steps import candidates as step3, learned_front as lf, mask as step_mask, rank_sort
from trawmem_gpu.select.steps.relevance import LearnedQueries, LearnedTables, learned_row

pytestmark = pytest.mark.skipif(not HAS_NUMBA, reason="needs numba")


def _stable_desc(vals: np.ndarray) -> np.ndarray:
    return np.argsort(-(vals + 0.0), kind="stable")


def _cos_cases(rng):
    yield np.zeros(0)
    yield np.array([0.25])
    yield np.array([0.25, 0.5])
    yield np.full(7, 0.5)
    yield rng.normal(size=97)
    yield rng.normal(size=1001) * 0.1 + 0.3                         # bunched in the middle, like cosines
    yield np.round(rng.normal(size=200), 1)                         # many exact ties
    yield np.array([0.0, -0.0, 1.0, -0.0, 0.0, -1.0, 0.0])          # signed zeros tie
    yield np.concatenate([1e-9 * rng.random(120), [5.0], 1e-9 * rng.random(3)])  # one crowded bucket
    yield np.concatenate([np.full(80, 1e-3), 1e-3 + 1e-12 * rng.integers(0, 3, 60), [2.0]])
    yield np.array([1e308, -1e308, 0.0, 1e308, 3.0])                # span overflows to inf
    yield rng.random(64) * 1e-300


def test_order_desc_fast_is_order_desc():
    rng = np.random.default_rng(5)
    for vals in _cos_cases(rng):
        m = len(vals)
        want = np.empty(m, np.int64)
        step3.order_desc(vals, m, want, np.empty(m + 1, np.int64), np.empty(m + 2, np.int64))
        got = np.full(m + 1, -7, np.int64)
        rank_sort.order_desc_fast(np.concatenate([vals, [np.nan]]), m, got, np.empty(m + 1, np.int64),
                                  np.empty(rank_sort.BUCKETS * (m + 1) + 1, np.int64), np.empty(m + 1))
        np.testing.assert_array_equal(got[:m], want, err_msg=f"{vals[:8]}")
        np.testing.assert_array_equal(got[:m], _stable_desc(vals))
        assert got[m] == -7


def _bm_cases(rng):
    yield np.zeros(0, np.float32)
    yield np.array([1.0], np.float32)
    yield np.full(9, 2.5, np.float32)
    yield rng.random(50).astype(np.float32) + 0.01
    yield (rng.lognormal(0.0, 1.5, 777)).astype(np.float32)          # skewed, like BM25
    yield np.round(rng.random(301) * 4, 1).astype(np.float32) + 0.1  # ties
    yield np.concatenate([np.full(300, 0.7, np.float32), (0.7 + 1e-6 * rng.integers(0, 4, 200)).astype(np.float32),
                          np.array([31.0, 1e-30, 3e38], np.float32)])  # crowded: the reference runs


def test_order_desc_keys_is_order_desc_bits():
    rng = np.random.default_rng(6)
    for v in _bm_cases(rng):
        m = len(v)
        arr = np.zeros(2 * m + 1, np.float32)
        pos = np.arange(m, dtype=np.int64) * 2 + 1
        arr[pos] = v
        bits = arr.view(np.int32)
        want = np.empty(m, np.int64)
        step3.order_desc_bits(bits, pos, m, want, np.empty(max(m, 1), np.int64), np.empty(4 * 257, np.int64))
        got = np.full(m + 1, -7, np.int64)
        keys = bits[pos].astype(np.int64)
        rank_sort.order_desc_keys(keys, m, got, np.empty(m + 1, np.int64), np.empty(max(m + 2, 4 * 257), np.int64),
                                  np.empty(m + 1, np.int64), bits, pos)
        np.testing.assert_array_equal(got[:m], want)
        np.testing.assert_array_equal(got[:m], _stable_desc(v.astype(np.float64)))
        assert got[m] == -7


def _bank(rng, m, n_threads, ties: bool):
    """One query over a random bank of ``m`` units in ``n_threads`` threads (at offset ``u0``)."""
    u0 = 3
    cos = rng.uniform(-0.2, 0.9, m)
    bm = np.where(rng.random(m) < 0.7, rng.lognormal(0.0, 1.0, m), 0.0).astype(np.float32)
    if ties:
        cos = np.round(cos, 1)
        bm = np.round(bm, 0).astype(np.float32)
    units = u0 + m + 2
    ult = np.zeros(units, np.int64)
    ult[u0:u0 + m] = np.sort(rng.integers(0, max(n_threads, 1), m))
    rel = np.full((units, 3), -1, np.int64)
    rel[:, 0] = rng.integers(0, 3, units)
    for j in range(m):  # previous / next in a session: mostly the neighbour, sometimes none
        rel[u0 + j, 1] = j - 1 if j > 0 and rng.random() < 0.8 else -1
        rel[u0 + j, 2] = j + 1 if j + 1 < m and rng.random() < 0.8 else -1
    tab = LearnedTables(rel, (rng.random(units) < 0.3).astype(np.float64), np.log1p(rng.integers(0, 21, units)))
    return u0, cos, bm, ult, tab


def _queries(rng, m, scale=1.0, dated=True):
    w = rng.normal(size=13) * 5 * scale
    w[2] = 200.0 * scale
    dm = rng.random(m)
    return LearnedQueries(rng.random(5), np.array([0, 2], np.int64), np.array([0.0, 1.0]), dm,
                          np.array([-1, 0 if dated else -1], np.int64), w, 60.0)


def _reference(cos, bm, m, u0, tab, lq, q, live, given, ult, n):
    alpha = np.zeros(max(m, 1))
    N = max(m, 1)
    s = step3.RankScratch(np.empty(N, np.int64), np.empty(N, np.int64), np.empty(N, np.int64),
                          np.empty(max(N + 1, 4 * 257), np.int64))
    learned_row(cos.copy(), m, bm, bm.view(np.int32), u0, tab, lq, q, alpha, s, np.empty(N), np.empty(N), given, live)
    r0, tlive = np.empty(max(n, 1)), np.empty(max(n, 1), np.bool_)
    step_mask.unit_seeds(alpha, m, ult, u0, live, n, r0, tlive)
    return alpha[:m], r0[:n], tlive[:n]


def _fast(cos, bm, m, u0, tab, lq, q, live, given, ult, n):
    s = lf.learned_scratch(m, n, lq.rrf_k)
    s.logit[:] = np.nan
    lf.learned_logits(cos.copy(), m, bm, u0, tab, lq, q, s, given, live)
    sc = s.logit
    r0, tlive = np.empty(max(n, 1)), np.empty(max(n, 1), np.bool_)
    pmax = lf.learned_seeds(sc, m, ult, u0, live, n, r0, tlive, s.smax)
    alpha = np.array([lf.learned_alpha(x, pmax) for x in sc[:m]])
    return alpha.reshape(m), r0[:n], tlive[:n]


def _given(rng, m):
    return step3.GivenRanks(rng.permutation(m * 3)[:m].astype(np.float64) + 1.0,
                            rng.permutation(m * 2)[:m].astype(np.float64) + 1.0)


@pytest.mark.parametrize("m,n_threads", [(0, 1), (1, 1), (2, 2), (17, 3), (97, 11), (600, 41), (1001, 7)])
@pytest.mark.parametrize("case", ["plain", "ties", "masked", "given", "no-bm25", "underflow"])
def test_learned_front_is_learned_row_then_unit_seeds(m, n_threads, case):
    rng = np.random.default_rng(m * 31 + n_threads + len(case))
    u0, cos, bm, ult, tab = _bank(rng, m, n_threads, case == "ties")
    if case == "no-bm25":
        bm[:] = 0.0
    lq = _queries(rng, m, scale=1e3 if case == "underflow" else 1.0)
    if case == "underflow":  # every logit far below -745: every p is 0, alpha 0 / 0
        lq = lq._replace(w=np.concatenate([np.zeros(12), [-1e4]]))
    live = np.ones(max(m, 1), np.bool_)
    if case == "masked":  # failing units hidden as mask.hide_failing does
        live[:m] = rng.random(m) < 0.6
        cos[~live[:m]] = step_mask.HIDDEN_COSINE
        bm[~live[:m]] = 0.0
    given = _given(rng, m) if case == "given" else step3.NO_RANKS
    for q in (0, 1):
        if case == "underflow" and m:  # P = 0: both raise (alpha would be 0 / 0)
            for fn in (_reference, _fast):
                with pytest.raises(ZeroDivisionError):
                    fn(cos, bm, m, u0, tab, lq, q, live, given, ult, n_threads)
            continue
        want = _reference(cos, bm, m, u0, tab, lq, q, live, given, ult, n_threads)
        got = _fast(cos, bm, m, u0, tab, lq, q, live, given, ult, n_threads)
        for name, a, b in zip(("alpha", "r0", "tlive"), got, want):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} {case} m={m} q={q}")
            if a.dtype == np.float64:  # bit for bit (a signed zero too)
                assert a.view(np.int64).tolist() == b.view(np.int64).tolist()


def test_seeds_read_near_the_top_only():
    """A thread whose largest logit and a close second differ by less than SLACK: both are
    evaluated and the larger p is kept; a logit far below is never the seed."""
    sc = np.array([2.0, 2.0 + 0.5 * lf.SLACK, -3.0, 5.0, 5.0])
    ult = np.array([0, 0, 0, 1, 1], np.int64)
    r0, tlive, smax = np.empty(2), np.empty(2, np.bool_), np.empty(2)
    pmax = lf.learned_seeds(sc, 5, ult, 0, np.ones(5, np.bool_), 2, r0, tlive, smax)
    p = [1.0 / (1.0 + math.exp(-x)) for x in sc]  # libm's exp, as the compiled code calls it
    assert pmax == p[3] and r0[1] == 1.0 and r0[0] == p[1] / p[3] and tlive.all()
