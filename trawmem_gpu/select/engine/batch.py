"""One call's queries as a typed batch, the query-bank similarities (GEMMs) and stage timing."""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import torch
from torch import Tensor

from ..objective import date_seconds
from ..params import per_query
from ..steps.candidates import own_dots
from ..tensor_ops import bank_groups
from .tables import Snapshot, unit_block


@dataclass
class QueryBatch:
    """The queries of one ``select_units`` call, checked, against one snapshot."""

    bidx: np.ndarray
    """[Q] int64 bank index (in the snapshot) of each query."""
    questions: list[str]
    Z: Tensor
    """[Q, d] unit-norm query vectors on the engine's device, in its dtype."""
    now: np.ndarray
    """[Q] float64 each query's date (POSIX seconds; NaN = none)."""
    params: list
    """[Q] each query's resolved ``QueryParams``."""
    sizes: dict
    """``{name: [Q] array}`` the params as columns (:data:`SIZE_COLUMNS`), made once per call."""
    masks: list | None = None
    """``[Q]`` each query's unit mask (``[N_b]`` bool, a filter's: ``select.restrict``) or None
    (no mask); None: no query of the batch has one."""

    def __len__(self) -> int:
        return len(self.bidx)

    def take(self, rows: np.ndarray) -> "QueryBatch":
        r = rows.tolist()
        return QueryBatch(self.bidx[rows], [self.questions[i] for i in r],
                          self.Z[torch.as_tensor(rows, device=self.Z.device)], self.now[rows],
                          [self.params[i] for i in r], {k: v[rows] for k, v in self.sizes.items()},
                          None if self.masks is None else _masks_or_none([self.masks[i] for i in r]))

    def mask_rows(self, width: int, device) -> Tensor | None:
        """``[Q, width]`` bool: True where a query's unit passes its mask (and on padding), or
        None when no query has a mask."""
        if self.masks is None:
            return None
        out = np.ones((len(self), width), dtype=bool)
        for q, m in enumerate(self.masks):
            if m is not None:
                out[q, :len(m)] = m
        return torch.as_tensor(out, device=device)

    def per_group(self, run) -> list:
        """``run(sub)`` for each group of queries that share steps 1-3's shapes
        (``QueryParams.shape_key``) and whether they have a token budget (``sub``: the group's
        :class:`QueryBatch`); its per-query results back in this batch's order."""
        seen: dict = {}
        for i, p in enumerate(self.params):
            seen.setdefault((p.shape_key, p.token_budget is None), []).append(i)
        if len(seen) <= 1:
            return run(self)
        out: list = [None] * len(self)
        for rows in seen.values():
            for q, r in zip(rows, run(self.take(np.asarray(rows, dtype=np.int64)))):
                out[q] = r
        return out


def _masks_or_none(masks: list) -> list | None:
    return None if all(m is None for m in masks) else masks


