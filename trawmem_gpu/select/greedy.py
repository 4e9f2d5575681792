"""The four-term objective J (Eq. 8) and its greedy maximizers, per query, in NumPy float64.

    J(S) = w_cov * sum_v pi(v) max_{u in S} K(u, v)          information coverage
         + w_role * sum_r delta_r max_{u in S} rho_r(u)        role coverage
         + w_aff * sum_{u in S} alpha(u)                       affinity
         + w_thr * sum_j [S hits L_j] * mass_j                 thread coverage (mass_j = sum pi over L_j)

Every term is monotone submodular, so lazy greedy (stale upper bounds) is exact. Ties between
equal marginal gains go to the lowest candidate index, in both maximizers.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass
class Objective:
    pi: np.ndarray      # [U]
    K: np.ndarray       # [U, U], K[u, v] = support of v by u
    rho: np.ndarray     # [U, R]
    delta: np.ndarray   # [R]
    alpha: np.ndarray   # [U]
    thread: np.ndarray  # [U] local thread index in [0, T)
    w_cov: float = 1.0
    w_role: float = 1.0
    w_aff: float = 1.0
    w_thr: float = 1.0

    def __post_init__(self):
        U = len(self.alpha)
        T = int(self.thread.max()) + 1 if U else 0
        self.mass = np.bincount(self.thread, weights=self.pi, minlength=T) if U else np.zeros(0)
        self.reset()

    def reset(self) -> None:
        U, R = self.rho.shape if self.rho.ndim == 2 else (0, 0)
        self.c = np.zeros(len(self.alpha))
        self.m = np.zeros(R)
        self.hit = np.zeros(len(self.mass), dtype=bool)

    def gain(self, u: int) -> float:
        g = self.w_cov * float(self.pi @ np.maximum(0.0, self.K[u] - self.c))
        g += self.w_role * float(self.delta @ np.maximum(0.0, self.rho[u] - self.m))
        g += self.w_aff * float(self.alpha[u])
        t = self.thread[u]
        if not self.hit[t]:
            g += self.w_thr * float(self.mass[t])
        return g

    def add(self, u: int) -> None:
        np.maximum(self.c, self.K[u], out=self.c)
        np.maximum(self.m, self.rho[u], out=self.m)
        self.hit[self.thread[u]] = True

    def coverage(self) -> float:
        return float(self.pi @ self.c)

    def value(self, S) -> float:
        """J(S) from scratch (for tests)."""
        S = list(S)
        if not S:
            return 0.0
        cov = float(self.pi @ self.K[S].max(axis=0))
        role = float(self.delta @ self.rho[S].max(axis=0))
        thr = float(self.mass[np.unique(self.thread[S])].sum())
        return self.w_cov * cov + self.w_role * role + self.w_aff * float(self.alpha[S].sum()) + self.w_thr * thr


def plain_greedy(obj: Objective, budget: int, stop_coverage: float = 1.01) -> tuple[list[int], list[float]]:
    """Add the unit of largest marginal gain (lowest index on ties), at most ``budget`` times.

    Stops early once the information coverage reaches ``stop_coverage``.
    """
    obj.reset()
    U = len(obj.alpha)
    chosen, gains = [], []
    free = np.ones(U, dtype=bool)
    for _ in range(min(budget, U)):
        best, bg = -1, -np.inf
        for u in range(U):
            if free[u]:
                g = obj.gain(u)
                if g > bg:
                    best, bg = u, g
        obj.add(best)
        free[best] = False
        chosen.append(best)
        gains.append(bg)
        if obj.coverage() >= stop_coverage:
            break
    return chosen, gains


def lazy_greedy(obj: Objective, budget: int, stop_coverage: float = 1.01) -> tuple[list[int], list[float]]:
    """Lazy greedy (Minoux): a heap of stale upper bounds keyed (-bound, index).

    The popped unit's gain is recomputed; it is taken when that gain beats the next bound, or
    equals it while the popped index is lower (the plain greedy tie rule); otherwise it goes
    back with its fresh bound. Submodularity makes stale bounds valid, so the picks equal
    ``plain_greedy``'s exactly.
    """
    obj.reset()
    U = len(obj.alpha)
    heap = [(-obj.gain(u), u) for u in range(U)]
    heapq.heapify(heap)
    chosen, gains = [], []
    fresh_at = np.zeros(U, dtype=np.int64)  # step at which each bound was computed
    step = 0
    while heap and len(chosen) < min(budget, U):
        nb, u = heapq.heappop(heap)
        if fresh_at[u] == step:
            g = -nb
        else:
            g = obj.gain(u)
            fresh_at[u] = step
        if heap:
            nb2, u2 = heap[0]
            if not (g > -nb2 or (g == -nb2 and u < u2)):
                heapq.heappush(heap, (-g, u))
                continue
        obj.add(u)
        chosen.append(u)
        gains.append(g)
        step += 1
        if obj.coverage() >= stop_coverage:
            break
    return chosen, gains
