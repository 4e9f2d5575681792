"""The compiled backend's two loops (CPU, numba; ``engine.compiled`` runs them over chunks of
queries), one query at a time in cache, composed from the steps' compiled variants.

* :func:`front_loop`, steps 1-3 (after one GEMM per bank for the query-unit cosines): BM25 of the
  bank's units (the query tokens' CSC columns added in token order in float32: bm25s' bits),
  the RRF affinity (``steps.candidates.rrf_row``), best-unit seeds, propagation and the capped
  neighbourhood (``steps.propagation.propagate_one``), the candidates. Its affinity and seeds
  (:func:`front_affinity`) and its neighbourhood and candidates (:func:`front_candidates`) are
  pieces of their own, which ``engine.seeded_front.seeded_loop`` (a shortlist's rounds) calls too.
* :func:`stage_loop`, steps 4-7: gravity (``steps.priority.gravity_one``), the unit features with
  the bridge read off the per-bank table, rho and phi (``steps.roles.unit_roles``), costs and
  priorities, and the lazy greedy (``steps.greedy.lazy_greedy_one``) over J's terms
  (``objective``), with K rows gathered from the per-bank table on first use.

Arguments travel as NamedTuples of arrays (numba passes them as structs:
``engine.compiled_args``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._jit import njit
from ..objective import support_from_cosine_compiled
from ..terms import LAMBDA_M, LAMBDA_R, TAU
from ..steps import candidates as step3, learned_front as step3l, mask as step_mask, roles as step4
from ..steps.greedy.compiled import W_COV, W_ROLE, W_THR, FusedWeights
from ..steps.greedy import CompiledQuery, GreedyScratch, KSource, StopRule, best_of_two_compiled, lazy_greedy_one
from ..steps.priority import gravity_one, unit_cost_compiled
from ..steps.propagation import PropagationParams, ThreadScratch, propagate_one


@njit(cache=True, nogil=True, inline="always")
def _query_mask(x, q, c0, m, vals, bm, ones):  # pragma: no cover - compiled
    """``(live, given)`` of query ``q`` of :func:`front_loop`: with a mask, its failing units hidden
    from the affinity's ranks and maxima (``steps.mask.hide_failing``), ``live`` its entries and no
    given ranks (ranked among the passing units of its units); without, every unit live and the
    ranks ``x.ranks`` gives (a shortlist's, or none)."""
    if x.masked[q]:
        step_mask.hide_failing(vals, bm, x.mask, c0, m)
        return x.mask[c0:c0 + m], step3.given_slice(x.ranks, c0, 0)
    return ones[:m], step3.given_slice(x.ranks, c0, m)


@njit(cache=True, nogil=True, inline="always")
def _graph_threads(x, q, n, tlive):  # pragma: no cover - compiled
    """Query ``q``'s thread graph in ``tlive[:n]`` after ``steps.mask.unit_seeds``: every thread
    without a mask (over a shortlist too: a thread outside it may be reached, then joins it); a
    masked query over a shortlist: ``x.tlive[q]``, the bank's threads with a passing unit (the
    restricted bank's threads); a masked query over its whole bank: those ``unit_seeds`` found."""
    if not x.masked[q]:
        tlive[:n] = True
    elif x.tlive.shape[0] > 0:
        tlive[:n] = x.tlive[q, :n]


class FrontScratch(NamedTuple):
    """:func:`front_loop`'s per-call scratch (:func:`front_scratch`): per unit of the largest bank
    (``N``) and per thread of the largest (``J``)."""

    bm: np.ndarray
    vals: np.ndarray
    alpha: np.ndarray
    rc: np.ndarray
    rb: np.ndarray
    rs: step3.RankScratch
    r0: np.ndarray
    r: np.ndarray
    in_h: np.ndarray
    ts: ThreadScratch
    ones: np.ndarray
    tlive: np.ndarray
    ls: step3l.LearnedScratch


@njit(cache=True, nogil=True)
def front_scratch(N, J, learned, rrf_k):  # pragma: no cover - compiled
    """A :class:`FrontScratch` for banks of at most ``N`` units and ``J`` threads."""
    return FrontScratch(np.empty(N, dtype=np.float32), np.empty(N), np.empty(N), np.empty(N), np.empty(N),
                        step3.RankScratch(np.empty(N, np.int64), np.empty(N, np.int64), np.empty(N, np.int64),
                                          np.empty(max(N + 1, 4 * 257), np.int64)),
                        np.empty(J), np.empty(J), np.empty(J, dtype=np.bool_),
                        ThreadScratch(np.empty(J, np.int64), np.empty(J, np.bool_), np.empty(J, np.int64),
                                      np.empty(J, np.bool_)),
                        np.ones(N, dtype=np.bool_), np.empty(J, dtype=np.bool_),
                        step3l.learned_scratch(N if learned else 0, J if learned else 0, rrf_k))


@njit(cache=True, nogil=True)
def batch_scratch(off, x, learned, rrf_k):  # pragma: no cover - compiled
    """:func:`front_scratch` for the largest bank of the batch ``x`` (:class:`FrontBatch`)."""
    N = J = 1
    for q in range(x.bidx.shape[0]):
        N = max(N, off.nu[x.bidx[q]])
        J = max(J, off.nt[x.bidx[q]])
    return front_scratch(N, J, learned, rrf_k)


@njit(cache=True, nogil=True, inline="always")
def front_affinity(tab, off, x, q, rrf_k, learned, ltab, lq, s):  # pragma: no cover - compiled
    """Step 3's affinity and step 1's seed scores of query ``q`` (:func:`front_loop`): BM25 of its
    units (float32, query-token order), then the RRF or ``learned`` affinity with the cosine ranks;
    ``s.r0[:n]`` each thread's best-unit seed score and ``s.tlive[:n]`` its thread graph. Returns
    ``(live, pmax)``: the units taking part (a filter's mask) and the ``learned`` alpha's ``P``."""
    b = x.bidx[q]
    m = off.nu[b]
    n = off.nt[b]
    nz = off.nz0[b]
    bm = s.bm
    for j in range(m):
        bm[j] = np.float32(0.0)
    for k in range(x.tok_ptr[q], x.tok_ptr[q + 1]):
        t = x.tok_ids[k]
        for e in range(tab.bm_ptr[t], tab.bm_ptr[t + 1]):
            bm[tab.bm_idx[nz + e]] += tab.bm_data[nz + e]
    c0, u0 = x.coff[q], off.uo[b]
    for j in range(m):
        s.vals[j] = x.cos[c0 + j]
    live, given = _query_mask(x, q, c0, m, s.vals, bm, s.ones)  # a filter's mask: failing units hidden
    pmax = 1.0
    if learned:  # the logits; alpha (p / P) only where read: the seeds, the candidates
        step3l.learned_logits(s.vals, m, bm, u0, ltab, lq, q, s.ls, given, live)
        pmax = step3l.learned_seeds(s.ls.logit, m, tab.ult, u0, live, n, s.r0, s.tlive, s.ls.smax)  # step 1
    else:  # positive float32 scores order like their bits
        step3.rrf_row(s.vals, m, bm, bm.view(np.int32), rrf_k, s.alpha, s.rs, s.rc, s.rb, given)
        step_mask.unit_seeds(s.alpha, m, tab.ult, u0, live, n, s.r0, s.tlive)  # step 1: best-unit seed scores (passing units)
    _graph_threads(x, q, n, s.tlive)
    return live, pmax


class Hood(NamedTuple):
    """A query's neighbourhood over its ``n`` threads, as ``propagate_one`` leaves it: ``in_h[:n]``,
    ``r[:n]``; ``tpos[:n]`` is written (each thread's neighbourhood position, -1 outside)."""

    in_h: np.ndarray
    r: np.ndarray
    tpos: np.ndarray


@njit(cache=True, nogil=True, inline="always")
def front_candidates(q, n, ult, live, learned, pmax, s, h, out):  # pragma: no cover - compiled
    """Query ``q``'s neighbourhood (``h``: :class:`Hood` over its ``n`` threads) and its candidates,
    ascending, into ``out`` (:class:`Candidates`, the threads as positions ``0 .. n``); ``ult[j]``:
    the thread of the query's unit ``j``; the alpha from ``s`` (:func:`front_affinity`'s)."""
    k = 0
    for t in range(n):
        if h.in_h[t]:
            if k >= out.hthread.shape[1]:
                raise IndexError("neighbourhood buffer narrower than a query's neighbourhood")
            h.tpos[t] = k
            out.hthread[q, k] = t
            out.rvec[q, k] = h.r[t]
            k += 1
        else:
            h.tpos[t] = -1
    out.n_h[q] = k
    k = 0
    W = out.cand.shape[1]
    for j in range(ult.shape[0]):
        t = ult[j]
        if h.in_h[t] and live[j]:
            if k >= W:  # the caller's bound on |U_q| was wrong: never write past the buffer
                raise IndexError("candidate buffer narrower than a query's candidate set")
            out.cand[q, k] = j
            out.lt[q, k] = h.tpos[t]
            out.alpha[q, k] = step3l.learned_alpha(s.ls.logit[j], pmax) if learned else s.alpha[j]
            k += 1
    out.n_cand[q] = k


@njit(cache=True, nogil=True, error_model="numpy")
def front_loop(tab, off, x, rrf_k, p, sizes, learned, ltab, lq, out):  # pragma: no cover - compiled
    """Steps 1-3 per query (see the module docstring): ``tab`` :class:`FrontTables`, ``off``
    ``tables.Offsets``, ``x`` :class:`FrontBatch`, ``p`` ``PropagationParams`` of the method with
    each query's sizes from ``sizes`` (``propagation.QuerySizes``); the ``learned``
    affinity instead of RRF when ``learned`` (``ltab`` / ``lq``: ``relevance.LearnedTables`` /
    ``LearnedQueries``); writes ``out`` (:class:`Candidates`)."""
    s = batch_scratch(off, x, learned, lq.rrf_k)
    for q in range(x.bidx.shape[0]):
        b = x.bidx[q]
        live, pmax = front_affinity(tab, off, x, q, rrf_k, learned, ltab, lq, s)
        # step 2: propagation and the capped neighbourhood; step 3: the candidates
        pq = PropagationParams(sizes.n_seeds[q], sizes.cap[q], sizes.hops[q], p.gamma, p.paper)
        propagate_one(s.r0, off.nt[b], off.to[b], tab.nbr, tab.nbw, pq, s.ts, s.r, s.in_h, s.tlive)
        u0 = off.uo[b]
        front_candidates(q, off.nt[b], tab.ult[u0:u0 + off.nu[b]], live, learned, pmax, s, Hood(s.in_h, s.r, out.tpos[q]),
                         out)


@njit(cache=True, nogil=True, error_model="numpy")
def stage_loop(tab, off, x, p, qt, sel, n_sel):  # pragma: no cover - compiled
    """Steps 4-7 per query (see the module docstring): ``tab`` :class:`StageTables`, ``off``
    ``tables.Offsets``, ``x`` :class:`StageBatch`, ``p`` :class:`StageParams`, ``qt``
    ``pool.QueryTables`` (K and the bridge of the queries whose bank has no tables); a masked query
    of a bank with tables whose mask cut a thread reads its bridge from ``x.bridge`` (``x.own``,
    ``engine.masks.stage_bridge``); writes the picks (candidate slots) to ``sel [Qc, B]`` and their
    number to ``n_sel``."""
    Q, U = x.cand.shape
    T = x.hthread.shape[1]
    R = x.Mq.shape[1]
    F = x.Mq.shape[2]
    U1, T1 = max(U, 1), max(T, 1)
    rho = np.empty((U1, R))
    pq = np.empty(U1)
    um = np.empty(U1)
    bound = np.empty(U1)
    kub = np.empty(max(U * T, 1))
    Dh = np.empty((T1, T1))
    grav = np.empty(T1)
    mass = np.empty(T1)
    hrows = np.empty(T1, np.int64)
    hcol = np.empty(T1, np.int64)  # boff + each neighbourhood thread (the bridge table's columns)
    f = np.empty((U1, F))  # each candidate's features (one row per unit)
    lg = np.empty(R)
    gs = GreedyScratch(np.empty(U1 * U1), np.empty(U1), np.empty(max(R, 1)), np.empty(U1), np.empty(U1, np.int64),
                       np.empty(U1, np.int64), np.zeros(U1, np.bool_), np.zeros(T1, np.bool_), np.empty(U1),
                       np.zeros(T1, np.bool_))
    uc = np.ones(U1)
    hc = np.zeros(T1)
    kpos = np.zeros(T1, np.int64)
    hkey = np.zeros(U1, np.int64)
    prev_run = -1
    other = np.empty(sel.shape[1], np.int64)
    mark = np.zeros(U1, np.bool_)
    iota = np.arange(U1)
    klocal, no_local = np.zeros(U1, np.bool_), np.zeros(0, np.bool_)
    t0, t1 = np.zeros(T1, np.int64), np.zeros(T1, np.int64)
    no_support = p.identity or not p.cross_thread  # K is 0 across threads: no bound from the other threads
    links = not p.identity  # a unit with a support link (a fact, its source) may have K = 1 in any thread
    k_shift = p.k_shift
    for q in range(Q):
        n = x.n_cand[q]
        lim = x.limit[q]
        if n <= 0 or lim <= 0:
            continue
        b = x.bidx[q]
        nt = x.n_h[q]
        w = x.W[q]
        capacity = x.capacity[q]
        tokens = capacity < np.inf
        lam_m, lam_r, tau = w[LAMBDA_M], w[LAMBDA_R], w[TAU]
        uo, boff, jb = off.uo[b], off.boff[b], off.nt[b]  # the bank's rows (locals: loaded once per query)
        cq = x.cand[q, :n]
        pooled = qt.bq_off[q] >= 0  # K and the bridge formed from the candidates (pool.py), not read off tables
        # steps 5-6: gravity of each neighbourhood thread
        for i in range(nt):
            hrows[i] = off.to[b] + x.hthread[q, i]
        gravity_one(nt, hrows, x.tpos[q], tab.graph, x.rvec[q], tau, p.c_hop, p.cross_thread, Dh, grav)
        for k in range(nt):
            mass[k] = 0.0
        # step 4: features (bridge from the table), rho, phi; steps 5-6: cost and capped weight
        kappa = 1.0 / max(1, x.budget[q])
        wsum = 0.0
        table_only = no_support and not pooled  # the bridge alone, read off the bank's table
        if table_only:
            for j in range(nt):
                hcol[j] = boff + x.hthread[q, j]
        for u in range(n):
            gl = uo + cq[u]
            t = x.lt[q, u]
            brow = boff + cq[u] * jb
            br = -np.inf
            if table_only:  # the loop below without its branches: the same maximum (a selection)
                crow = cq[u] * jb
                for j in range(nt):
                    c = tab.btab[crow + hcol[j]]
                    if j != t and c > br:
                        br = c
            else:
                kr = kub[u * T:(u + 1) * T]  # K(u, v) <= kr[j] for every unit v of neighbourhood thread j
                for j in range(nt):
                    if j != t:
                        c = qt.bq[qt.bq_off[q] + u * nt + j] if pooled else tab.btab[brow + x.hthread[q, j]]
                        if c > br:
                            br = c
                        if not no_support:
                            kr[j] = 1.0 if links and tab.linked[gl] > 0 else support_from_cosine_compiled(c, k_shift)
                    else:
                        kr[j] = 1.0
            br = x.bridge[q, u] if x.own[q] else (0.0 if br == -np.inf else min(max(br, 0.0), 1.0))
            fu = f[u]
            fu[0] = 1.0
            fu[1] = x.alpha[q, u]
            fu[2] = x.rvec[q, t]
            fu[3] = br
            fu[4] = tab.head_sim[gl]
            fu[5] = tab.temporal[gl]
            fu[6] = tab.position[gl]
        # rho, phi, cost and capped weight in a pass of their own: fused with the loop above, the
        # compiled loop ran markedly slower (benchmarks/results/select_profile_cpu50.md)
        for u in range(n):
            gl = uo + cq[u]
            t = x.lt[q, u]
            phi = step4.unit_roles(f[u], x.Mq, x.delta, q, p.T_R, lg, rho, u)
            cost = unit_cost_compiled(tab.d_in[gl], x.alpha[q, u], phi, lam_m, lam_r)
            wu = min(kappa, grav[t] * np.exp(-cost / tau))
            pq[u] = wu
            wsum += wu
        for u in range(n):
            pq[u] = pq[u] / wsum if wsum > 0 else 0.0
            mass[x.lt[q, u]] += pq[u]
        all_mass = 0.0  # sum_j mass[j] * 1.0 in j's order: the bound of a unit with K = 1 in every thread
        if no_support and links:  # the one case that reads it (below)
            for j in range(nt):
                all_mass += mass[j] * 1.0
        for u in range(n):
            um[u] = mass[x.lt[q, u]]
            if p.identity:
                bound[u] = pq[u]
            elif no_support:  # K's row bound is 1 in its own thread, else 1 (a link) or 0: the sum
                # below, term by term, adds mass[j] (or 0.0) in j's order, so it equals these bits
                bound[u] = all_mass if links and tab.linked[uo + cq[u]] > 0 else um[u]
            else:
                ub = 0.0
                for j in range(nt):
                    ub += mass[j] * kub[u * T + j]
                bound[u] = ub
        # step 7: the lazy greedy over J (under a token budget: the cost-aware greedy)
        if tokens:
            for u in range(n):
                uc[u] = tab.tok_unit[uo + cq[u]]
            for j in range(nt):  # heading keys: the first neighbourhood thread of each heading run
                hc[j] = tab.tok_head[off.to[b] + x.hthread[q, j]]
                run = tab.tok_hrun[off.to[b] + x.hthread[q, j]]
                kpos[j] = j if (j == 0 or run != prev_run) else kpos[j - 1]
                prev_run = run
            for u in range(n):
                hkey[u] = kpos[x.lt[q, u]]
        if pooled:
            ks = KSource(qt.kq, qt.kq_off[q], n, iota, p.identity, no_local, t0, t1)
        else:  # without cross-thread support an unlinked unit's K row is 0 outside its thread
            kl = klocal[:n] if no_support and not p.identity else no_local
            if kl.shape[0] > 0:
                for j in range(nt):
                    t0[j] = n
                    t1[j] = 0
                for u in range(n):
                    t = x.lt[q, u]
                    t0[t] = min(t0[t], u)
                    t1[t] = u + 1
                    kl[u] = not (links and tab.linked[uo + cq[u]] > 0)
            ks = KSource(tab.ktab, off.koff[b], off.nu[b], cq, p.identity, kl, t0, t1)
        cw = FusedWeights(w[W_COV], w[W_ROLE], w[W_THR])
        rule = StopRule(lim, p.stop_coverage, lim, None)
        g = CompiledQuery(pq[:n], rho[:n], x.delta[q], x.modular[q, :n], x.lt[q, :n], um[:n], bound[:n], ks, cw,
                          rule, uc[:n], hc[:nt], capacity, tokens and p.keys != 0, hkey[:n])
        if tokens and p.keys < 0:
            g0 = CompiledQuery(pq[:n], rho[:n], x.delta[q], x.modular[q, :n], x.lt[q, :n], um[:n], bound[:n], ks,
                               cw, rule, uc[:n], hc[:nt], capacity, False, hkey[:n])
            n_sel[q] = best_of_two_compiled(g0, g, gs, sel[q], other, mark)
        else:
            n_sel[q] = lazy_greedy_one(g, gs, sel[q])
