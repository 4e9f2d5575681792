"""Padded-batch torch helpers the steps share: bank grouping, compaction, top-k masks and ranks
that break ties to the lower index (the reference's order), exactly and without a full sort
where one is not needed."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

NEG_INF, POS_INF = float("-inf"), float("inf")


def bank_groups(bidx: Tensor) -> list[tuple[int, Tensor]]:
    """``[(bank, rows)]``: the rows of ``bidx`` holding each distinct bank (one sort, then
    slices; no per-bank pass over the whole batch)."""
    order = torch.sort(bidx, stable=True).indices
    b = bidx[order].cpu().numpy()
    if len(b) == 0:
        return []
    cut = np.flatnonzero(np.diff(b)) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(b)]])
    return [(int(b[s]), order[s:e]) for s, e in zip(starts.tolist(), ends.tolist())]


def compact(mask: Tensor, width: int, fill: int) -> Tensor:
    """``[Q, width]`` column indices of the True entries of each row of ``mask``, ascending,
    padded with ``fill`` (a cumsum + scatter compaction, no sort)."""
    Q, N = mask.shape
    pos = torch.where(mask, torch.cumsum(mask.to(torch.int64), dim=1) - 1, width)
    out = torch.full((Q, width + 1), fill, dtype=torch.int64, device=mask.device)
    out.scatter_(1, pos, torch.arange(N, device=mask.device).expand(Q, N).contiguous())
    return out[:, :width]


def topk_mask(x: Tensor, k: int, valid: Tensor) -> Tensor:
    """``[Q, J]`` mask of the ``k`` largest valid entries of each row, ties to the lower index
    (all valid entries when a row has fewer): the first ``k`` of a stable descending sort,
    found with one ``topk`` for the k-th value and a cumsum over the entries equal to it."""
    Q, J = x.shape
    kk = min(k, J)
    if kk <= 0:
        return torch.zeros(Q, J, dtype=torch.bool, device=x.device)
    xm = torch.where(valid, x, NEG_INF)
    thr = torch.topk(xm, kk, dim=1).values[:, -1:]
    gt = (xm > thr) & valid
    eq = (xm == thr) & valid
    need = kk - gt.sum(dim=1, keepdim=True)
    return gt | (eq & (torch.cumsum(eq.to(torch.int64), dim=1) <= need))


def topk_ties_low(scores: Tensor, mask: Tensor, k: int, ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Top ``k`` of each row of ``scores`` (live where ``mask``), descending, ties to the lower
    id (``ids``, default the column): ``(values [Q, k], ids [Q, k])``, ``(-inf, -1)`` padding."""
    Q, W = scores.shape
    masked = torch.where(mask, scores, NEG_INF)
    if ids is None and W > 4 * k:  # wide rows: a top-k mask, then sort only the k survivors
        sel = compact(topk_mask(scores, k, mask), min(k, W), fill=0)  # ascending ids
        vals = torch.gather(masked, 1, sel)
        live = torch.gather(mask, 1, sel) & (torch.arange(sel.shape[1], device=sel.device)[None, :]
                                            < mask.sum(dim=1, keepdim=True))
        vals = torch.where(live, vals, NEG_INF)
        o = torch.sort(-vals, dim=1, stable=True).indices  # ties keep ascending ids
        top, cos = torch.gather(sel, 1, o), torch.gather(vals, 1, o)
        tid = torch.where(torch.gather(live, 1, o), top, -1)
    else:
        if ids is None:
            ids = torch.arange(W, device=scores.device).expand(Q, W)
            order = torch.sort(-masked, dim=1, stable=True).indices  # columns are ids: stable = ties low
        else:  # sort by id first, then stably by score: equal scores keep ascending ids
            o1 = torch.sort(torch.where(mask, ids, torch.iinfo(torch.int64).max), dim=1, stable=True).indices
            o2 = torch.sort(-torch.gather(masked, 1, o1), dim=1, stable=True).indices
            order = torch.gather(o1, 1, o2)
        top = order[:, :min(k, W)]
        cos = torch.gather(masked, 1, top)
        tid = torch.where(torch.gather(mask, 1, top), torch.gather(ids, 1, top), -1)
    if tid.shape[1] < k:
        pad = k - tid.shape[1]
        cos = torch.cat([cos, torch.full((Q, pad), NEG_INF, dtype=cos.dtype, device=cos.device)], 1)
        tid = torch.cat([tid, torch.full((Q, pad), -1, dtype=torch.int64, device=cos.device)], 1)
    return torch.where(tid >= 0, cos, NEG_INF), tid