def make_batch(snap: Snapshot, bank_ids, questions, Z, dates, device, dtype, params=None, cfg=None,
               masks=None) -> QueryBatch:
    """Check and convert a call's inputs: unknown bank ids raise ``KeyError``; mismatched lengths,
    a wrong vector width, NaN / inf vectors and dates that are not datetimes raise ``ValueError``;
    ``params`` (one ``QueryParams`` for all, one per query, or None = the defaults) are resolved
    against the method ``cfg`` (bad ones raise ``ConfigError``); ``masks``: None or one unit mask
    (or None) per query, of its bank's length (``ValueError`` otherwise)."""
    bank_ids, questions = list(bank_ids), list(questions)
    Q = len(bank_ids)
    if len(questions) != Q:
        raise ValueError(f"{Q} bank ids but {len(questions)} questions")
    try:  # one map over the index (the same as snap.bank_index per id, without a call per id)
        bidx = np.fromiter(map(snap.index.__getitem__, bank_ids), dtype=np.int64, count=Q)
    except KeyError:  # again per id, for the message naming the unknown one
        bidx = np.fromiter((snap.bank_index(b) for b in bank_ids), dtype=np.int64, count=Q)
    Zt = Z.detach() if isinstance(Z, Tensor) else torch.as_tensor(np.asarray(Z, dtype=np.float64))
    Zt = Zt.to(device=device, dtype=dtype)
    d = snap.t["unit_vecs"].shape[1]
    if Zt.ndim != 2 or Zt.shape[0] != Q or Zt.shape[1] != d:
        raise ValueError(f"Z must have shape [{Q}, {d}], got {tuple(Zt.shape)}")
    # a NaN or inf anywhere makes the sum NaN or inf; a finite sum clears every row at once (an
    # overflowing sum of finite rows falls through to the row check, which passes them)
    bad = torch.zeros(0, dtype=torch.bool) if bool(torch.isfinite(Zt.sum())) else ~torch.isfinite(Zt).all(dim=1)
    if bool(bad.any()):
        raise ValueError(f"query vectors hold NaN or inf (rows {bad.nonzero().flatten()[:10].tolist()})")
    if dates is None:
        now = np.full(Q, np.nan)
    else:
        dates = list(dates)
        if len(dates) != Q:
            raise ValueError(f"{Q} queries but {len(dates)} dates")
        for i, d_ in enumerate(dates):
            if d_ is not None and not isinstance(d_, datetime):
                raise ValueError(f"dates[{i}] must be a datetime or None (got {type(d_).__name__})")
        now = np.array([date_seconds(d_) for d_ in dates], dtype=np.float64)
    ps = per_query(params, Q, cfg)
    if masks is not None:
        from ..restrict import as_mask

        masks = list(masks)
        if len(masks) != Q:
            raise ValueError(f"{Q} queries but {len(masks)} unit masks")
        masks = _masks_or_none([as_mask(m, int(snap.off.nu[b]), f"masks[{i}]") for i, (m, b) in
                                enumerate(zip(masks, bidx.tolist()))])
    return QueryBatch(bidx, questions, Zt, now, ps, size_columns(ps), masks)


SIZE_COLUMNS = {
    "unit_cap": (np.int64, lambda p: p.budget or 0),  # B, 0 = no cap
    "pool": (np.int64, lambda p: p.pool_budget),  # QueryParams.pool_budget
    "threads": (np.int64, lambda p: max(p.n_seeds, p.neighborhood_cap)),  # most neighbourhood threads
    "n_seeds": (np.int64, lambda p: p.n_seeds), "cap": (np.int64, lambda p: p.neighborhood_cap),
    "hops": (np.int64, lambda p: p.hops),
    "capacity": (np.float64, lambda p: np.inf if p.token_budget is None else float(p.token_budget)),  # T
}
"""The per-query columns of a batch's resolved params: name -> (dtype, value of one params)."""


def size_columns(params: list) -> dict:
    """:data:`SIZE_COLUMNS` of ``params`` (one value per distinct params object)."""
    Q = len(params)
    if Q and all(p is params[0] for p in params):  # one params for the whole batch (the common case)
        return {k: np.full(Q, f(params[0]), dtype=dt) for k, (dt, f) in SIZE_COLUMNS.items()}
    return {k: np.array([f(p) for p in params], dtype=dt).reshape(Q) for k, (dt, f) in SIZE_COLUMNS.items()}


class Timer:
    """Seconds per stage, summed into ``out`` (CUDA work is synchronized at each lap)."""

    def __init__(self, out: dict, device: torch.device):
        self.out = out
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.out[name] = self.out.get(name, 0.0) + now - self.t
        self.t = now

    def add(self, times: dict) -> None:
        for k, v in times.items():
            self.out[k] = self.out.get(k, 0.0) + v


# ----------------------------------------------------------------------------------------------
# similarities of each query with its own bank's rows
# ----------------------------------------------------------------------------------------------
def own_rows(starts: Tensor, counts: Tensor, bidx: Tensor) -> tuple[Tensor, Tensor]:
    """Padded stored rows of each query's own bank: ``(ids [Q, W], mask [Q, W])``; padding slots
    point at the bank's first row (never at another bank's)."""
    n = counts[bidx]
    local = torch.arange(int(n.max()), device=bidx.device)
    mask = local[None, :] < n[:, None]
    return starts[bidx][:, None] + torch.where(mask, local[None, :], 0), mask


