"""K and the bridge of a query's candidate pool, formed from the candidates' vectors: what a bank
without per-bank tables (``tables.py``: a bank past ``EngineConfig.table_max_units`` units, or an
engine whose banks' tables would pass ``EngineConfig.table_bytes``) reads instead of ``ktab`` and
``btab``.

The per-bank tables hold ``K_b [N, N]`` and ``btab [N, J]``: ``N^2`` floats per bank, and their
build forms the bank's Gram matrix and the kernel's temporaries, ``N^2`` each (a 12,009-unit bank
took 12 GB to open). A query reads only its candidates' ``[U, U]`` block of K and their best
cosine per neighbourhood thread, and every unit of a neighbourhood thread is a candidate
(``steps.candidates``), so both are formed from ``S = E_c E_c^T`` of the candidates' vectors:
``K = objective.support_kernel(S, same thread, floor)`` with the floor of the bank's support links
between the candidates (``objective.support_links``), and ``bridge[u, j]`` = the largest ``S[u, v]``
over the candidates ``v`` of neighbourhood thread ``j``. These are the tables' values, entry by
entry (the same formula on the same vectors; a dot product's last bit may follow the BLAS's
blocking, as the reference's own ``E_c E_c^T`` does). Memory per query: ``U^2`` floats, in
chunks of at most :data:`POOL_ELEMS`.

* the compiled stage (``compiled_loops.stage_loop``) reads :class:`QueryTables` (flat, per chunk part:
  :func:`stage_parts`, :func:`query_tables`);
* the tensor backend (``tensor.select_chunk``) reads :func:`pool_similarity` and
  :func:`pool_floors` over the chunk's rows without tables.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._jit import njit, prefetch_ahead
from ..objective import support_from_cosine_compiled, support_kernel
from . import shortlist
from .tables import Snapshot, unit_block, unit_rows

POOL_ELEMS = 1 << 22
"""Most ``sum_q U_q^2`` the compiled stage forms at once for the queries of banks without tables
(32 MiB of float64); a chunk with more is run in parts (:func:`stage_parts`)."""


class QueryTables(NamedTuple):
    """The compiled stage's per-query K and bridge (flat float64, row ``q`` of the chunk part):
    query ``q``'s ``K [n, n]`` at ``kq[kq_off[q]:]`` and its bridge cosines ``[n, n_h]`` (candidate
    ``u``'s best cosine with neighbourhood thread ``j``: ``bq[bq_off[q] + u * n_h + j]``);
    ``bq_off[q] < 0``: the query's bank has its tables (read ``ktab`` / ``btab``)."""

    kq: np.ndarray
    kq_off: np.ndarray
    bq: np.ndarray
    bq_off: np.ndarray


def no_query_tables(Q: int) -> QueryTables:
    """:class:`QueryTables` for ``Q`` queries whose banks all have their tables."""
    e = np.zeros(1)
    return QueryTables(e, np.full(Q, -1, np.int64), e, np.full(Q, -1, np.int64))


def stage_parts(snap: Snapshot, bidx: np.ndarray, n_cand: np.ndarray, limit: int = POOL_ELEMS) -> list[tuple[int, int]]:
    """Row ranges ``[a, b)`` of a chunk, cut so the queries of banks without tables in one range,
    padded to the range's largest, form at most ``limit`` K entries (one range when every bank has
    its tables; a range holds at least one query)."""
    Q = len(bidx)
    own = snap.off.tab[bidx] == 0
    if not own.any():
        return [(0, Q)]
    out, a, k, top = [], 0, 0, 0
    for i in range(Q):
        n = int(n_cand[i]) if own[i] else 0
        if k and (k + 1) * max(top, n) ** 2 > limit:
            out.append((a, i))
            a, k, top = i, 0, 0
        if own[i]:
            k, top = k + 1, max(top, n)
    out.append((a, Q))
    return out


def candidate_gram(snap: Snapshot, bank: int, cand: np.ndarray) -> Tensor:
    """``S [U, U]`` cosines between the candidates ``cand`` (bank-local) of bank ``bank`` (engine dtype)."""
    E = unit_rows(snap, torch.as_tensor(int(snap.off.uo[bank]) + np.asarray(cand, dtype=np.int64)))
    return E @ E.T


def query_kernel(snap: Snapshot, cfg, bank: int, cand: np.ndarray, S: Tensor, lt: Tensor) -> Tensor:
    """``K [U, U]`` of one query's candidates from their cosines ``S`` and neighbourhood threads
    ``lt``: the kernel the bank's ``ktab`` would hold for them."""
    links = snap.infos[bank].links
    floor = None if links is None else links.between(cand)
    fl = None if floor is None else torch.as_tensor(floor, dtype=S.dtype, device=S.device)
    return support_kernel(S, lt[:, None] == lt[None, :], cfg, fl)


@njit(cache=True, nogil=True)
def _fill(G, n, nt, lt, kernel, kq, kq_off, bq, bq_off):  # pragma: no cover - compiled
    """Per query ``i`` of a part: its bridge cosines (the largest ``G[i, u, v]`` over the candidates
    ``v`` of each neighbourhood thread) at ``bq[bq_off[i]:]`` and, unless the kernel is the
    identity, its K at ``kq[kq_off[i]:]``: ``objective.support_kernel``'s steps in its order (the
    clip formula, zero across threads without cross-thread support, unit diagonal; a floor is
    raised after). ``kernel``: ``(k_shift, cross_thread, identity)``."""
    k_shift, cross, identity = kernel
    for i in range(G.shape[0]):
        m, t = n[i], max(nt[i], 1)
        b0 = bq_off[i]
        for j in range(m * t):
            bq[b0 + j] = -np.inf
        for u in range(m):
            for v in range(m):
                c = G[i, u, v]
                j = b0 + u * t + lt[i, v]
                if c > bq[j]:
                    bq[j] = c
        if identity:
            continue
        k0 = kq_off[i]
        for u in range(m):
            for v in range(m):
                k = support_from_cosine_compiled(G[i, u, v], k_shift)
                if not cross and lt[i, u] != lt[i, v]:
                    k = 0.0
                kq[k0 + u * m + v] = 1.0 if u == v else k


