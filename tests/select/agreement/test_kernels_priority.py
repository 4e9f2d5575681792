"""Tests for the batched Stage-2 ops and their Triton kernels: the role priority, the support
kernel K, the dispatch, and the CUDA-only check at realistic shapes (the greedy op:
test_kernels_greedy.py).

Layout follows vLLM's tests/kernels: module-level shape lists with odd sizes, the reference is
computed first, then the op under test, compared with ``torch.testing.assert_close`` and a
tolerance explained next to it. Without CUDA the Triton kernels run under TRITON_INTERPRET=1
(set by conftest.py) on small grids; the CUDA-only test at realistic shapes skips cleanly.
"""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.objective import support_kernel
from trawmem_gpu.select.steps.greedy import StopRule, greedy_select
from trawmem_gpu.select.steps.priority import HAS_TRITON, role_priority, role_priority_torch

from kernel_cases import (
    CUDA,
    needs_triton,
    DEVICE,
    NUM_QUERIES,
    NUM_UNITS,
    NUM_FEATS,
    NUM_THREADS,
    NUM_ROLES,
    K_MODES,
    SEEDS,
    W,
    LAMBDA_M,
    LAMBDA_R,
    TAU,
    T_R,
    make_inputs,
    priority_args,
    greedy_problem,
    assert_same_selection,
)


# ---------------------------------------------------------------------------------------------
# Op 1: role priority
# ---------------------------------------------------------------------------------------------
def _priority_loop(x):
    """Unit-by-unit float64 statement of the role-priority math (oracle for the torch spec)."""
    Q, U, F = x["feats"].shape
    T = x["gravity"].shape[1]
    rho = np.zeros((Q, U, NUM_ROLES))
    phi, w, pi = np.zeros((Q, U)), np.zeros((Q, U)), np.zeros((Q, U))
    for q in range(Q):
        kappa = 1.0 / max(1, int(x["budget"][q]))
        for u in range(U):
            if not bool(x["valid"][q, u]):
                continue
            logits = [sum(float(x["Mq"][q, r, f]) * float(x["feats"][q, u, f]) for f in range(F)) / T_R
                      for r in range(NUM_ROLES)]
            mx = max(logits)
            ex = [math.exp(v - mx) for v in logits]
            rho[q, u] = [e / sum(ex) for e in ex]
            phi[q, u] = sum(float(x["delta"][q, r]) * rho[q, u, r] for r in range(NUM_ROLES))
            cost = (float(x["dist_in"][q, u]) + LAMBDA_M * (1 - float(x["alpha"][q, u]))
                    + LAMBDA_R * (1 - phi[q, u]))
            t = int(x["thread"][q, u])
            grav = float(x["gravity"][q, t]) if 0 <= t < T else 0.0
            w[q, u] = min(kappa, grav * math.exp(-cost / TAU))
        s = w[q].sum()
        pi[q] = w[q] / s if s > 0 else 0.0
    return rho, phi, w, pi


@pytest.mark.parametrize("num_units", [1, 6])
@pytest.mark.parametrize("num_feats", NUM_FEATS)
def test_role_priority_torch_matches_loop(num_units, num_feats):
    x = make_inputs(3, num_units, 4, num_feats, 5, seed=1, dtype=torch.float64)
    if num_units > 1:
        x["thread"][0, 0] = 4  # live unit with an out-of-range thread: gravity 0, w = 0
    ref = _priority_loop(x)
    out = role_priority_torch(*priority_args(x))
    # float64 on both sides; only summation order differs -> agreement to ~1e-15.
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, torch.from_numpy(r), rtol=1e-12, atol=1e-14)
    if num_units > 1:
        assert float(out[2][0, 0]) == 0.0


