"""Steps 1-3 of a query on a large bank (at least ``EngineConfig.ann_min_units`` units) over a
shortlist of the bank instead of all of it: the compiled front (``compiled_loops.front_loop``) run on a
per-query working set of units.

The exact front scores every unit of the bank (a ``[N, d]`` product, BM25 over the bank, ranks
over ``N``). Here, per query:

1. the bank's approximate index (``steps.ann.VectorIndex``) proposes the ``ann_shortlist`` units of
   largest cosine, and the query's BM25 postings (sparse, exact, float32 in token order as bm25s
   adds them) give the ``ann_shortlist`` units of largest BM25;
2. the working set ``W`` is every unit of the threads holding one of them (whole threads, so a
   thread's best-unit seed score and its candidates are complete);
3. the front loop runs with ``W`` as the query's bank: exact cosines (re-scored, float64), BM25,
   the ``learned`` (or ``rrf``) affinity with its ranks and its normalization over ``W``, best-unit
   seeds among ``W``'s threads, propagation over the bank's whole thread graph, the capped
   neighbourhood and its candidates;
4. a neighbourhood thread outside ``W`` (reached by propagation) joins ``W`` with its units, and
   step 3 runs again (at most :data:`ROUNDS` times), so every candidate's affinity is computed.

**A masked query** (a filter's unit mask, ``select.restrict``: the bank restricted to its
passing units is what it selects over) runs the same steps over the passing units: the index is
searched among them only (``VectorIndex.search(keep=)``; a mask passing at most ``ann_shortlist``
units proposes all of them, exactly) and the BM25 top is taken among them; ``W`` holds whole
threads, so the front loop reads the mask at ``W``'s units (``steps.mask``: a failing unit of
``W`` is no seed, candidate, rank or context); its ranks are those among ``W``'s passing units
(no ranks estimated for the restricted bank: the shortlist's rank sample is of the whole bank);
its thread graph is the bank's threads that hold a passing unit (:func:`live_threads`, as the
restricted bank's), so propagation may reach a thread outside ``W``, which then joins it.

What is approximate: a unit outside ``W`` cannot seed, and the affinity's ranks and maximum are
taken over ``W`` (for the shortlisted units the cosine ranks are the bank's when the index finds
the true top ones; BM25's maximum is the bank's). ``python -m benchmarks run scale-query --only ann``
measures the candidate pool against the exact front's. Everything after step 3 is unchanged.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from .._jit import njit, prefetch_ahead
from ..steps.ann import AnnParams, VectorIndex
from ..steps.candidates import GivenRanks
from ..steps.relevance import LearnedQueries, LearnedTables, no_learned_tables
from . import assembly, ranks, working_set
from .compiled_args import NO_THREADS
from .lexical_shortlist import Lexical, lexical, ranks_of, scores_at, scores_of, warm
from .rank_sample import RankSample, dots as sample_dots, rank_sample
from .tables import Offsets, Snapshot, unit_block

ROUNDS = 3
"""Most front runs per query (the first, then one per growth of its working set)."""
_LOCK = threading.Lock()


ASSEMBLY = True
"""A front round's arguments are built by one compiled call per query (``assembly.front_args``);
False: by :func:`thread_space` and :func:`compact` in NumPy (the plain form: the same arrays)."""
REUSE = True
"""A grown working set keeps the ranks of the units it held (:func:`grown`); False: every front
round ranks its whole working set again (the plain form, for comparison: the same ranks)."""
RANK_DEPTH = 1024
"""Units the index proposes per query for ranking (their exact cosines rank the working set's
units above the last of them: :func:`given_ranks`); the first ``ann_shortlist`` of them seed the
working set."""
RANK_SAMPLE = 4096
"""Units of a bank, drawn once with a fixed seed, whose cosines estimate the rank of a unit past the
shortlist (:func:`given_ranks`)."""


class Shortlist(NamedTuple):
    """One query's working set and what ranks its units in the whole bank."""

    units: np.ndarray
    """``W``: bank-local units, ascending."""
    edge: float
    """The smallest exact cosine among the index's proposals (above it, ranks are counted among them)."""
    head: np.ndarray
    """``(cosine, unit)`` of the index's ``RANK_DEPTH`` proposals in rank order (cosine descending,
    ties to the lower unit): ``[2, K]`` float64, empty for a masked query (ranked in ``W``)."""
    sample: np.ndarray
    """Cosines of the bank's rank sample, ascending."""
    lex: Lexical
    """The query's BM25 over the bank (``lexical_shortlist``: what ranks a unit's score)."""
    cos: np.ndarray
    """Exact cosines of ``units`` (float64, as :func:`_gather_dots` sums them) ..."""
    bm: np.ndarray
    """... and their exact float32 BM25 (``lexical_shortlist.scores_at``)."""
    cols: np.ndarray
    """The query's BM25 columns (store columns, token order)."""
    ranks: tuple | None = None
    """``units``' ranks in the bank, ``(by cosine, by BM25)`` as :func:`given_ranks` returns them,
    once a front round has computed them (:func:`ranked`); :func:`grown` keeps them for the units
    a grown working set keeps and computes only those of the units it adds. None: not computed."""
    by_unit: np.ndarray | None = None
    """The positions of :attr:`head`'s units in unit order (a stable argsort of ``head[1]``, which
    ``ranks.cosine_ranks`` merges ``W`` with), kept for every round's ranks; None: sorted there."""