GATHER = True
""":func:`candidate_rows` gathers the rows by one compiled pass per query (:func:`_rows64`); False:
``tables.unit_rows`` (the same values)."""


def candidate_rows(snap: Snapshot, bidx: np.ndarray, cand: np.ndarray, n: np.ndarray) -> Tensor:
    """``[Q, U, d]`` float64: row ``q``'s first ``n[q]`` candidates' unit vectors (bank-local units
    ``cand[q]`` of bank ``bidx[q]``; a mapped bank's from its own vectors, ``tables.unit_block``);
    its padding rows are unit 0's (``tables.unit_rows``) or zero (:data:`GATHER`: never read).
    Gathered and cast to float64 in one pass, prefetching the rows ahead (``shortlist.PREFETCH_ROWS``),
    when the engine's dtype is float64: the cast of a stored row is then the exact one
    ``unit_rows`` makes through the engine's dtype."""
    U = cand.shape[1]
    if not GATHER or snap.t["head_sim"].dtype != torch.float64 or snap.t["unit_vecs"].device.type != "cpu":
        live = np.arange(U)[None, :] < n[:, None]
        gid = torch.as_tensor(snap.off.uo[bidx][:, None] + np.where(live, cand, 0))
        return unit_rows(snap, gid).to(torch.float64)
    vecs0 = snap.np["unit_vecs"]
    out = np.zeros((len(bidx), U, vecs0.shape[1]))
    for q, b in enumerate(bidx.tolist()):
        vecs, base = unit_block(snap, b)
        _rows64(vecs, base + cand[q, :n[q]], out[q], shortlist.PREFETCH_ROWS)
    return torch.from_numpy(out)


@njit(cache=True, nogil=True)
def _rows64(vecs, rows, out, ahead):  # pragma: no cover - compiled
    """``out[i] = vecs[rows[i]]`` as float64, the rows ``ahead`` prefetched."""
    for i in range(len(rows)):
        prefetch_ahead(vecs, rows, 0, i, ahead)
        for k in range(vecs.shape[1]):
            out[i, k] = vecs[rows[i], k]


def query_tables(snap: Snapshot, cfg, x, a: int, b: int) -> QueryTables:
    """:class:`QueryTables` of rows ``[a, b)`` of the compiled stage's batch ``x``
    (``compiled_args.StageBatch``): one batched product ``E_c E_c^T`` for the part's queries of
    banks without tables, then their K and bridge (:func:`_fill`) and the support links' floors."""
    Q = b - a
    own = np.flatnonzero((snap.off.tab[x.bidx[a:b]] == 0) & (x.n_cand[a:b] > 0))
    if not len(own):
        return no_query_tables(Q)
    n, nt = x.n_cand[a:b][own].astype(np.int64), x.n_h[a:b][own].astype(np.int64)
    U = int(n.max())
    E = candidate_rows(snap, x.bidx[a:b][own], x.cand[a:b][own, :U], n)
    G = torch.bmm(E, E.transpose(1, 2)).numpy()
    kq_off, bq_off = np.full(Q, -1, np.int64), np.full(Q, -1, np.int64)
    identity = cfg.kernel == "identity"
    bsz, ksz = n * np.maximum(nt, 1), (0 if identity else 1) * n * n
    bq_off[own] = np.concatenate([[0], np.cumsum(bsz)[:-1]])
    kq_off[own] = np.concatenate([[0], np.cumsum(ksz)[:-1]])
    bq, kq = np.empty(max(1, int(bsz.sum()))), np.empty(max(1, int(ksz.sum())))
    lt = np.ascontiguousarray(x.lt[a:b][own, :U])
    _fill(G, n, nt, lt, (float(cfg.k_shift), bool(cfg.cross_thread), identity), kq, kq_off[own], bq, bq_off[own])
    if not identity:
        for i, r in enumerate(own.tolist()):
            links = snap.infos[int(x.bidx[a + r])].links
            F = None if links is None else links.between(x.cand[a + r, :n[i]])
            if F is not None:
                K = kq[kq_off[r]:kq_off[r] + n[i] * n[i]]
                np.maximum(K, F.reshape(-1), out=K)
    return QueryTables(kq, kq_off, bq, bq_off)


def pool_similarity(snap: Snapshot, gid: Tensor) -> Tensor:
    """``S [Qs, U, U]`` the candidates' cosines for the tensor backend's rows ``gid [Qs, U]`` (stored rows)."""
    E = unit_rows(snap, gid)
    return torch.bmm(E, E.transpose(1, 2))


def pool_floors(snap: Snapshot, bidx: Tensor, cand: Tensor, n_cand: Tensor) -> Tensor | None:
    """``[Qs, U, U]`` the support links' floor between each row's candidates (0 on padding), None
    when no row's bank has links."""
    b = bidx.cpu().tolist()
    if all(snap.infos[i].links is None for i in b):
        return None
    Qs, U = cand.shape
    out = np.zeros((Qs, U, U))
    cc, nn = cand.cpu().numpy(), n_cand.cpu().tolist()
    for r, (i, n) in enumerate(zip(b, nn)):
        links = snap.infos[i].links
        F = None if links is None or n <= 0 else links.between(cc[r, :n])
        if F is not None:
            out[r, :n, :n] = F
    return torch.as_tensor(out, device=cand.device)
