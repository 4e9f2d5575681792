"""Tests for the batched greedy op and its Triton kernel: lazy == plain, the torch path against
the NumPy reference, exact ties, stop rules, Triton against torch (the role priority and the
dispatch: test_kernels_priority.py).

Layout follows vLLM's tests/kernels: module-level shape lists with odd sizes, the reference is
computed first, then the op under test, compared with ``torch.testing.assert_close`` and a
tolerance explained next to it. Without CUDA the Triton kernels run under TRITON_INTERPRET=1
(set by conftest.py) on small grids; the CUDA-only test at realistic shapes skips cleanly.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trawmem_gpu.select.objective import CoverageWeights
from trawmem_gpu.select.steps.greedy import (
    GreedyProblem,
    StopRule,
    greedy_reference_np,
    greedy_select,
    greedy_select_torch,
    pick_limit,
)

from kernel_cases import (
    needs_triton,
    DEVICE,
    NUM_QUERIES,
    NUM_UNITS,
    EMBED_DIMS,
    NUM_ROLES,
    K_MODES,
    SEEDS,
    W,
    make_inputs,
    greedy_problem,
    assert_same_selection,
)


def _random_query(rng, U, T, R=NUM_ROLES):
    valid = rng.random(U) < 0.85
    pi = rng.random(U) * valid
    pi = pi / pi.sum() if pi.sum() > 0 else pi
    E = rng.standard_normal((U, 6))
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    K = np.clip(E @ E.T, 0, 1)
    np.fill_diagonal(K, 1.0)
    rho = rng.dirichlet(np.ones(R), size=U)
    delta = rng.dirichlet(np.ones(R))
    thread = np.where(valid, rng.integers(0, T, U), -1)
    return dict(pi=pi, K=K, rho=rho, delta=delta, modular=rng.random(U), thread=thread,
                thread_mass=rng.random(T) / T, valid=valid)


def _one(x, w=W, budget=40, stop=2.0, max_steps=40, lazy=False):
    """The NumPy reference on one query given as a dict of per-query arrays."""
    p = GreedyProblem(*(None if x.get(k) is None else np.asarray(x[k])[None] for k in GreedyProblem._fields))
    sel, gains, n = greedy_reference_np(p, w, StopRule(np.array([budget]), stop, max_steps), lazy=lazy)
    return sel[0, :n[0]].tolist(), gains[0, :n[0]].tolist()


def test_lazy_matches_plain_random():
    rng = np.random.default_rng(7)
    for i in range(120):
        U = int(rng.integers(1, 40))
        x = _random_query(rng, U, T=int(rng.integers(1, 6)))
        w = tuple(float(v) for v in rng.choice([0.0, 0.05, 1.0, 3.0], size=4))
        x["modular"] = w[3] * x["modular"]
        kw = dict(w=CoverageWeights(*w[:3]), budget=int(rng.integers(0, U + 3)),
                  stop=float(rng.choice([2.0, 0.5, 0.8])), max_steps=int(rng.integers(1, 20)))
        plain, lazy = _one(x, **kw), _one(x, **kw, lazy=True)
        assert plain[0] == lazy[0], (i, plain, lazy)
        assert plain[1] == lazy[1]  # same float64 gain function -> bit-identical gains


def _tie_query():
    """Dyadic inputs with exact duplicates: every sum is exact in any order and any precision.

    Units 0, 4, 9, 20, 31 share vector e0, role row, alpha and thread (indices chosen to span
    blocks of 16); 2, 13, 26 share e1 and thread 1; the rest use distinct axes. The duplicates of
    one group have bit-identical gains at every step, so only the tie rule decides the order.
    """
    U, D = 33, 40
    E = np.zeros((U, D))
    axis = np.arange(U) + 2
    group_a, group_b = [0, 4, 9, 20, 31], [2, 13, 26]
    axis[group_a], axis[group_b] = 0, 1
    E[np.arange(U), axis] = 1.0
    valid = np.ones(U, dtype=bool)
    valid[[5, 17]] = False
    pi = np.where(valid, 1.0 / 32, 0.0)  # 31 live units; sums stay dyadic
    rho = np.tile(np.array([0.5, 0.25, 0.25]), (U, 1))
    rho[group_b] = [0.25, 0.5, 0.25]
    alpha = np.full(U, 0.5)
    alpha[group_a] = 0.75
    thread = np.arange(U) % 4
    thread[group_a], thread[group_b] = 0, 1
    thread[~valid] = -1
    return dict(pi=pi, K=(E @ E.T).clip(0, 1), rho=rho, delta=np.array([0.5, 0.25, 0.25]), modular=alpha,
                thread=thread, thread_mass=np.array([0.25, 0.125, 0.0625, 0.0625]), valid=valid)


def test_lazy_matches_plain_exact_ties():
    x = _tie_query()
    alpha = x["modular"]
    for w in [(1, 1, 1, 1), (1, 0, 0, 0), (0, 0, 1, 0), (0, 0, 0, 0)]:
        x["modular"] = w[2] * alpha
        cw = CoverageWeights(w[0], w[1], w[3])
        plain, lazy = _one(x, cw), _one(x, cw, lazy=True)
        assert plain == lazy
        assert sorted(plain[0]) == [u for u in range(33) if x["valid"][u]]  # all live, once
    # all-zero weights: every gain is 0, so ties decide everything -> index order
    x["modular"] = 0 * alpha
    assert _one(x, CoverageWeights(0, 0, 0))[0] == [u for u in range(33) if x["valid"][u]]
    # affinity only: group a (alpha 0.75) first in index order, then the rest in index order
    x["modular"] = alpha
    assert _one(x, CoverageWeights(0, 0, 0), budget=6, max_steps=6, lazy=True)[0] == [0, 4, 9, 20, 31, 1]


def _batch_of(queries):
    """Stack per-query NumPy dicts (same U, T) into a float32 torch GreedyProblem."""
    out = {}
    for k in GreedyProblem._fields:
        if queries[0].get(k) is None:  # an optional field (the unit attributes)
            continue
        t = torch.from_numpy(np.stack([q[k] for q in queries]))
        out[k] = t.float() if t.is_floating_point() else t
    out["thread"] = out["thread"].long()
    return GreedyProblem(**out)


def _on(p: GreedyProblem, device=DEVICE) -> GreedyProblem:
    return GreedyProblem(*(None if v is None else v.to(device) for v in p))


# ---------------------------------------------------------------------------------------------
# Op 2: batched greedy vs the NumPy reference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_queries", NUM_QUERIES)
@pytest.mark.parametrize("num_units", NUM_UNITS)
@pytest.mark.parametrize("stop_coverage", [2.0, 0.6])
@pytest.mark.parametrize("seed", SEEDS)
@torch.inference_mode()
def test_greedy_torch_matches_numpy(num_queries, num_units, stop_coverage, seed):
    x = make_inputs(num_queries, num_units, 4, 3, 5, seed, dtype=torch.float64)
    p = greedy_problem(x)
    rule = StopRule(x["budget"], stop_coverage, 8)
    ref = greedy_reference_np(p, W, rule)
    assert (ref[0] == greedy_reference_np(p, W, rule, lazy=True)[0]).all()
    # float64 torch: same math, other summation order -> identical picks, gains to ~1e-15.
    sel, gains, n_sel = greedy_select_torch(p, W, rule)
    np.testing.assert_array_equal(sel.numpy(), ref[0])
    np.testing.assert_array_equal(n_sel.numpy(), ref[2])
    torch.testing.assert_close(gains.double(), torch.from_numpy(ref[1]), rtol=1e-6, atol=1e-7)
    # float32 torch: rounding ~1e-7 relative on O(1) gains; picks agree unless two gains are
    # within float32 rounding of each other (then assert_same_selection checks it was a near-tie).
    p32 = GreedyProblem(*(v.float() if v is not None and v.is_floating_point() else v for v in p))
    assert_same_selection(ref, greedy_select(p32, W, rule, impl="torch"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("k_mode", K_MODES)
def test_greedy_exact_ties(impl, k_mode):
    x = _tie_query()
    p = _batch_of([x, x])
    p.valid[1, :3] = False  # second query: first duplicates of group a / b are padding
    p.thread[1, :3] = -1
    if k_mode == "identity":
        p = p._replace(K=None)
    rule = StopRule(torch.tensor([40, 12]), 2.0, 40)
    w = CoverageWeights(1.0, 1.0, 1.0)
    ref = greedy_reference_np(p, w, rule)
    lazy = greedy_reference_np(p, w, rule, lazy=True)
    np.testing.assert_array_equal(lazy[0], ref[0])
    out = greedy_select(_on(p), w, rule._replace(budget=rule.budget.to(DEVICE)), impl=impl)
    # All inputs are dyadic and every partial sum is exactly representable in float32, so the
    # float32 paths are exact: identical picks and bit-identical gains (atol = rtol = 0).
    np.testing.assert_array_equal(out[0].cpu().numpy(), ref[0])
    np.testing.assert_array_equal(out[2].cpu().numpy(), ref[2])
    torch.testing.assert_close(out[1].cpu().double(), torch.from_numpy(ref[1]), rtol=0, atol=0)
    assert int(out[2][1]) == 12


@needs_triton
@pytest.mark.parametrize("k_mode", K_MODES)
def test_greedy_triton_ties_across_blocks(k_mode):
    """The tie query with 16-row blocks: duplicates 0/4/9 | 20 | 31 and 2/13 | 26 sit in
    different blocks, so the cross-block rule (keep the earlier block on equal gains) decides."""
    from trawmem_gpu.kernels.greedy import greedy_select_triton

    p = _batch_of([_tie_query()])
    if k_mode == "identity":
        p = p._replace(K=None)
    rule = StopRule(torch.tensor([40]), 2.0, 40)
    alpha = p.modular
    for w in [(1.0, 1.0, 1.0, 1.0), (0.0, 0.0, 0.0, 0.0)]:
        pw = p._replace(modular=w[2] * alpha)
        cw = CoverageWeights(w[0], w[1], w[3])
        ref = greedy_reference_np(pw, cw, rule)
        out = greedy_select_triton(_on(pw), torch.tensor([[w[0], w[1], w[3]]], device=DEVICE),
                                   pick_limit(rule, pw.valid.sum(1)).to(DEVICE), 2.0, 40, block_u=16)
        # dyadic inputs: exact in float32, so picks and gains must match bit for bit
        np.testing.assert_array_equal(out[0].cpu().numpy(), ref[0])
        torch.testing.assert_close(out[1].cpu().double(), torch.from_numpy(ref[1]), rtol=0, atol=0)


def _stop_batch():
    """Identity K, coverage only: picks follow pi; after two picks covered = 0.75 exactly."""
    pi = torch.tensor([[0.125, 0.5, 0.0, 0.25, 0.125], [0.0, 0.0, 0.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, False, True, True], [False] * 5])
    return GreedyProblem(pi, torch.eye(5).expand(2, 5, 5) * (valid[:, :, None] & valid[:, None, :]),
                         torch.zeros(2, 5, 3), torch.full((2, 3), 1 / 3), torch.zeros(2, 5),
                         torch.where(valid, 0, -1), torch.zeros(2, 1), valid)


@pytest.mark.parametrize("impl", ["numpy", "torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("stop_coverage,expect", [(0.75, [1, 3]), (0.74, [1, 3]), (0.76, [1, 3, 0]),
                                                  (2.0, [1, 3, 0, 4])])
def test_greedy_stop_coverage_and_empty_query(impl, stop_coverage, expect):
    p = _stop_batch()
    w = CoverageWeights(1.0, 0.0, 0.0)
    rule = StopRule(torch.tensor([5, 5]), stop_coverage, 6)
    if impl == "numpy":
        sel, gains, n_sel = (torch.from_numpy(a) for a in greedy_reference_np(p, w, rule))
    else:
        sel, gains, n_sel = greedy_select(_on(p), w, rule._replace(budget=rule.budget.to(DEVICE)), impl=impl)
    assert sel[0].tolist() == expect + [-1] * (6 - len(expect))
    assert n_sel.tolist() == [len(expect), 0]
    assert gains[0, : len(expect)].tolist() == [0.5, 0.25, 0.125, 0.125][: len(expect)]
    # the empty query: nothing picked, no NaN
    assert sel[1].tolist() == [-1] * 6 and gains[1].tolist() == [0.0] * 6
    assert not torch.isnan(gains).any()


# ---------------------------------------------------------------------------------------------
# Op 2: Triton kernel vs the torch path
# ---------------------------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize("num_queries", NUM_QUERIES)
@pytest.mark.parametrize("num_units", NUM_UNITS)
@pytest.mark.parametrize("k_mode", K_MODES)
@pytest.mark.parametrize("seed", SEEDS)
@torch.inference_mode()
def test_greedy_triton_matches_torch(num_queries, num_units, k_mode, seed):
    x = make_inputs(num_queries, num_units, 4, 3, EMBED_DIMS[0], seed, device=DEVICE)
    p = greedy_problem(x, k_mode)
    # per-query weights, as a learned head sets them
    w = CoverageWeights(1.0, torch.linspace(0.5, 1.5, num_queries, device=DEVICE)[:, None], 1.0)
    rule = StopRule(x["budget"], 0.9, 6)
    ref = greedy_select(p, w, rule, impl="torch")
    out = greedy_select(p, w, rule, impl="triton")
    # Both float32; coverage sums run in another order: a few ulps on O(1) gains. Near-ties may
    # split (see assert_same_selection).
    assert_same_selection(ref, out, rtol=1e-5, atol=1e-6)
    assert out[0].dtype == torch.int64 and out[2].dtype == torch.int64 and out[1].dtype == torch.float32
    assert (out[2] <= torch.minimum(x["budget"], x["valid"].sum(1))).all()
    if num_queries >= 3:
        assert int(out[2][-1]) == 0 and (out[0][-1] == -1).all()


@needs_triton
@pytest.mark.parametrize("k_mode", K_MODES)
@pytest.mark.parametrize("block_u", [16, 32])
@torch.inference_mode()
def test_greedy_triton_multi_block(k_mode, block_u):
    """U = 33 with 16- and 32-row blocks: the candidate sweep crosses block boundaries; budget > U
    exhausts every live unit."""
    from trawmem_gpu.kernels.greedy import greedy_select_triton

    x = make_inputs(2, 33, 3, 3, 7, seed=11, device=DEVICE)
    x["budget"][:] = 40
    p = greedy_problem(x, k_mode)
    rule = StopRule(x["budget"], 2.0, 40)
    ref = greedy_select_torch(p, W, rule)
    out = greedy_select_triton(p, torch.tensor([list(W)] * 2, device=DEVICE), pick_limit(rule, x["valid"].sum(1)),
                               2.0, 40, block_u=block_u)
    assert_same_selection(ref, out, rtol=1e-5, atol=1e-6)  # float32 both; see above
    assert out[2].tolist() == x["valid"].sum(1).tolist()