def unit_index(snap: Snapshot, bank: int, kind: str, use_gpu: bool, vectors: str = "float32"
               ) -> tuple[VectorIndex, RankSample]:
    """The bank's approximate index over its unit vectors and its rank sample
    (``rank_sample.RankSample``: at most ``RANK_SAMPLE`` units, int8 codes), built on first use and
    kept with the bank's ``BankInfo`` (a later snapshot of the same bank object reuses them); an
    appended bank's index is the old one grown (``bank_tables.grown_indexes``), not rebuilt."""
    info = snap.infos[bank]
    key = ("unit_index", kind) + (() if vectors == "float32" else (vectors,))
    with _LOCK:
        got = info.cache.get(key)
        if got is None:
            vecs, a = unit_block(snap, bank)  # the table's rows, or a mapped bank's own vectors
            n = int(snap.off.nu[bank])
            rng = np.random.default_rng(0)
            sample = a + (np.arange(n) if n <= RANK_SAMPLE else np.sort(rng.choice(n, RANK_SAMPLE, replace=False)))
            index = info.cache.pop(("grown", *key), None) or VectorIndex(
                vecs[a:a + n], kind, use_gpu, vectors=vectors, rerank=info.bank.unit_vecs)  # compact: re-ranked in float32
            got = info.cache[key] = (index, rank_sample(sample - a, vecs[sample]))
        return got


def warm_up(snap: Snapshot, plan, indexes: bool = False) -> list[int]:
    """The banks of ``snap`` searched over a shortlist (at least ``plan.ann_min_units`` units),
    with the first-use costs of their queries paid now: the compiled pass only some queries take
    (``lexical_shortlist.warm``) and, with ``indexes``, each bank's approximate index
    (:func:`unit_index`, otherwise built by its first query). Nothing to do (``[]``) when no bank
    is that large, or with the tensor front (``tensor.py`` searches its own indexes)."""
    if plan.ann_min_units is None or plan.front != "compiled":
        return []
    big = np.flatnonzero(snap.off.nu >= plan.ann_min_units).tolist()
    if big:
        warm(snap)
        working_set.warm(snap.np["unit_thread"], snap.np["rel_idx"])
    for b in big if indexes else ():
        unit_index(snap, b, plan.ann_kind, plan.device.type == "cuda", plan.ann_vectors)
    return big


