"""Token budgets (``QueryParams.token_budget``): the cost-aware knapsack greedy (lazy == plain, the
result fits, the guarantee) and every optimizer against the NumPy reference (NumPy plain / lazy,
torch plain / lazy, numba; Triton routed to torch).

Random problems and tiny hand-made banks for most of it; the LoCoMo dev banks for the check that
every method's rendered workspace holds at most T tokens on real turns.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from select_objective import _objective as _select_objective
from trawmem_gpu.select._jit import HAS_NUMBA
from trawmem_gpu.select.objective import CoverageWeights, Objective
from trawmem_gpu.select.steps import greedy as G



# ----------------------------------------------------------------------------------------------
# the knapsack greedy: lazy == plain, the result fits, the guarantee
# ----------------------------------------------------------------------------------------------
def _objective(rng, U, ties=False):
    """test_select's random objective (threads 0..3), with random token costs: own costs 1-29,
    headings up to 39 (large, so keys rise when a thread is hit)."""
    obj = _select_objective(rng, U, ties)
    uc = rng.integers(1, 30, size=U).astype(float)
    hc = rng.integers(0, 40, size=int(obj.thread.max()) + 1).astype(float)
    if ties:
        uc = np.round(uc / 10) * 10 + 10
    return obj, uc, hc


def _cost(S, uc, hc, th):
    return float(uc[list(S)].sum() + hc[sorted({int(th[u]) for u in S})].sum()) if len(S) else 0.0


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("ratio", [False, True, None])
def test_lazy_equals_plain_under_a_token_budget(ratio, ties):
    rng = np.random.default_rng(11 + ties)
    for trial in range(40):
        U = int(rng.integers(1, 30))
        obj, uc, hc = _objective(rng, U, ties)
        cap = float(rng.integers(5, 200))
        rule = G.StopRule(U if trial % 3 else max(1, U // 3), 2.0, None, G.TokenBudget(cap, uc, hc, ratio))
        plain = G.cost_aware_greedy(obj, rule, lazy=False)
        lazy = G.cost_aware_greedy(obj, rule, lazy=True)
        assert lazy[0] == plain[0], (trial, lazy[0], plain[0])
        np.testing.assert_allclose(lazy[1], plain[1], rtol=0, atol=0)
        assert _cost(plain[0], uc, hc, obj.thread) <= cap
        assert len(plain[0]) <= rule.budget
        # gains are the marginal values, and J is their sum
        assert math.isclose(G.j_value(plain[1]), obj.value(plain[0]), rel_tol=1e-12, abs_tol=1e-12)
        if len(plain[0]) < rule.budget:  # nothing left out still fits (a run only stops when full)
            if True:
                left = cap - _cost(plain[0], uc, hc, obj.thread)
                hit = {int(obj.thread[u]) for u in plain[0]}
                assert all(uc[u] + (0 if obj.thread[u] in hit else hc[obj.thread[u]]) > left
                           for u in set(range(U)) - set(plain[0]))


def _modular_objective(gains, threads):
    n = len(gains)
    return Objective(np.full(n, 1 / n), np.eye(n), np.zeros((n, 1)), np.zeros(1), np.asarray(gains, float),
                     np.asarray(threads), CoverageWeights(0.0, 0.0, 0.0))


def test_best_of_two_keeps_the_better_run():
    # unit 0: gain 3 for all 10 tokens; unit 1: gain 0.5 for 1 token (the better ratio)
    obj = _modular_objective([3.0, 0.5], [0, 1])
    tb = G.TokenBudget(10.0, np.array([10.0, 1.0]), np.array([0.0, 0.0]))
    rule = G.StopRule(2, 2.0, None, tb)
    for lazy in (False, True):
        assert G.cost_aware_greedy(obj, rule._replace(tokens=tb._replace(ratio=False)), lazy)[0] == [0]
        assert G.cost_aware_greedy(obj, rule._replace(tokens=tb._replace(ratio=True)), lazy)[0] == [1]
        assert G.cost_aware_greedy(obj, rule, lazy)[0] == [0]  # J 3 beats J 0.5
    # ... and the other way round: three cheap units beat one dear one
    obj = _modular_objective([1.5, 1.4, 1.4], [0, 1, 1])
    tb = G.TokenBudget(10.0, np.array([10.0, 1.0, 1.0]), np.array([0.0, 8.0]))
    for lazy in (False, True):
        assert G.cost_aware_greedy(obj, G.StopRule(3, 2.0, None, tb._replace(ratio=False)), lazy)[0] == [0]
        assert G.cost_aware_greedy(obj, G.StopRule(3, 2.0, None, tb), lazy)[0] == [1, 2]
    # the same set chosen both ways: the ratio run's pick order, whatever the summation order says
    calls = []

    def run(r):
        calls.append(r.tokens.ratio)
        return ([1, 0], [0.5, 0.25]) if r.tokens.ratio else ([0, 1], [0.5, 0.2500001])
    assert G.best_of_two(run, G.StopRule(3, 2.0, None, tb)) == ([1, 0], [0.5, 0.25]) and calls == [False, True]


def test_a_key_that_rises_when_its_heading_is_paid_is_taken():
    """Unit 1 shares unit 0's thread (heading 8): its key 1.4 / 9 is below unit 2's 0.4 / 2 until
    unit 0 pays the heading, then 1.4 / 1 is above it. The lazy heap must re-key it."""
    obj = _modular_objective([2.0, 1.4, 0.4], [0, 0, 1])
    tb = G.TokenBudget(12.0, np.array([1.0, 1.0, 2.0]), np.array([8.0, 0.0]), ratio=True)
    for lazy in (False, True):
        assert G.cost_aware_greedy(obj, G.StopRule(3, 2.0, None, tb), lazy)[0] == [0, 1, 2]


def test_cost_aware_greedy_guarantee_on_small_problems():
    """Brute force: the cost-aware greedy gets >= (1 - 1/e) / 2 of the best set that fits with
    modular costs (headings 0), and of the best set that fits when every unit pays its heading."""
    rng = np.random.default_rng(5)
    bound = (1 - 1 / math.e) / 2
    worst = 1.0
    for trial in range(60):
        U = int(rng.integers(3, 10))
        obj, uc, hc = _objective(rng, U)
        if trial % 2:
            hc = np.zeros_like(hc)
        cap = float(rng.integers(10, 80))
        S, _ = G.cost_aware_greedy(obj, G.StopRule(U, 2.0, None, G.TokenBudget(cap, uc, hc)))
        pess = uc + hc[obj.thread]
        best = max((obj.value(c) for k in range(U + 1) for c in itertools.combinations(range(U), k)
                    if pess[list(c)].sum() <= cap), default=0.0)
        if best > 0:
            worst = min(worst, obj.value(S) / best)
            assert obj.value(S) >= bound * best - 1e-12, (trial, obj.value(S), best)
    assert worst <= 1.0


# ----------------------------------------------------------------------------------------------
# every optimizer picks what the NumPy reference picks
# ----------------------------------------------------------------------------------------------
def _batch_problem(seed, Q, U, T):
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((Q, U, 5))
    E /= np.linalg.norm(E, axis=2, keepdims=True)
    K = np.clip(E @ E.transpose(0, 2, 1) - 0.1, 0, 1)
    for q in range(Q):
        np.fill_diagonal(K[q], 1.0)
    pi = rng.random((Q, U)) ** 3
    valid = np.ones((Q, U), dtype=bool)
    valid[0, U - 3:] = False  # padding
    pi = np.where(valid, pi, 0)
    pi /= pi.sum(1, keepdims=True)
    thread = np.where(valid, rng.integers(0, T, (Q, U)), -1)
    mass = np.stack([np.bincount(thread[q][valid[q]], weights=pi[q][valid[q]], minlength=T) for q in range(Q)])
    p = G.GreedyProblem(pi, K, rng.dirichlet(np.ones(3), size=(Q, U)), rng.dirichlet(np.ones(3), size=Q),
                        rng.random((Q, U)), thread, mass, valid)
    tb = G.TokenBudget(rng.integers(20, 150, size=Q).astype(float), rng.integers(1, 25, (Q, U)).astype(float),
                       rng.integers(0, 30, (Q, T)).astype(float))
    return p, tb


def _numba_batch(p, w, rule):
    """The compiled greedy of the CPU engine, one query at a time (as ``engine/compiled.py``)."""
    from trawmem_gpu.select.steps.greedy.compiled import FusedWeights

    fused = FusedWeights(*(getattr(w, name) for name in FusedWeights._fields))  # the fused terms' weights
    Q, U = p.pi.shape
    T = p.thread_mass.shape[1]
    s = G.greedy_scratch(U, 3, T + 1)
    tb = rule.tokens
    sel = np.full((Q, U), -1, dtype=np.int64)
    n_sel = np.zeros(Q, dtype=np.int64)
    for q in range(Q):
        live = np.flatnonzero(p.valid[q])
        K = np.ascontiguousarray(p.K[q][np.ix_(live, live)])
        lt = np.ascontiguousarray(p.thread[q][live])
        args = (np.ascontiguousarray(p.pi[q][live]), np.ascontiguousarray(p.rho[q][live]), p.delta[q],
                np.ascontiguousarray(p.modular[q][live]), lt, p.thread_mass[q][lt], K @ p.pi[q][live],
                G.KSource(K.reshape(-1), 0, len(live), np.arange(len(live)), False), fused,
                G.StopRule(min(int(rule.budget[q]), len(live)), 2.0, len(live), None),
                np.ascontiguousarray(tb.unit_cost[q][live]), np.ascontiguousarray(tb.head_cost[q]),
                float(tb.capacity[q]))
        row = np.full(len(live), -1, dtype=np.int64)
        if tb.ratio is None:
            n = G.best_of_two_compiled(G.CompiledQuery(*args, False), G.CompiledQuery(*args, True), s, row,
                                       np.empty(len(live), np.int64), np.zeros(len(live), np.bool_))
        else:
            n = G.lazy_greedy_one(G.CompiledQuery(*args, tb.ratio), s, row)
        sel[q, :n] = live[row[:n]]
        n_sel[q] = n
    return sel, None, n_sel


def _torch(fn):
    def run(p, w, rule):
        t = lambda a: torch.as_tensor(a)  # noqa: E731
        pt = G.GreedyProblem(*(None if x is None else t(x) for x in p))
        tb = rule.tokens
        tt = None if tb is None else G.TokenBudget(t(tb.capacity), t(tb.unit_cost), t(tb.head_cost), tb.ratio)
        return fn(pt, w, rule._replace(budget=t(rule.budget), tokens=tt))
    return run


OPTIMIZERS = [
    pytest.param(lambda p, w, r: G.greedy_reference_np(p, w, r, lazy=True), id="numpy-lazy"),
    pytest.param(_torch(G.greedy_select_torch), id="torch-plain"),
    pytest.param(_torch(G.greedy_lazy_torch), id="torch-lazy"),
    pytest.param(_torch(lambda p, w, r: G.greedy_lazy_torch(p, w, r, k=1)), id="torch-lazy-k1"),
    pytest.param(_numba_batch, id="numba", marks=pytest.mark.skipif(not HAS_NUMBA, reason="needs numba")),
]


@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("ratio", [None, False, True], ids=["best", "gain", "ratio"])
def test_every_optimizer_agrees_under_a_token_budget(opt, ratio):
    w = CoverageWeights(0.8, 1.1, 0.9)
    for seed, (Q, U, T) in enumerate([(3, 13, 4), (2, 29, 6), (4, 7, 2)]):
        p, tb = _batch_problem(seed, Q, U, T)
        budget = np.array([U] + [max(1, U // 2)] * (Q - 1))
        rule = G.StopRule(budget, 2.0, U, tb._replace(ratio=ratio))
        want_sel, _, want_n = G.greedy_reference_np(p, w, rule, lazy=False)
        sel, _, n = opt(p, w, rule)
        sel, n = np.asarray(sel), np.asarray(n)
        for q in range(Q):
            assert sel[q, :n[q]].tolist() == want_sel[q, :want_n[q]].tolist(), (seed, q)
            S = want_sel[q, :want_n[q]]
            assert _cost(S, tb.unit_cost[q], tb.head_cost[q], p.thread[q]) <= tb.capacity[q]


def test_token_budgets_never_reach_the_triton_kernel(monkeypatch):
    """The Triton greedy kernel has the unit budget only: under a token budget ``impl="auto"``
    runs the torch plain greedy and never asks for the kernel (``impl="triton"`` is refused:
    ``test_dispatch.py``)."""
    from trawmem_gpu.select.steps.greedy import batched as GB

    p, tb = _batch_problem(0, 3, 13, 4)
    w = CoverageWeights(1.0, 1.0, 1.0)
    run = _torch(lambda pt, w_, r: G.greedy_select(pt, w_, r, impl="auto"))

    def boom(*a, **k):
        raise AssertionError("the Triton kernel ran under a token budget")
    monkeypatch.setattr(GB, "kernels", boom)
    monkeypatch.setattr(GB, "use_triton", boom)
    rule = G.StopRule(np.full(3, 13), 2.0, 13, tb)
    sel, _, n = run(p, w, rule)
    want, _, want_n = _torch(G.greedy_select_torch)(p, w, rule)
    assert torch.equal(sel, want) and torch.equal(n, want_n)
    with pytest.raises(AssertionError, match="Triton kernel ran"):  # without T it would ask for the kernel
        run(p, w, rule._replace(tokens=None))
