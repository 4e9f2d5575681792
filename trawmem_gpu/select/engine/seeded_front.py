"""The shortlist's front loop with each query's thread space grown from its seeds (``shortlist.py``,
step 3; :data:`SEEDED`), the same candidates as :func:`compiled_loops.front_loop` over the space
``assembly._assemble`` builds.

That space holds every thread within the query's ``hops`` of any thread of its working set ``W``
(1,573 threads at 10^6 synthetic units, from 180 of ``W``'s own): propagation might start at any
of them. It starts at the ``n_seeds`` best, though, and their choice needs only ``W``'s threads:
a thread without a unit of ``W`` has no seed score (``-inf``). So per query, one compiled pass:

1. the affinity and seed scores over ``W``'s own threads (``front_affinity``, over the space
   ``assembly._assemble`` builds with ``hops`` 0: ``W``'s threads, and the bank's lowest when ``W``
   has fewer threads than seeds);
2. the seeds among them (``propagation.top_seeds``); when there are ``n_seeds`` of finite score (every
   unmasked query with as many threads as seeds), they are the seeds over the whole space too (its
   other threads score ``-inf``), so the space is grown from them: the threads within ``hops`` of the
   seeds (a breadth-first walk of the bank's thread table, :func:`assembly._walk`) with ``W``'s
   own, renumbered in bank order, edges only for the threads fewer than ``hops`` from a seed (the
   rows propagation reads). Otherwise (fewer seeds of finite score: a mask, a small ``W``) it is grown
   from every thread of ``W``: ``assembly._assemble``'s space;
3. propagation, the neighbourhood and the candidates over that space (``propagate_one``,
   ``front_candidates``), the neighbourhood written as bank-local threads.

Propagation reads only rows of threads fewer than ``hops`` edges from a seed, and every thread it
reaches is within ``hops`` of one, so both spaces give it the same rows in the same order (threads
keep their bank order): the neighbourhood, its ``r~`` and the candidates are equal, bit for bit
(``tests/select/test_seeded_front.py`` against ``front_loop``). At 10^6 units the space holds
about 250 threads instead of 1,573.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._jit import njit
from ..steps.propagation import PropagationParams, ThreadScratch, propagate_one, top_seeds
from . import assembly
from .assembly import _bigger, _renumbered, _walk
from .compiled_loops import Hood, batch_scratch, front_affinity, front_candidates

SEEDED = True
"""The shortlist's front rounds grow each query's thread space from its seeds (:func:`seeded_loop`);
False: from every thread of its working set (``assembly.front_args`` and ``front_loop``, the
same candidates)."""


class Space(NamedTuple):
    """What :func:`seeded_loop` grows each query's thread space from."""

    nbr: np.ndarray
    """The snapshot's thread table (global rows, packed: ``assembly.packed_length``) ..."""
    nbw: np.ndarray
    """... and its edge weights."""
    g0: np.ndarray
    """``[Q]`` the first global thread of each query's bank."""
    own: np.ndarray
    """Flat: query ``q``'s own threads (bank-local, ascending; the ``hops``-0 space of
    ``assembly._assemble``) at ``off.to[q] : off.to[q] + off.nt[q]``."""
    tlive: np.ndarray
    """``[Q, J]`` the bank's threads with a unit a masked query's mask passes
    (``shortlist.live_threads``); ``[0, 0]`` when no query is masked."""
    level: np.ndarray
    """At least the largest bank's threads, all -1 (``assembly.levels``), left so."""
    sizes: object
    """``propagation.QuerySizes``: each query's ``n_seeds``, ``cap`` and ``hops``."""


def space(snap, bidx: np.ndarray, own: list, tlive: np.ndarray, sizes) -> Space:
    """The :class:`Space` of a front round whose own threads per query are ``own`` (``(ids, ...)``
    of ``assembly.front_args`` with ``hops`` 0), ``tlive`` of ``shortlist.live_threads``."""
    ids = np.concatenate([o[0] for o in own]).astype(np.int64, copy=False) if own else np.zeros(0, np.int64)
    n = snap.np
    return Space(n["nbr"], n["nbw"], snap.off.to[bidx].astype(np.int64), ids, tlive,
                 assembly.levels(int(snap.off.nt[bidx].max()) if len(bidx) else 0), sizes)


def run(tab, off, x, rrf_k, p, sp: Space, learned, ltab, lq, out) -> None:
    """:func:`seeded_loop`, the calling thread's level array dropped if it is cut short."""
    try:
        seeded_loop(tab, off, x, rrf_k, p, sp, learned, ltab, lq, out)
    except BaseException:
        assembly.drop_levels()
        raise


