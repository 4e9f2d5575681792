"""The working set's cosine ranks in the whole bank (``shortlist.given_ranks``), compiled beside
their plain NumPy form, which states the math and which :data:`COMPILED` off selects; the ranks
are equal (``tests/select/test_ranks.py``), so nothing picked changes.

A unit ``u`` of ``W`` with cosine ``c`` is ranked (from 1, float64):

* with the index's ``H`` proposals (``head``: their exact cosines, non-increasing, ties to the
  lower unit, and their units): ``u``'s place among them when it is one of them (the first place
  when a unit repeats); else 1 + the proposals scoring more than ``c``, plus those tied with it
  of a lower unit;
* without proposals (a masked query's): its place in ``W`` by cosine descending, ties to the
  lower position;
* and when ``c`` is below the ``edge`` (the last proposal's cosine), at least ``1 + n_bank *``
  the share of the rank sample (sorted ascending, float32, compared as float64) above ``c``.

The compiled form counts by merges instead of NumPy's searches, sorts and masks: ``W``'s cosines
in ascending order (NumPy's argsort) against the proposals' cosines and the rank sample (two
ascending runs: each count is where one run's walk stands), and ``W`` (ascending) against the
proposals' units sorted (at 10^6 units, ~1,600 units and 1,024 proposals a round; 1,500 binary
searches in 1,024 and in 4,096 cosines took 60 and 80 us). Non-finite cosines, or ``W`` not
strictly ascending, take the plain form.
"""
from __future__ import annotations

import numpy as np

from .._jit import njit

COMPILED = True
"""``shortlist.given_ranks`` ranks by :func:`_cosine_ranks`; False: by :func:`cosine_ranks_plain`."""


def cosine_ranks(head: np.ndarray, cos: np.ndarray, W: np.ndarray, edge: float, sample: np.ndarray,
                 n_bank: int, by_unit: np.ndarray | None = None) -> np.ndarray:
    """``[len(W)]`` float64: each unit's cosine rank in the bank (module docstring). ``head``:
    ``[2, H]`` (cosines, units as float64); ``cos``: ``W``'s cosines; ``W`` ascending; ``by_unit``:
    a stable argsort of ``head[1]`` when the caller holds one (``shortlist.Shortlist.by_unit``)."""
    c64, hc, w = (np.ascontiguousarray(cos, dtype=np.float64), np.ascontiguousarray(head[0], dtype=np.float64),
                  np.ascontiguousarray(W, dtype=np.int64))
    if not COMPILED or not _finite_ascending(c64, hc, w):
        return cosine_ranks_plain(head, cos, W, edge, sample, n_bank)
    hu = head[1].astype(np.int64)
    return _cosine_ranks(hc, hu, by_unit if by_unit is not None and len(by_unit) == len(hu) else np.argsort(hu, kind="stable"), c64,
                         np.argsort(c64), w, float(edge), np.ascontiguousarray(sample), int(n_bank))


@njit(cache=True, nogil=True)
def _finite_ascending(cos, hc, W):  # pragma: no cover - compiled
    """Whether ``cos`` and ``hc`` are finite and ``W`` strictly ascending (what the compiled form needs)."""
    for x in cos:
        if not np.isfinite(x):
            return False
    for x in hc:
        if not np.isfinite(x):
            return False
    for i in range(1, len(W)):
        if W[i] <= W[i - 1]:
            return False
    return True


def cosine_ranks_plain(head: np.ndarray, cos: np.ndarray, W: np.ndarray, edge: float, sample: np.ndarray,
                       n_bank: int) -> np.ndarray:
    """:func:`cosine_ranks` in NumPy (the reference)."""
    m = len(W)
    rc = np.empty(m)
    if head.shape[1]:  # counted among the index's proposals: those scoring more, then the lower tied ones
        hc, hu = head
        hu = hu.astype(np.int64)
        asc = hc[::-1]
        hi = np.searchsorted(asc, cos, side="right")
        rc[:] = 1.0 + (len(hc) - hi)
        by_unit = np.argsort(hu, kind="stable")
        p = np.minimum(np.searchsorted(hu[by_unit], W), len(hu) - 1)
        found = hu[by_unit[p]] == W
        rc[found] = 1.0 + by_unit[p[found]]  # a proposal: its (first) place in the proposals' order
        tie = (hi - np.searchsorted(asc, cos, side="left") > 0) & ~found
        for j in np.flatnonzero(tie):  # a unit the index missed, tied with a proposal (rare)
            rc[j] += np.count_nonzero((hc == cos[j]) & (hu < W[j]))
    else:
        rc[np.lexsort((np.arange(m), -cos))] = np.arange(1, m + 1)
    past = cos < edge
    if past.any() and len(sample):
        above = len(sample) - np.searchsorted(sample, cos[past], side="right")
        rc[past] = np.maximum(rc[past], 1.0 + n_bank * above / len(sample))
    return rc


@njit(cache=True, nogil=True)
def _cosine_ranks(hc, hu, by_unit, cos, order, W, edge, sample, n_bank):  # pragma: no cover - compiled
    """:func:`cosine_ranks` for finite cosines (``hc`` non-increasing, ``by_unit`` a stable argsort
    of ``hu``, ``order`` an argsort of ``cos``, ``W`` ascending)."""
    m, H, S = len(W), len(hc), len(sample)
    rc = np.empty(m)
    if H:
        asc = hc[::-1]
        hi = np.empty(m, np.int64)  # proposals at most / below each unit's cosine (searchsorted right / left)
        lo = np.empty(m, np.int64)
        a = b = 0
        for r in range(m):  # cosines ascending: both walks only move forward
            c = cos[order[r]]
            while a < H and asc[a] <= c:
                a += 1
            while b < H and asc[b] < c:
                b += 1
            hi[order[r]], lo[order[r]] = a, b
        k = 0
        for i in range(m):
            rc[i] = 1.0 + (H - hi[i])
            while k < H and hu[by_unit[k]] < W[i]:  # W ascending: one merge with the sorted units
                k += 1
            if k < H and hu[by_unit[k]] == W[i]:
                rc[i] = 1.0 + by_unit[k]
            else:
                for j in range(H - hi[i], H - lo[i]):  # tied, of a lower unit
                    if hu[j] < W[i]:
                        rc[i] += 1.0
    else:
        desc = np.argsort(-cos, kind="mergesort")
        for r in range(m):
            rc[desc[r]] = r + 1.0
    if S:
        a = 0
        for r in range(m):  # the sample's values above each cosine below the edge (float32 read as float64)
            i = order[r]
            while a < S and sample[a] <= cos[i]:
                a += 1
            if cos[i] < edge:
                est = 1.0 + n_bank * (S - a) / S
                if est > rc[i]:
                    rc[i] = est
    return rc
