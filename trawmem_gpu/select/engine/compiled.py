"""The compiled backend (CPU, numba): two loops over a chunk of queries, one query at a time in
cache, composed from the steps' compiled variants.

* :func:`front_loop`, steps 1-3 (after one GEMM per bank for the query-unit cosines): BM25 of the
  bank's units (the query tokens' CSC columns added in token order in float32: bm25s' bits),
  the RRF affinity (``steps.candidates.rrf_row``), best-unit seeds, propagation and the capped
  neighbourhood (``steps.propagation.propagate_one``), the candidates.
* :func:`stage_loop`, steps 4-7: gravity (``steps.priority.gravity_one``), the unit features with
  the bridge read off the per-bank table, rho and phi (``steps.roles.unit_roles``), costs and
  priorities, and the lazy greedy (``steps.greedy.lazy_greedy_one``) over J's terms
  (``objective``), with K rows gathered from the per-bank table on first use.

Arguments travel as NamedTuples of arrays (numba passes them as structs). Queries run grouped by
bank (a stable sort: one GEMM per bank over a contiguous block of rows, the bank's tables stay in
cache through its queries), in chunks; the calling thread first does the text work of every chunk
(question tokens, demand features: Python, under the GIL), then the chunks run, on worker threads
when ``threads > 1`` (the GEMMs and the compiled loops release the GIL). The tensor backend's
steps are the specification these loops are tested against.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .._jit import njit
from ..objective import support_from_cosine_compiled
from ..terms import LAMBDA_M, LAMBDA_R, TAU
from ..steps import candidates as step3, mask as step_mask, relevance as step3r, roles as step4
from ..steps.greedy.compiled import W_COV, W_ROLE, W_THR, FusedWeights
from ..steps.greedy import CompiledQuery, GreedyScratch, KSource, StopRule, best_of_two_compiled, lazy_greedy_one
from ..steps.priority import gravity_one, unit_cost_compiled
from ..steps.propagation import PropagationParams, ThreadScratch, propagate_one, propagation_params, query_sizes
from .batch import QueryBatch, Timer
from . import shortlist
from .compiled_args import (Candidates, FrontBatch, FrontTables, StageBatch, front_tables,  # noqa: F401
                            stage_batch, stage_params, stage_tables)
from .masks import front_masks, roles_count, stage_bridge
from .pool import POOL_ELEMS, query_tables, stage_parts
from .tables import Snapshot

FRONT_ROWS = 1 << 20
"""Compiled front: queries per chunk x largest bank (bounds the ``[Qc, N]`` cosine buffer)."""


# ----------------------------------------------------------------------------------------------
# the loops
# ----------------------------------------------------------------------------------------------
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


@njit(cache=True, nogil=True, error_model="numpy")
def front_loop(tab, off, x, rrf_k, p, sizes, learned, ltab, lq, out):  # pragma: no cover - compiled
    """Steps 1-3 per query (see the module docstring): ``tab`` :class:`FrontTables`, ``off``
    ``tables.Offsets``, ``x`` :class:`FrontBatch`, ``p`` ``PropagationParams`` of the method with
    each query's sizes from ``sizes`` (``propagation.QuerySizes``); the ``learned``
    affinity instead of RRF when ``learned`` (``ltab`` / ``lq``: ``relevance.LearnedTables`` /
    ``LearnedQueries``); writes ``out`` (:class:`Candidates`)."""
    Q = x.bidx.shape[0]
    N = J = 1
    for q in range(Q):
        N = max(N, off.nu[x.bidx[q]])
        J = max(J, off.nt[x.bidx[q]])
    bm = np.empty(N, dtype=np.float32)
    bmbits = bm.view(np.int32)  # positive float32 scores order like their bits
    vals = np.empty(N)
    alpha = np.empty(N)
    rc = np.empty(N)
    rb = np.empty(N)
    rs = step3.RankScratch(np.empty(N, np.int64), np.empty(N, np.int64), np.empty(N, np.int64),
                           np.empty(max(N + 1, 4 * 257), np.int64))
    r0 = np.empty(J)
    r = np.empty(J)
    in_h = np.empty(J, dtype=np.bool_)
    ts = ThreadScratch(np.empty(J, np.int64), np.empty(J, np.bool_), np.empty(J, np.int64), np.empty(J, np.bool_))
    ones, tlive = np.ones(N, dtype=np.bool_), np.empty(J, dtype=np.bool_)
    W = out.cand.shape[1]
    for q in range(Q):
        b = x.bidx[q]
        m = off.nu[b]
        n = off.nt[b]
        nz = off.nz0[b]
        # step 3, affinity: BM25 (float32, query-token order), then RRF with the cosine ranks
        for j in range(m):
            bm[j] = np.float32(0.0)
        for k in range(x.tok_ptr[q], x.tok_ptr[q + 1]):
            t = x.tok_ids[k]
            for e in range(tab.bm_ptr[t], tab.bm_ptr[t + 1]):
                bm[tab.bm_idx[nz + e]] += tab.bm_data[nz + e]
        c0, u0 = x.coff[q], off.uo[b]
        for j in range(m):
            vals[j] = x.cos[c0 + j]
        live, given = _query_mask(x, q, c0, m, vals, bm, ones)  # a filter's mask: failing units hidden
        if learned:
            step3r.learned_row(vals, m, bm, bmbits, u0, ltab, lq, q, alpha, rs, rc, rb, given, live)
        else:
            step3.rrf_row(vals, m, bm, bmbits, rrf_k, alpha, rs, rc, rb, given)
        step_mask.unit_seeds(alpha, m, tab.ult, u0, live, n, r0, tlive)  # step 1: best-unit seed scores (passing units)
        _graph_threads(x, q, n, tlive)
        # step 2: propagation and the capped neighbourhood
        pq = PropagationParams(sizes.n_seeds[q], sizes.cap[q], sizes.hops[q], p.gamma, p.paper)
        propagate_one(r0, n, off.to[b], tab.nbr, tab.nbw, pq, ts, r, in_h, tlive)
        k = 0
        for t in range(n):
            if in_h[t]:
                if k >= out.hthread.shape[1]:
                    raise IndexError("neighbourhood buffer narrower than a query's neighbourhood")
                out.tpos[q, t] = k
                out.hthread[q, k] = t
                out.rvec[q, k] = r[t]
                k += 1
            else:
                out.tpos[q, t] = -1
        out.n_h[q] = k
        # step 3: the candidates, ascending
        k = 0
        for j in range(m):
            t = tab.ult[u0 + j]
            if in_h[t] and live[j]:
                if k >= W:  # the caller's bound on |U_q| was wrong: never write past the buffer
                    raise IndexError("candidate buffer narrower than a query's candidate set")
                out.cand[q, k] = j
                out.lt[q, k] = out.tpos[q, t]
                out.alpha[q, k] = alpha[j]
                k += 1
        out.n_cand[q] = k


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
    f = np.empty(F)
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
        for u in range(n):
            gl = uo + cq[u]
            t = x.lt[q, u]
            brow = boff + cq[u] * jb
            br = -np.inf
            kr = kub[u * T:(u + 1) * T]  # K(u, v) <= kr[j] for every unit v of neighbourhood thread j
            for j in range(nt):
                if j != t:
                    c = qt.bq[qt.bq_off[q] + u * nt + j] if pooled else tab.btab[brow + x.hthread[q, j]]
                    if c > br:
                        br = c
                    kr[j] = 1.0 if links and tab.linked[gl] > 0 else 0.0 if no_support else support_from_cosine_compiled(c, k_shift)
                else:
                    kr[j] = 1.0
            br = x.bridge[q, u] if x.own[q] else (0.0 if br == -np.inf else min(max(br, 0.0), 1.0))
            f[0] = 1.0
            f[1] = x.alpha[q, u]
            f[2] = x.rvec[q, t]
            f[3] = br
            f[4] = tab.head_sim[gl]
            f[5] = tab.temporal[gl]
            f[6] = tab.position[gl]
            phi = step4.unit_roles(f, x.Mq, x.delta, q, p.T_R, lg, rho, u)
            cost = unit_cost_compiled(tab.d_in[gl], x.alpha[q, u], phi, lam_m, lam_r)
            wu = min(kappa, grav[t] * np.exp(-cost / tau))
            pq[u] = wu
            wsum += wu
        for u in range(n):
            pq[u] = pq[u] / wsum if wsum > 0 else 0.0
            mass[x.lt[q, u]] += pq[u]
        for u in range(n):
            um[u] = mass[x.lt[q, u]]
            if p.identity:
                bound[u] = pq[u]
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
            ks = KSource(qt.kq, qt.kq_off[q], n, iota, p.identity)
        else:
            ks = KSource(tab.ktab, off.koff[b], off.nu[b], cq, p.identity)
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


# ----------------------------------------------------------------------------------------------
# orchestration
# ----------------------------------------------------------------------------------------------
def run_stage(snap: Snapshot, cfg, x: StageBatch) -> tuple[np.ndarray, np.ndarray]:
    """:func:`stage_loop` on one chunk: ``(sel [Qc, B] candidate slots (-1 pad), n_sel [Qc])``."""
    Q = len(x.bidx)
    width = max(1, int(x.limit.max()) if Q else 1)  # B_q <= |U_q|: the pool sizes it, never B alone
    sel = np.full((Q, width), -1, dtype=np.int64)
    n_sel = np.zeros(Q, dtype=np.int64)
    tab = snap.lazy("stage_tables", lambda: stage_tables(snap))
    for a, b in stage_parts(snap, x.bidx, x.n_cand, POOL_ELEMS):  # K formed per query: bounded parts
        part = x if (a, b) == (0, Q) else StageBatch(*(f[a:b] for f in x))
        stage_loop(tab, snap.off, part, stage_params(cfg), query_tables(snap, cfg, x, a, b), sel[a:b], n_sel[a:b])
    return sel, n_sel


def select(snap: Snapshot, plan, cfg, head, batch: QueryBatch, pool, timer: Timer) -> list[list[int]]:
    """All steps with the compiled front and stage (see the module docstring); picks per query in
    input order. ``pool``: a thread pool for ``plan.threads > 1`` workers, or None."""
    Q = len(batch)
    out: list[list[int] | None] = [None] * Q
    timer.lap("text")  # (input checks)
    t0 = time.perf_counter()
    texts = _texts(snap, plan, cfg, head, batch)
    timer.out["text"] = timer.out.get("text", 0.0) + time.perf_counter() - t0
    Zn = batch.Z.numpy()
    pending = [_chunk(snap, plan, cfg, batch, Zn, *t) if pool is None else pool.submit(_chunk, snap, plan, cfg, batch,
                                                                                       Zn, *t) for t in texts]
    t0 = None
    for item in pending:
        rows, picks, times = item if pool is None else item.result()
        t0 = t0 or time.perf_counter()
        for q, units in zip(rows.tolist(), picks):
            out[q] = units
        timer.add(times)
    timer.out["output"] = timer.out.get("output", 0.0) + time.perf_counter() - (t0 or time.perf_counter())
    return out  # type: ignore[return-value]


def candidates(snap: Snapshot, plan, cfg, head, batch: QueryBatch) -> list[np.ndarray]:
    """Steps 1-3 only, as :func:`select` runs them: each query's candidates (bank-local, ascending)."""
    out: list = [None] * len(batch)
    Zn = batch.Z.numpy()
    for rows, cols, _demand, lq in _texts(snap, plan, cfg, head, batch):
        c, _ = _front(snap, plan, cfg, batch, Zn, rows, cols, lq, lambda name: None)
        for i, q in enumerate(rows.tolist()):
            out[q] = np.sort(c.cand[i, :c.n_cand[i]])
    return out