def ranks(x: Tensor, mask: Tensor) -> Tensor:
    """``[Q, N]`` 1-based descending ranks of ``x`` among the live entries of each row (ties to
    the lower index; padding ranks after every live entry).

    The values become order-preserving int64 keys. On CPU the keys are argsorted by NumPy (its
    vectorized int64 sort is ~2x torch's) without stability, and only rows holding two equal
    keys are re-sorted stably by torch, so ties still go to the lower index."""
    key = torch.where(mask, -x + 0.0, POS_INF)  # + 0.0: -0.0 -> 0.0, equal values stay equal
    pad = None
    if key.dtype == torch.float64:  # order-preserving int64 view (+inf padding keeps the largest key)
        bits = key.view(torch.int64)
        key = torch.where(bits < 0, bits ^ 0x7FFFFFFFFFFFFFFF, bits)
        pad = int(torch.tensor(POS_INF, dtype=torch.float64).view(torch.int64))
    return ranks_from_keys(key, unique=False, pad_key=pad).to(x.dtype)


def ranks_from_keys(key: Tensor, unique: bool, pad_key: int | None = None) -> Tensor:
    """Ranks (1-based, ascending key, ties to the lower index) from ``[Q, N]`` int64 keys.

    ``unique``: the keys already hold the column index in their low 32 bits (so no two are
    equal). Entries keyed ``>= pad_key`` (padding, ranked last) may come in any order among
    themselves. On CPU, NumPy sorts the keys with the index packed into their low bits (a plain
    vectorized int64 sort): the low ``b`` bits of a key are replaced by the column index, so
    equal keys order by index; rows where two keys differ only in those low bits (values within
    ~2^-40 relative, or exact ties) are re-sorted stably by torch.
    """
    Q, N = key.shape
    if key.device.type == "cpu" and key.dtype == torch.int64 and Q and N and N < (1 << 31):
        k = key.numpy()
        if unique:
            order = np.sort(k, axis=1) & 0xFFFFFFFF
        else:
            b = max(1, (N - 1).bit_length())
            packed = ((k >> b) << b) | np.arange(N, dtype=np.int64)
            srt = np.sort(packed, axis=1)
            order = srt & ((1 << b) - 1)
            hi = srt >> b
            pad = (np.iinfo(np.int64).max if pad_key is None else pad_key) >> b
            tied = np.nonzero(((hi[:, 1:] == hi[:, :-1]) & (hi[:, 1:] < pad)).any(axis=1))[0]
            if len(tied):
                order[tied] = torch.sort(key[torch.from_numpy(tied)], dim=1, stable=True).indices.numpy()
        order = torch.from_numpy(order)
    else:
        order = torch.sort(key, dim=1, stable=True).indices
    out = torch.empty(Q, N, dtype=torch.int64, device=key.device)
    out.scatter_(1, order, torch.arange(1, N + 1, device=key.device).expand(Q, N))
    return out


def ranks_positive(x: Tensor) -> Tensor:
    """``[Q, N]`` 1-based descending ranks of the positive entries of each row (ties to the lower
    index), as :func:`ranks` gives them (positives rank before every other entry); arbitrary
    elsewhere. Scores that are float32 values (BM25 from bm25s) get unique int64 keys (float32
    bits, then the index), so no tie pass is needed."""
    Q, N = x.shape
    pos = x > 0
    xf = torch.where(pos, x, 0.0).to(torch.float32)
    if N >= (1 << 31) or not bool(torch.equal(xf.to(x.dtype), torch.where(pos, x, 0.0))):
        return ranks(x, pos)  # not float32 scores: the general path
    bits = xf.view(torch.int32).to(torch.int64)  # non-negative floats: bits are monotone
    key = (((1 << 31) - 1 - bits) << 32) | torch.arange(N, device=x.device)
    return ranks_from_keys(key, unique=True).to(x.dtype)
