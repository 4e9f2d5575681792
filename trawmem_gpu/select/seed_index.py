"""Exact per-bank top-k head search for seed selection: one faiss index over every head of the
collection, or batched per-bank similarity in torch, with a measured dispatch between them.

Seeds are the ``n_seeds`` threads of a query's *own* bank with the largest head score
``r_head = 1 / (1 + d(z, h))`` (``SelectConfig.seed_score="head"``, the paper's seeding). The
score is a monotone function of ``cos(z, h)``, so the seeds are found by a top-k search over the
bank's head vectors. :class:`HeadIndex` answers "the ``k`` heads of bank ``b`` with the largest
cosine to ``z``, ties to the lower thread id, cosines in float64" in one of two ways:

``torch``
    Batched per-bank similarity: one GEMM per distinct bank of the batch against that bank's
    head rows (float64 on CPU), padded ``[Q, J_max]``, then a stable sort. Exact by construction.

``faiss``
    One ``IndexFlatIP`` over all heads of the collection (float32; a GPU index when faiss has
    GPUs and torch has CUDA). On CPU each distinct bank of the batch is one search restricted to
    its contiguous id range (``SearchParameters(sel=IDSelectorRange(lo, hi))``). GPU faiss
    indexes ignore ID selectors, so there the whole batch is one search for a larger ``k``
    whose hits are then filtered to the query's own id range. Either way faiss only proposes
    candidates: every proposed head is re-scored exactly (float64 dot products in torch) and
    ordered by (cosine descending, id ascending), and a query is accepted only when the float32
    score faiss reports for the last candidate, plus a rounding bound, is still below the exact
    k-th cosine -- so no head faiss did not return can tie or beat it. Queries that fail that
    test (or get too few own-bank hits) are answered by the torch path. The result is therefore
    identical to the torch path's; faiss is an accelerator, never an authority.

Bank isolation is structural on both paths: ids are restricted (or filtered) to the query's
own ``[bank_thread_offsets[b], bank_thread_offsets[b + 1])`` range and returned bank-local.

``mode="auto"`` picks ``faiss`` only where it measured faster (``benchmarks/bench_select.py
--seed-search``): few distinct banks per batch, each with many heads; ``torch`` otherwise (many
small banks: the per-bank faiss calls cost more than the tiny GEMMs they replace). faiss is
imported lazily and is optional: without it every mode runs the torch path.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

MODES = ("auto", "torch", "faiss")
AUTO_MIN_HEADS = 2048
"""``auto`` uses faiss only when the batch's banks hold at least this many heads on average..."""
AUTO_MAX_BANKS = 64
"""...and the batch touches at most this many distinct banks (one faiss call per bank on CPU)."""


def faiss_available() -> bool:
    """Whether ``import faiss`` can work (without importing it)."""
    try:
        return importlib.util.find_spec("faiss") is not None
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        return False


def _faiss():
    import faiss  # noqa: PLC0415 - optional dependency, imported on first use

    return faiss


def faiss_gpus() -> int:
    """GPUs faiss can use (0 without faiss, with faiss-cpu, or without CUDA in torch)."""
    if not faiss_available() or not torch.cuda.is_available():
        return 0
    try:
        return int(_faiss().get_num_gpus())
    except Exception:  # noqa: BLE001 - a faiss without GPU support
        return 0


def float32_ip_error(d: int) -> float:
    """A bound on |float32 inner product - exact| for unit vectors of dimension ``d`` (sum of
    ``d`` products rounded in float32, plus the rounding of a float64 query to float32)."""
    return (2.0 * d + 8.0) * float(np.finfo(np.float32).eps)


@dataclass
class SearchStats:
    """What the last :meth:`HeadIndex.search` did (for benchmarks and tests)."""

    mode: str = "torch"
    faiss_calls: int = 0
    fallback_queries: int = 0
    per_mode_queries: dict = field(default_factory=dict)