def sim_mode(sim: str, bidx: Tensor, snap: Snapshot, device: torch.device) -> str:
    """``auto`` on CPU: ``grouped`` (one GEMM per distinct bank) while banks average 8 or more
    queries of the batch, else ``dots`` (a compiled loop of per-query dot products over the own
    bank, when numba imports); on CUDA ``grouped`` up to 64 distinct banks (one GEMM launch per
    bank), then ``global`` while the stored rows are at most 16x the largest bank, else ``gather``
    (the thresholds' measurements: ``docs/method-defaults.md``)."""
    if sim != "auto":
        return sim
    from .._jit import HAS_NUMBA

    n_banks = len(torch.unique(bidx))
    if device.type == "cpu":
        return "dots" if n_banks * 8 > len(bidx) and HAS_NUMBA else "grouped"
    if n_banks <= 64:
        return "grouped"
    return "global" if snap.rows["unit_vecs"] <= 16 * snap.max_units else "gather"


def similarity(snap: Snapshot, sim: str, Z: Tensor, bidx: Tensor, heads: bool, chunk_elems: int) -> Tensor:
    """``[Q, W]`` cos(z_q, v) for every unit (or head, ``heads``) of each query's own bank, 0 on padding."""
    vecs = snap.t["head_vecs" if heads else "unit_vecs"]
    starts, counts = (snap.off_t.to, snap.off_t.nt) if heads else (snap.off_t.uo, snap.off_t.nu)
    ids, _ = own_rows(starts, counts, bidx)
    mapped = not heads and bool(snap.mapped[bidx.cpu().numpy()].any())
    mode = "grouped" if mapped else sim_mode(sim, bidx, snap, Z.device)  # a mapped bank's rows are its own
    if mode == "dots":
        from .._jit import HAS_NUMBA

        if not HAS_NUMBA or Z.device.type != "cpu":
            raise ValueError("sim='dots' needs numba and a CPU engine")
        Q, W = ids.shape
        out = np.zeros((Q, W))  # row q at offset q * W of the flat buffer, zero past its bank
        off = snap.off.to if heads else snap.off.uo
        cnt = snap.off.nt if heads else snap.off.nu
        own_dots(np.ascontiguousarray(Z.numpy()), vecs.numpy(), off, cnt, bidx.numpy(),
                 np.arange(Q, dtype=np.int64) * W, out.reshape(-1))
        return torch.from_numpy(out).to(Z.dtype)
    if mode == "global":
        rows = snap.rows["head_vecs" if heads else "unit_vecs"]
        return torch.gather(Z @ vecs[:rows].T.to(Z.dtype), 1, ids)  # .to: a float32 unit table, exact
    if mode == "grouped":
        out = torch.zeros(ids.shape, dtype=Z.dtype, device=Z.device)
        off, cnt = starts.tolist(), counts.tolist()
        for bank, rows in bank_groups(bidx):
            a, n = off[bank], cnt[bank]
            own = torch.from_numpy(unit_block(snap, bank)[0][:n]) if mapped and snap.mapped[bank] else vecs[a:a + n]
            out[rows, :n] = Z[rows] @ own.T.to(Z.dtype)
        return out
    if mode != "gather":
        raise ValueError(f"sim must be 'auto', 'grouped', 'global', 'gather' or 'dots' (got {mode!r})")
    out = torch.empty(ids.shape, dtype=Z.dtype, device=Z.device)
    step = max(1, max(chunk_elems, 1 << 24) // max(1, ids.shape[1] * vecs.shape[1]))
    for s in range(0, ids.shape[0], step):
        out[s:s + step] = torch.bmm(vecs[ids[s:s + step]].to(Z.dtype), Z[s:s + step, :, None]).squeeze(2)
    return torch.where(own_rows(starts, counts, bidx)[1], out, 0.0)
