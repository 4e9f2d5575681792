"""Stage 2, step 2 (design note): propagate the seeds' scores over the thread graph G_H for up to
H hops, keeping the max over paths, and cap the neighbourhood H_q at ``neighborhood_cap``
threads (the seeds, then the best-scored others; ties to the lower thread id).

One relaxation (Eq. 4) is :func:`relax`, used by all three variants side by side: the NumPy
reference (:func:`neighbourhood`), the torch batch (:func:`propagate_torch`,
:func:`neighbourhood_torch`) and the compiled per-query loop (:func:`propagate_one`). All three
process relaxations in the reference's order: round 1 from the seeds in seed-rank order, later
rounds from the threads updated in the previous round in ascending id, each relaxation reading
the source's *current* score.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._jit import njit
from ..tensor_ops import NEG_INF, POS_INF, compact, topk_mask


def relax(r_src, w, gamma, paper):
    """Score a neighbour receives from a source scored ``r_src`` over an edge of weight ``w``:
    Eq. 4 as written (``paper``) or damped, never above the source (floats, arrays, tensors)."""
    return gamma * r_src + (1 - gamma) * w if paper else r_src * (gamma + (1 - gamma) * w)


relax_compiled = njit(cache=True, inline="always")(relax)


# ----------------------------------------------------------------------------------------------
# reference (NumPy, one query)
# ----------------------------------------------------------------------------------------------
def neighbourhood(ctx, r0: np.ndarray, cfg, params) -> dict[int, float]:
    """Seeds and their best neighbours within H hops: ``{thread: r~}`` (max over paths), ascending
    (``params``: the query's resolved ``QueryParams``: n_seeds, hops, neighborhood_cap)."""
    order = sorted(range(len(r0)), key=lambda j: (-r0[j], j))
    seeds = order[:params.n_seeds]
    r = {j: float(r0[j]) for j in seeds}
    frontier = list(seeds)
    paper = cfg.propagation == "paper"
    for _ in range(params.hops):
        nxt = []
        for j in frontier:
            for k, w in ctx.neighbours(j, cfg.semantic_edges):
                val = relax(r[j], w, cfg.gamma, paper)
                if val > r.get(k, -np.inf):
                    r[k] = val
                    nxt.append(k)
        frontier = sorted(set(nxt))
    seed_set = set(seeds)
    rest = sorted((k for k in r if k not in seed_set), key=lambda k: (-r[k], k))
    keep = seeds + rest[:max(0, params.neighborhood_cap - len(seeds))]
    return {k: r[k] for k in sorted(keep)}


# ----------------------------------------------------------------------------------------------
# torch (a batch of queries; threads are bank-local, column J is a dummy sink for padding)
# ----------------------------------------------------------------------------------------------
class ThreadGraph(NamedTuple):
    """G_H as padded neighbour lists (ELL) over stored threads: ``nbr [rows, D]`` bank-local
    neighbour ids (-1 = none) and ``nbw`` their weights; row ``dummy`` has no neighbour."""

    nbr: object
    nbw: object
    dummy: int


def propagate_torch(r0: Tensor, n_threads: Tensor, toff: Tensor, graph: ThreadGraph, cfg, params,
                    live: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Seeds and H hops of max-over-paths relaxation: ``(r [Q, J], seed_mask [Q, J])``, every query
    of the batch with the same resolved ``params`` (n_seeds, hops).

    :param r0: ``[Q, J]`` seed scores (-inf on padding); ``n_threads``, ``toff``: ``[Q]`` the
        query's bank's thread count and first stored thread row
    :param live: ``[Q, J]`` bool, the threads a query's unit mask leaves (``select.restrict``):
        the others are out of the graph (never a seed, never reached); None: every thread
    One Python iteration per frontier slot, vectorized over queries and over the ``D`` neighbours
    of the slot's thread.
    """
    Q, J = r0.shape
    dev = r0.device
    ns = min(params.n_seeds, J)
    tvalid = torch.arange(J, device=dev)[None, :] < n_threads[:, None]
    if live is not None:
        tvalid = tvalid & live
        live = torch.cat([live, torch.zeros(Q, 1, dtype=torch.bool, device=dev)], dim=1)
    r = torch.full((Q, J + 1), NEG_INF, dtype=r0.dtype, device=dev)
    r0p = torch.cat([r0, r[:, :1]], dim=1)
    # seeds: the ns best valid threads (ties -> lower thread index), in seed-rank order
    idx = compact(topk_mask(r0, ns, tvalid), ns, fill=J)  # ascending thread index, J = none
    seeds = torch.gather(idx, 1, torch.sort(-torch.gather(r0p, 1, idx), dim=1, stable=True).indices)
    r.scatter_(1, seeds, torch.gather(r0p, 1, seeds))
    r[:, J] = NEG_INF
    seed_mask = torch.zeros(Q, J + 1, dtype=torch.bool, device=dev)
    seed_mask.scatter_(1, seeds, True)
    paper = cfg.propagation == "paper"
    frontier = seeds
    for _ in range(params.hops):
        if frontier.shape[1] == 0:
            break
        nxt = torch.zeros(Q, J + 1, dtype=torch.bool, device=dev)
        for f in range(frontier.shape[1]):
            j = frontier[:, f]
            gj = torch.where(j < J, toff + j, graph.dummy)
            nb = graph.nbr[gj].long()  # [Q, D] bank-local ids, -1 = none (the table's int32, as int64)
            nb = torch.where(nb >= 0, nb, J)
            val = relax(torch.gather(r, 1, j[:, None]), graph.nbw[gj].to(r.dtype), cfg.gamma, paper)
            cur = torch.gather(r, 1, nb)
            upd = (val > cur) & (nb < J)
            if live is not None:
                upd &= torch.gather(live, 1, nb)
            r.scatter_(1, nb, torch.where(upd, val, cur))
            nxt.scatter_(1, nb, upd | torch.gather(nxt, 1, nb))
            r[:, J] = NEG_INF
        nxt = nxt[:, :J]
        frontier = compact(nxt, int(nxt.sum(dim=1).max()), fill=J)
    return r[:, :J], seed_mask[:, :J]


def neighbourhood_torch(r: Tensor, seed_mask: Tensor, cap: int) -> tuple[Tensor, Tensor, Tensor]:
    """Cap H_q to the seeds + the best others: ``(in_h [Q, J], tpos [Q, J], n_h [Q])``; ``tpos``
    numbers the kept threads in ascending id (-1 elsewhere)."""
    J = r.shape[1]
    key = torch.where(seed_mask, POS_INF, r)
    in_h = topk_mask(key, min(cap, J), r > NEG_INF)
    return in_h, positions(in_h), in_h.sum(dim=1)


def positions(in_h: Tensor) -> Tensor:
    """``[Q, J]`` position of each kept thread among the kept ones (ascending id), -1 elsewhere."""
    return torch.where(in_h, torch.cumsum(in_h.to(torch.int64), dim=1) - 1, -1)


# ----------------------------------------------------------------------------------------------
# compiled (numba, one query at a time)
# ----------------------------------------------------------------------------------------------
class PropagationParams(NamedTuple):
    """One query's propagation: its resolved ``QueryParams`` sizes and the method's relaxation."""

    n_seeds: int
    cap: int
    hops: int
    gamma: float
    paper: bool


def propagation_params(cfg, params, J: int) -> PropagationParams:
    """The :class:`PropagationParams` of a query with resolved ``params`` over ``J`` threads."""
    return PropagationParams(min(params.n_seeds, J), min(params.neighborhood_cap, J), params.hops,
                             float(cfg.gamma), cfg.propagation == "paper")


class QuerySizes(NamedTuple):
    """Per-query propagation sizes of a batch (``[Q]`` int64 each) for the compiled loops."""

    n_seeds: np.ndarray
    cap: np.ndarray
    hops: np.ndarray


def query_sizes(n_seeds, cap, hops, J: int) -> QuerySizes:
    """:class:`QuerySizes` of per-query resolved sizes (``[Q]`` each), seeds and cap clipped to ``J``."""
    c = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    return QuerySizes(c(np.minimum(n_seeds, J)), c(np.minimum(cap, J)), c(hops))


class ThreadScratch(NamedTuple):
    """Per-worker scratch of :func:`propagate_one`, each ``[>= J]``."""

    seeds: np.ndarray
    picked: np.ndarray
    front: np.ndarray
    nxt: np.ndarray


def thread_scratch(J: int, n_seeds: int) -> ThreadScratch:
    J = max(J, 1)
    return ThreadScratch(np.empty(max(n_seeds, 1), np.int64), np.empty(J, np.bool_), np.empty(J, np.int64),
                         np.empty(J, np.bool_))


@njit(cache=True, nogil=True, inline="always")
def top_seeds(r0, n, live, k, seeds):  # pragma: no cover - compiled
    """``seeds[:k]``: the ``k`` live threads of ``r0[:n]`` best by (r0 desc, id asc), in that order
    (``k`` at most the live threads; returns ``k``). One pass, each live thread entering a sorted
    list of at most ``k`` (it holds the largest id so far, so it goes after every equal ``r0``):
    the order :func:`top_seeds_reference`'s selection picks (non-NaN ``r0``)."""
    ns = 0
    for j in range(n):
        if not live[j]:
            continue
        if ns < k:
            i = ns
            ns += 1
        elif k > 0 and r0[j] > r0[seeds[k - 1]]:
            i = k - 1
        else:
            continue
        x = r0[j]
        while i > 0 and r0[seeds[i - 1]] < x:
            seeds[i] = seeds[i - 1]
            i -= 1
        seeds[i] = j
    return k


@njit(cache=True, nogil=True)
def top_seeds_reference(r0, n, live, k, seeds):  # pragma: no cover - compiled
    """:func:`top_seeds` as the plain selection: ``k`` times the best live thread not yet picked
    by r0, the lowest id on ties."""
    picked = np.zeros(n, np.bool_)
    for i in range(k):
        b = -1
        for j in range(n):
            if live[j] and not picked[j] and (b < 0 or r0[j] > r0[b]):
                b = j
        picked[b] = True
        seeds[i] = b
    return k


@njit(cache=True)
def propagate_one(r0, n, g0, nbr, nbw, p, s, r, in_h, live):  # pragma: no cover - compiled
    """One query over its ``n`` threads (``g0``: its bank's first stored thread row), in the
    reference's order: seeds = the ``p.n_seeds`` best by (r0 desc, id asc); relaxations by
    :func:`relax`; then the seeds plus the best other reached threads by (r~ desc, id asc) up to
    ``p.cap``. Writes ``r[:n]`` (-inf where unreached) and ``in_h[:n]``. Only threads with
    ``live[j]`` take part (a unit mask's: the others are out of the graph)."""
    D = nbr.shape[1]
    picked, seeds, front, nxt = s.picked, s.seeds, s.front, s.nxt
    n_live = 0
    for j in range(n):
        picked[j] = False
        r[j] = -np.inf
        in_h[j] = False
        n_live += live[j]
    k_seeds = top_seeds(r0, n, live, min(p.n_seeds, n_live), seeds)
    for i in range(k_seeds):
        b = seeds[i]
        picked[b] = True
        r[b] = r0[b]
    nf = k_seeds
    for i in range(nf):
        front[i] = seeds[i]
    for _h in range(p.hops):
        if nf == 0:
            break
        for j in range(n):
            nxt[j] = False
        for i in range(nf):
            j = front[i]
            g = g0 + j
            for e in range(D):
                k = nbr[g, e]
                if k < 0 or not live[k]:
                    continue
                val = relax_compiled(r[j], nbw[g, e], p.gamma, p.paper)
                if val > r[k]:
                    r[k] = val
                    nxt[k] = True
        nf = 0
        for j in range(n):
            if nxt[j]:
                front[nf] = j
                nf += 1
    for i in range(k_seeds):
        in_h[seeds[i]] = True
    need = p.cap - k_seeds
    if need <= 0:
        return
    nc = 0  # reached non-seeds, ascending id
    for j in range(n):
        if not picked[j] and r[j] > -np.inf:
            front[nc] = j
            nc += 1
    if nc > need:  # the best `need` by (r desc, id asc): stable insertion sort on r
        for i in range(1, nc):
            v = front[i]
            x = r[v]
            k = i
            while k > 0 and r[front[k - 1]] < x:
                front[k] = front[k - 1]
                k -= 1
            front[k] = v
        nc = need
    for i in range(nc):
        in_h[front[i]] = True


@njit(cache=True)
def propagate_batch(r0, nt, toff, nbr, nbw, p, sizes, r, in_h, live):  # pragma: no cover - compiled
    """:func:`propagate_one` for every query of a batch (``r0``, ``r``, ``in_h``, ``live``: ``[Q, J]``;
    ``nt``, ``toff``: ``[Q]``; ``p``: the method's :class:`PropagationParams`, whose sizes
    ``sizes`` (:class:`QuerySizes`) replaces per query)."""
    Q, J = r0.shape
    s = ThreadScratch(np.empty(max(J, 1), np.int64), np.empty(max(J, 1), np.bool_),
                      np.empty(max(J, 1), np.int64), np.empty(max(J, 1), np.bool_))
    for q in range(Q):
        pq = PropagationParams(sizes.n_seeds[q], sizes.cap[q], sizes.hops[q], p.gamma, p.paper)
        propagate_one(r0[q], nt[q], toff[q], nbr, nbw, pq, s, r[q], in_h[q], live[q])
