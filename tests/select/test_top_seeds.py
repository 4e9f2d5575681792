"""Propagation's seeds (``steps.propagation.top_seeds``, one pass with a bounded sorted list)
against the selection it replaced (``top_seeds_reference``): random and tied scores, ``-inf``,
masked threads, every ``k`` from 0 to the live threads, odd sizes and no threads at all."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.steps.propagation import top_seeds, top_seeds_reference


def _both(r0, live, k):
    n = len(r0)
    a, b = np.full(max(n, 1), -7, np.int64), np.full(max(n, 1), -7, np.int64)
    assert top_seeds(r0, n, live, k, a) == top_seeds_reference(r0, n, live, k, b) == k
    return a, b


@pytest.mark.parametrize("seed", range(8))
def test_top_seeds_equal_the_selection(seed):
    rng = np.random.default_rng(seed)
    for n in (0, 1, 2, 3, 7, 26, 70, 129):
        kind = seed % 4
        if kind == 0:
            r0 = rng.random(n)
        elif kind == 1:  # many ties
            r0 = rng.integers(0, 3, n).astype(np.float64)
        elif kind == 2:  # -inf and ties
            r0 = np.where(rng.random(n) < 0.3, -np.inf, rng.integers(0, 5, n) / 4.0)
        else:  # all equal
            r0 = np.full(n, 0.5)
        live = rng.random(n) < (0.5 if seed % 2 else 1.0)
        n_live = int(live.sum())
        for k in range(n_live + 1):
            a, b = _both(r0, live, k)
            assert np.array_equal(a[:k], b[:k]), (n, k)
            assert all(live[a[:k]]) and len(set(a[:k].tolist())) == k
            assert (a[k:] == -7).all()  # nothing written past k


def test_top_seeds_order_is_score_then_id():
    r0 = np.array([0.2, 0.9, 0.9, -np.inf, 0.5, 0.9])
    live = np.array([True, True, False, True, True, True])
    a, _ = _both(r0, live, 4)
    assert a[:4].tolist() == [1, 5, 4, 0]
    a, _ = _both(r0, live, 5)
    assert a[:5].tolist() == [1, 5, 4, 0, 3]
