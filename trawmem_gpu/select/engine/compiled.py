"""The compiled backend (CPU, numba): two loops over a chunk of queries, one query at a time in
cache, composed from the steps' compiled variants (``engine.compiled_loops`` says what each loop
computes: ``front_loop`` steps 1-3, ``stage_loop`` steps 4-7); this module runs them.

Arguments travel as NamedTuples of arrays (numba passes them as structs). Queries run grouped by
bank (a stable sort: one GEMM per bank over a contiguous block of rows, the bank's tables stay in
cache through its queries), in chunks; the calling thread first does the text work of every chunk
(question tokens, demand features: Python, under the GIL), then the chunks run, on worker threads
when ``threads > 1`` (the GEMMs and the compiled loops release the GIL). The tensor backend's
steps are the specification these loops are tested against.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import numpy as np
import torch

from ..steps import candidates as step3, relevance as step3r, roles as step4
from ..steps.propagation import propagation_params, query_sizes
from ..text_features import demand_matrix
from .batch import QueryBatch, Timer
from . import seeded_front, shortlist, working_set
from .compiled_args import (Candidates, FrontBatch, FrontTables, StageBatch, front_tables,  # noqa: F401
                            stage_batch, stage_params, stage_tables)
from .compiled_loops import front_loop, stage_loop
from .masks import front_masks, roles_count, stage_bridge
from .pool import POOL_ELEMS, query_tables, stage_parts
from .tables import Snapshot, unit_block

FRONT_ROWS = 1 << 20
"""Compiled front: queries per chunk x largest bank (bounds the ``[Qc, N]`` cosine buffer)."""
APPROX_ROWS = 64
"""Most queries in a chunk over shortlists (large banks): a chunk holds every query's working set
and its compacted tables at once (tens of MiB a query on a bank of 10^5 units whose threads have
hundreds of neighbours), so it is also bounded by ``FRONT_ROWS`` like an exact chunk: 10 queries
at 10^5 units, one at 10^6. A chunk of 64 queries there held 2.4 GiB."""


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
        with _positions_kept(c):
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
    cuts = sorted(set(range(0, n_exact, chunk)) | set(range(n_exact, Q, min(chunk, APPROX_ROWS))))
    bm = snap.bm25
    texts = []
    for s, e in zip(cuts, cuts[1:] + [Q]):
        rows = order[s:e]
        qtext = [batch.questions[i] for i in rows.tolist()]
        ptr, ids, _slow = step3.bm25_columns(batch.bidx[rows].tolist(), qtext, bm.vocabs, bm.plain, bm.store.col0,
                                              bm.words)
        X = demand_matrix(qtext)  # once per question, for both step 4's demand and the learned cues
        texts.append((rows, (ptr, ids), step4.demand(qtext, cfg, head, X),
                      _learned_queries(snap, cfg, batch, rows, qtext, X[:, 1])))
    return texts


def _approximate(snap: Snapshot, plan, bidx: np.ndarray) -> np.ndarray:
    """``[Q]`` bool: the query's bank is searched over a shortlist (``EngineConfig.ann_min_units``)."""
    if plan.ann_min_units is None:
        return np.zeros(len(bidx), dtype=bool)
    return snap.off.nu[bidx] >= plan.ann_min_units


def _learned_queries(snap: Snapshot, cfg, batch: QueryBatch, rows: np.ndarray, qtext: list[str], z_temp=None):
    """The ``learned`` affinity's question cues of a chunk (text work, on the calling thread), or
    an empty one for the ``rrf`` affinity. ``z_temp``: the chunk's temporal cues, if known; a
    query's unit times are sliced only when it has a date (``date_match`` reads them then only)."""
    if cfg.affinity != "learned":
        e = np.zeros(0)
        return step3r.LearnedQueries(e, np.zeros(0, np.int64), e, e, np.zeros(0, np.int64), e, 0.0)
    off, attrs = snap.off, snap.np["attrs"]
    b, now = batch.bidx[rows].tolist(), batch.now[rows]
    return step3r.learned_queries(qtext, [snap.infos[x].speakers for x in b],
                                  [attrs[off.uo[x]:off.uo[x] + off.nu[x], 0] if t == t else None
                                   for x, t in zip(b, now.tolist())], now, cfg, z_temp)


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
    with _positions_kept(c):
        return _stage(snap, cfg, batch, rows, c, sz, demand, lap, times)


def _stage(snap: Snapshot, cfg, batch: QueryBatch, rows: np.ndarray, c: Candidates, sz: dict, demand, lap, times):
    """Steps 4-7 of :func:`_chunk`'s candidates ``c``: ``(rows, picks, stage seconds)``."""
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
                   n_h=np.empty(Qc, np.int64), tpos=_positions(Qc, J) if approx else np.empty((Qc, J), np.int64))
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
    dots = plan.sim == "dots" or (plan.sim == "auto" and len(starts) * 8 > Qc)
    if dots and not snap.mapped[bidx].any():  # every bank's rows in the table: one call
        step3.own_dots(Zc, snap.np["unit_vecs"], off.uo, off.nu, bidx, coff, cos)
        return cos, coff
    for a, e in zip(starts.tolist(), ends.tolist()):  # bank by bank: its table rows, or a mapped bank's own vectors
        vecs, base = unit_block(snap, int(bidx[a]))
        n, o = int(nu[a]), int(coff[a])
        rows = vecs[base:base + n]
        if dots:
            step3.own_dots(Zc[a:e], rows, np.zeros(1, np.int64), nu[a:a + 1], np.zeros(e - a, np.int64), coff[a:e], cos)
        else:  # the rows cast to the queries' dtype (exact; a copy, so a read-only map is never handed to torch)
            own = rows_as(snap, int(bidx[a]), rows, Zc.dtype)
            torch.mm(torch.from_numpy(Zc[a:e]), torch.from_numpy(own).T,
                     out=torch.from_numpy(cos[o:o + (e - a) * n]).view(e - a, n))
    return cos, coff


