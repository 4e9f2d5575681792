"""Random greedy problems for the objective tests, and the ``GreedyProblem`` an optimizer takes for one."""
from __future__ import annotations

import numpy as np
import torch

from trawmem_gpu.select import objective as J
from trawmem_gpu.select.terms import UNIT_ATTRIBUTES
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.steps import greedy as G


def _problem(seed: int, Q: int, U: int, T: int) -> dict:
    """Random float64 problems: every unit live and in a thread, pi a distribution, K a clipped
    cosine kernel; budget below U so the order of picks matters."""
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((Q, U, 5))
    E /= np.linalg.norm(E, axis=2, keepdims=True)
    K = J.support_kernel(E @ E.transpose(0, 2, 1), None, SelectConfig(k_shift=0.2, cross_thread=True))
    pi = rng.random((Q, U)) ** 3
    pi /= pi.sum(1, keepdims=True)
    thread = rng.integers(0, T, (Q, U))
    mass = np.stack([np.bincount(thread[q], weights=pi[q], minlength=T) for q in range(Q)])
    rho = rng.dirichlet(np.ones(3), size=(Q, U))
    # unit attributes: dates up to 90 days before NOW in column 0 (``time``), small ids or NaN in
    # any other column (what a term that reads attributes sees: shared values across units)
    A = len(UNIT_ATTRIBUTES)
    attrs = np.where(rng.random((Q, U, A)) < 0.3, np.nan, rng.integers(1, 6, (Q, U, A)).astype(float))
    attrs[..., 0] = NOW - rng.random((Q, U)) * 90 * 86400
    attrs[..., J.GROUP] = rng.integers(-1, 4, (Q, U))  # restatement groups, shared by several units; -1 = none
    return dict(pi=pi, K=K, rho=rho, delta=rng.dirichlet(np.ones(3), size=Q), alpha=rng.random((Q, U)),
                thread=thread, thread_mass=mass, valid=np.ones((Q, U), dtype=bool), budget=np.full(Q, U // 2),
                attrs=attrs)

NOW = 1.7e9  # a query date (POSIX seconds); the units' dates lie up to 90 days before it


def _problem_of(x, modular, torch_=True):
    f = (lambda a: torch.as_tensor(a)) if torch_ else (lambda a: a)
    return G.GreedyProblem(f(x["pi"]), f(x["K"]), f(x["rho"]), f(x["delta"]), f(modular), f(x["thread"]),
                           f(x["thread_mass"]), f(x["valid"]), f(x["attrs"]), f(x["alpha"]))
