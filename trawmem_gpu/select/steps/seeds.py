"""Stage 2, step 1 (design note): seeds. ``r0(T_j) = 1 / (1 + d_idx(z_q, h_j))`` from the
thread heads (the paper), or from the thread's best unit affinity (``seed_score="best_unit"``),
or the max of both; the seeds are the ``n_seeds`` threads of best r0, ties to the lower id.

Side by side: the NumPy reference (:func:`seed_scores`), the torch batch (:func:`seed_scores_torch`,
:func:`head_seeds_torch`) and the exact per-bank top-k head search behind the head seeds,
:class:`HeadIndex` (the compiled backend reads r0 off its front loop: best-unit seeds only).

Head search. Seeds are the ``n_seeds`` threads of a query's *own* bank with the largest head
score ``r_head = 1 / (1 + d(z, h))``. The score is a monotone function of ``cos(z, h)``, so the
seeds are found by a top-k search over the bank's head vectors. :class:`HeadIndex` answers "the
``k`` heads of bank ``b`` with the largest cosine to ``z``, ties to the lower thread id, cosines in
float64" in one of two ways:

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
own ``[starts[b], starts[b] + counts[b])`` range and returned bank-local.

``mode="auto"`` picks ``faiss`` only for few distinct banks per batch, each with many heads
(:data:`AUTO_MIN_HEADS`, :data:`AUTO_MAX_BANKS`); ``torch`` otherwise (many small banks: the
per-bank faiss calls cost more than the tiny GEMMs they replace; the thresholds come from
``benchmarks/bench_select.py --seed-search``). faiss is
imported lazily and is optional: without it every mode runs the torch path.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..tensor_ops import NEG_INF, bank_groups, topk_ties_low
from .ann import _faiss, faiss_available, faiss_gpus  # noqa: F401 - the faiss probes live with the indexes

# ----------------------------------------------------------------------------------------------
# reference (NumPy, one query)
# ----------------------------------------------------------------------------------------------


def head_scores(cos_h: np.ndarray, d_idx: str) -> np.ndarray:
    """``r_head = 1 / (1 + d_idx(z, h))`` from head cosines: ``d = |z - h|`` (unit vectors) or ``1 - cos``."""
    d = np.sqrt(np.maximum(0.0, 2.0 - 2.0 * cos_h)) if d_idx == "l2" else 1.0 - cos_h
    return 1.0 / (1.0 + d)


def seed_scores(ctx, z: np.ndarray, alpha_all: np.ndarray, cfg) -> np.ndarray:
    """``[J]`` r0 per thread of the bank (``alpha_all``: step 3's affinity of every unit)."""
    bank = ctx.bank
    r_head = head_scores(bank.head_vecs.astype(np.float64) @ z, cfg.d_idx)
    if cfg.seed_score == "head":
        return r_head
    r_unit = np.maximum.reduceat(alpha_all, bank.thread_offsets[:-1])
    return r_unit if cfg.seed_score == "best_unit" else np.maximum(r_head, r_unit)


# ----------------------------------------------------------------------------------------------
# torch (a batch of queries, each over its own bank; -inf on padding threads)
# ----------------------------------------------------------------------------------------------
def head_scores_torch(cos_h: Tensor, d_idx: str) -> Tensor:
    """:func:`head_scores` on tensors."""
    d = torch.sqrt(torch.clamp(2.0 - 2.0 * cos_h, min=0.0)) if d_idx == "l2" else 1.0 - cos_h
    return 1.0 / (1.0 + d)


def seed_scores_torch(alpha: Tensor, ult: Tensor, tvalid: Tensor, cos_h: Tensor | None, cfg) -> Tensor:
    """``r0 [Q, J]`` for ``best_unit`` and ``max`` seeds: the segment max of ``alpha [Q, N]`` over
    each thread's units (``ult [Q, N]``: bank-local thread, ``J`` on padding), maxed with the head
    scores of ``cos_h [Q, J]`` for ``max``."""
    Q, J = tvalid.shape
    r_unit = torch.full((Q, J + 1), NEG_INF, dtype=alpha.dtype, device=alpha.device)
    r_unit.scatter_reduce_(1, ult, alpha, reduce="amax", include_self=True)
    r_unit = r_unit[:, :J]
    r0 = r_unit if cfg.seed_score == "best_unit" else torch.maximum(head_scores_torch(cos_h, cfg.d_idx), r_unit)
    return torch.where(tvalid, r0, torch.full_like(r0, NEG_INF))


def head_seeds_torch(index: "HeadIndex", Z: Tensor, bidx: Tensor, J: int, cfg, n_seeds: int) -> Tensor:
    """``r0 [Q, J]`` for head seeds: finite only on each query's ``n_seeds`` seeds (the batch's
    queries share ``n_seeds``, their resolved ``QueryParams.n_seeds``).

    The index returns the ``n_seeds + slack`` heads of the own bank with the largest cosine;
    r_head is computed for those, and the seeds are the best ``n_seeds`` by (r_head descending,
    thread id ascending), the reference's order. r_head is monotone in the cosine, so every
    other head scores at most the last candidate's r_head; a query whose n_seeds-th seed does not
    beat that strictly (a possible tie across the cut) gets all of its bank's head scores instead.
    """
    ns = max(1, min(n_seeds, J))
    kq = ns + max(8, ns)
    cos, ids = index.search(Z, bidx, kq)
    live = ids >= 0
    r = torch.where(live, head_scores_torch(torch.where(live, cos, 0.0), cfg.d_idx), NEG_INF)
    r_top, seeds = topk_ties_low(r, live, ns, ids=ids)
    Q = Z.shape[0]
    r0 = torch.full((Q, J + 1), NEG_INF, dtype=Z.dtype, device=Z.device)
    r0.scatter_(1, torch.where(seeds >= 0, seeds, J), torch.where(seeds >= 0, r_top, NEG_INF))
    r0 = r0[:, :J]
    safe = (index.counts[bidx] <= kq) | (r_top[:, ns - 1] > r[:, kq - 1])
    bad = (~safe).nonzero().flatten()
    if len(bad):  # a tie may straddle the cut: score every head of those queries' banks
        full, tvalid = index.own_cos(Z[bad], bidx[bad])
        r0[bad, :full.shape[1]] = torch.where(tvalid, head_scores_torch(full, cfg.d_idx), NEG_INF)
    return r0


# ----------------------------------------------------------------------------------------------
# exact per-bank head search
# ----------------------------------------------------------------------------------------------

MODES = ("auto", "torch", "faiss")
AUTO_MIN_HEADS = 2048
"""``auto`` uses faiss only when the batch's banks hold at least this many heads on average..."""
AUTO_MAX_BANKS = 64
"""...and the batch touches at most this many distinct banks (one faiss call per bank on CPU)."""


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
    :param starts: ``[B]`` int64 row of each bank's first head in ``head_vecs``
    :param counts: ``[B]`` int64 heads of each bank (its rows are ``starts[b] : starts[b] + counts[b]``)
    :param mode: ``auto``, ``torch`` or ``faiss`` (``faiss`` without faiss installed runs torch)
    :param use_gpu: put the faiss index on a GPU when faiss has GPUs and torch has CUDA
        (default: when ``head_vecs`` is on CUDA)
    :param approx: ``[B]`` bool, the banks searched approximately (``EngineConfig.ann_min_units``):
        an approximate index over each such bank's heads (``steps.ann.VectorIndex``, kept in
        ``caches[b]`` when given, so later snapshots of the bank reuse it) proposes ``k + slack``
        heads, re-scored exactly; no exactness test (the one approximate path of the head seeds)
    :param ann: ``(kind, AnnParams)`` of those indexes
    """

    def __init__(self, head_vecs: Tensor, starts: Tensor, counts: Tensor, mode: str = "auto",
                 use_gpu: bool | None = None, approx=None, ann=None, caches=None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.vecs = head_vecs
        self.off = starts.to(torch.int64)
        self.counts = counts.to(torch.int64)
        self.off_cpu = self.off.cpu().numpy()
        self.end_cpu = self.off_cpu + self.counts.cpu().numpy()
        self.mode = mode
        self.device = head_vecs.device
        self.d = int(head_vecs.shape[1])
        self.use_gpu = (head_vecs.device.type == "cuda") if use_gpu is None else bool(use_gpu)
        self._faiss_index = None
        self._faiss_gpu = False
        self._gpu_res = None
        self.stats = SearchStats()
        self.approx = np.zeros(len(self.off_cpu), dtype=bool) if approx is None else np.asarray(approx, dtype=bool)
        self.ann = ann
        self.caches = caches if caches is not None else [{} for _ in range(len(self.off_cpu))]

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
        far = torch.as_tensor(self.approx, device=bidx.device)[bidx]
        if bool(far.any()):  # large banks: their approximate indexes; the others as below
            cos = torch.full((Q, k), float("-inf"), dtype=self.vecs.dtype, device=self.device)
            ids = torch.full((Q, k), -1, dtype=torch.int64, device=self.device)
            a, e = far.nonzero().flatten(), (~far).nonzero().flatten()
            cos[a], ids[a] = self._search_approx(Z[a], bidx[a], k)
            if len(e):
                cos[e], ids[e] = self.search(Z[e], bidx[e], k, mode)
            return cos, ids
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

    def own_cos(self, Z: Tensor, bidx: Tensor) -> tuple[Tensor, Tensor]:
        """``[Q, J_max]`` cosines to every head of the own bank (``-inf`` padding) and the mask."""
        n = self.counts[bidx]
        J = int(n.max())
        local = torch.arange(J, device=self.device)
        mask = local[None, :] < n[:, None]
        out = torch.full((Z.shape[0], J), float("-inf"), dtype=self.vecs.dtype, device=self.device)
        off, cnt = self.off.tolist(), self.counts.tolist()
        for bank, rows in bank_groups(bidx):
            a, m = off[bank], cnt[bank]
            out[rows, :m] = Z[rows] @ self.vecs[a:a + m].T
        return out, mask

    def _search_torch(self, Z: Tensor, bidx: Tensor, k: int) -> tuple[Tensor, Tensor]:
        cos, mask = self.own_cos(Z, bidx)
        return topk_ties_low(cos, mask, k)

    def _search_approx(self, Z: Tensor, bidx: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The ``k`` best heads of each query's own (large) bank among its approximate index's
        ``k + max(8, k)`` proposals, re-scored exactly, ties to the lower id."""
        from .ann import VectorIndex

        kind, params = self.ann
        kk = k + max(8, k)
        Q = Z.shape[0]
        prop = np.full((Q, kk), -1, dtype=np.int64)
        z32 = np.ascontiguousarray(Z.detach().float().cpu().numpy())
        bcpu = bidx.cpu().numpy()
        for bank in np.unique(bcpu).tolist():
            rows = np.flatnonzero(bcpu == bank)
            lo, hi = int(self.off_cpu[bank]), int(self.end_cpu[bank])
            cache = self.caches[bank]
            index = cache.get(("head_index", kind))
            if index is None:
                index = cache[("head_index", kind)] = VectorIndex(self.vecs[lo:hi].detach().float().cpu().numpy(),
                                                                  kind, self.use_gpu)
            _, I = index.search(z32[rows], kk, params)
            prop[rows, :I.shape[1]] = np.where(I >= 0, I + lo, -1)
        P = torch.as_tensor(prop, device=self.device)
        lo_t = self.off[bidx][:, None]
        inside = P >= 0
        exact = torch.bmm(self.vecs[torch.where(inside, P, lo_t)], Z[:, :, None]).squeeze(2)
        exact = torch.where(inside, exact, float("-inf"))
        local = torch.where(inside, P - lo_t, torch.iinfo(torch.int64).max)
        return topk_ties_low(exact, inside, k, ids=local)

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
            lo, hi = self.off_cpu[bcpu], self.end_cpu[bcpu]
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
                lo, hi = int(self.off_cpu[bank]), int(self.end_cpu[bank])
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
        inside = (P >= lo_t) & (P < lo_t + self.counts[bidx][:, None])
        Pc = torch.where(inside, P, lo_t)
        exact = torch.empty(P.shape, dtype=self.vecs.dtype, device=dev)
        step = max(1, (1 << 20) // (kk * self.d))  # ~8 MB of gathered rows at a time
        for s in range(0, Q, step):
            exact[s:s + step] = torch.bmm(self.vecs[Pc[s:s + step]], Z[s:s + step, :, None]).squeeze(2)
        exact = torch.where(inside, exact, float("-inf"))
        local = torch.where(inside, P - lo_t, torch.iinfo(torch.int64).max)
        cos, ids = topk_ties_low(exact, inside, k, ids=local)
        bound = torch.as_tensor(last, dtype=exact.dtype, device=dev) + float32_ip_error(self.d)
        n_own = self.counts[bidx]
        kth = cos[:, k - 1]
        enough = inside.sum(1) >= torch.clamp(n_own, max=k)
        ok = enough & ((bound < kth) | (torch.as_tensor(last, device=dev) == float("-inf")))
        return cos, ids, ok
