"""Unit masks in the engine (``select.restrict`` says what a mask means): the per-chunk inputs
the backends read, kept apart from the loops so the unmasked path is the one it was.

* :func:`front_masks`: a chunk's masks laid out like its flat cosines (the compiled front loop);
* :func:`partial_rows`: which queries hold, in their neighbourhood, a thread with a failing unit;
* :func:`stage_bridge`: for those queries the bridge feature from their candidates' cosines (banks
  with tables only: a bank without forms it from the candidates anyway, ``pool.py``). The
  per-bank bridge table holds each unit's best cosine to *every* unit of a thread, the reference's
  bridge is the best cosine to a *candidate* of another thread; the two agree while a thread's
  units are all candidates, which a mask breaks. The table still bounds K from above (a maximum
  over more units), so the compiled greedy's bounds keep reading it.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..steps.roles import bridge_from_similarity
from .tables import unit_block, unit_rows


def front_masks(masks: list | None, rows: np.ndarray, nu: np.ndarray, coff: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mask, masked)`` of the chunk ``rows`` (``nu``, ``coff``: its queries' unit counts and flat
    offsets): ``mask`` flat bool, query ``i``'s units at ``coff[i] : coff[i] + nu[i]`` (True for a
    query without a mask), ``masked [Qc]``: the query has one."""
    Qc = len(rows)
    total = int(nu.sum()) if Qc else 0
    masked = np.zeros(Qc, dtype=np.bool_)
    if masks is None:
        return np.ones(max(total, 1), dtype=np.bool_), masked
    flat = np.ones(max(total, 1), dtype=np.bool_)
    for i, q in enumerate(rows.tolist()):
        m = masks[q]
        if m is not None:
            masked[i] = True
            flat[coff[i]:coff[i] + nu[i]] = m
    return flat, masked


def thread_lengths(snap) -> np.ndarray:
    """``[thread rows]`` int64: units of every stored thread (0 on the dummy row and dead rows),
    built once per snapshot."""
    def build():
        tl = np.zeros(snap.rows["nbr"], dtype=np.int64)
        for i, info in enumerate(snap.infos):
            a = int(snap.off.to[i])
            tl[a:a + info.n_threads] = np.diff(info.bank.thread_offsets)
        return tl

    return snap.lazy("mask_thread_lengths", build)


def partial_rows(snap, bidx: np.ndarray, lt: np.ndarray, n_cand: np.ndarray, hthread: np.ndarray, n_h: np.ndarray,
                 masked: np.ndarray) -> np.ndarray:
    """``[Qc]`` bool: the masked queries of banks with tables whose neighbourhood holds a thread
    with fewer candidates than units (a thread a mask cut). A bank without tables (``pool.py``)
    forms every query's bridge from its candidates, the passing units, already."""
    out = np.zeros(len(bidx), dtype=bool)
    rows = np.flatnonzero(np.asarray(masked, dtype=bool) & (snap.off.tab[bidx] != 0))
    if not len(rows):
        return out
    tl = thread_lengths(snap)
    for q in rows.tolist():
        n, t = int(n_cand[q]), int(n_h[q])
        have = np.bincount(lt[q, :n], minlength=t)[:t]
        full = tl[snap.off.to[bidx[q]] + hthread[q, :t]]
        out[q] = bool((have < full).any())
    return out


def _own_bridge(vecs: np.ndarray, gid: np.ndarray, lt: np.ndarray) -> np.ndarray:
    """One query's bridge over its candidates (stored rows ``gid``, neighbourhood threads ``lt``):
    the reference's formula and float64 ``E @ E.T``."""
    n = len(gid)
    S = vecs[gid].astype(np.float64) @ vecs[gid].astype(np.float64).T
    b = np.where(lt[:, None] != lt[None, :], S, -np.inf).max(axis=1) if n > 1 else np.zeros(n)
    return np.clip(np.where(np.isfinite(b), b, 0.0), 0.0, 1.0)


def roles_count(W: np.ndarray) -> np.ndarray:
    """``[Q]`` bool: the queries whose picks the role features can change (``W``: their weight
    matrix, ``objective.weight_matrix``): a nonzero ``lambda_r`` (phi in the costs) or a nonzero
    weight of a term that reads rho. Elsewhere the bridge feature changes nothing (0 times a finite
    value adds exactly 0), so a cut thread's bridge need not be computed."""
    from ..terms import COL, COVERAGE_TERMS, LAMBDA_R

    cols = [LAMBDA_R] + [COL[t.weight] for t in COVERAGE_TERMS if getattr(t, "x", None) == "rho"]
    return (np.asarray(W)[:, cols] != 0).any(axis=1)


def stage_bridge(snap, cols: dict, masked: np.ndarray) -> dict:
    """``{"bridge": [Qc, U], "own": [Qc]}`` for the compiled stage (``cols``: the chunk's
    candidates, steps 1-3's output; ``masked``: the queries with a mask whose roles count,
    :func:`roles_count`): for each query :func:`partial_rows` marks, the bridge from its
    candidates' cosines (:func:`_own_bridge`); the other rows read the per-bank table (``own``
    False)."""
    cand, n_cand, lt, bidx = cols["cand"], cols["n_cand"], cols["lt"], cols["bidx"]
    own = partial_rows(snap, bidx, lt, n_cand, cols["hthread"], cols["n_h"], masked)
    bridge = np.zeros((cand.shape[0], max(cand.shape[1], 1)))
    for q in np.flatnonzero(own).tolist():
        n = int(n_cand[q])
        vecs, base = unit_block(snap, int(bidx[q]))  # the table, or a mapped bank's own vectors
        bridge[q, :n] = _own_bridge(vecs, base + cand[q, :n], lt[q, :n])
    return {"bridge": bridge, "own": own}


def chunk_bridge(snap, c, bridge: Tensor, masked: Tensor) -> Tensor:
    """The tensor stage's bridge ``[Qc, U]`` (``c``: its ``tensor.Chunk``) with the rows
    :func:`partial_rows` marks among ``masked`` taken from their candidates' cosines instead of the
    per-bank table (on CPU :func:`_own_bridge`, the reference's float64 product; on a GPU
    ``bridge_from_similarity``)."""
    if not bool(masked.any()):
        return bridge
    n = lambda t: t.cpu().numpy()  # noqa: E731
    partial = partial_rows(snap, n(c.bidx), n(c.lt), n(c.n_cand), n(c.hthread), n(c.n_h), n(masked))
    rows = np.flatnonzero(partial)
    if not len(rows):
        return bridge
    out = bridge.clone()
    if out.device.type == "cpu" and "unit_vecs" in snap.np:
        for q in rows.tolist():
            k = int(c.n_cand[q])
            vecs, base = unit_block(snap, int(c.bidx[q]))  # the table, or a mapped bank's own vectors
            out[q, :k] = torch.from_numpy(_own_bridge(vecs, base + n(c.cand[q, :k]), n(c.lt[q, :k])))
        return out
    r = torch.as_tensor(rows, device=out.device)
    E = unit_rows(snap, c.gid[r])
    out[r] = bridge_from_similarity(torch.bmm(E, E.transpose(1, 2)), c.lt[r], c.cvalid[r]).to(out.dtype)
    return out