def working_sets(snap: Snapshot, plan, Z: np.ndarray, bidx: np.ndarray, tok: tuple, context: bool,
                 masks: list | None = None) -> list[Shortlist]:
    """Steps 1-2 of the module docstring: each query's :class:`Shortlist` (``context``: the units
    before and after each unit of ``W`` in its session join it, for the context features;
    ``masks``: per query its unit mask or None, a masked query's proposals are passing units)."""
    M = int(plan.ann_shortlist)
    params = AnnParams(plan.ann_nprobe, plan.ann_ef_search)
    near: list = [None] * len(bidx)
    heads: list = [np.zeros((2, 0))] * len(bidx)
    sample: list = [None] * len(bidx)
    known: list = [(np.zeros(0, np.int64), np.zeros(0))] * len(bidx)  # the proposals' cosines, by unit
    by_unit: list = [None] * len(bidx)
    masks = masks if masks is not None else [None] * len(bidx)
    for bank in np.unique(bidx).tolist():
        rows = np.flatnonzero(bidx == bank)
        index, rsample = unit_index(snap, bank, plan.ann_kind, plan.device.type == "cuda", plan.ann_vectors)
        vecs, base = unit_block(snap, bank)
        plain = [r for r in rows.tolist() if masks[r] is None]
        if plain:
            _, ids = index.search(Z[plain], max(M, RANK_DEPTH), params)
            for r, i in zip(plain, ids):
                i = i[i >= 0]
                o = np.argsort(i, kind="stable")
                iu = i[o].astype(np.int64)
                c, cu = np.empty(len(i)), np.empty(len(i))
                if SORTED_GATHER:  # read in unit order, placed back in the index's order (the same sums)
                    _gather_dots(vecs, base + iu, np.full(len(i), r), Z, cu, PREFETCH_ROWS)
                    c[o] = cu
                else:
                    _gather_dots(vecs, base + i, np.full(len(i), r), Z, c, PREFETCH_ROWS)
                    cu[:] = c[o]
                near[r], heads[r], placed = working_set.head_order(c, i, M, placed=True)  # by cosine, ties to the lower unit
                known[r] = (iu, cu)
                by_unit[r] = placed[o] if len(iu) < 2 or (iu[1:] > iu[:-1]).all() else None  # distinct: the stable order
        for r in rows.tolist():
            if masks[r] is not None:
                near[r] = _near_passing(index, Z[r], masks[r], M, params)
        for r in rows.tolist():  # an estimate of ranks: int8 codes are enough (``rank_sample``)
            dots = sample_dots(rsample, Z[r])
            dots.sort()
            sample[r] = (dots, rsample.units)
    ptr, ids = tok
    out = []
    for q, bank in enumerate(bidx.tolist()):
        uo = int(snap.off.uo[bank])
        cols = np.asarray(ids[ptr[q]:ptr[q + 1]], dtype=np.int64)
        lex = lexical(snap, bank, cols, M, sample[q][1], masks[q])  # a mask: the top among the passing units
        top = lex.top
        ult = snap.np["unit_thread"][uo + np.concatenate([near[q], top]).astype(np.int64)]
        W = working_set.assemble(snap.infos[bank].bank.thread_offsets, ult, snap.np["rel_idx"], uo, context)
        cos = np.empty(len(W))
        vecs, base = unit_block(snap, bank)
        if REUSE_DOTS:
            _known_dots(vecs, base, W, Z[q], *known[q], cos, PREFETCH_ROWS)
        else:
            _gather_dots(vecs, base + W, np.full(len(W), q), Z, cos, PREFETCH_ROWS)
        edge = heads[q][0, -1:] if heads[q].shape[1] else cos[np.searchsorted(W, near[q])]
        out.append(Shortlist(W, float(edge.min()) if len(edge) else np.inf, heads[q], sample[q][0], lex, cos,
                             scores_of(lex, snap, bank, cols, W), cols, by_unit=by_unit[q]))
    return out


