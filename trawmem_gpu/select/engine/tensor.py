"""The tensor backend: the steps' torch variants over padded batches of queries.

Steps 1-3 run over the whole batch (``Q`` queries, each against its own bank; ``N`` = most units
of a bank in the batch, ``J`` = most threads): the affinity ``[Q, N]`` (one GEMM per bank, BM25 on
the CPU), seeds and propagation ``[Q, J]`` (loops only over hops and frontier slots), the
neighbourhood and the candidates ``[Q, U]``. Steps 4-7 run per chunk of queries of similar
``|U_q|`` (``Qc * U * U <= chunk_elems``): features ``[Qc, U, F]``, gravity (Floyd-Warshall over
``[Qc, T, T]``), the role-priority op, K ``[Qc, U, U]`` (a gather from the per-bank table, or from
the candidates' cosines) and a greedy op; the priority and plain-greedy ops are Triton kernels on
CUDA. On CPU with numba, steps 4-7 may run compiled instead (``engine/compiled.py``).

Precision: float64 on CPU (agrees with the float64 NumPy reference up to summation order),
float32 on CUDA. Exact ties break the same way (lowest index) everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..objective import ModularInputs, coverage_weights, modular_gain, support_kernel, weight_columns
from ..steps import candidates as step3
from ..steps import propagation as step2
from ..steps import relevance as step3r
from ..steps import roles as step4
from ..steps import seeds as step1
from ..steps.ann import AnnParams
from ..steps.greedy import GreedyProblem, TokenBudget, config_rule, greedy_lazy_torch, greedy_select
from ..steps.priority import PriorityInputs, PriorityWeights, edge_costs_torch, effective_budget, gravity_torch, \
    role_priority
from ..tensor_ops import NEG_INF, POS_INF
from ..terms import COVERAGE_TERMS
from . import pool
from .batch import QueryBatch, Timer, own_rows, similarity
from .masks import chunk_bridge, roles_count
from .tables import Snapshot


@dataclass
class Localized:
    """Steps 1-3 for a whole batch (rows = queries in input order)."""

    bidx: Tensor
    """[Q] bank index."""
    alpha: Tensor
    """[Q, N] affinity of every unit of the bank (0 on padding)."""
    r: Tensor
    """[Q, J] propagated thread score r~ (-inf where unreached)."""
    in_h: Tensor
    """[Q, J] bool, the neighbourhood H_q."""
    tpos: Tensor
    """[Q, J] position of a thread inside H_q (ascending thread order), -1 outside."""
    n_h: Tensor
    """[Q] |H_q|."""
    cand: Tensor
    """[Q, U] bank-local unit ids of the candidates, ascending (0 on padding)."""
    cvalid: Tensor
    """[Q, U] bool."""
    n_cand: Tensor
    """[Q] |U_q|."""
    masked: Tensor | None = None
    """[Q] bool: the query has a unit mask (None: no query has one)."""


def localize(snap: Snapshot, plan, cfg, batch: QueryBatch, timer: Timer, params) -> Localized:
    """Steps 1-3 of every query of ``batch``, all of one ``QueryParams.shape_key`` (``params``: one
    of them, resolved: n_seeds, neighborhood_cap and hops are read)."""
    dev = plan.device
    bidx = torch.as_tensor(batch.bidx, device=dev)
    lex = None
    if plan.lexical:
        bm = snap.bm25
        cols = step3.bm25_columns(batch.bidx.tolist(), batch.questions, bm.vocabs, bm.plain, bm.store.col0, bm.words)
        lex = step3.bm25_batch(batch.bidx, cols[:2], bm.store, int(snap.off.nu[batch.bidx].max()))
        lex = lex.astype(np.float64)
        for q in cols[2]:  # a BM25 variant with a non-occurrence term: bm25s per query
            sc = snap.infos[int(batch.bidx[q])].bm25.scores(batch.questions[q])
            lex[q, :len(sc)] = sc
    timer.lap("text")
    # step 3's alpha over each query's whole bank (the seeds read it)
    uid, umask = own_rows(snap.off_t.uo, snap.off_t.nu, bidx)
    fm = batch.mask_rows(umask.shape[1], dev)
    if fm is not None:  # a filter's mask (select.restrict): failing units are not live anywhere below
        umask = umask & fm
        lex = None if lex is None else np.where(fm.cpu().numpy()[:, :lex.shape[1]], lex, 0.0)
    cos = similarity(snap, plan.sim, batch.Z, bidx, heads=False, chunk_elems=plan.chunk_elems)
    if cfg.affinity == "learned":
        alpha = _learned_affinity(snap, cfg, batch, cos, umask, uid, lex)
    elif cfg.affinity == "rrf" and plan.rrf_rows == "compiled" and fm is None and _bm25_is_float32(cos, lex):
        alpha = torch.from_numpy(step3.rrf_compiled(cos.numpy(), umask.sum(dim=1).numpy(), lex, float(cfg.rrf_k)))
    else:
        alpha = step3.affinity_torch(cos, umask, None if lex is None else torch.as_tensor(lex, dtype=plan.dtype,
                                                                                        device=dev), cfg)
    J = int(snap.off_t.nt[bidx].max())
    tvalid = torch.arange(J, device=dev)[None, :] < snap.off_t.nt[bidx][:, None]
    ult = torch.where(umask, snap.t["unit_thread"][uid], J)  # bank-local thread, J on padding
    live = None
    if fm is not None:  # the threads that hold a passing unit; the others are out of the graph
        live = torch.zeros(len(bidx), J + 1, dtype=torch.bool, device=dev).scatter_(1, ult, True)[:, :J]
        tvalid = tvalid & live
    timer.lap("affinity")
    # step 1
    if cfg.seed_score == "head":
        index = snap.lazy("head_index", lambda: head_index(snap, plan))
        if live is None:
            r0 = step1.head_seeds_torch(index, batch.Z, bidx, J, cfg, params.n_seeds)
        else:  # every live head scored (the search's top k may hold dead threads); propagation seeds them
            r0 = torch.where(tvalid, step1.head_scores_torch(index.own_cos(batch.Z, bidx)[0], cfg.d_idx), NEG_INF)
    else:
        cos_h = similarity(snap, plan.sim, batch.Z, bidx, heads=True, chunk_elems=plan.chunk_elems) \
            if cfg.seed_score == "max" else None
        r0 = step1.seed_scores_torch(alpha, ult, tvalid, cos_h, cfg)
    timer.lap("seeds")
    # step 2
    if plan.propagation == "compiled":  # the reference's algorithm, compiled, per query
        r, in_h, tpos, n_h = _propagate_compiled(snap, cfg, r0, batch, live)
    else:
        graph = step2.ThreadGraph(snap.t["nbr"], snap.t["nbw"], snap.dummy_thread)
        r, seed_mask = step2.propagate_torch(r0, snap.off_t.nt[bidx], snap.off_t.to[bidx], graph, cfg, params, live)
        in_h, tpos, n_h = step2.neighbourhood_torch(r, seed_mask, params.neighborhood_cap)
    timer.lap("propagation")
    # step 3: the candidates
    cand, cvalid, n_cand = step3.candidates_torch(in_h, umask, ult)
    timer.lap("candidates")
    masked = None if fm is None else torch.as_tensor([m is not None for m in batch.masks], device=dev)
    return Localized(bidx, alpha, r, in_h, tpos, n_h, cand, cvalid, n_cand, masked)


def head_index(snap: Snapshot, plan) -> step1.HeadIndex:
    """The snapshot's head index: exact per bank, approximate for banks of at least
    ``plan.ann_min_units`` units (their indexes kept with the banks' ``BankInfo.cache``)."""
    approx = None if plan.ann_min_units is None else snap.off.nu >= plan.ann_min_units
    return step1.HeadIndex(snap.t["head_vecs"][:snap.rows["head_vecs"]], snap.off_t.to, snap.off_t.nt,
                           mode=plan.seed_search, approx=approx,
                           ann=(plan.ann_kind, AnnParams(plan.ann_nprobe, plan.ann_ef_search)),
                           caches=[i.cache for i in snap.infos])


def _bm25_is_float32(cos: Tensor, lex) -> bool:
    """The batch's BM25 scores are float32 values (the compiled RRF rows' input; the plan chose
    them for CPU float64 with numba: ``Plan.rrf_rows``)."""
    if lex is None:
        return False
    N = cos.shape[1]
    if N == 0 or N >= (1 << 31) or lex.shape != tuple(cos.shape):
        return False
    return bool(np.array_equal(lex.astype(np.float32).astype(np.float64), lex))


def _propagate_compiled(snap: Snapshot, cfg, r0: Tensor, batch: QueryBatch, live: Tensor | None = None):
    """Step 2 with :func:`~..steps.propagation.propagate_batch`: ``(r, in_h, tpos, n_h)`` as the
    torch step gives them (``live``: the threads a unit mask leaves, None: all)."""
    Q, J = r0.shape
    r = np.full((Q, J), -np.inf)
    in_h = np.zeros((Q, J), dtype=np.bool_)
    bidx = batch.bidx
    lv = np.ones((Q, J), dtype=np.bool_) if live is None else np.ascontiguousarray(live.numpy())
    step2.propagate_batch(np.ascontiguousarray(r0.numpy(), dtype=np.float64), snap.off.nt[bidx], snap.off.to[bidx],
                          snap.np["nbr"], snap.np["nbw"], step2.propagation_params(cfg, batch.params[0], J),
                          step2.query_sizes(*(batch.sizes[k] for k in ("n_seeds", "cap", "hops")), J), r, in_h, lv)
    in_h_t = torch.from_numpy(in_h)
    return torch.from_numpy(r).to(r0.dtype), in_h_t, step2.positions(in_h_t), in_h_t.sum(dim=1)


def chunks(loc: Localized, square: bool, chunk_elems: int) -> list[Tensor]:
    """Queries sorted by ``|U_q|`` (descending), cut so ``Qc * U^2 <= chunk_elems`` when a chunk
    forms ``[Qc, U, U]`` matrices (``square``: the torch steps 4-7). The compiled steps keep only
    ``[U, U]`` per query, so their chunks are cut at ``Qc * U * max(T, 8) <= max(chunk_elems,
    2^22)`` and ordered by bank inside (one bank's tables stay in cache while its queries run)."""
    order = torch.sort(loc.n_cand, descending=True, stable=True).indices.cpu()
    sizes = loc.n_cand.cpu()[order].tolist()
    width = max(8, int(loc.n_h.max()) if len(loc.n_h) else 1)
    budget = chunk_elems if square else max(chunk_elems, 1 << 22)
    out, start = [], 0
    while start < len(order):
        u = max(1, sizes[start])
        qc = max(1, budget // (u * (u if square else width)))
        rows = order[start:start + qc]
        if not square:
            rows = rows[torch.sort(loc.bidx.cpu()[rows], stable=True).indices]
        out.append(rows.to(loc.bidx.device))
        start += qc
    return out


@dataclass
class Chunk:
    """The candidates of a chunk of queries, ready for steps 4-7."""

    rows: Tensor
    """[Qc] query indices."""
    bidx: Tensor
    cand: Tensor
    """[Qc, U] bank-local unit ids."""
    cvalid: Tensor
    n_cand: Tensor
    gid: Tensor
    """[Qc, U] stored unit rows."""
    lt: Tensor
    """[Qc, U] neighbourhood thread position (-1 pad)."""
    alpha: Tensor
    hthread: Tensor
    """[Qc, T] bank-local ids of the H_q threads, ascending (-1 pad)."""
    rvec: Tensor
    """[Qc, T] their r~ (0 pad)."""
    tpos: Tensor
    n_h: Tensor
    budget: Tensor
    """[Qc] B_q of the priority cap kappa = 1 / B_q (from ``QueryParams.pool_budget``)."""
    masked: Tensor | None = None
    """[Qc] bool: the query has a unit mask (None: none has)."""


def chunk_of(snap: Snapshot, cfg, loc: Localized, rows: Tensor, pool: Tensor) -> Chunk:
    """The chunk of queries ``rows`` (``pool``: ``[Qc]`` their ``QueryParams.pool_budget``)."""
    n_cand = loc.n_cand[rows]
    U = max(1, int(n_cand.max()))
    T = max(1, int(loc.n_h[rows].max()))
    cand, cvalid = loc.cand[rows, :U], loc.cvalid[rows, :U]
    bidx = loc.bidx[rows]
    gid = snap.off_t.uo[bidx][:, None] + cand  # inside the own bank
    tpos = loc.tpos[rows]
    lt = torch.where(cvalid, torch.gather(tpos, 1, snap.t["unit_thread"][gid]), -1)
    alpha = torch.where(cvalid, torch.gather(loc.alpha[rows], 1, cand), 0.0)
    Qc, J = tpos.shape
    slot = torch.where(loc.in_h[rows], tpos, T)
    hthread = torch.full((Qc, T + 1), -1, dtype=torch.int64, device=cand.device)
    hthread.scatter_(1, slot, torch.arange(J, device=cand.device).expand(Qc, J).clone())
    rvec = torch.zeros(Qc, T + 1, dtype=alpha.dtype, device=cand.device)
    rvec.scatter_(1, slot, torch.where(loc.in_h[rows], loc.r[rows], 0.0))
    budget = effective_budget(pool, n_cand)
    return Chunk(rows, bidx, cand, cvalid, n_cand, gid, lt, alpha, hthread[:, :T], rvec[:, :T], tpos,
                 loc.n_h[rows], budget, None if loc.masked is None else loc.masked[rows])


def candidate_attrs(attrs: Tensor, gid: Tensor, cvalid: Tensor) -> Tensor:
    """``[Qc, U, A]`` float64 the candidates' unit attributes (terms.unit_attributes)."""
    return attrs[torch.where(cvalid, gid, 0)].to(torch.float64)


def select_chunk(snap: Snapshot, plan, cfg, c: Chunk, W: Tensor, demand, now: Tensor, timer: Timer,
                 unit_cap: Tensor, capacity: Tensor | None):
    """Steps 4-7 of one chunk with the torch ops: ``(sel [Qc, B] candidate slots, n_sel [Qc])``.
    ``W``: ``[Qc, len(QUERY_WEIGHTS)]``; ``demand``: ``(delta [Qc, R], Mq [Qc, R, F])``; ``now``: ``[Qc]``
    float64 (dates keep their seconds; J's modular part is formed in float64, then cast);
    ``unit_cap``: ``[Qc]`` each query's B (0 = no cap); ``capacity``: ``[Qc]`` each query's T, or
    None when the chunk's queries have no token budget."""
    delta, Mq = demand
    dt, dev = plan.dtype, plan.device
    w = weight_columns(W)
    T = c.hthread.shape[1]
    # step 4: unit features (the bridge off the bank's table, or from the candidates' cosines S)
    own = (snap.off_t.tab[c.bidx] == 0).nonzero().flatten()  # rows whose bank has no tables
    tab = (snap.off_t.tab[c.bidx] != 0).nonzero().flatten()
    S = pool.pool_similarity(snap, c.gid if len(own) == len(c.bidx) else c.gid[own]) if len(own) else None
    if not len(own):
        brow = snap.off_t.boff[c.bidx][:, None] + c.cand * snap.off_t.nt[c.bidx][:, None]
        bridge = step4.bridge_from_table(snap.t["btab"], brow, c.hthread, c.lt, c.cvalid)
    elif not len(tab):
        bridge = step4.bridge_from_similarity(S, c.lt, c.cvalid)
    else:
        bridge = torch.zeros(c.cand.shape, dtype=dt, device=dev)
        brow = snap.off_t.boff[c.bidx[tab]][:, None] + c.cand[tab] * snap.off_t.nt[c.bidx[tab]][:, None]
        bridge[tab] = step4.bridge_from_table(snap.t["btab"], brow, c.hthread[tab], c.lt[tab], c.cvalid[tab])
        bridge[own] = step4.bridge_from_similarity(S, c.lt[own], c.cvalid[own])
    if c.masked is not None and len(tab):  # a thread a mask cut: the table's maximum is over units that are no
        # candidates (rows ``own`` formed theirs from their candidates, the passing units: masks.partial_rows)
        bridge = chunk_bridge(snap, c, bridge, c.masked & torch.as_tensor(roles_count(W.cpu().numpy()),
                                                                          device=c.masked.device))
    unit_cols = tuple(snap.t[k][c.gid].to(dt) for k in ("head_sim", "temporal", "position"))  # temporal: float32
    feats = step4.features_torch(c.alpha, torch.gather(c.rvec, 1, c.lt.clamp(min=0)), bridge, unit_cols, c.cvalid)
    timer.lap("roles")
    # steps 5-6: gravity, costs, priorities
    hvalid = c.hthread >= 0
    if cfg.cross_thread:
        gh = torch.where(hvalid, snap.off_t.to[c.bidx][:, None] + c.hthread, snap.dummy_thread)
        Dh = edge_costs_torch(snap.t["nbr"][gh].long(), snap.t["nbw"][gh].to(dt), c.tpos, T, cfg.c_hop)
    else:
        Dh = torch.full((len(c.rows), T, T), POS_INF, dtype=dt, device=dev)
    gravity = gravity_torch(Dh, hvalid, c.rvec, w["tau"], cfg.cross_thread)
    d_in = torch.where(c.cvalid, snap.t["d_in"][c.gid], 0.0)
    x = PriorityInputs(feats, Mq, delta, c.lt, c.cvalid, gravity, d_in, c.alpha, c.budget)
    rho, _phi, _w, pi = role_priority(x, PriorityWeights(w["lambda_m"], w["lambda_r"], w["tau"]), cfg.T_R,
                                      impl=plan.kernels)
    pi = pi.to(dt)
    mass = torch.zeros(len(c.rows), T + 1, dtype=dt, device=dev)
    mass.scatter_add_(1, torch.where(c.lt >= 0, c.lt, T), torch.where(c.cvalid, pi, 0.0))
    timer.lap("priority")
    # step 7: J and its greedy maximization
    K = support_matrix(snap, cfg, c, S, own, tab)
    attrs = (lambda: candidate_attrs(snap.t["attrs"], c.gid, c.cvalid))
    x = ModularInputs(c.alpha, attrs, now[:, None])  # gathers the attributes once, if a term reads them
    modular = modular_gain(x, w, cfg)
    reads = [t for t in COVERAGE_TERMS if t.reads_attrs and bool((w[t.weight] != 0).any())]
    p = GreedyProblem(pi, K, rho.to(dt), delta, modular.to(dt), c.lt, mass[:, :T], c.cvalid,
                      x.attrs if reads else None, c.alpha.to(dt) if reads else None)
    U = c.cand.shape[1]
    width = max(1, min(U, int(torch.where(unit_cap > 0, unit_cap, U).max()))) if len(unit_cap) else 1
    rule = config_rule(cfg, unit_cap.to(c.n_cand.device), c.n_cand, width, token_budget(snap, cfg, c, capacity))
    if plan.optimizer == "lazy":
        sel, _gains, n_sel = greedy_lazy_torch(p, coverage_weights(w), rule)
    else:
        sel, _gains, n_sel = greedy_select(p, coverage_weights(w), rule,
                                           impl=plan.kernels if rule.tokens is None else plan.greedy_tokens)
    timer.lap("greedy")
    return sel, n_sel


def token_budget(snap: Snapshot, cfg, c: Chunk, capacity: Tensor | None) -> TokenBudget | None:
    """The chunk's knapsack on workspace tokens (None without a token budget): each query's T
    (``capacity [Qc]``), the candidates' and the neighbourhood threads' token costs from the
    per-bank tables."""
    if capacity is None:
        return None
    uc = torch.where(c.cvalid, snap.t["tok_unit"][c.gid].to(snap.t["tok_head"].dtype), 1.0)  # float32 table
    rows = torch.where(c.hthread >= 0, snap.off_t.to[c.bidx][:, None] + c.hthread, snap.dummy_thread)
    return TokenBudget(capacity, uc, snap.t["tok_head"][rows], cfg.knapsack_ratio,
                       heading_keys(snap.t["tok_hrun"][rows], c.hthread >= 0, c.lt))


def heading_keys(run: Tensor, valid: Tensor, lt: Tensor) -> Tensor:
    """``[Qc, U]`` each candidate's heading key (``TokenBudget.unit_key``): the position of the first
    neighbourhood thread of its thread's heading run (``run [Qc, T]``: each neighbourhood thread's
    run, threads ascending, so a run's threads are consecutive)."""
    T = run.shape[1]
    pos = torch.arange(T, device=run.device).expand_as(run)
    start = torch.ones_like(valid)
    start[:, 1:] = run[:, 1:] != run[:, :-1]
    key = torch.cummax(torch.where(start | ~valid, pos, 0), dim=1).values
    return torch.gather(key, 1, lt.clamp(min=0))


def support_matrix(snap: Snapshot, cfg, c: Chunk, S: Tensor | None, own: Tensor, tab: Tensor) -> Tensor | None:
    """``K [Qc, U, U]`` of the chunk's candidates (0 on padding pairs): a gather from the per-bank
    table for the rows ``tab``, ``objective.support_kernel`` of their cosines ``S`` (and the
    support links' floor, ``pool.pool_floors``) for the rows ``own`` of banks without tables; None
    for the identity kernel."""
    if cfg.kernel == "identity":
        return None
    pair = c.cvalid[:, :, None] & c.cvalid[:, None, :]
    every = lambda rows, t: t if len(rows) == len(c.bidx) else t[rows]  # noqa: E731 - no copy for a whole chunk
    parts = []
    if len(tab):
        cand, bidx = every(tab, c.cand), every(tab, c.bidx)
        n = snap.off_t.nu[bidx][:, None, None]
        parts.append(torch.take(snap.t["ktab"], snap.off_t.koff[bidx][:, None, None] + cand[:, :, None] * n
                                + cand[:, None, :]))
    if len(own):
        lt = every(own, c.lt)
        floor = pool.pool_floors(snap, every(own, c.bidx), every(own, c.cand), every(own, c.n_cand))
        parts.append(support_kernel(S, lt[:, :, None] == lt[:, None, :], cfg, floor))
    if len(parts) == 1:
        K = parts[0]
    else:
        K = torch.empty(pair.shape, dtype=parts[0].dtype, device=pair.device)
        K[tab], K[own] = parts
    return torch.where(pair, K, torch.zeros((), dtype=K.dtype, device=K.device))


def _learned_affinity(snap: Snapshot, cfg, batch: QueryBatch, cos: Tensor, umask: Tensor, uid: Tensor,
                      lex: np.ndarray) -> Tensor:
    """Step 3's ``learned`` affinity for the batch: the per-unit inputs gathered per query row, the
    question cues per query (speakers named, temporal cue, relative dates), then
    :func:`~trawmem_gpu.select.steps.relevance.learned_affinity_torch`."""
    dev, dt = cos.device, cos.dtype
    idx = snap.t["rel_idx"][uid].long()  # [Q, N, 3] speaker, prev, next (bank-local; the table is int32)
    live = umask[:, :, None]
    idx = torch.where(live, idx, torch.tensor([0, -1, -1], device=dev))
    if batch.masks is not None:  # a session neighbour that a filter's mask leaves out is no context
        nb = idx[:, :, 1:]
        ok = (nb >= 0) & torch.gather(umask, 1, nb.clamp(min=0).flatten(1)).view_as(nb)
        idx = torch.cat([idx[:, :, :1], torch.where(ok, nb, -1)], dim=2)
    time = snap.t["attrs"][uid][:, :, 0]
    words = torch.where(umask, snap.t["rel_words"][uid].to(dt), torch.zeros((), dtype=dt, device=dev))
    rows = step3r.RelevanceRows(idx[:, :, 0], idx[:, :, 1], idx[:, :, 2], snap.t["temporal"][uid].to(dt), time, words)
    infos = [snap.infos[int(b)] for b in batch.bidx]
    S = max(1, max(len(i.speakers) for i in infos))
    named = np.zeros((len(infos), S))
    date_cols = {}
    nu = snap.off.nu[batch.bidx]
    time_np = time.cpu().numpy()
    for q, (info, text) in enumerate(zip(infos, batch.questions)):
        named[q, :len(info.speakers)] = step3r.speakers_named(text, info.speakers)
        col = step3r.date_match(time_np[q, :nu[q]], text, float(batch.now[q]))
        if col is not None:
            date_cols[q] = col
    z_temp = torch.as_tensor([step4.demand_features_cached(t)[1] for t in batch.questions], dtype=dt, device=dev)
    return step3r.learned_affinity_torch(cos, umask, torch.as_tensor(lex, dtype=dt, device=dev), rows,
                                         torch.as_tensor(named, dtype=dt, device=dev), z_temp, date_cols, cfg)
