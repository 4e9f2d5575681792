"""Shared by the kernel agreement tests (tests/select/agreement/test_kernels_*.py): the shape
lists, the weights, the random padded batches and the selection comparison."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.objective import CoverageWeights, support_kernel
from trawmem_gpu.select.steps.greedy import GreedyProblem
from trawmem_gpu.select.steps.priority import HAS_TRITON, PriorityInputs, PriorityWeights, role_priority_torch

CUDA = torch.cuda.is_available()
# The forced Triton path runs on CUDA, or on CPU through the interpreter.
TRITON_OK = HAS_TRITON and (CUDA or os.environ.get("TRITON_INTERPRET") == "1")
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="needs triton (CUDA or TRITON_INTERPRET=1)")
DEVICE = "cuda" if CUDA else "cpu"

NUM_QUERIES = [1, 3]
NUM_UNITS = [1, 5, 17, 33]
NUM_FEATS = [1, 7]
NUM_THREADS = [1, 4]
EMBED_DIMS = [5]
NUM_ROLES = 3
K_MODES = ["matrix", "identity"]
SEEDS = [0]
W = CoverageWeights(1.0, 1.0, 1.0)  # w_cov, w_role, w_thr: every term matters
W_AFF = 0.1  # the modular part is W_AFF * alpha

LAMBDA_M, LAMBDA_R, TAU, T_R = 1.25, 0.5, 0.5, 1.0


def make_inputs(Q, U, T, F, D, seed, device="cpu", dtype=torch.float32):
    """Random padded batch. Query 0 is full, the last of >= 3 queries has no live unit, the
    others have a random live count; padding is scattered, not only at the tail."""
    g = torch.Generator().manual_seed(seed)
    n_valid = torch.randint(0, U + 1, (Q,), generator=g)
    n_valid[0] = U
    if Q >= 3:
        n_valid[-1] = 0
    valid = torch.zeros(Q, U, dtype=torch.bool)
    for q in range(Q):
        valid[q, torch.randperm(U, generator=g)[: int(n_valid[q])]] = True
    thread = torch.randint(0, T, (Q, U), generator=g)
    thread[~valid] = -1
    x = dict(
        feats=torch.randn(Q, U, F, generator=g, dtype=dtype),
        Mq=torch.randn(Q, NUM_ROLES, F, generator=g, dtype=dtype),
        delta=torch.softmax(torch.randn(Q, NUM_ROLES, generator=g, dtype=dtype), -1),
        thread=thread,
        valid=valid,
        gravity=torch.rand(Q, T, generator=g, dtype=dtype),
        dist_in=torch.rand(Q, U, generator=g, dtype=dtype),
        alpha=torch.rand(Q, U, generator=g, dtype=dtype),
        budget=torch.randint(1, U + 4, (Q,), generator=g),  # sometimes larger than U
        E=torch.nn.functional.normalize(torch.randn(Q, U, D, generator=g, dtype=dtype), dim=-1),
        thread_mass=torch.rand(Q, T, generator=g, dtype=dtype) / T,
    )
    return {k: v.to(device) for k, v in x.items()}


def priority_args(x):
    return (PriorityInputs(x["feats"], x["Mq"], x["delta"], x["thread"], x["valid"], x["gravity"], x["dist_in"],
                           x["alpha"], x["budget"]), PriorityWeights(LAMBDA_M, LAMBDA_R, TAU), T_R)


def kernel_of(E, cfg=SelectConfig(k_shift=0.0, cross_thread=True)):
    """K from unit vectors by the objective's support kernel (clipped cosine, unit diagonal)."""
    return support_kernel(E @ E.transpose(-1, -2), None, cfg)


def greedy_problem(x, k_mode="matrix"):
    """pi, rho from the torch role priority, K from E (or the identity): the greedy op's input."""
    rho, _, _, pi = role_priority_torch(*priority_args(x))
    K = kernel_of(x["E"]) if k_mode == "matrix" else None
    return GreedyProblem(pi, K, rho, x["delta"], W_AFF * x["alpha"], x["thread"], x["thread_mass"], x["valid"])


def assert_same_selection(ref, out, rtol=1e-5, atol=1e-6):
    """Compare greedy outputs ``(sel, gains, n_sel)`` of a reference and a float32 path.

    Selections must match step by step. A float32 path may break a near-tie differently (sums
    in another order); that is accepted only if, at the first differing step, both picked gains
    agree within the tolerance (a genuine near-tie); the rest of that query is then
    path-dependent and not compared. Returns the number of such near-tie divergences.
    """
    sel_r, g_r, n_r = (torch.as_tensor(np.asarray(t.cpu()) if torch.is_tensor(t) else t) for t in ref)
    sel_o, g_o, n_o = (t.cpu() for t in out)
    diverged = 0
    for q in range(sel_r.shape[0]):
        for t in range(sel_r.shape[1]):
            if int(sel_r[q, t]) != int(sel_o[q, t]):
                assert int(sel_r[q, t]) >= 0 and int(sel_o[q, t]) >= 0, (q, t, sel_r[q], sel_o[q])
                torch.testing.assert_close(g_o[q, t].double(), g_r[q, t].double(), rtol=rtol, atol=atol)
                diverged += 1
                break
            torch.testing.assert_close(g_o[q, t].double(), g_r[q, t].double(), rtol=rtol, atol=atol)
        else:
            assert int(n_r[q]) == int(n_o[q])
    return diverged