def _texts(snap: Snapshot, plan, cfg, head, batch: QueryBatch) -> list[tuple]:
    """The batch in chunks (bank-sorted; the banks searched over a shortlist in chunks of their
    own) with each chunk's text work: ``(rows, BM25 columns, demand, learned cues)``."""
    Q = len(batch)
    approx = _approximate(snap, plan, batch.bidx)  # banks searched over a shortlist (shortlist.py) run apart
    order = np.lexsort((batch.bidx, approx))
    chunk = max(1, FRONT_ROWS // max(1, int(snap.off.nu[batch.bidx].max())))  # the batch's banks, not the largest stored
    workers = max(1, min(plan.threads, Q))
    if workers > 1:
        chunk = min(chunk, max(16, -(-Q // (4 * workers))))
    n_exact = int((~approx).sum())
    cuts = sorted(set(range(0, n_exact, chunk)) | set(range(n_exact, Q, max(chunk, 64))))
    bm = snap.bm25
    texts = []
    for s, e in zip(cuts, cuts[1:] + [Q]):
        rows = order[s:e]
        qtext = [batch.questions[i] for i in rows.tolist()]
        ptr, ids, _slow = step3.bm25_columns(batch.bidx[rows].tolist(), qtext, bm.vocabs, bm.plain, bm.store.col0)
        texts.append((rows, (ptr, ids), step4.demand(qtext, cfg, head), _learned_queries(snap, cfg, batch, rows, qtext)))
    return texts


def _approximate(snap: Snapshot, plan, bidx: np.ndarray) -> np.ndarray:
    """``[Q]`` bool: the query's bank is searched over a shortlist (``EngineConfig.ann_min_units``)."""
    if plan.ann_min_units is None:
        return np.zeros(len(bidx), dtype=bool)
    return snap.off.nu[bidx] >= plan.ann_min_units


def _learned_queries(snap: Snapshot, cfg, batch: QueryBatch, rows: np.ndarray, qtext: list[str]):
    """The ``learned`` affinity's question cues of a chunk (text work, on the calling thread), or
    an empty one for the ``rrf`` affinity."""
    if cfg.affinity != "learned":
        e = np.zeros(0)
        return step3r.LearnedQueries(e, np.zeros(0, np.int64), e, e, np.zeros(0, np.int64), e, 0.0)
    off, attrs = snap.off, snap.np["attrs"]
    b = batch.bidx[rows]
    return step3r.learned_queries(qtext, [snap.infos[int(x)].speakers for x in b],
                                  [attrs[off.uo[x]:off.uo[x] + off.nu[x], 0] for x in b], batch.now[rows], cfg)


def _chunk(snap: Snapshot, plan, cfg, batch: QueryBatch, Zn: np.ndarray, rows: np.ndarray, cols, demand, lq):
    """One chunk of :func:`select` (``rows``: query indices, bank-sorted): :func:`_front`, then
    :func:`stage_loop`. Returns ``(rows, picks, stage seconds)``."""
    times: dict[str, float] = {}
    t0 = time.perf_counter()

    def lap(name):
        nonlocal t0
        now = time.perf_counter()
        times[name] = times.get(name, 0.0) + now - t0
        t0 = now

    c, sz = _front(snap, plan, cfg, batch, Zn, rows, cols, lq, lap)
    delta, Mq, W = demand
    bidx = batch.bidx[rows]
    cc = dict(c._asdict(), bidx=bidx)
    masked = (np.zeros(len(rows), dtype=bool) if batch.masks is None
              else np.array([batch.masks[q] is not None for q in rows.tolist()], dtype=bool))
    if masked.any():  # a mask may cut a thread of a bank with tables: those queries' bridge from their candidates
        cc.update(stage_bridge(snap, cc, masked & roles_count(W)))
    sb = stage_batch(snap, cfg, cc, Mq, delta, W, batch.now[rows], sz["unit_cap"], sz["pool"], sz["capacity"])
    sel, n_sel = run_stage(snap, cfg, sb)
    lap("select")
    # sel's -1 padding reads slot 0 here and is cut off below: one gather, one conversion
    got = np.take_along_axis(c.cand, np.maximum(sel, 0), axis=1).tolist()
    picks = [g[:k] for g, k in zip(got, n_sel.tolist())]
    lap("output")
    return rows, picks, times


def _front(snap: Snapshot, plan, cfg, batch: QueryBatch, Zn: np.ndarray, rows: np.ndarray, cols, lq, lap):
    """Steps 1-3 of a chunk: the cosines (one GEMM per bank, or per-query dots when banks average
    fewer than 8 queries) and :func:`front_loop`, or for large banks the shortlist's front
    (:func:`_front_shortlist`). Returns ``(Candidates with bank-local units, the chunk's sizes)``."""
    off = snap.off
    bidx = batch.bidx[rows]
    Qc = len(rows)
    approx = bool(_approximate(snap, plan, bidx[:1])[0])  # a chunk is all exact or all approximate
    if not approx:
        cos, coff = _similarity(snap, plan, bidx, np.ascontiguousarray(Zn[rows]))
        lap("similarity")
    J = int(off.nt[bidx].max())
    sz = {k: v[rows] for k, v in batch.sizes.items()}  # the chunk's per-query sizes
    threads = sz["threads"]  # most neighbourhood threads of each query
    T = max(1, min(J, int(threads.max())))
    Ub = max(1, int(snap.unit_cap(bidx, threads).max()))  # most candidates any of these queries can have
    # the front loop writes every entry a later step reads; alpha's padding goes through J's modular part
    c = Candidates(cand=np.empty((Qc, Ub), np.int64), n_cand=np.empty(Qc, np.int64), lt=np.empty((Qc, Ub), np.int64),
                   alpha=np.zeros((Qc, Ub)), hthread=np.empty((Qc, T), np.int64), rvec=np.empty((Qc, T)),
                   n_h=np.empty(Qc, np.int64), tpos=np.empty((Qc, J), np.int64))
    pp, qs = propagation_params(cfg, batch.params[int(rows[0])], J), query_sizes(sz["n_seeds"], sz["cap"], sz["hops"], J)
    masks = None if batch.masks is None else [batch.masks[q] for q in rows.tolist()]
    if approx:
        _front_shortlist(snap, plan, cfg, np.ascontiguousarray(Zn[rows]), bidx, (cols, lq), (pp, qs), c, lap, masks)
    else:
        x = FrontBatch(bidx, cos, coff, *cols, *front_masks(masks, np.arange(Qc), off.nu[bidx], coff))
        front_loop(snap.lazy("front_tables", lambda: front_tables(snap)), off, x, float(cfg.rrf_k), pp, qs,
                   cfg.affinity == "learned", snap.lazy("learned_tables", lambda: step3r.learned_tables(snap.np)),
                   lq, c)
    lap("localize")
    return c, sz


def _similarity(snap: Snapshot, plan, bidx: np.ndarray, Zc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chunk's query-unit cosines over each query's whole bank, flat (``FrontBatch.cos``), and
    each query's offset: one GEMM per bank, or per-query dots when banks average fewer than 8 queries."""
    off = snap.off
    Qc = len(bidx)
    nu = off.nu[bidx]
    coff = np.zeros(Qc, dtype=np.int64)
    np.cumsum(nu[:-1], out=coff[1:])
    cos = np.empty(int(nu.sum()))
    cut = np.flatnonzero(np.diff(bidx)) + 1
    starts, ends = np.concatenate([[0], cut]), np.concatenate([cut, [Qc]])
    if plan.sim == "dots" or (plan.sim == "auto" and len(starts) * 8 > Qc):
        step3.own_dots(Zc, snap.np["unit_vecs"], off.uo, off.nu, bidx, coff, cos)
    else:
        Zc_t, vecs = torch.from_numpy(Zc), snap.t["unit_vecs"]
        for a, e in zip(starts.tolist(), ends.tolist()):
            n, uo, o = int(nu[a]), int(off.uo[bidx[a]]), int(coff[a])
            torch.mm(Zc_t[a:e], vecs[uo:uo + n].T, out=torch.from_numpy(cos[o:o + (e - a) * n]).view(e - a, n))
    return cos, coff


def _front_shortlist(snap: Snapshot, plan, cfg, Zc: np.ndarray, bidx: np.ndarray, text: tuple, sizes, c: Candidates,
                     lap, masks: list | None = None) -> None:
    """Steps 1-3 of a chunk of queries on large banks over their working sets (``shortlist.py``):
    :func:`front_loop` with each query's working set as its bank, grown by the neighbourhood
    threads it lacks, then the candidates mapped back to bank-local units (written to ``c``).
    ``text``: the chunk's ``(BM25 columns, learned cues)``; ``masks``: per query its bank's unit mask or None (``shortlist.py``, masked queries: the
    working set is proposed among the passing units, the mask is read at its units, the ranks are
    among its passing units and the thread graph is the bank's threads with a passing unit)."""
    learned = cfg.affinity == "learned"
    cols, lq = text
    W = shortlist.working_sets(snap, plan, Zc, bidx, cols, learned, masks)
    tlive = shortlist.live_threads(snap, bidx, masks)
    lap("similarity")
    for _ in range(shortlist.ROUNDS):
        tables, off, cos, coff, tptr, tids, ranks, ltab, lqc = shortlist.compact(snap, Zc, bidx, W, cols, lq, learned)
        wmasks = None if masks is None else [None if m is None else m[w.units] for m, w in zip(masks, W)]
        x = FrontBatch(np.arange(len(bidx)), cos, coff, tptr, tids,
                       *front_masks(wmasks, np.arange(len(bidx)), off.nu, coff), ranks, tlive)
        front_loop(FrontTables(*tables), off, x, float(cfg.rrf_k), *sizes, learned, ltab, lqc, c)
        grew = False
        for q, b in enumerate(bidx.tolist()):
            offs = snap.infos[b].bank.thread_offsets
            miss = shortlist.missing_threads(offs, W[q].units, c.hthread[q, :c.n_h[q]])
            if len(miss):
                W[q], grew = W[q]._replace(units=np.union1d(W[q].units, shortlist.threads_units(offs, miss))), True
        if not grew:
            break
    for q in range(len(bidx)):
        n = int(c.n_cand[q])
        c.cand[q, :n] = W[q].units[c.cand[q, :n]]
