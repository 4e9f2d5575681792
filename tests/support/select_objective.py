"""J of a picked set, computed from the reference's pieces."""
from __future__ import annotations

import numpy as np

from trawmem_gpu.select.objective import Objective


def _objective(rng, U, ties=False, w_aff=1.0):
    E = rng.normal(size=(U, 6))
    if ties and U > 1:
        E[U // 2:] = E[: U - U // 2]
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    K = np.clip(E @ E.T, 0, 1)
    np.fill_diagonal(K, 1)
    pi = rng.random(U)
    pi /= pi.sum()
    alpha = np.round(rng.random(U), 1) if ties else rng.random(U)
    rho = rng.dirichlet(np.ones(3), size=U)
    delta = rng.dirichlet(np.ones(3))
    th = np.unique(np.sort(rng.integers(0, 4, size=U)), return_inverse=True)[1]
    return Objective(pi, K, rho, delta, w_aff * alpha, th)