def grown(snap: Snapshot, short: Shortlist, bank: int, more: np.ndarray, z: np.ndarray) -> Shortlist:
    """``short`` with the units ``more`` (bank-local, ascending and unique, none of them in ``W``:
    ``working_set.missing_units``, which already takes ``W`` away) in its working set too,
    their cosines with ``z`` and BM25 computed (the others' kept), and, when ``short`` holds its ranks and they are
    the bank's (an unmasked query: :func:`given_ranks` ranks each unit on its own, by the index's
    proposals, the rank sample and the query's BM25 table), the added units' ranks (the others'
    kept). A masked query's cosine ranks are among ``W``, so they are ranked again."""
    new = np.ascontiguousarray(more, dtype=np.int64)
    cos = np.empty(len(new))
    vecs, base = unit_block(snap, bank)
    _gather_dots(vecs, base + new, np.zeros(len(new), np.int64), z[None, :], cos, PREFETCH_ROWS)
    units = np.concatenate([short.units, new])
    order = np.argsort(units, kind="stable")
    bm_new = scores_of(short.lex, snap, bank, short.cols, new)
    ranks = None
    if REUSE and short.ranks is not None and short.head.shape[1]:
        add = given_ranks(short._replace(units=new, cos=cos, bm=bm_new), cos, int(snap.off.nu[bank]))
        ranks = tuple(np.concatenate([old, a])[order] for old, a in zip(short.ranks, add))
    bm = np.concatenate([short.bm, bm_new])
    return short._replace(units=units[order], cos=np.concatenate([short.cos, cos])[order], bm=bm[order], ranks=ranks)


def ranked(short: Shortlist, n_bank: int) -> Shortlist:
    """``short`` with its :attr:`Shortlist.ranks` (computed by :func:`given_ranks` unless held)."""
    return short if short.ranks is not None else short._replace(ranks=given_ranks(short, short.cos, n_bank))


def _near_passing(index: VectorIndex, z: np.ndarray, keep: np.ndarray, M: int, params: AnnParams) -> np.ndarray:
    """A masked query's cosine proposals: every passing unit when at most ``M`` pass, else the
    index's ``M`` best among the passing units."""
    passing = np.flatnonzero(keep)
    if len(passing) <= M:
        return passing
    _, ids = index.search(z[None, :], M, params, keep=keep)
    i = ids[0]
    return i[i >= 0]


def live_threads(snap: Snapshot, bidx: np.ndarray, masks: list | None) -> np.ndarray:
    """``[Q, J]`` bool (``compiled_args.FrontBatch.tlive``): for each masked query the threads of its
    bank that hold a passing unit (its thread graph, as the restricted bank's: ``select.restrict``);
    the rows of unmasked queries are unread; ``NO_THREADS`` when no query has a mask."""
    if masks is None or all(m is None for m in masks):
        return NO_THREADS
    J = max(1, int(snap.off.nt[bidx].max()))
    out = np.ones((len(bidx), J), dtype=np.bool_)
    for q, (m, b) in enumerate(zip(masks, bidx.tolist())):
        if m is not None:
            uo, nu = int(snap.off.uo[b]), int(snap.off.nu[b])
            out[q] = False
            out[q, snap.np["unit_thread"][uo:uo + nu][m]] = True
    return out


def given_ranks(short: Shortlist, cos: np.ndarray, n_bank: int) -> tuple[np.ndarray, np.ndarray]:
    """The ranks of the working set's units in the whole bank, by cosine and by BM25 (float64).

    By cosine: 1 + the index's ``RANK_DEPTH`` proposals scoring more (and tied ones of a lower
    unit) for a unit at or above the last of them (its rank in the bank when the index found the
    true top ones; a masked query: its rank in ``W``), else the larger of that and ``1 + N * (the share of the bank's rank sample above its
    cosine)``. By BM25: ``lexical_shortlist.ranks_of`` (exact when the query's terms hold few
    postings or when read in one compiled pass, ``lexical_dense``; with the impact-ordered reading,
    exact above the threshold bound and estimated below it)."""
    W = short.units
    rc = ranks.cosine_ranks(short.head, cos, W, short.edge, short.sample, n_bank, short.by_unit)  # compiled or plain
    return rc, ranks_of(short.lex, W, short.bm)


