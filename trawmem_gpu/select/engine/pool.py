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

* the compiled stage (``compiled.stage_loop``) reads :class:`QueryTables` (flat, per chunk part:
  :func:`stage_parts`, :func:`query_tables`);
* the tensor backend (``tensor.select_chunk``) reads :func:`pool_similarity` and
  :func:`pool_floors` over the chunk's rows without tables.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..objective import support_kernel
from .tables import Snapshot

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
    """Row ranges ``[a, b)`` of a chunk, cut so the queries of banks without tables in one range form
    at most ``limit`` K entries (one range when every bank has its tables; a range holds at least
    one query)."""
    Q = len(bidx)
    own = snap.off.tab[bidx] == 0
    if not own.any():
        return [(0, Q)]
    size = np.where(own, n_cand.astype(np.int64) ** 2, 0)
    out, a, acc = [], 0, 0
    for i in range(Q):
        if acc and acc + size[i] > limit:
            out.append((a, i))
            a, acc = i, 0
        acc += size[i]
    out.append((a, Q))
    return out


def candidate_gram(snap: Snapshot, bank: int, cand: np.ndarray) -> Tensor:
    """``S [U, U]`` cosines between the candidates ``cand`` (bank-local) of bank ``bank`` (engine dtype)."""
    E = snap.t["unit_vecs"][torch.as_tensor(int(snap.off.uo[bank]) + np.asarray(cand, dtype=np.int64))]
    return E @ E.T


def query_kernel(snap: Snapshot, cfg, bank: int, cand: np.ndarray, S: Tensor, lt: Tensor) -> Tensor:
    """``K [U, U]`` of one query's candidates from their cosines ``S`` and neighbourhood threads
    ``lt``: the kernel the bank's ``ktab`` would hold for them."""
    links = snap.infos[bank].links
    floor = None if links is None else links.between(cand)
    fl = None if floor is None else torch.as_tensor(floor, dtype=S.dtype, device=S.device)
    return support_kernel(S, lt[:, None] == lt[None, :], cfg, fl)


def query_tables(snap: Snapshot, cfg, x, a: int, b: int) -> QueryTables:
    """:class:`QueryTables` of rows ``[a, b)`` of the compiled stage's batch ``x``
    (``compiled_args.StageBatch``)."""
    Q = b - a
    if (snap.off.tab[x.bidx[a:b]] != 0).all():
        return no_query_tables(Q)
    kq_off, bq_off = np.full(Q, -1, np.int64), np.full(Q, -1, np.int64)
    ks, bs, nk, nb = [], [], 0, 0
    identity = cfg.kernel == "identity"
    for i in range(Q):
        q = a + i
        bank, n, nt = int(x.bidx[q]), int(x.n_cand[q]), int(x.n_h[q])
        if snap.off.tab[bank] or n <= 0:
            continue
        cand = x.cand[q, :n]
        lt = torch.as_tensor(x.lt[q, :n])
        S = candidate_gram(snap, bank, cand).to(torch.float64)
        bt = torch.full((n, max(nt, 1)), float("-inf"), dtype=torch.float64)
        bt.scatter_reduce_(1, lt[None, :].expand(n, n), S, reduce="amax", include_self=True)
        bq_off[i], nb = nb, nb + bt.numel()
        bs.append(bt.flatten().numpy())
        if not identity:
            K = query_kernel(snap, cfg, bank, cand, S, lt)
            kq_off[i], nk = nk, nk + K.numel()
            ks.append(K.flatten().numpy())
    cat = lambda parts: np.ascontiguousarray(np.concatenate(parts)) if parts else np.zeros(1)  # noqa: E731
    return QueryTables(cat(ks), kq_off, cat(bs), bq_off)


def pool_similarity(snap: Snapshot, gid: Tensor) -> Tensor:
    """``S [Qs, U, U]`` the candidates' cosines for the tensor backend's rows ``gid [Qs, U]`` (stored rows)."""
    E = snap.t["unit_vecs"][gid]
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
