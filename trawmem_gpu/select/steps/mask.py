"""A filter's unit mask inside the steps (``select.restrict`` says what a mask means): the
hooks the compiled front loop calls, one query at a time, where the affinity, the seeds and the
candidates are formed. The torch front applies the same rules with tensor masks
(``engine/tensor.py``: the live-unit mask, ``ult`` and ``tvalid``).

* :func:`hide_failing`: before the affinity, a failing unit's cosine goes below every cosine and
  its BM25 score to 0, so the ``rrf`` and ``learned`` affinities' ranks and maxima, which the
  compiled rows take over the bank's units, are those of the passing units (a stable descending
  sort puts the failing units last; they hold no BM25 rank);
* :func:`unit_seeds`: best-unit seed scores r0 over the passing units, and which threads hold one
  (the others are out of the thread graph for propagation);
* the candidates are the passing units of the neighbourhood's threads (the front loop's test).
"""
from __future__ import annotations

import numpy as np

from .._jit import njit

HIDDEN_COSINE = -4.0
"""The cosine a failing unit takes before the affinity: below every cosine (all lie in [-1, 1]),
finite (the compiled sorts take finite values only)."""


@njit(cache=True, nogil=True)
def hide_failing(vals, bm, mask, c0, m):  # pragma: no cover - compiled
    """``vals[j] = HIDDEN_COSINE`` and ``bm[j] = 0`` for every unit ``j < m`` whose mask entry
    ``mask[c0 + j]`` is False."""
    for j in range(m):
        if not mask[c0 + j]:
            vals[j] = HIDDEN_COSINE
            bm[j] = np.float32(0.0)


@njit(cache=True, nogil=True)
def unit_seeds(alpha, m, ult, u0, live, n, r0, tlive):  # pragma: no cover - compiled
    """Best-unit seed scores: ``r0[t]`` = the largest ``alpha`` of a passing unit (``live``) of
    thread ``t`` (``ult[u0 + j]``: unit ``j``'s bank-local thread), ``-inf`` for a thread without
    one; ``tlive[t]``: the thread holds a passing unit."""
    for t in range(n):
        r0[t] = -np.inf
        tlive[t] = False
    for j in range(m):
        if live[j]:
            t = ult[u0 + j]
            tlive[t] = True
            if alpha[j] > r0[t]:
                r0[t] = alpha[j]