def front_args(snap: Snapshot, Z: np.ndarray, bidx: np.ndarray, shorts: list[Shortlist], tok: tuple, lq,
               learned: bool, hops, n_seeds):
    """``(spaces, compact's tuple)`` of a front round: each query's :class:`ThreadSpace` (its
    ``hops`` and ``n_seeds``) and :func:`compact` over them, compiled (:data:`ASSEMBLY`) or not."""
    if ASSEMBLY:
        shorts[:] = [ranked(sh, int(snap.off.nu[b])) for sh, b in zip(shorts, bidx.tolist())]
        spaces, args = assembly.front_args(snap, bidx, shorts, lq, learned, hops, n_seeds)
        return [ThreadSpace(*sp) for sp in spaces], args
    spaces = [thread_space(snap, b, sh.units, int(hops[q]), int(n_seeds[q])) for q, (b, sh) in
              enumerate(zip(bidx.tolist(), shorts))]
    return spaces, compact(snap, Z, bidx, shorts, tok, lq, learned, spaces)


def compact(snap: Snapshot, Z: np.ndarray, bidx: np.ndarray, shorts: list[Shortlist], tok: tuple, lq,
            learned: bool, spaces: list[ThreadSpace]):
    """The front loop's arguments with query ``q``'s working set as its bank ``q`` and its
    :class:`ThreadSpace` ``spaces[q]`` as the bank's threads: ``(FrontTables fields, Offsets, cos,
    coff, tok_ptr, tok_ids, GivenRanks, LearnedTables, LearnedQueries)``. ``shorts[q]`` is replaced
    by itself with its ranks (:func:`ranked`), which :func:`grown` keeps for the next round."""
    n = snap.np
    W = [sh.units for sh in shorts]
    Q = len(W)
    nu = np.array([len(w) for w in W], dtype=np.int64)
    uo = np.concatenate([[0], np.cumsum(nu)[:-1]]).astype(np.int64)
    glob = [int(snap.off.uo[b]) + w for b, w in zip(bidx.tolist(), W)]
    g = np.concatenate(glob) if Q else np.zeros(0, np.int64)
    cos = np.concatenate([sh.cos for sh in shorts]) if Q else np.zeros(0)
    shorts[:] = [ranked(sh, int(snap.off.nu[b])) for sh, b in zip(shorts, bidx.tolist())]
    rk = [sh.ranks for sh in shorts]
    ranks = GivenRanks(np.concatenate([r[0] for r in rk]), np.concatenate([r[1] for r in rk]))
    # one column per query: its working set's BM25 (summed in token order already: the loop adds it to 0)
    bidx_c = [np.flatnonzero(sh.bm != 0) for sh in shorts]
    bdat = [sh.bm[p] for sh, p in zip(shorts, bidx_c)]
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    bptr = np.concatenate([[0], np.cumsum([len(p) for p in bidx_c])]).astype(np.int64)
    tptr = np.arange(Q + 1, dtype=np.int64)
    tids = np.arange(Q, dtype=np.int64)
    nt = np.array([len(sp.ids) for sp in spaces], dtype=np.int64)
    to = np.concatenate([[0], np.cumsum(nt)[:-1]]).astype(np.int64)
    ult = np.concatenate([np.searchsorted(sp.ids, n["unit_thread"][gq]) for sp, gq in zip(spaces, glob)]) if Q \
        else np.zeros(0, np.int64)
    nbr = np.array(assembly.padded([sp.nbr for sp in spaces], -1, n["nbr"].dtype))  # a copy, as concatenate's
    nbw = np.array(assembly.padded([sp.nbw for sp in spaces], 0, n["nbw"].dtype))
    tables = (ult, nbr, nbw, cat(bdat, np.float32), cat(bidx_c, np.int64), bptr)
    zeros = np.zeros(Q, np.int64)
    off = Offsets(uo, to, zeros, zeros, zeros, zeros, nu, nt, zeros)
    ltab, lqc = _learned(snap, bidx, W, glob, lq, learned)
    return tables, off, cos, uo, tptr, tids, ranks, ltab, lqc