class HeadIndex:
    """Exact top-k head search restricted to each query's own bank (see the module docstring).

    :param head_vecs: ``[H, d]`` packed head vectors (torch, on the engine's device and dtype)
    :param bank_thread_offsets: ``[B + 1]`` int64 offsets of each bank's heads in ``head_vecs``
    :param mode: ``auto``, ``torch`` or ``faiss`` (``faiss`` without faiss installed runs torch)
    :param use_gpu: put the faiss index on a GPU when faiss has GPUs and torch has CUDA
        (default: when ``head_vecs`` is on CUDA)
    """

    def __init__(self, head_vecs: Tensor, bank_thread_offsets: Tensor, mode: str = "auto",
                 use_gpu: bool | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.vecs = head_vecs
        self.off = bank_thread_offsets.to(torch.int64)
        self.off_cpu = self.off.cpu().numpy()
        self.counts = self.off[1:] - self.off[:-1]
        self.mode = mode
        self.device = head_vecs.device
        self.d = int(head_vecs.shape[1])
        self.use_gpu = (head_vecs.device.type == "cuda") if use_gpu is None else bool(use_gpu)
        self._faiss_index = None
        self._faiss_gpu = False
        self._gpu_res = None
        self.stats = SearchStats()

    # ------------------------------------------------------------------------------------------
    # faiss index (built on first use)
    # ------------------------------------------------------------------------------------------
    @property
    def faiss_ready(self) -> bool:
        return faiss_available()

    def _index(self):
        if self._faiss_index is None:
            faiss = _faiss()
            x = np.ascontiguousarray(self.vecs.detach().float().cpu().numpy())
            index = faiss.IndexFlatIP(self.d)
            index.add(x)
            if self.use_gpu and faiss_gpus() > 0:
                self._gpu_res = faiss.StandardGpuResources()
                index = faiss.index_cpu_to_gpu(self._gpu_res, self.device.index or 0, index)
                self._faiss_gpu = True
            self._faiss_index = index
        return self._faiss_index

    def nbytes(self) -> int:
        """Bytes held by the faiss index (float32 copy of the heads; 0 until built)."""
        return 0 if self._faiss_index is None else int(self.vecs.shape[0]) * self.d * 4

    # ------------------------------------------------------------------------------------------
    # search
    # ------------------------------------------------------------------------------------------
    def choose(self, bidx: Tensor) -> str:
        """The mode ``auto`` resolves to for a batch over banks ``bidx``."""
        if self.mode != "auto":
            return "faiss" if (self.mode == "faiss" and faiss_available()) else "torch"
        if not faiss_available():
            return "torch"
        banks = torch.unique(bidx)
        if len(banks) > AUTO_MAX_BANKS:
            return "torch"
        mean_heads = float(self.counts[banks].double().mean())
        return "faiss" if mean_heads >= AUTO_MIN_HEADS else "torch"

    def search(self, Z: Tensor, bidx: Tensor, k: int, mode: str | None = None) -> tuple[Tensor, Tensor]:
        """``(cos [Q, k] float64-or-engine-dtype, ids [Q, k] int64 bank-local)``: the ``k`` heads of
        each query's own bank with the largest cosine, descending, ties to the lower id; ``-inf``
        / ``-1`` where the bank has fewer than ``k`` heads.

        :param Z: ``[Q, d]`` query vectors (unit norm) in the index's dtype and device
        :param bidx: ``[Q]`` bank index of each query
        """
        mode = self.choose(bidx) if mode in (None, "auto") else mode
        if mode == "faiss" and not faiss_available():
            mode = "torch"
        self.stats = SearchStats(mode=mode)
        Q = Z.shape[0]
        if Q == 0 or k <= 0:
            return (torch.zeros(Q, max(k, 0), dtype=self.vecs.dtype, device=self.device),
                    torch.zeros(Q, max(k, 0), dtype=torch.int64, device=self.device))
        if mode == "torch":
            self.stats.per_mode_queries = {"torch": Q}
            return self._search_torch(Z, bidx, k)
        cos, ids, ok = self._search_faiss(Z, bidx, k)
        bad = (~ok).nonzero().flatten()
        self.stats.fallback_queries = int(len(bad))
        self.stats.per_mode_queries = {"faiss": Q - len(bad), "torch": int(len(bad))}
        if len(bad):
            c2, i2 = self._search_torch(Z[bad], bidx[bad], k)
            cos[bad], ids[bad] = c2, i2
        return cos, ids

    def _own_cos(self, Z: Tensor, bidx: Tensor) -> tuple[Tensor, Tensor]:
        """``[Q, J_max]`` cosines to every head of the own bank (``-inf`` padding) and the mask."""
        n = self.counts[bidx]
        J = int(n.max())
        local = torch.arange(J, device=self.device)
        mask = local[None, :] < n[:, None]
        out = torch.full((Z.shape[0], J), float("-inf"), dtype=self.vecs.dtype, device=self.device)
        from .engine import bank_groups

        off, cnt = self.off.tolist(), self.counts.tolist()
        for bank, rows in bank_groups(bidx):
            a, m = off[bank], cnt[bank]
            out[rows, :m] = Z[rows] @ self.vecs[a:a + m].T
        return out, mask

    def _search_torch(self, Z: Tensor, bidx: Tensor, k: int) -> tuple[Tensor, Tensor]:
        cos, mask = self._own_cos(Z, bidx)
        return _topk_ties_low(cos, mask, k)

    def _search_faiss(self, Z: Tensor, bidx: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
        """Candidates from faiss, re-scored exactly; ``ok [Q]`` marks queries proven exact."""
        index = self._index()
        faiss = _faiss()
        Q = Z.shape[0]
        kk = k + max(8, k)  # proposals beyond k: room for the exactness test
        z32 = np.ascontiguousarray(Z.detach().float().cpu().numpy())
        bcpu = bidx.cpu().numpy()
        prop = np.full((Q, kk), -1, dtype=np.int64)   # global ids proposed
        last = np.full(Q, np.inf, dtype=np.float64)    # float32 score bounding the unproposed
        if self._faiss_gpu:
            # GPU indexes ignore ID selectors: one search for a larger k, filtered to the own bank.
            kg = min(int(self.vecs.shape[0]), kk * 8)
            D, I = index.search(z32, kg)
            self.stats.faiss_calls = 1
            lo, hi = self.off_cpu[bcpu], self.off_cpu[bcpu + 1]
            own = (I >= lo[:, None]) & (I < hi[:, None])
            for q in range(Q):
                hits, sc = I[q][own[q]], D[q][own[q]]
                take = min(kk, hits.size)
                prop[q, :take] = hits[:take]
                if take < hits.size:  # dropped own hits score at most the last one taken
                    last[q] = float(sc[take - 1])
                elif hits.size == hi[q] - lo[q]:  # every own head proposed
                    last[q] = -np.inf
                else:  # own heads not returned score at most the k_g-th global score
                    last[q] = float(D[q, -1])
        else:
            for bank in np.unique(bcpu).tolist():
                rows = np.nonzero(bcpu == bank)[0]
                lo, hi = int(self.off_cpu[bank]), int(self.off_cpu[bank + 1])
                kb = min(kk, hi - lo)
                params = faiss.SearchParameters(sel=faiss.IDSelectorRange(lo, hi))
                D, I = index.search(z32[rows], kb, params=params)
                self.stats.faiss_calls += 1
                prop[rows, :kb] = I
                last[rows] = -np.inf if kb == hi - lo else D[:, -1].astype(np.float64)
        # exact re-scoring of the proposals (bank-local ids; anything outside the bank dropped)
        dev = self.device
        P = torch.as_tensor(prop, device=dev)
        lo_t = self.off[bidx][:, None]
        inside = (P >= lo_t) & (P < self.off[bidx + 1][:, None])
        Pc = torch.where(inside, P, lo_t)
        exact = torch.empty(P.shape, dtype=self.vecs.dtype, device=dev)
        step = max(1, (1 << 20) // (kk * self.d))  # ~8 MB of gathered rows at a time
        for s in range(0, Q, step):
            exact[s:s + step] = torch.bmm(self.vecs[Pc[s:s + step]], Z[s:s + step, :, None]).squeeze(2)
        exact = torch.where(inside, exact, float("-inf"))
        local = torch.where(inside, P - lo_t, torch.iinfo(torch.int64).max)
        cos, ids = _topk_ties_low(exact, inside, k, ids=local)
        bound = torch.as_tensor(last, dtype=exact.dtype, device=dev) + float32_ip_error(self.d)
        n_own = self.counts[bidx]
        kth = cos[:, k - 1]
        enough = inside.sum(1) >= torch.clamp(n_own, max=k)
        ok = enough & ((bound < kth) | (torch.as_tensor(last, device=dev) == float("-inf")))
        return cos, ids, ok


def _topk_ties_low(scores: Tensor, mask: Tensor, k: int, ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Top ``k`` of each row of ``scores`` (live where ``mask``), descending, ties to the lower
    id (``ids``, default the column); ``(-inf, -1)`` padding."""
    Q, W = scores.shape
    masked = torch.where(mask, scores, float("-inf"))
    if ids is None and W > 4 * k:  # wide rows: a top-k mask, then sort only the k survivors
        from .engine import _compact, _topk_mask

        sel = _compact(_topk_mask(scores, k, mask), min(k, W), fill=0)  # ascending ids
        vals = torch.gather(masked, 1, sel)
        live = torch.gather(mask, 1, sel) & (torch.arange(sel.shape[1], device=sel.device)[None, :]
                                            < mask.sum(dim=1, keepdim=True))
        vals = torch.where(live, vals, float("-inf"))
        o = torch.sort(-vals, dim=1, stable=True).indices  # ties keep ascending ids
        top = torch.gather(sel, 1, o)
        cos = torch.gather(vals, 1, o)
        tid = torch.where(torch.gather(live, 1, o), top, -1)
        if sel.shape[1] < k:
            cos = torch.cat([cos, torch.full((Q, k - sel.shape[1]), float("-inf"), dtype=cos.dtype,
                                             device=cos.device)], 1)
            tid = torch.cat([tid, torch.full((Q, k - sel.shape[1]), -1, dtype=torch.int64, device=cos.device)], 1)
        return torch.where(tid >= 0, cos, float("-inf")), tid
    if ids is None:
        ids = torch.arange(W, device=scores.device).expand(Q, W)
        order = torch.sort(-masked, dim=1, stable=True).indices  # columns are ids: stable = ties low
    else:  # sort by id first, then stably by score: equal scores keep ascending ids
        o1 = torch.sort(torch.where(mask, ids, torch.iinfo(torch.int64).max), dim=1, stable=True).indices
        o2 = torch.sort(-torch.gather(masked, 1, o1), dim=1, stable=True).indices
        order = torch.gather(o1, 1, o2)
    kk = min(k, W)
    top = order[:, :kk]
    cos = torch.gather(masked, 1, top)
    tid = torch.where(torch.gather(mask, 1, top), torch.gather(ids, 1, top), -1)
    if kk < k:
        cos = torch.cat([cos, torch.full((Q, k - kk), float("-inf"), dtype=cos.dtype, device=cos.device)], 1)
        tid = torch.cat([tid, torch.full((Q, k - kk), -1, dtype=torch.int64, device=cos.device)], 1)
    cos = torch.where(tid >= 0, cos, float("-inf"))
    return cos, tid