@needs_triton
@pytest.mark.parametrize("num_queries", NUM_QUERIES)
@pytest.mark.parametrize("num_units", NUM_UNITS)
@pytest.mark.parametrize("num_feats", NUM_FEATS)
@pytest.mark.parametrize("num_threads", NUM_THREADS)
@pytest.mark.parametrize("seed", SEEDS)
@torch.inference_mode()
def test_role_priority_triton_matches_torch(num_queries, num_units, num_feats, num_threads, seed):
    x = make_inputs(num_queries, num_units, num_threads, num_feats, 5, seed, device=DEVICE)
    ref = role_priority(*priority_args(x), impl="torch")
    out = role_priority(*priority_args(x), impl="triton")
    # Both float32; the kernel accumulates the logits feature by feature and multiplies by
    # 1/T_R and 1/tau instead of dividing, so results differ by a few ulps. rho, phi are O(1)
    # and w, pi are <= 1, so rtol 1e-5 / atol 1e-6 is ~10 ulps.
    for name, r, o in zip(("rho", "phi", "w", "pi"), ref, out):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    rho, phi, w, pi = out
    assert not torch.isnan(pi).any()
    assert (rho[~x["valid"]] == 0).all() and (pi[~x["valid"]] == 0).all()
    live_q = x["valid"].any(1)
    torch.testing.assert_close(pi.sum(1)[live_q], torch.ones_like(pi.sum(1)[live_q]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
def test_role_priority_zero_sum_gives_zero_pi(impl):
    x = make_inputs(3, 5, 2, 4, 5, seed=3, device=DEVICE)
    x["valid"][1] = False  # no live unit
    x["thread"][1] = -1
    x["dist_in"][2] = 1e4  # every w of query 2 underflows to 0
    rho, phi, w, pi = role_priority(*priority_args(x), impl=impl)
    assert torch.isfinite(pi).all() and torch.isfinite(rho).all()
    assert (pi[1] == 0).all() and (rho[1] == 0).all() and (phi[1] == 0).all() and (w[1] == 0).all()
    assert (w[2] == 0).all() and (pi[2] == 0).all()
    torch.testing.assert_close(pi[0].sum(), torch.tensor(1.0, device=pi.device), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# K and the NumPy references
# ---------------------------------------------------------------------------------------------
def test_support_kernel_numpy_and_torch():
    """The objective's K: clipped, shifted cosine with a unit diagonal (one formula for NumPy and
    torch, bit for bit), zero across threads without cross-thread support, or the identity."""
    x = make_inputs(1, 9, 2, 2, 4, seed=5, dtype=torch.float64)
    E = x["E"][0]
    S = E @ E.T
    thread = torch.tensor([0, 0, 1, 1, 1, 2, 2, 0, 1])
    same = thread[:, None] == thread[None, :]
    for cfg in (SelectConfig(cross_thread=True), SelectConfig(k_shift=0.0, cross_thread=True), SelectConfig(),
                SelectConfig(kernel="identity")):
        want = np.clip((S.numpy() - cfg.k_shift) * (1.0 / (1.0 - cfg.k_shift)), 0, 1)  # objective's statement
        if not cfg.cross_thread:
            want = np.where(same.numpy(), want, 0.0)
        np.fill_diagonal(want, 1.0)
        if cfg.kernel == "identity":
            want = np.eye(9)
        Kt = support_kernel(S, same, cfg)
        Kn = support_kernel(S.numpy(), same.numpy(), cfg)
        np.testing.assert_array_equal(Kt.numpy(), want)  # same IEEE operations: exact
        np.testing.assert_array_equal(Kn, want)


# ---------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------
def test_dispatch_auto_and_errors():
    x = make_inputs(2, 5, 2, 3, 4, seed=2, dtype=torch.float64)
    out = role_priority(*priority_args(x))  # CPU -> torch path keeps float64
    assert out[0].dtype == torch.float64 or CUDA
    with pytest.raises(ValueError, match="impl must be"):
        role_priority(*priority_args(x), impl="cuda")
    with pytest.raises(ValueError, match="impl must be"):
        greedy_select(greedy_problem(x), W, StopRule(x["budget"], 2.0, 4), impl="gpu")


def test_import_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from trawmem_gpu.select.objective import CoverageWeights\n"
        "from trawmem_gpu.select.steps import greedy as g, priority as p\n"
        "assert not p.HAS_TRITON\n"
        "pi = torch.full((1, 3), 1/3); v = torch.ones(1, 3, dtype=torch.bool)\n"
        "pb = g.GreedyProblem(pi, None, torch.zeros(1, 3, 3), torch.zeros(1, 3), torch.zeros(1, 3),\n"
        "    torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 1), v)\n"
        "rule = g.StopRule(torch.tensor([2]), 2.0, 16)\n"
        "s = g.greedy_select(pb, CoverageWeights(1.0, 1.0, 1.0), rule)\n"
        "assert s[0].tolist() == [[0, 1] + [-1] * 14], s\n"
        "try:\n"
        "    g.greedy_select(pb, CoverageWeights(1.0, 1.0, 1.0), rule, impl='triton')\n"
        "    raise SystemExit('expected RuntimeError')\n"
        "except RuntimeError:\n"
        "    pass\n"
    )
    # the timeout is a bound only: torch and triton import slowly on a busy machine
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------------------
# CUDA: realistic shapes
# ---------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not (CUDA and HAS_TRITON), reason="needs CUDA and triton")
@pytest.mark.parametrize("num_queries,num_units", [(64, 512), (37, 301)])
@pytest.mark.parametrize("k_mode", K_MODES)
@torch.inference_mode()
def test_cuda_triton_matches_torch_large(num_queries, num_units, k_mode):
    x = make_inputs(num_queries, num_units, 24, 16, 384, seed=0, device="cuda")
    x["budget"] = torch.randint(1, 33, (num_queries,), device="cuda")
    ref_p = role_priority(*priority_args(x), impl="torch")
    out_p = role_priority(*priority_args(x), impl="triton")
    for r, o in zip(ref_p, out_p):  # float32 both, a few ulps (see the small-shape test)
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6)
    p = greedy_problem(x, k_mode)
    rule = StopRule(x["budget"], 0.95, 32)
    ref = greedy_select(p, W, rule, impl="torch")
    out = greedy_select(p, W, rule, impl="triton")
    # float32 both: near-ties may split (tolerated only when both picked gains agree to 1e-5 relative).
    diverged = assert_same_selection(ref, out, rtol=1e-5, atol=1e-6)
    assert diverged <= max(1, num_queries // 10)