PREFETCH_ROWS = 32
"""Rows a compiled gather of scattered unit rows (:func:`_gather_dots`, :func:`_known_dots`,
``pool.candidate_rows``) asks the cache for ahead of the one it reads (``_jit.prefetch_row``;
0: none). The rows are scattered over the bank's table, so each is a fresh read from memory:
asked for early, they arrive while the rows before them are summed (1,024 rows of 384 float32,
cold: 0.45 ms, 0.21 ms with 32 ahead)."""


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz", "contract"}, inline="always")
def _row_dot(v, z):  # pragma: no cover - compiled
    """``v . z`` summed in float64 in any order: the one sum of :func:`_gather_dots` and
    :func:`_known_dots` (inlined in both, under their flags), so they give the same bits."""
    acc = 0.0
    for k in range(v.shape[0]):
        acc += v[k] * z[k]
    return acc


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz", "contract"})
def _gather_dots(vecs, rows, qrow, Z, out, ahead):  # pragma: no cover - compiled
    """``out[i] = vecs[rows[i]] . Z[qrow[i]]`` (one thread, no BLAS pool: small per-query products;
    summed in any order, as ``candidates.own_dots``), the rows ``ahead`` of each prefetched."""
    for i in range(rows.shape[0]):
        prefetch_ahead(vecs, rows, 0, i, ahead)
        out[i] = _row_dot(vecs[rows[i]], Z[qrow[i]])


SORTED_GATHER = True
"""The index's proposals are read from the bank's table in unit order (``working_sets``): units of
one thread are adjacent rows, so neighbouring proposals share pages and cache lines; False: in
the index's order (the same cosines, each row's own sum)."""

REUSE_DOTS = True
"""The working set's cosines of units the index proposed are the proposals' (computed once, by the
same :func:`_gather_dots` sum: the same bits; :func:`_known_dots`); False: every one computed again."""


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz", "contract"})
def _known_dots(vecs, base, W, z, ku, kc, out, ahead):  # pragma: no cover - compiled
    """``out[i] = vecs[base + W[i]] . z`` (``W`` ascending) as :func:`_gather_dots` sums it, or
    ``kc[k]`` where ``W[i] == ku[k]`` (``ku`` ascending: units whose cosine is known)."""
    k = 0
    for i in range(W.shape[0]):
        prefetch_ahead(vecs, W, base, i, ahead)
        while k < ku.shape[0] and ku[k] < W[i]:
            k += 1
        if k < ku.shape[0] and ku[k] == W[i]:
            out[i] = kc[k]
        else:
            out[i] = _row_dot(vecs[base + W[i]], z)


def _learned(snap: Snapshot, bidx, W, glob, lq, learned: bool):
    """The learned affinity's tables and question cues over the working sets (prev / next as
    positions in ``W[q]``, -1 outside it; the date match of ``W[q]``'s units)."""
    if not learned:
        return no_learned_tables(), lq
    n = snap.np
    rel, dm, dm_off, k = [], [], [], 0
    for q, (w, gq) in enumerate(zip(W, glob)):
        r = n["rel_idx"][gq].copy()
        for c in (1, 2):
            p = np.minimum(np.searchsorted(w, r[:, c]), len(w) - 1)
            r[:, c] = np.where((r[:, c] >= 0) & (w[p] == r[:, c]), p, -1)
        rel.append(r)
        if lq.dm_off[q] >= 0:
            dm_off.append(k)
            dm.append(lq.dm[lq.dm_off[q] + w])
            k += len(w)
        else:
            dm_off.append(-1)
    g = np.concatenate(glob)
    ltab = LearnedTables(np.ascontiguousarray(np.concatenate(rel)), n["temporal"][g], n["rel_words"][g])
    return ltab, LearnedQueries(lq.named, lq.named_off, lq.z_temp, np.concatenate(dm) if dm else np.zeros(0),
                                np.asarray(dm_off, np.int64), lq.w, lq.rrf_k)