@njit(cache=True, nogil=True, error_model="numpy")
def seeded_loop(tab, off, x, rrf_k, p, sp, learned, ltab, lq, out):  # pragma: no cover - compiled
    """``front_loop``'s steps 1-3 over shortlists (module docstring): ``tab`` ``FrontTables`` with
    ``ult`` positions in each query's own threads ``sp.own``; ``sp``: :class:`Space`; writes
    ``out`` (``Candidates``; ``hthread`` as bank-local threads, ``tpos`` unwritten)."""
    s = batch_scratch(off, x, learned, lq.rrf_k)
    for q in range(x.bidx.shape[0]):
        b = x.bidx[q]
        n, u0, m = off.nt[b], off.uo[b], off.nu[b]
        live, pmax = front_affinity(tab, off, x, q, rrf_k, learned, ltab, lq, s)
        pq = PropagationParams(sp.sizes.n_seeds[q], sp.sizes.cap[q], sp.sizes.hops[q], p.gamma, p.paper)
        own = sp.own[off.to[b]:off.to[b] + n]
        ids, local, w, at = _grown(sp, q, own, tab.ult[u0:u0 + m], _seeds(s, n, pq.n_seeds), pq.hops)
        n2 = len(ids)
        r0, tlive, ult = np.full(n2, -np.inf), np.ones(n2, np.bool_), np.empty(m, np.int64)
        for i in range(n):  # the own threads' scores and graph at their places in the grown space
            r0[at[i]] = s.r0[i]
        if x.masked[q] and sp.tlive.shape[0] > 0:
            for i in range(n2):
                tlive[i] = sp.tlive[q, ids[i]]
        elif x.masked[q]:  # over its whole bank: the threads of its passing units (unit_seeds')
            tlive[:] = False
            for i in range(n):
                tlive[at[i]] = s.tlive[i]
        for j in range(m):
            ult[j] = at[tab.ult[u0 + j]]
        h = Hood(np.empty(n2, np.bool_), np.empty(n2), np.empty(n2, np.int64))
        ts = ThreadScratch(np.empty(n2, np.int64), np.empty(n2, np.bool_), np.empty(n2, np.int64),
                           np.empty(n2, np.bool_))
        propagate_one(r0, n2, 0, local, w, pq, ts, h.r, h.in_h, tlive)
        front_candidates(q, n2, ult, live, learned, pmax, s, h, out)
        for k in range(out.n_h[q]):
            out.hthread[q, k] = ids[out.hthread[q, k]]


@njit(cache=True, nogil=True)
def _seeds(s, n, k):  # pragma: no cover - compiled
    """The ``k`` seeds among the query's ``n`` own threads (positions), or an empty array when fewer
    than ``k`` of them take part with a finite score (then the seeds may lie outside them)."""
    live = 0
    for i in range(n):
        live += s.tlive[i]
    if live < k:
        return np.empty(0, np.int64)
    seeds = np.empty(k, np.int64)
    top_seeds(s.r0, n, s.tlive, k, seeds)
    for i in range(k):
        if not np.isfinite(s.r0[seeds[i]]):
            return np.empty(0, np.int64)
    return seeds


@njit(cache=True, nogil=True)
def _grown(sp, q, own, ult, seeds, hops):  # pragma: no cover - compiled
    """``(ids, local nbr, local nbw, at)``: the query's thread space (bank-local, ascending), grown
    ``hops`` levels from ``seeds`` (positions in ``own``), or from every own thread holding a unit
    (``ult``) when there are none, with the rest of ``own`` at level ``hops``; its rows renumbered
    as ``assembly._assemble``'s; ``at[i]``: own thread ``i``'s place in it."""
    level, g0 = sp.level, sp.g0[q]
    got = np.empty(max(16, 4 * len(own)), np.int64)
    n = 0
    if len(seeds):
        for i in seeds:
            level[own[i]] = 0
            got[n] = own[i]
            n += 1
    else:
        for t in ult:
            if level[own[t]] < 0:
                level[own[t]] = 0
                got[n] = own[t]
                n += 1
    got, n = _walk(sp.nbr, g0, level, got, n, hops, 0, True)
    for t in own:  # W's other threads (and the bank's lowest, when it has fewer than seeds): no rows read
        if level[t] < 0:
            if n == len(got):
                got = _bigger(got, n)
            level[t] = hops
            got[n] = t
            n += 1
    ids, local, w = _renumbered(sp.nbr, sp.nbw, g0, level, got[:n], hops)
    H = hops + 1
    at = np.empty(len(own), np.int64)
    for i in range(len(own)):
        at[i] = level[own[i]] // H
    for i in range(n):
        level[ids[i]] = -1
    return ids, local, w, at