ROWS_KEPT_BYTES = 64 << 20
"""Most bytes of banks' unit rows :func:`rows_as` keeps cast per snapshot (past it, cast per call)."""


def rows_as(snap: Snapshot, bank: int, rows: np.ndarray, dtype) -> np.ndarray:
    """``np.asarray(rows, dtype)`` (a copy where the dtypes differ), kept for the snapshot while the
    kept casts hold at most :data:`ROWS_KEPT_BYTES` (the GEMM reads a float32 table's rows as
    float64; the same values, cast once per snapshot instead of once per call). A mapped bank's
    rows are cast per call (they stay on disk)."""
    if snap.mapped[bank] or rows.dtype == dtype:
        return np.asarray(rows, dtype=dtype)
    kept = snap.lazy("rows_as", lambda: {"bytes": 0})
    key = (bank, np.dtype(dtype).str)
    got = kept.get(key)
    if got is None:
        got = np.asarray(rows, dtype=dtype)
        if kept["bytes"] + got.nbytes <= ROWS_KEPT_BYTES:  # racing threads may both add one: a bound, loosely
            kept["bytes"] += got.nbytes
            kept[key] = got
    return got


TPOS_KEPT = True
"""A chunk over shortlists writes its ``Candidates.tpos`` (``[Qc, J]``, J the bank's threads: 1 MB a
query at 10^6 units) into an array the calling thread keeps, all -1 between chunks
(:func:`_positions`; the chunk's neighbourhood entries are set back after its stage,
:func:`_positions_kept`), instead of a new one filled with -1 per chunk; False: a new one."""
_TPOS = threading.local()


def _positions(Qc: int, J: int) -> np.ndarray:
    """``[Qc, J]`` int64, all -1: this thread's kept array when it has that shape (:data:`TPOS_KEPT`),
    else a new one; lent to the chunk until :func:`_positions_kept` gives it back."""
    if not TPOS_KEPT:
        return np.empty((Qc, J), np.int64)  # filled by _front_shortlist
    got = getattr(_TPOS, "free", None)
    _TPOS.free = None
    if got is None or got.shape != (Qc, J):
        got = np.full((Qc, J), -1, np.int64)
    _TPOS.lent = got
    return got


def _lent(tpos: np.ndarray) -> bool:
    """Whether ``tpos`` is this thread's array lent by :func:`_positions` (all -1 when lent)."""
    return getattr(_TPOS, "lent", None) is tpos


@contextmanager
def _positions_kept(c: Candidates):
    """Give ``c.tpos`` back to this thread when the chunk is done with it (its neighbourhood entries
    set to -1 again); a chunk cut short drops it (which entries it set is unknown)."""
    mine = _lent(c.tpos)
    _TPOS.lent = None
    ok = False
    try:
        yield
        ok = True
    finally:
        if mine and ok:
            for q in range(len(c.n_h)):
                c.tpos[q, c.hthread[q, :c.n_h[q]]] = -1
            _TPOS.free = c.tpos


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
    qs = sizes[1]
    seeded = seeded_front.SEEDED  # the front round's own threads only; its loop grows each space from the seeds
    hops = np.zeros_like(qs.hops) if seeded else qs.hops
    for r in range(shortlist.ROUNDS):
        spaces, (tables, off, cos, coff, tptr, tids, ranks, ltab, lqc) = shortlist.front_args(
            snap, Zc, bidx, W, cols, lq, learned, hops, qs.n_seeds)
        wmasks = None if masks is None else [None if m is None else m[w.units] for m, w in zip(masks, W)]
        x = FrontBatch(np.arange(len(bidx)), cos, coff, tptr, tids,
                       *front_masks(wmasks, np.arange(len(bidx)), off.nu, coff), ranks,
                       tlive if not len(tlive) else shortlist.local_rows(tlive, spaces))
        local = c._replace(tpos=np.empty((len(bidx), max(1, int(off.nt.max()))), np.int64))
        if seeded:  # the neighbourhood written as bank-local threads
            seeded_front.run(FrontTables(*tables), off, x, float(cfg.rrf_k), sizes[0],
                             seeded_front.space(snap, bidx, spaces, tlive, qs), learned, ltab, lqc, local)
        else:
            front_loop(FrontTables(*tables), off, x, float(cfg.rrf_k), *sizes, learned, ltab, lqc, local)
        grew = False
        for q, b in enumerate(bidx.tolist()):
            if not seeded:  # the neighbourhood's threads as bank-local ids
                c.hthread[q, :c.n_h[q]] = spaces[q].ids[c.hthread[q, :c.n_h[q]]]
            offs = snap.infos[b].bank.thread_offsets
            more = working_set.missing_units(offs, W[q].units, c.hthread[q, :c.n_h[q]])
            if len(more) and r + 1 < shortlist.ROUNDS:  # the last round's candidates are positions in this W
                W[q], grew = shortlist.grown(snap, W[q], b, more, Zc[q]), True
        if not grew:
            break
    if not _lent(c.tpos):
        c.tpos.fill(-1)  # else all -1 already (_positions)
    for q in range(len(bidx)):
        n = int(c.n_cand[q])
        c.cand[q, :n] = W[q].units[c.cand[q, :n]]
        c.tpos[q, c.hthread[q, :c.n_h[q]]] = np.arange(c.n_h[q])