class ThreadSpace(NamedTuple):
    """One query's threads of the front loop (a working set's own thread ids, ``0 .. len(ids)``)."""

    ids: np.ndarray
    """Bank-local threads, ascending: the working set's threads, every thread within the query's
    ``hops`` of them, and (when the working set has fewer threads than seeds) the bank's lowest."""
    nbr: np.ndarray
    """``[len(ids), D]`` neighbours as positions in ``ids`` (-1: none, or a thread past ``hops``)."""
    nbw: np.ndarray
    """``[len(ids), D]`` their edge weights."""


def thread_space(snap: Snapshot, bank: int, units: np.ndarray, hops: int, n_seeds: int) -> ThreadSpace:
    """The threads query's front loop reads, for a working set ``units`` of ``bank``.

    Seeds are threads of the working set (the others have no unit, so no seed score) and
    propagation follows at most ``hops`` edges from them, so every thread it reaches is within
    ``hops`` edges of a working-set thread: those threads and the edges among them are the space
    (an edge out of it leaves a thread ``hops`` edges away, which propagation never relaxes).
    Thread ids keep their order, so the loop's ties (lowest id) fall as over the whole bank; a
    working set of fewer threads than seeds takes the bank's lowest threads too (seeds without a
    score, as over the whole bank)."""
    g0, J = int(snap.off.to[bank]), int(snap.off.nt[bank])
    own = np.unique(snap.np["unit_thread"][int(snap.off.uo[bank]) + units])
    pad = min(J, n_seeds + len(own)) if len(own) < n_seeds else 0
    return ThreadSpace(*_space(snap.np["nbr"], snap.np["nbw"], g0, J, own, int(hops), pad))


@njit(cache=True, nogil=True)
def _space(nbr, nbw, g0, J, own, hops, pad):  # pragma: no cover - compiled
    """``(ids, local nbr, local nbw)`` of :func:`thread_space`: a breadth-first walk of ``hops``
    levels from ``own`` with a level per thread of the bank (every column of each row read), then
    the rows of the threads fewer than ``hops`` edges away renumbered (the others' are never read:
    -1 and 0), as many columns as the longest of those rows (1 + its last neighbour's column)."""
    D = nbr.shape[1]
    level = np.full(J, -1, np.int64)
    got = np.empty(max(len(own) * (1 + D), 16), np.int64)
    n = 0
    for t in own:
        level[t] = 0
        got[n] = t
        n += 1
    got, n = assembly._walk(nbr, g0, level, got, n, hops, pad, False)
    ids = np.sort(got[:n])
    pos = np.empty(J, np.int64)  # read only where level >= 0
    width = 1
    for i in range(n):
        pos[ids[i]] = i
        if level[ids[i]] < hops:
            for e in range(D):
                if nbr[g0 + ids[i], e] >= 0:
                    width = max(width, e + 1)
    local = np.full((n, width), -1, nbr.dtype)
    w = np.zeros((n, width), nbw.dtype)
    for i in range(n):
        t = ids[i]
        if level[t] < hops:
            for e in range(width):
                k = nbr[g0 + t, e]
                if k >= 0 and level[k] >= 0:
                    local[i, e] = pos[k]
                    w[i, e] = nbw[g0 + t, e]
    return ids, local, w


def local_rows(tlive: np.ndarray, spaces: list[ThreadSpace]) -> np.ndarray:
    """``tlive`` (``[Q, J]``, :func:`live_threads`) read at each query's :class:`ThreadSpace`."""
    out = np.zeros((len(spaces), max(1, max(len(sp.ids) for sp in spaces))), dtype=np.bool_)
    for q, sp in enumerate(spaces):
        out[q, :len(sp.ids)] = tlive[q, sp.ids]
    return out
