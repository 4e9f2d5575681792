"""Batched TrawMem selection: many queries over many banks in one pass.

:class:`SelectionEngine` reproduces :func:`trawmem_gpu.select.reference.select_reference`
stage by stage, but every stage runs on padded tensors over the whole batch of queries
(``Q`` queries, each against its own bank) instead of a Python loop over queries. Loops remain
only over propagation hops / frontier slots, Floyd-Warshall pivots, greedy steps, distinct banks
of a batch (one GEMM each) and memory-bounded chunks of queries; the two text stages (BM25 and
the demand features of the question) are CPU work on the question text.

Stages (shapes; ``N`` = most units of a bank in the batch, ``J`` = most threads, ``D`` = most
graph neighbours of a thread, ``T`` <= ``neighborhood_cap``, ``U`` = most candidates):

0. text: BM25 of every unit of the own bank for all queries of a bank at once, bit-identical to
   bm25s per query (``_lexical``), and the demand features, once per distinct question.
1. ``_affinity``: alpha of every unit of the query's own bank, ``[Q, N]`` (dense, fused with
   BM25, or reciprocal-rank fusion of cosine and BM25 ranks, as ``SelectConfig.affinity`` says;
   ranks from a stable int64-key sort per row; on CPU with numba the compiled front's per-query
   RRF instead, see ``_rrf_cpu``).
2. ``_seed_scores``: r0 per thread, ``[Q, J]`` (segment max of alpha over thread ranges; head
   seeds from the seed index of ``seed_index.py``: faiss with per-bank restriction or batched
   per-bank similarity, dispatched on measured thresholds, exact either way).
3. ``_propagate``: seeds (a top-k mask, ties -> lower thread), then H hops of relaxation over the
   padded neighbour lists (``[threads, D]``, ELL layout), in the reference's exact processing
   order -> r~ ``[Q, J]``.
4. ``_neighbourhood``: cap to seeds + best others (ties -> lower thread index) -> ``[Q, J]`` mask.
5. ``_candidates``: units of the neighbourhood threads, ascending, padded ``[Q, U]``.
6. per chunk of queries: features, gravity (Floyd-Warshall over the neighbourhood's head graph,
   then ``sum_j r~_j exp(-Dhead[j, k] / tau)``), role softmax, priorities, and the greedy:

   * CPU with numba (default there): :func:`_stage6_loop`, one compiled loop over the chunk's
     queries doing all of stage 6 per query in cache, reading ``K`` and the bridge feature from
     the per-bank tables; its lazy greedy picks exactly what plain greedy picks (ties included);
   * otherwise (CUDA, no numba, ``greedy="lazy"|"dispatch"``): the torch ops on ``[Qc, U, *]``
     tensors -- ``_features`` ``[Qc, U, 7]``, ``_gravity`` ``[Qc, T, T]``, ``role_priority``,
     ``_kernel`` ``K [Qc, U, U]`` and ``greedy_select`` (Triton on CUDA) or
     :func:`greedy_lazy_batched` on CPU; chunks sorted by U, ``Qc * U^2 <= chunk_elems``.

On CPU with numba and the default affinity / seeds (``rrf``, ``best_unit``), stages 0-5 run as
one compiled loop per query after the GEMM instead (``front="compiled"``,
:mod:`~trawmem_gpu.select.compiled_front`: BM25, RRF ranks by bucket and radix sorts, seeds,
propagation, candidates), queries grouped by bank and chunked, chunks on worker threads when
``threads > 1``; the tensor stages 0-5 above are its specification and the path everywhere else.

Per-bank tables built at construction while they fit in ``gram_bytes`` (default 2 GiB): the
support kernel ``K_b`` of every bank (``N_b^2`` floats: the candidates' ``K`` is a gather, never
a ``U x U x d`` product) and the thread-max cosine table ``btab`` (``N_b J_b`` floats: the bridge
feature is a max over ``T`` entries instead of ``U``). Without them the candidate stage forms
``E E^T`` per chunk. A learned role head (``head``) supplies ``delta``, ``M(delta)`` and
per-query objective / cost weights, as it does for the reference.

The factorization behind the gravity: the reference's priority weight is
``sum_j r~_j exp(-C(T_j, v) / tau)`` with ``C(T_j, v) = Dhead[j, k(v)] + d_in(v) + lambda_m (1 -
alpha(v)) + lambda_r (1 - phi(v))``; only ``Dhead`` depends on ``j``, so the sum equals
``gravity[k(v)] * exp(-(d_in(v) + ...) / tau)``. In-thread distances ``d_in`` do not depend on
the query and are precomputed per unit at construction.

Bank isolation is structural: a query's units are addressed as ``bank_unit_offsets[b] + i``
with ``i < n_units[b]`` and its threads as ``bank_thread_offsets[b] + j`` with ``j <
n_threads[b]``; graph neighbours are stored as bank-local thread ids; table entries as
``koff[b] + i * N_b + j``. No stage can address a unit or thread of another bank.

Precision: float64 on CPU (agrees with the float64 NumPy reference up to summation order),
float32 on CUDA (the Triton kernels' dtype). Float rounding can break near-ties differently
from the reference; exact ties break the same way (lowest index) everywhere.

Memory (dominant terms): the packed collection (``d * 8`` bytes per unit on CPU, ``d * 4`` on
CUDA, plus 5 scalars per unit), the tables (``sum_b N_b^2 + N_b J_b`` floats: 30 MB for the 7
LoCoMo dev banks in float64, 880 B per unit for banks of 100 units), neighbour lists ``threads *
D * 16`` bytes; per batch ``Q * N`` (affinity) and ``Q * J`` (thread scores) floats; per chunk
``Qc * U * T`` (compiled stage 6) or ``Qc * U * U`` (torch stage 6) floats. The propagation never
materializes a ``[Q, J, J]`` adjacency: each relaxation step gathers the ``[Q, D]`` neighbour
rows of one frontier slot. :meth:`SelectionEngine.nbytes` counts what the engine holds.
"""
from __future__ import annotations

import functools
import importlib.util
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..build.graph import SEMANTIC
from ..store.bank import Bank
from ..store.collection import PackedCollection, pack_banks
from ..workspace import Workspace, assemble
from . import compiled_front
from .batched_ops import greedy_select, role_priority
from .config import SelectConfig
from .lexical import BM25Index, tokenize
from .context import unit_features
from .reference import demand_mix
from .text_features import demand_features

NEG_INF, POS_INF = float("-inf"), float("inf")
PER_QUERY_WEIGHTS = ("w_cov", "w_role", "w_aff", "w_thr", "lambda_m", "lambda_r", "tau")
"""Config fields a learned head may set per query (scalars, or ``[Qc, 1]`` tensors in a chunk)."""


@functools.lru_cache(maxsize=1 << 16)
def _demand_features_cached(question: str) -> np.ndarray:
    """``demand_features`` once per distinct question text (read-only result; callers copy)."""
    x = demand_features(question)
    x.setflags(write=False)
    return x


@dataclass
class _Batch:
    """Whole-batch tensors after stages 1-5 (rows = queries in input order)."""

    bidx: Tensor       # [Q] bank index
    uoff: Tensor       # [Q] first global unit of the bank
    toff: Tensor       # [Q] first global thread of the bank
    alpha: Tensor      # [Q, N] affinity of every unit of the bank (0 on padding)
    r: Tensor          # [Q, J] propagated thread score r~ (-inf where unreached)
    in_h: Tensor       # [Q, J] bool, neighbourhood H_q
    tpos: Tensor       # [Q, J] position of a thread inside H_q (ascending thread order), -1 outside
    n_h: Tensor        # [Q] |H_q|
    cand: Tensor       # [Q, U] bank-local unit ids of the candidates, ascending (0 on padding)
    cvalid: Tensor     # [Q, U] bool
    n_cand: Tensor     # [Q] |U_q|
    delta: Tensor      # [Q, R] task demand
    Mq: Tensor         # [Q, R, F] role matrix M(delta)
    weights: dict | None  # learned per-query weights {SelectConfig field: [Q]} (head), else None


class SelectionEngine:
    """Batched Stage-2 selection over a fixed set of banks (see the module docstring).

    :param banks: the banks this engine serves (ids must be unique)
    :param cfg: selection config (its ablation is applied once, here)
    :param head: optional learned role head; used only if it has ``role_matrices`` (and its
        per-query weights if it has ``weights_batch``; see :meth:`_demand`)
    :param device: torch device; CUDA when present, else CPU
    :param impl: kernel dispatch for ``role_priority`` / ``greedy_select``: ``auto`` (Triton on
        CUDA), ``torch`` or ``triton``
    :param dtype: compute dtype; float64 on CPU and float32 on CUDA by default
    :param sim: how query-unit (and query-head) similarities are computed: ``grouped`` (one GEMM
        per distinct bank of the batch against that bank's rows), ``global`` (one GEMM against
        every packed row, then each query gathers its own bank's columns), ``gather`` (gather
        each query's bank vectors, batched mat-vec; no loop, no wasted products, but memory
        bound), ``dots`` (CPU, numba: a compiled per-query loop of dot products over the own
        bank) or ``auto``: on CUDA ``grouped`` while the batch touches at most 64 banks, else
        ``global`` while the collection is at most 16x the largest bank, else ``gather``; on CPU
        ``grouped``, or ``dots`` when banks average fewer than 8 queries (see ``_sim_mode``)
    :param chunk_elems: bound on ``Qc * U * U`` per candidate-stage chunk of the torch stage 6
        (default 2^19 on CPU, where cache-sized chunks ran ~4x faster than 2^23 on the dev data;
        2^24 on CUDA); the compiled stage 6 cuts chunks at ``Qc * U * max(T, 8) <= 2^22``
    :param gram_bytes: build the per-bank ``K`` and bridge tables while they fit in this many
        bytes (0: never; the candidate stage then computes ``E E^T`` per chunk)
    :param greedy: stage 6 on CPU: ``numba`` (the compiled per-query loop, :func:`_stage6_loop`),
        ``lazy`` (torch ops and :func:`greedy_lazy_batched`), ``dispatch`` (torch ops and
        ``greedy_select``: Triton on CUDA, the torch loop on CPU) or ``auto`` (numba on CPU when
        it imports and the tables fit, else lazy; dispatch on CUDA)
    :param seed_search: head-seed search (``seed_score="head"``): ``auto`` (measured dispatch,
        see :mod:`~trawmem_gpu.select.seed_index`), ``torch`` or ``faiss``
    :param front: stages 0-5 with the compiled stage 6: ``compiled`` (one numba loop per query
        after the GEMM, :mod:`~trawmem_gpu.select.compiled_front`; needs the ``rrf`` affinity,
        ``best_unit`` seeds and bm25s' plain scores), ``torch`` (the tensor stages) or ``auto``
        (compiled where it applies)
    :param threads: worker threads of the compiled CPU path (chunks of queries in parallel; the
        compiled loops release the GIL); default ``torch.get_num_threads()``
    """

    def __init__(self, banks: list[Bank], cfg: SelectConfig | None = None, head=None, device=None,
                 impl: str = "auto", dtype: torch.dtype | None = None, sim: str = "auto",
                 chunk_elems: int | None = None, gram_bytes: int = 1 << 31, greedy: str = "auto",
                 seed_search: str = "auto", front: str = "auto", threads: int | None = None):
        if not banks:
            raise ValueError("SelectionEngine needs at least one bank")
        ids = [b.bank_id for b in banks]
        if len(set(ids)) != len(ids):
            raise ValueError("bank ids must be unique")
        if sim not in ("auto", "grouped", "global", "gather", "dots"):
            raise ValueError(f"sim must be 'auto', 'grouped', 'global', 'gather' or 'dots', got {sim!r}")
        self.cfg = (cfg or SelectConfig()).resolved()
        self.head = head if (head is not None and hasattr(head, "role_matrices")) else None
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype or (torch.float32 if self.device.type == "cuda" else torch.float64)
        self.impl = impl
        if impl == "auto" and self.device.type == "cuda" and importlib.util.find_spec("trawmem_gpu.kernels") is None:
            self.impl = "torch"  # no Triton kernels in this install: the torch ops are the fallback
        if greedy not in ("auto", "lazy", "dispatch", "numba"):
            raise ValueError(f"greedy must be 'auto', 'lazy', 'dispatch' or 'numba', got {greedy!r}")
        self.chunk_elems = int(chunk_elems or (1 << 24 if self.device.type == "cuda" else 1 << 19))
        self.banks = list(banks)
        self.index = {b: i for i, b in enumerate(ids)}
        cfg_ = self.cfg
        # BM25 only when the affinity reads it (so a host without bm25s / nltk can run dense configs)
        lexical = cfg_.affinity == "rrf" or (cfg_.affinity == "fused" and cfg_.lexical_weight > 0)
        self.bm25 = [BM25Index([t.lexical_text() for t in b.turns]) for b in banks] if lexical else None
        self.packed: PackedCollection = pack_banks(self.banks, str(self.device), dtype=self.dtype)
        self._build_unit_tables()
        self._build_neighbours()
        self._build_tables(gram_bytes)
        cpu_ok = self.device.type == "cpu" and impl != "triton"
        if greedy == "auto":
            greedy = ("numba" if self.ktab is not None and _numba_kernels() is not None else "lazy") if cpu_ok \
                else "dispatch"
        if greedy == "numba" and (self.device.type != "cpu" or self.ktab is None or _numba_kernels() is None):
            raise ValueError("greedy='numba' needs a CPU engine, numba, and the per-bank tables (gram_bytes)")
        self.greedy = greedy
        self.sim = sim
        if seed_search not in ("auto", "torch", "faiss"):
            raise ValueError(f"seed_search must be 'auto', 'torch' or 'faiss', got {seed_search!r}")
        self.seed_index = None  # built on first use, for head seeds (see seed_index.py)
        self.seed_search = seed_search
        if front not in ("auto", "compiled", "torch"):
            raise ValueError(f"front must be 'auto', 'compiled' or 'torch', got {front!r}")
        front_ok = (self.greedy == "numba" and self.dtype == torch.float64 and cfg_.affinity == "rrf"
                    and cfg_.seed_score == "best_unit" and sim in ("auto", "grouped", "dots")
                    and compiled_front.kernels() is not None and self._bm25_plain())
        if front == "compiled" and not front_ok:
            raise ValueError("front='compiled' needs greedy='numba' (CPU, numba, tables), float64, affinity='rrf', "
                             "seed_score='best_unit', sim in ('auto', 'grouped', 'dots') and plain bm25s scores")
        self.front = "compiled" if front_ok and front != "torch" else "torch"
        self.front_rows = 1 << 20  # compiled front: queries per chunk x largest bank (bounds [Qc, N] scratch)
        self.threads = int(threads if threads is not None else torch.get_num_threads())
        if self.threads < 1:
            raise ValueError(f"{self.threads=} must be >= 1")
        self._pool = None
        self._pool_size = 0
        self._pool_lock = threading.Lock()
        self.last_timings: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------
    # construction: query-independent tables
    # ------------------------------------------------------------------------------------------
    def _tensor(self, a, dtype=None) -> Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype or self.dtype, device=self.device)

    def _build_unit_tables(self) -> None:
        """Per packed unit: head_sim, temporal, position, d_in, bank-local thread id."""
        cfg = self.cfg
        self.n_units = self._tensor([b.n_units for b in self.banks], torch.int64)
        self.n_threads = self._tensor([b.n_threads for b in self.banks], torch.int64)
        feats = [unit_features(b) for b in self.banks]
        self.head_sim = self._tensor(np.concatenate([f[0] for f in feats]))
        self.temporal = self._tensor(np.concatenate([f[1] for f in feats]))
        self.position = self._tensor(np.concatenate([f[2] for f in feats]))
        self.d_in = self._tensor(np.concatenate([in_thread_distances(f[0], b.thread_offsets, cfg.c_head, cfg.c_step)
                                                 for f, b in zip(feats, self.banks)]))
        self.unit_lthread = self._tensor(np.concatenate([b.unit_thread for b in self.banks]), torch.int64)

    def _build_tables(self, table_bytes: int) -> None:
        """Per-bank query-independent tables, when together they fit in ``table_bytes``:

        * ``ktab``: the support kernel ``K_b`` of every bank (``N_b x N_b``, flattened; entry
          ``koff[b] + i * N_b + j``) -- the same elementwise expression the reference applies to
          its candidate Gram matrix, so a gather gives exactly the candidates' ``K``;
        * ``btab``: ``max_{u in thread t} cos(e_v, e_u)`` per unit ``v`` and bank thread ``t``
          (``N_b x J_b``, entry ``boff[b] + i * J_b + t``): the bridge feature of a candidate is
          the max of its row over the *other* neighbourhood threads, ``[U, T]`` work instead of
          ``[U, U]``.

        Both None otherwise (the candidate stage then forms ``E E^T`` per chunk).
        """
        P = self.packed
        self.ktab = self.btab = None
        nu = [b.n_units for b in self.banks]
        nt = [b.n_threads for b in self.banks]
        k_el = 0 if self.cfg.kernel == "identity" else sum(n * n for n in nu)
        b_el = sum(n * j for n, j in zip(nu, nt))
        if (k_el + b_el) * P.unit_vecs.element_size() > table_bytes:
            return
        cfg = self.cfg
        off = P.bank_unit_offsets.tolist()
        ks, bs = [], []
        one = torch.ones((), dtype=self.dtype, device=self.device)
        for i, (a, e) in enumerate(zip(off[:-1], off[1:])):
            E = P.unit_vecs[a:e]
            G = E @ E.T
            lt = self.unit_lthread[a:e]
            bt = torch.full((e - a, nt[i]), NEG_INF, dtype=self.dtype, device=self.device)
            bt.scatter_reduce_(1, lt[None, :].expand(e - a, e - a), G, reduce="amax", include_self=True)
            bs.append(bt.flatten())
            if cfg.kernel != "identity":
                K = torch.clamp((G - cfg.k_shift) / (1.0 - cfg.k_shift), 0.0, 1.0)
                if not cfg.cross_thread:
                    K = torch.where(lt[:, None] == lt[None, :], K, 0.0)
                K.diagonal().copy_(one.expand(e - a))
                ks.append(K.flatten())
        self.btab = torch.cat(bs)
        self.boff = self._tensor(np.concatenate([[0], np.cumsum([n * j for n, j in zip(nu, nt)])[:-1]]), torch.int64)
        self.ktab = torch.cat(ks) if ks else torch.zeros(1, dtype=self.dtype, device=self.device)
        self.koff = self._tensor(np.concatenate([[0], np.cumsum([n * n for n in nu])[:-1]]) if ks
                                 else np.zeros(len(nu)), torch.int64)

    def table_nbytes(self) -> int:
        """Bytes held by the per-bank tables (0 when they are not built)."""
        return sum(t.element_size() * t.nelement() for t in (self.ktab, self.btab) if t is not None)

    def nbytes(self) -> int:
        """Bytes of every tensor the engine holds (packed collection, unit tables, graph, tables)."""
        own = (self.head_sim, self.temporal, self.position, self.d_in, self.unit_lthread, self.nbr, self.nbw,
               self.n_units, self.n_threads)
        return self.packed.nbytes() + self.table_nbytes() + sum(t.element_size() * t.nelement() for t in own)

    def _build_neighbours(self) -> None:
        """Thread graph as padded neighbour lists (ELL) over packed threads, bank-local ids.

        ``nbr [threads + 1, D]`` (-1 = none; the last row is an all-empty dummy row) and
        ``nbw`` the edge weights; semantic edges dropped when the config says so; a repeated
        (src, dst) pair keeps its largest weight (what a max-over-paths relaxation sees).
        """
        src, dst, w = [], [], []
        t0 = 0
        for b in self.banks:
            keep = np.ones(len(b.edge_src), dtype=bool) if self.cfg.semantic_edges else (b.edge_kind != SEMANTIC)
            src.append(b.edge_src[keep].astype(np.int64) + t0)
            dst.append(b.edge_dst[keep].astype(np.int64))
            w.append(b.edge_w[keep].astype(np.float64))
            t0 += b.n_threads
        src, dst, w = np.concatenate(src), np.concatenate(dst), np.concatenate(w)
        order = np.lexsort((-w, dst, src))
        src, dst, w = src[order], dst[order], w[order]
        first = np.ones(len(src), dtype=bool)
        first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
        src, dst, w = src[first], dst[first], w[first]
        deg = np.bincount(src, minlength=t0)
        D = max(1, int(deg.max()) if len(deg) else 1)
        start = np.concatenate([[0], np.cumsum(deg)])
        slot = np.arange(len(src)) - start[src]
        nbr = np.full((t0 + 1, D), -1, dtype=np.int64)
        nbw = np.zeros((t0 + 1, D), dtype=np.float64)
        nbr[src, slot] = dst
        nbw[src, slot] = w
        self.dummy_thread = t0
        self.nbr = self._tensor(nbr, torch.int64)
        self.nbw = self._tensor(nbw)

    # ------------------------------------------------------------------------------------------
    # public API
    # ------------------------------------------------------------------------------------------
    def select(self, bank_ids: list[str], questions: list[str], Z) -> list[Workspace]:
        """Workspaces (selected units grouped under their heads) for a batch of queries."""
        picks = self.select_units(bank_ids, questions, Z)
        return [assemble(self.banks[self.index[b]], q, p) for b, q, p in zip(bank_ids, questions, picks)]

    def select_units(self, bank_ids: list[str], questions: list[str], Z) -> list[list[int]]:
        """Selected bank-local unit indices per query, in pick order.

        :param bank_ids: ``Q`` bank ids (unknown ids raise ``KeyError``)
        :param questions: ``Q`` question texts (BM25 and demand features)
        :param Z: ``[Q, d]`` unit-norm query vectors (NumPy or torch; NaN/inf raise ``ValueError``)
        """
        bank_ids, questions = list(bank_ids), list(questions)
        if len(bank_ids) != len(questions):
            raise ValueError(f"{len(bank_ids)} bank ids but {len(questions)} questions")
        if not bank_ids:
            return []
        Zt = self._check_queries(Z, len(bank_ids))
        bidx_list = []
        for b in bank_ids:
            if b not in self.index:
                raise KeyError(f"unknown bank id {b!r}")
            bidx_list.append(self.index[b])
        tm = self.last_timings = {}
        sync = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        t = time.perf_counter()

        def lap(name):
            nonlocal t
            sync()
            now = time.perf_counter()
            tm[name] = tm.get(name, 0.0) + now - t
            t = now

        if self.front == "compiled":
            return self._select_compiled(bidx_list, questions, Zt, lap)
        batch = self._stages_1_to_5(bidx_list, questions, Zt, lap)
        out: list[list[int] | None] = [None] * len(bank_ids)
        n_cand, n_h, bidx = batch.n_cand, batch.n_h, batch.bidx
        for rows in self._chunks(n_cand, n_h, bidx):
            sel, n_sel, cand_c = self._select_chunk(batch, rows, lap)
            sel_units = torch.gather(cand_c, 1, sel.clamp(min=0)).tolist()
            for q, units, n in zip(rows.tolist(), sel_units, n_sel.tolist()):
                out[q] = units[:n]
        lap("output")
        return out  # type: ignore[return-value]

    def _stages_1_to_5(self, bidx_list: list[int], questions: list[str], Zt: Tensor, lap) -> _Batch:
        """Text, affinity, seeds, propagation, neighbourhood and candidates for a whole batch."""
        bidx = torch.as_tensor(bidx_list, dtype=torch.int64, device=self.device)
        lex = self._lexical(bidx_list, questions)
        delta, Mq, weights = self._demand(questions)
        lap("text_cpu")
        alpha, umask, cos_h, tvalid, ult = self._affinity(Zt, bidx, lex)
        lap("affinity")
        r0 = self._seed_scores(alpha, umask, cos_h, tvalid, ult, Zt, bidx)
        if self.greedy == "numba":  # CPU with numba: stages 3-4 as one compiled per-query loop
            r, in_h, tpos, n_h = self._propagate_numba(r0, bidx)
        else:
            r, seed_mask = self._propagate(r0, tvalid, bidx)
            in_h, tpos, n_h = self._neighbourhood(r, seed_mask)
        lap("propagate")
        cand, cvalid, n_cand = self._candidates(in_h, umask, ult)
        lap("candidates")
        return _Batch(bidx, self.packed.bank_unit_offsets[bidx], self.packed.bank_thread_offsets[bidx], alpha, r,
                      in_h, tpos, n_h, cand, cvalid, n_cand, delta, Mq, weights)

    def _select_compiled(self, bidx_list: list[int], questions: list[str], Zt: Tensor, lap) -> list[list[int]]:
        """All stages on CPU with the compiled front and stage 6 (``front="compiled"``).

        Queries run grouped by bank (a stable sort: one GEMM per bank over a contiguous block of
        rows; the bank's tables stay in cache through its queries), in chunks of at most
        ``front_rows / N`` queries. The calling thread first does the text work of every chunk
        (question tokens, demand features: Python, under the GIL), then :meth:`_compiled_chunk`
        the rest, chunk by chunk. With ``threads > 1`` those go to a thread pool (about four
        chunks per thread, for balance): the GEMMs and the compiled loops release the GIL, so the
        workers run in parallel. Text first measured 1.56x over one thread on 2 cores, against
        1.39x when the caller tokenized chunk k + 1 while workers ran chunk k (three busy threads
        on two cores). Stage timings are summed over chunks (with threads: CPU seconds)."""
        t = self._np_tables()
        Q = len(bidx_list)
        bidx_all = np.asarray(bidx_list, dtype=np.int64)
        order = np.argsort(bidx_all, kind="stable")
        chunk = max(1, self.front_rows // max(1, int(t["nu"].max())))
        workers = max(1, min(self.threads, Q))
        if workers > 1:
            chunk = min(chunk, max(16, -(-Q // (4 * workers))))
        Zn = Zt.numpy()
        out: list[list[int] | None] = [None] * Q
        tm = self.last_timings
        lap("text_cpu")  # (input checks)
        pool = None
        if workers > 1:
            with self._pool_lock:  # callers may share one engine across their own threads
                if self._pool is None or self._pool_size < workers:
                    from concurrent.futures import ThreadPoolExecutor

                    if self._pool is not None:
                        self._pool.shutdown(wait=False)
                    self._pool, self._pool_size = ThreadPoolExecutor(workers, thread_name_prefix="trawmem"), workers
                pool = self._pool
        pending = []
        t0 = time.perf_counter()
        texts = [(order[s:s + chunk], self._compiled_text(order[s:s + chunk], bidx_all, questions))
                 for s in range(0, Q, chunk)]
        tm["text_cpu"] = tm.get("text_cpu", 0.0) + time.perf_counter() - t0
        for rows, text in texts:
            if pool is None:
                pending.append(self._compiled_chunk(rows, bidx_all, Zn, text))
            else:
                pending.append(pool.submit(self._compiled_chunk, rows, bidx_all, Zn, text))
        t0 = None
        for item in pending:
            rows, picks, times = item if pool is None else item.result()
            t0 = t0 or time.perf_counter()
            for q, units in zip(rows.tolist(), picks):
                out[q] = units
            for k, v in times.items():
                tm[k] = tm.get(k, 0.0) + v
        tm["output"] = tm.get("output", 0.0) + time.perf_counter() - (t0 or time.perf_counter())
        return out  # type: ignore[return-value]

    def _compiled_text(self, rows: np.ndarray, bidx_all: np.ndarray, questions: list[str]):
        """Text work of one chunk: the queries' BM25 term columns (global CSC columns, in
        query-token order, as CSR ``ptr / ids``) and the demand (``delta``, ``M(delta)``, weights)."""
        qtext = [questions[i] for i in rows.tolist()]
        ptr, ids, _slow = self._bm25_columns(bidx_all[rows].tolist(), qtext)  # plain banks only here
        delta, Mq, weights = self._demand(qtext)
        return ptr, ids, delta, Mq, weights

    def _compiled_chunk(self, rows: np.ndarray, bidx_all: np.ndarray, Zn: np.ndarray,
                        text) -> tuple[np.ndarray, list[list[int]], dict]:
        """One chunk of :meth:`_select_compiled` (``rows``: query indices, bank-sorted;
        ``text``: :meth:`_compiled_text`): the cosines (one GEMM per bank, or the compiled
        per-query dots when banks average fewer than 8 queries; into one flat buffer, bank-local
        unit order), :func:`~trawmem_gpu.select.compiled_front._front_loop` and
        :func:`_stage6_loop`. Returns ``(rows, picks, stage seconds)``."""
        front, _, dots, _ = compiled_front.kernels()
        cfg = self.cfg
        t = self._np_tables()
        data, indices, indptr, _tok_off, _plain = self._bm25_tables()
        ptr, ids, delta, Mq, weights = text
        times: dict[str, float] = {}
        t0 = time.perf_counter()

        def lap(name):
            nonlocal t0
            now = time.perf_counter()
            times[name] = times.get(name, 0.0) + now - t0
            t0 = now

        bidx = bidx_all[rows]
        Qc = len(rows)
        # cosines of each query with its own bank's units, flat (bank-local unit order)
        nu = t["nu"][bidx]
        coff = np.zeros(Qc, dtype=np.int64)
        np.cumsum(nu[:-1], out=coff[1:])
        cos = np.empty(int(nu.sum()))
        Zc = np.ascontiguousarray(Zn[rows])
        cut = np.flatnonzero(np.diff(bidx)) + 1
        starts, ends = np.concatenate([[0], cut]), np.concatenate([cut, [Qc]])
        if self.sim == "dots" or (self.sim == "auto" and len(starts) * 8 > Qc):
            dots(Zc, t["vecs"], t["uo"], t["nu"], bidx, coff, cos)
        else:
            Zc_t = torch.from_numpy(Zc)
            for a, e in zip(starts.tolist(), ends.tolist()):
                b, n = int(bidx[a]), int(t["nu"][bidx[a]])
                o = int(coff[a])
                blk = torch.from_numpy(cos[o:o + (e - a) * n]).view(e - a, n)
                uo = int(t["uo"][b])
                torch.mm(Zc_t[a:e], self.packed.unit_vecs[uo:uo + n].T, out=blk)
        lap("affinity")
        J = int(t["nt"][bidx].max())
        T = max(1, min(J, max(cfg.neighborhood_cap, cfg.n_seeds)))
        Ub = max(1, int(t["ucap"][bidx].max()))  # most candidates any of these queries can have
        # every entry a later stage reads is written by the front loop: no fill needed
        cand = np.empty((Qc, Ub), dtype=np.int64)
        n_cand = np.empty(Qc, dtype=np.int64)
        lt = np.empty((Qc, Ub), dtype=np.int64)
        alpha = np.empty((Qc, Ub))
        hthread = np.empty((Qc, T), dtype=np.int64)
        rvec = np.empty((Qc, T))
        n_h = np.empty(Qc, dtype=np.int64)
        tpos = np.empty((Qc, J), dtype=np.int64)
        front(cos, coff, nu, t["nt"][bidx], t["uo"][bidx], t["to"][bidx], t["ult"],
              ptr, ids, data, indices, indptr,
              float(cfg.rrf_k), t["nbr"], t["nbw"], min(cfg.n_seeds, J), cfg.neighborhood_cap, cfg.hops,
              cfg.gamma, cfg.propagation == "paper", cand, n_cand, lt, alpha, hthread, rvec, n_h, tpos)
        lap("front")
        P = np.empty((Qc, 7))
        for k, name in enumerate(("lambda_m", "lambda_r", "tau", "w_cov", "w_role", "w_aff", "w_thr")):
            P[:, k] = weights[name].numpy() if weights and name in weights else getattr(cfg, name)
        budget = np.clip(np.minimum(n_cand, cfg.budget), 1, None)
        limit = np.clip(np.minimum(budget, n_cand), 0, cfg.budget)
        sel, n_sel = stage6_numba(dict(cand=cand, n_cand=n_cand, lt=lt, alpha=alpha, hthread=hthread, rvec=rvec,
                                       n_h=n_h, tpos=tpos, uoff=t["uo"][bidx], toff=t["to"][bidx], Mq=Mq,
                                       delta=delta, P=P, budget=budget, limit=limit, **self._stage6_tables(bidx)),
                                  cfg)
        lap("greedy")
        picks = [cand[i, sel[i, :n_sel[i]]].tolist() for i in range(Qc)]
        lap("output")
        return rows, picks, times

    def _np_tables(self) -> dict:
        """NumPy views of the CPU tensors the compiled loops read (built once)."""
        if getattr(self, "_np", None) is None:
            P = self.packed
            self._np = dict(
                nu=self.n_units.numpy(), nt=self.n_threads.numpy(), uo=P.bank_unit_offsets.numpy(),
                to=P.bank_thread_offsets.numpy(), ult=self.unit_lthread.numpy(), nbr=self.nbr.numpy(),
                nbw=np.ascontiguousarray(self.nbw.numpy(), dtype=np.float64), vecs=P.unit_vecs.numpy(),
                koff=self.koff.numpy(), boff=self.boff.numpy(), ktab=self.ktab.numpy(), btab=self.btab.numpy(),
                head_sim=self.head_sim.numpy(), temporal=self.temporal.numpy(), position=self.position.numpy(),
                d_in=self.d_in.numpy())
            # per bank, the most candidates a query can have: its max(cap, n_seeds) longest threads
            h = max(self.cfg.neighborhood_cap, self.cfg.n_seeds)
            self._np["ucap"] = np.array([int(np.sort(np.diff(b.thread_offsets))[::-1][:h].sum()) for b in self.banks],
                                        dtype=np.int64)
        return self._np

    def _stage6_tables(self, bidx: np.ndarray) -> dict:
        """The bank-indexed and table arguments of :func:`_stage6_loop` for queries of banks ``bidx``."""
        t = self._np_tables()
        return dict(koff=t["koff"][bidx], nb=t["nu"][bidx], boff=t["boff"][bidx], jb=t["nt"][bidx], ktab=t["ktab"],
                    btab=t["btab"], head_sim=t["head_sim"], temporal=t["temporal"], position=t["position"],
                    d_in=t["d_in"], nbr=t["nbr"], nbw=t["nbw"])

    def _bm25_plain(self) -> bool:
        """Every bank's BM25 is a plain float32 score matrix (no non-occurrence term)."""
        if self.bm25 is None:
            return False
        data, _i, _p, _o, plain = self._bm25_tables()
        return all(plain) and data.dtype == np.float32

    def candidate_sets(self, bank_ids: list[str], questions: list[str], Z) -> list[np.ndarray]:
        """The candidate units U_q (bank-local ids, ascending) of each query: stages 1-5 only.
        For benchmarks that run another greedy on the same candidates (``candidate_kernel``)."""
        bidx_list = [self.index[b] for b in bank_ids]
        if not bidx_list:
            return []
        b = self._stages_1_to_5(bidx_list, list(questions), self._check_queries(Z, len(bidx_list)), lambda _n: None)
        cand, n = b.cand.cpu().numpy(), b.n_cand.cpu().tolist()
        return [cand[i, :k].copy() for i, k in enumerate(n)]

    def candidate_kernel(self, bank_id: str, cand: np.ndarray) -> np.ndarray:
        """``K [U, U]`` (float64 NumPy) of candidate units ``cand`` of bank ``bank_id``: the
        support kernel the greedy maximizes coverage of."""
        i = self.index[bank_id]
        c = torch.as_tensor(np.asarray(cand, dtype=np.int64), device=self.device)
        if self.cfg.kernel == "identity":
            return np.eye(len(c))
        if self.ktab is not None:
            n = self.banks[i].n_units
            K = torch.take(self.ktab, self.koff[i] + c[:, None] * n + c[None, :])
            return K.double().cpu().numpy()
        E = self.packed.unit_vecs[int(self.packed.bank_unit_offsets[i]) + c]
        S = E @ E.T
        K = torch.clamp((S - self.cfg.k_shift) / (1.0 - self.cfg.k_shift), 0.0, 1.0)
        if not self.cfg.cross_thread:
            lt = self.unit_lthread[int(self.packed.bank_unit_offsets[i]) + c]
            K = torch.where(lt[:, None] == lt[None, :], K, 0.0)
        K.fill_diagonal_(1.0)
        return K.double().cpu().numpy()

    # ------------------------------------------------------------------------------------------
    # input checks and text stages (CPU)
    # ------------------------------------------------------------------------------------------
    def _check_queries(self, Z, Q: int) -> Tensor:
        """``[Q, d]`` query vectors on the device in the compute dtype."""
        Zt = Z.detach() if isinstance(Z, Tensor) else torch.as_tensor(np.asarray(Z, dtype=np.float64))
        Zt = Zt.to(device=self.device, dtype=self.dtype)
        if Zt.ndim != 2 or Zt.shape[0] != Q or Zt.shape[1] != self.packed.unit_vecs.shape[1]:
            raise ValueError(f"Z must have shape [{Q}, {self.packed.unit_vecs.shape[1]}], got {tuple(Zt.shape)}")
        bad = ~torch.isfinite(Zt).all(dim=1)
        if bool(bad.any()):
            raise ValueError(f"query vectors hold NaN or inf (rows {bad.nonzero().flatten()[:10].tolist()})")
        return Zt

    def _bm25_tables(self):
        """Every bank's bm25s score matrix (CSC over its own vocabulary) concatenated once:
        ``(data, indices, indptr, tok_off, plain)`` with bank ``b``'s term ``t`` at global column
        ``tok_off[b] + t``; ``plain[b]`` False for a bank whose BM25 variant needs bm25s itself."""
        if getattr(self, "_bm25_flat", None) is None:
            datas, inds, ptrs, tok_off, plain = [], [], [], [0], []
            nnz = 0
            for bm in self.bm25:
                m = bm.model
                ok = getattr(m, "nonoccurrence_array", None) is None and isinstance(m.scores, dict)
                plain.append(ok)
                if ok:
                    d, ix, ip = m.scores["data"], m.scores["indices"], m.scores["indptr"]
                else:
                    d, ix, ip = np.zeros(0, np.float32), np.zeros(0, np.int32), np.zeros(1, np.int64)
                datas.append(d)
                inds.append(ix.astype(np.int64))
                ptrs.append(ip[:-1].astype(np.int64) + nnz)
                nnz += len(d)
                tok_off.append(tok_off[-1] + len(ip) - 1)
            dtypes = {d.dtype for d in datas if len(d)} or {np.dtype(np.float32)}
            if len(dtypes) != 1:
                raise ValueError(f"banks' BM25 indexes use different dtypes {dtypes}")
            self._bm25_flat = (np.concatenate(datas).astype(dtypes.pop()), np.concatenate(inds),
                               np.concatenate(ptrs + [np.array([nnz], dtype=np.int64)]), tok_off, plain)
        return self._bm25_flat

    def _bm25_columns(self, bidx: list[int], questions: list[str]) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Each query's BM25 term columns in the concatenated score matrix (:meth:`_bm25_tables`),
        in query-token order, as CSR ``(ptr [Q + 1], ids)``; questions tokenized once per distinct
        text. ``slow``: queries whose bank's BM25 needs bm25s itself (no columns listed)."""
        _data, _indices, _indptr, tok_off, plain = self._bm25_tables()
        tokens: dict[str, list[str]] = {}
        ids: list[int] = []
        ptr = [0]
        slow: list[int] = []
        for q, (b, text) in enumerate(zip(bidx, questions)):
            if not plain[b]:
                slow.append(q)
            else:
                toks = tokens.get(text)
                if toks is None:
                    toks = tokens[text] = tokenize(text)
                vocab, o = self.bm25[b].vocab, tok_off[b]
                ids += [o + vocab[w] for w in toks if w in vocab]
            ptr.append(len(ids))
        return np.asarray(ptr, dtype=np.int64), np.asarray(ids, dtype=np.int64), slow

    def _lexical(self, bidx: list[int], questions: list[str]) -> np.ndarray | None:
        """``[Q, N]`` raw BM25 scores of every unit of the query's bank (0 on padding; CPU).

        bm25s keeps, per term, the BM25 contribution of every unit holding it (CSC ``data``,
        ``indices``, ``indptr``) and scores a query by adding its terms' columns in query-token
        order in float32 (``np.add.at``). This does the same additions, in the same order and
        precision, for the whole batch at once over the concatenated matrices of all banks
        (:meth:`_bm25_tables`): token position ``p`` of every query is one fancy-indexed float32
        add (a query appears once per position, so no index repeats), hence bit-identical scores
        and no per-bank Python work. Questions are tokenized once per distinct text. None when
        the affinity has no lexical part (``dense``, or ``fused`` with lexical_weight 0).
        """
        cfg = self.cfg
        if cfg.affinity == "dense" or (cfg.affinity == "fused" and cfg.lexical_weight <= 0):
            return None
        data, indices, indptr, _tok_off, _plain = self._bm25_tables()
        N = max(self.banks[b].n_units for b in set(bidx))
        Q = len(bidx)
        out = np.zeros((Q, N), dtype=data.dtype)
        ptr, ids, slow = self._bm25_columns(bidx, questions)
        flat = out.reshape(-1)
        lens = np.diff(ptr)
        for p in range(int(lens.max()) if Q else 0):
            who = np.flatnonzero(lens > p)
            tid = ids[ptr[who] + p]
            start, end = indptr[tid], indptr[tid + 1]
            ln = end - start
            tot = int(ln.sum())
            if tot == 0:
                continue
            first = np.repeat(np.cumsum(ln) - ln, ln)
            pos = np.repeat(start, ln) + (np.arange(tot) - first)
            flat[np.repeat(who * N, ln) + indices[pos]] += data[pos]
        lex = out.astype(np.float64)
        for q in slow:  # a BM25 variant with a non-occurrence term: bm25s per query
            sc = self.bm25[bidx[q]].scores(questions[q])
            lex[q, :len(sc)] = sc
        return lex

    def _demand(self, questions: list[str]) -> tuple[Tensor, Tensor, dict | None]:
        """Task demand ``delta [Q, R]``, role matrices ``M(delta) [Q, R, F]`` and per-query weights.

        Hand-set: ``delta = A x / 1^T A x``, ``M(delta) = M * (1 + delta)`` row-wise, with
        ``x = demand_features(question)``, weights None (the config's). A learned head replaces
        them: ``head.role_matrices(X)`` (X: ``[Q, 4]`` float64 tensor) must return ``(delta [Q, R],
        Mq [Q, R, F])``; ``head.weights_batch(X)``, if present, returns ``{field: [Q]}`` for
        SelectConfig fields among w_cov, w_role, w_aff, w_thr, lambda_m, lambda_r, tau.
        """
        X = np.stack([_demand_features_cached(q) for q in questions])
        if self.head is not None:
            Xt = torch.as_tensor(X, dtype=torch.float64)
            delta, Mq = self.head.role_matrices(Xt)
            weights = None
            if hasattr(self.head, "weights_batch"):
                weights = {k: torch.as_tensor(v).to(self.device, self.dtype)
                           for k, v in self.head.weights_batch(Xt).items()}
                unknown = set(weights) - set(PER_QUERY_WEIGHTS)
                if unknown:
                    raise ValueError(f"head sets weights the batched engine cannot vary per query: {sorted(unknown)}")
            return (torch.as_tensor(delta).to(self.device, self.dtype), torch.as_tensor(Mq).to(self.device, self.dtype),
                    weights or None)
        delta = demand_mix(np.array(self.cfg.A), X)  # the reference's own function: same bits
        delta = delta / delta.sum(axis=1, keepdims=True)
        Mq = np.array(self.cfg.M)[None] * (1.0 + delta)[:, :, None]
        return self._tensor(delta), self._tensor(Mq), None

    # ------------------------------------------------------------------------------------------
    # stage 1-2: affinity and seed scores over each query's own bank
    # ------------------------------------------------------------------------------------------
    def _own_rows(self, offsets: Tensor, counts: Tensor, bidx: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Padded global ids of each query's own bank rows: ``(ids [Q, W], mask [Q, W], local [W])``.

        Padding slots point at the bank's first row (never at another bank's)."""
        n = counts[bidx]
        W = int(n.max())
        local = torch.arange(W, device=self.device)
        mask = local[None, :] < n[:, None]
        ids = offsets[bidx][:, None] + torch.where(mask, local[None, :], torch.zeros_like(local)[None, :])
        return ids, mask, local

    def _sim_mode(self, bidx: Tensor) -> str:
        """On CPU: ``grouped`` (one GEMM per distinct bank) while banks average 8 or more queries
        of the batch, else ``dots`` (a compiled loop of per-query dot products over the own
        bank, when numba imports). Measured at Q = 1024, 1 thread, d = 384: 7 banks of 570 units
        16.6 vs 27.7 us per query; 100 banks of 100: 7.7 vs 8.0; 1,000: 25.6 vs 11.8; 5,000: 38.6
        vs 13.0 (``global`` and ``gather`` were 200-2,100 and ~250 us: memory bound). On CUDA
        ``grouped`` up to 64 distinct banks (one GEMM launch per bank), then ``global`` or
        ``gather``."""
        if self.sim != "auto":
            return self.sim
        n_banks = len(torch.unique(bidx))
        if self.device.type == "cpu":
            return "dots" if n_banks * 8 > len(bidx) and _numba_dots() is not None else "grouped"
        if n_banks <= 64:
            return "grouped"
        return "global" if int(self.n_units.sum()) <= 16 * int(self.n_units.max()) else "gather"

    def _similarity(self, Zt: Tensor, vecs: Tensor, ids: Tensor, bidx: Tensor, offsets: Tensor,
                    counts: Tensor) -> Tensor:
        """``[Q, W]`` cos(z_q, vecs[ids[q, w]]) for each query's own bank rows (see ``sim``)."""
        mode = self._sim_mode(bidx)
        if mode == "dots":
            dots = _numba_dots()
            if dots is None or self.device.type != "cpu":
                raise ValueError("sim='dots' needs numba and a CPU engine")
            Q, W = ids.shape
            out = np.zeros((Q, W))  # row q at offset q * W of the flat buffer, zero past its bank
            dots(np.ascontiguousarray(Zt.numpy()), vecs.numpy(), offsets.numpy(), counts.numpy(), bidx.numpy(),
                 np.arange(Q, dtype=np.int64) * W, out.reshape(-1))
            return torch.from_numpy(out).to(self.dtype)
        if mode == "global":
            return torch.gather(Zt @ vecs.T, 1, ids)
        if mode == "grouped":
            out = torch.zeros(ids.shape, dtype=self.dtype, device=self.device)
            off, cnt = offsets.tolist(), counts.tolist()
            for bank, rows in bank_groups(bidx):
                a, n = off[bank], cnt[bank]
                out[rows, :n] = Zt[rows] @ vecs[a:a + n].T
            return out
        out = torch.empty(ids.shape, dtype=self.dtype, device=self.device)
        step = max(1, max(self.chunk_elems, 1 << 24) // max(1, ids.shape[1] * vecs.shape[1]))
        for s in range(0, ids.shape[0], step):
            E = vecs[ids[s:s + step]]  # [Qc, W, d]
            out[s:s + step] = torch.bmm(E, Zt[s:s + step, :, None]).squeeze(2)
        return out

    def _affinity(self, Zt: Tensor, bidx: Tensor, lex: np.ndarray | None):
        """Stage 1: ``alpha [Q, N]`` (0 on padding), ``umask [Q, N]``, head cosines ``[Q, J]``,
        ``tvalid [Q, J]``.

        ``dense``: ``(1 + cos) / 2``; ``fused``: ``(1 - w) dense + w bm25 / max_bank(bm25)``;
        ``rrf``: ``1 / (k + rank_cos) + [bm25 > 0] / (k + rank_bm25)`` over the bank (ranks from 1,
        ties to the lower unit index), divided by its bank maximum.
        """
        P = self.packed
        cfg = self.cfg
        uid, umask, _ = self._own_rows(P.bank_unit_offsets, self.n_units, bidx)
        cos = self._similarity(Zt, P.unit_vecs, uid, bidx, P.bank_unit_offsets, self.n_units)
        rrf_fast = cfg.affinity == "rrf" and _rrf_fast_ok(cos, lex)
        if rrf_fast:  # CPU float64 with numba: keys, one NumPy sort per list, ranks and fusion compiled
            alpha = torch.from_numpy(_rrf_cpu(cos.numpy(), umask.sum(dim=1).numpy(), lex, float(cfg.rrf_k)))
        elif cfg.affinity == "rrf":
            bm = self._tensor(lex)
            s = _ranks(cos, umask).add_(cfg.rrf_k).reciprocal_()
            s += torch.where(bm > 0, _ranks_positive(bm).add_(cfg.rrf_k).reciprocal_(), 0.0)
            s.masked_fill_(~umask, 0.0)
            alpha = s.div_(s.amax(dim=1, keepdim=True))
        elif cfg.affinity in ("dense", "fused"):
            alpha = (1.0 + cos) / 2.0
            if lex is not None:
                bm = self._tensor(lex)
                mx = bm.amax(dim=1, keepdim=True)
                norm = torch.where(mx > 0, bm / torch.where(mx > 0, mx, 1.0), 0.0)
                lw = cfg.lexical_weight
                alpha = (1.0 - lw) * alpha + lw * norm
        else:
            raise NotImplementedError(f"affinity {cfg.affinity!r} is not implemented in the batched engine")
        alpha = torch.where(umask, alpha, torch.zeros((), dtype=self.dtype, device=self.device))
        tid, tvalid, _ = self._own_rows(P.bank_thread_offsets, self.n_threads, bidx)
        cos_h = None  # best_unit seeds need no head scores; head seeds use the seed index
        if cfg.seed_score == "max":
            cos_h = self._similarity(Zt, P.head_vecs, tid, bidx, P.bank_thread_offsets, self.n_threads)
        ult = torch.where(umask, self.unit_lthread[uid], tvalid.shape[1])  # bank-local thread, J on padding
        return alpha, umask, cos_h, tvalid, ult

    def _r_head(self, cos_h: Tensor) -> Tensor:
        d = torch.sqrt(torch.clamp(2.0 - 2.0 * cos_h, min=0.0)) if self.cfg.d_idx == "l2" else 1.0 - cos_h
        return 1.0 / (1.0 + d)

    def _seed_scores(self, alpha: Tensor, umask: Tensor, cos_h: Tensor | None, tvalid: Tensor, ult: Tensor,
                     Zt: Tensor, bidx: Tensor) -> Tensor:
        """Stage 2: ``r0 [Q, J]`` (-inf on padding threads).

        Head score ``1 / (1 + d_idx(z, h))``; best-unit score = segment max of alpha over each
        thread's unit range (scatter-amax into bank-local thread slots). Head seeds
        (``seed_score="head"``) come from the seed index (:meth:`_head_seeds`): only the seeds
        get a finite r0, which is all propagation reads.
        """
        Q, J = tvalid.shape
        cfg = self.cfg
        if cfg.seed_score == "head":
            return self._head_seeds(Zt, bidx, J)
        r_unit = torch.full((Q, J + 1), NEG_INF, dtype=self.dtype, device=self.device)
        r_unit.scatter_reduce_(1, ult, alpha, reduce="amax", include_self=True)
        r_unit = r_unit[:, :J]
        r0 = r_unit if cfg.seed_score == "best_unit" else torch.maximum(self._r_head(cos_h), r_unit)
        return torch.where(tvalid, r0, torch.full_like(r0, NEG_INF))

    def _head_seeds(self, Zt: Tensor, bidx: Tensor, J: int) -> Tensor:
        """``r0 [Q, J]`` for head seeds: finite only on each query's ``n_seeds`` seeds.

        The seed index (:class:`~trawmem_gpu.select.seed_index.HeadIndex`, faiss or batched
        per-bank similarity, see ``seed_search``) returns the ``n_seeds + slack`` heads of the own
        bank with the largest cosine; r_head is computed for those, and the seeds are the best
        ``n_seeds`` by (r_head descending, thread id ascending), the reference's order. r_head is
        monotone in the cosine, so every other head scores at most the last candidate's r_head;
        a query whose n_seeds-th seed does not beat that strictly (a possible tie across the cut)
        gets all of its bank's head scores instead.
        """
        from .seed_index import HeadIndex, _topk_ties_low

        cfg = self.cfg
        P = self.packed
        if self.seed_index is None:
            self.seed_index = HeadIndex(P.head_vecs, P.bank_thread_offsets, mode=self.seed_search)
        ns = cfg.n_seeds
        kq = ns + max(8, ns)
        cos, ids = self.seed_index.search(Zt, bidx, kq)
        live = ids >= 0
        r = torch.where(live, self._r_head(torch.where(live, cos, 0.0)), NEG_INF)
        r_top, seeds = _topk_ties_low(r, live, ns, ids=ids)
        Q = Zt.shape[0]
        r0 = torch.full((Q, J + 1), NEG_INF, dtype=self.dtype, device=self.device)
        r0.scatter_(1, torch.where(seeds >= 0, seeds, J), torch.where(seeds >= 0, r_top, NEG_INF))
        r0 = r0[:, :J]
        nt = self.n_threads[bidx]
        safe = (nt <= kq) | (r_top[:, ns - 1] > r[:, kq - 1])
        bad = (~safe).nonzero().flatten()
        if len(bad):  # a tie may straddle the cut: score every head of those queries' banks
            tid, tvalid, _ = self._own_rows(P.bank_thread_offsets, self.n_threads, bidx[bad])
            full = self._r_head(self._similarity(Zt[bad], P.head_vecs, tid, bidx[bad], P.bank_thread_offsets,
                                                 self.n_threads))
            r0[bad, :full.shape[1]] = torch.where(tvalid, full, NEG_INF)
        return r0

    # ------------------------------------------------------------------------------------------
    # stage 3-4: propagation and neighbourhood
    # ------------------------------------------------------------------------------------------
    def _propagate(self, r0: Tensor, tvalid: Tensor, bidx: Tensor) -> tuple[Tensor, Tensor]:
        """Stage 3: seeds and H hops of max-over-paths relaxation -> ``(r [Q, J], seed_mask [Q, J])``.

        Reproduces the reference's order exactly: round 1 relaxes from the seeds in seed-rank
        order, later rounds from the threads updated in the previous round in ascending id; each
        relaxation reads the source's *current* score (an update earlier in the same round is
        seen). One Python iteration per frontier slot, vectorized over queries and over the
        ``D`` neighbours of the slot's thread. Column ``J`` is a dummy sink for padding.
        """
        cfg = self.cfg
        Q, J = r0.shape
        dev = self.device
        ns = min(cfg.n_seeds, J)
        tvalid = torch.arange(J, device=dev)[None, :] < self.n_threads[bidx][:, None]
        r = torch.full((Q, J + 1), NEG_INF, dtype=self.dtype, device=dev)
        r0p = torch.cat([r0, r[:, :1]], dim=1)
        # seeds: the ns best valid threads (ties -> lower thread index), in seed-rank order
        idx = _compact(_topk_mask(r0, ns, tvalid), ns, fill=J)  # ascending thread index, J = none
        seeds = torch.gather(idx, 1, torch.sort(-torch.gather(r0p, 1, idx), dim=1, stable=True).indices)
        r.scatter_(1, seeds, torch.gather(r0p, 1, seeds))
        r[:, J] = NEG_INF
        seed_mask = torch.zeros(Q, J + 1, dtype=torch.bool, device=dev)
        seed_mask.scatter_(1, seeds, True)
        toff = self.packed.bank_thread_offsets[bidx]
        g = cfg.gamma
        frontier = seeds
        for _ in range(cfg.hops):
            if frontier.shape[1] == 0:
                break
            nxt = torch.zeros(Q, J + 1, dtype=torch.bool, device=dev)
            for f in range(frontier.shape[1]):
                j = frontier[:, f]
                live = j < J
                gj = torch.where(live, toff + j, self.dummy_thread)
                nb = self.nbr[gj]  # [Q, D] bank-local ids, -1 = none
                nb = torch.where(nb >= 0, nb, J)
                w = self.nbw[gj]
                rj = torch.gather(r, 1, j[:, None])
                val = g * rj + (1 - g) * w if cfg.propagation == "paper" else rj * (g + (1 - g) * w)
                cur = torch.gather(r, 1, nb)
                upd = (val > cur) & (nb < J)
                r.scatter_(1, nb, torch.where(upd, val, cur))
                nxt.scatter_(1, nb, upd | torch.gather(nxt, 1, nb))
                r[:, J] = NEG_INF
            nxt = nxt[:, :J]
            count = nxt.sum(dim=1)
            F = int(count.max())
            frontier = _compact(nxt, F, fill=J)
        return r[:, :J], seed_mask[:, :J]

    def _propagate_numba(self, r0: Tensor, bidx: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Stages 3-4 with :func:`~.compiled_front._propagate_one` per query (the reference's algorithm, compiled):
        ``(r [Q, J], in_h [Q, J], tpos [Q, J], n_h [Q])`` as :meth:`_propagate` and
        :meth:`_neighbourhood` give them."""
        cfg = self.cfg
        Q, J = r0.shape
        r = np.full((Q, J), NEG_INF)
        in_h = np.zeros((Q, J), dtype=np.bool_)
        compiled_front.kernels()[1](np.ascontiguousarray(r0.numpy(), dtype=np.float64), self.n_threads[bidx].numpy(),
                           self.packed.bank_thread_offsets[bidx].numpy(), self.nbr.numpy(),
                           np.ascontiguousarray(self.nbw.numpy(), dtype=np.float64), min(cfg.n_seeds, J),
                           cfg.neighborhood_cap, cfg.hops, cfg.gamma, cfg.propagation == "paper", r, in_h)
        in_h_t = torch.from_numpy(in_h)
        tpos = torch.where(in_h_t, torch.cumsum(in_h_t.to(torch.int64), dim=1) - 1, -1)
        return torch.from_numpy(r).to(self.dtype), in_h_t, tpos, in_h_t.sum(dim=1)

    def _neighbourhood(self, r: Tensor, seed_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Stage 4: cap H_q to seeds + best others -> ``(in_h [Q, J], tpos [Q, J], n_h [Q])``.

        Order: seeds first, then reached threads by descending r~ (ties -> lower thread id),
        the first ``neighborhood_cap`` kept; ``tpos`` numbers the kept threads in ascending id.
        """
        Q, J = r.shape
        reached = r > NEG_INF
        key = torch.where(seed_mask, POS_INF, r)
        cap = min(self.cfg.neighborhood_cap, J)
        in_h = _topk_mask(key, cap, reached)
        n_keep = in_h.sum(dim=1)
        tpos = torch.where(in_h, torch.cumsum(in_h.to(torch.int64), dim=1) - 1, -1)
        return in_h, tpos, n_keep

    # ------------------------------------------------------------------------------------------
    # stage 5: candidates
    # ------------------------------------------------------------------------------------------
    def _candidates(self, in_h: Tensor, umask: Tensor, ult: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Stage 5: ``(cand [Q, U], cvalid [Q, U], n_cand [Q])``: units of H_q threads in ascending
        bank-local order (the reference's candidate order), compacted with a cumsum (no sort)."""
        J = in_h.shape[1]
        in_hp = torch.cat([in_h, torch.zeros(in_h.shape[0], 1, dtype=torch.bool, device=self.device)], 1)
        cmask = umask & torch.gather(in_hp, 1, ult.clamp(max=J))
        n_cand = cmask.sum(dim=1)
        U = int(n_cand.max())
        cand = _compact(cmask, U, fill=0)
        cvalid = torch.arange(U, device=self.device)[None, :] < n_cand[:, None]
        return cand, cvalid, n_cand

    def _chunks(self, n_cand: Tensor, n_h: Tensor, bidx: Tensor) -> list[Tensor]:
        """Size buckets: queries sorted by |U_q| (descending), cut so ``Qc * U^2 <= chunk_elems``
        when the chunk forms ``[Qc, U, U]`` matrices (torch stage 6). The compiled CPU stage keeps
        only ``[U, U]`` per query, so its chunks are cut at ``Qc * U * max(T, 8) <= 2^22`` and
        ordered by bank inside (one bank's tables stay in cache while its queries run)."""
        order = torch.sort(n_cand, descending=True, stable=True).indices.cpu()
        sizes = n_cand.cpu()[order].tolist()
        square = self.greedy != "numba"
        width = max(8, int(n_h.max()) if len(n_h) else 1)
        budget = self.chunk_elems if square else max(self.chunk_elems, 1 << 22)
        chunks, start = [], 0
        while start < len(order):
            u = max(1, sizes[start])
            qc = max(1, budget // (u * (u if square else width)))
            rows = order[start:start + qc]
            if not square:
                rows = rows[torch.sort(bidx.cpu()[rows], stable=True).indices]
            chunks.append(rows.to(self.device))
            start += qc
        return chunks

    # ------------------------------------------------------------------------------------------
    # stage 6: per chunk -- features, gravity, priorities, K, greedy
    # ------------------------------------------------------------------------------------------
    def _select_chunk(self, b: _Batch, rows: Tensor, lap) -> tuple[Tensor, Tensor, Tensor]:
        """Greedy picks for queries ``rows``: ``(sel [Qc, B] candidate slots, n_sel [Qc], cand [Qc, U])``."""
        cfg = self.cfg

        def wq(name: str):  # the config's scalar, or the head's per-query value as [Qc, 1]
            return b.weights[name][rows][:, None] if b.weights and name in b.weights else getattr(cfg, name)

        lambda_m, lambda_r, tau = wq("lambda_m"), wq("lambda_r"), wq("tau")
        w_cov, w_role, w_aff, w_thr = wq("w_cov"), wq("w_role"), wq("w_aff"), wq("w_thr")
        # Triton kernels take scalar weights; per-query weights run the torch ops.
        impl_p = "torch" if any(isinstance(x, Tensor) for x in (lambda_m, lambda_r, tau)) else self.impl
        impl_g = "torch" if any(isinstance(x, Tensor) for x in (w_cov, w_role, w_aff, w_thr)) else self.impl
        n_cand = b.n_cand[rows]
        U = max(1, int(n_cand.max()))
        T = max(1, int(b.n_h[rows].max()))
        cand, cvalid = b.cand[rows, :U], b.cvalid[rows, :U]
        gid = b.uoff[rows][:, None] + cand  # [Qc, U] global unit ids, inside the own bank
        lt = torch.gather(b.tpos[rows], 1, self.unit_lthread[gid])  # [Qc, U] neighbourhood thread
        lt = torch.where(cvalid, lt, -1)
        alpha = torch.where(cvalid, torch.gather(b.alpha[rows], 1, cand), 0.0)
        hthread, rvec = self._neighbourhood_threads(b, rows, T)
        budget = torch.clamp(torch.clamp(n_cand, max=cfg.budget), min=1)
        if self.greedy == "numba":
            Qc = len(rows)
            bank = b.bidx[rows]
            P = torch.stack([torch.as_tensor(w, dtype=self.dtype).reshape(-1).expand(Qc)
                             for w in (lambda_m, lambda_r, tau, w_cov, w_role, w_aff, w_thr)], dim=1)
            args = dict(cand=cand, n_cand=n_cand, lt=lt, alpha=alpha, hthread=hthread, rvec=rvec, n_h=b.n_h[rows],
                        tpos=b.tpos[rows], uoff=b.uoff[rows], toff=b.toff[rows], Mq=b.Mq[rows], delta=b.delta[rows],
                        P=P, budget=budget, limit=torch.clamp(torch.minimum(budget, n_cand), min=0, max=cfg.budget),
                        **self._stage6_tables(bank.numpy()))
            lap("features")
            sel, n_sel = stage6_numba(args, cfg)
            lap("greedy")
            return torch.from_numpy(sel), torch.from_numpy(n_sel), cand
        E = S = None
        if self.btab is not None:
            bridge = self._bridge_from_table(b, rows, cand, cvalid, lt, hthread)
        else:
            E, S = self._candidate_similarity(cand, gid)
            bridge = _bridge_from_similarity(S, lt, cvalid)
        feats = self._features(bridge, alpha, lt, cvalid, rvec, gid)
        lap("features")
        gravity = self._gravity(b, rows, hthread, rvec, T, tau)
        lap("gravity")
        d_in = torch.where(cvalid, self.d_in[gid], 0.0)
        rho, _phi, _w, pi = role_priority(feats, b.Mq[rows], b.delta[rows], lt, cvalid, gravity, d_in, alpha, budget,
                                          lambda_m, lambda_r, tau, cfg.T_R, impl=impl_p)
        pi = pi.to(self.dtype)
        mass = torch.zeros(len(rows), T + 1, dtype=self.dtype, device=self.device)
        mass.scatter_add_(1, torch.where(lt >= 0, lt, T), torch.where(cvalid, pi, 0.0))
        lap("priority")
        K, E_arg, identity = self._kernel(b, rows, cand, S, E, gid, lt, cvalid)
        if self.greedy == "lazy":
            if K is None:  # identity kernel
                K = torch.where(cvalid[:, :, None] & torch.eye(U, dtype=torch.bool, device=self.device)[None], 1.0,
                                torch.zeros((), dtype=self.dtype, device=self.device))
            sel, _gains, n_sel = greedy_lazy_batched(pi, K, rho.to(self.dtype), b.delta[rows], alpha, lt, mass[:, :T],
                                                     cvalid, budget, w_cov, w_role, w_aff, w_thr,
                                                     cfg.stop_coverage, max_steps=cfg.budget)
            lap("greedy")
            return sel, n_sel, cand
        sel, _gains, n_sel = greedy_select(pi, K, rho.to(self.dtype), b.delta[rows], alpha, lt, mass[:, :T], cvalid,
                                           budget, w_cov, w_role, w_aff, w_thr, cfg.stop_coverage,
                                           max_steps=cfg.budget, E=E_arg, identity=identity, impl=impl_g)
        lap("greedy")
        return sel, n_sel, cand

    def _candidate_similarity(self, cand: Tensor, gid: Tensor) -> tuple[Tensor, Tensor]:
        """``(E [Qc, U, d], S [Qc, U, U])``: candidate vectors and their cosines (no tables)."""
        E = self.packed.unit_vecs[gid]
        return E, torch.bmm(E, E.transpose(1, 2))

    def _bridge_from_table(self, b: _Batch, rows: Tensor, cand: Tensor, cvalid: Tensor, lt: Tensor,
                           hthread: Tensor) -> Tensor:
        """bridge ``[Qc, U]`` = clip(max over the *other* neighbourhood threads t of btab[v, t], 0, 1),
        0 when there is none (the max over candidates of other threads, as the reference takes it)."""
        bank = b.bidx[rows]
        J = self.n_threads[bank][:, None, None]
        T = hthread.shape[1]
        idx = self.boff[bank][:, None, None] + cand[:, :, None] * J + hthread.clamp(min=0)[:, None, :]
        B = torch.take(self.btab, idx)  # [Qc, U, T]
        own = torch.arange(T, device=self.device)[None, None, :] == lt[:, :, None]
        keep = (hthread >= 0)[:, None, :] & ~own & cvalid[:, :, None]
        bridge = torch.where(keep, B, NEG_INF).amax(dim=2) if T else torch.full_like(cand, NEG_INF, dtype=self.dtype)
        return torch.clamp(torch.where(torch.isfinite(bridge), bridge, 0.0), 0.0, 1.0)

    def _neighbourhood_threads(self, b: _Batch, rows: Tensor, T: int) -> tuple[Tensor, Tensor]:
        """``hthread [Qc, T]`` bank-local ids of the H_q threads in ascending order (-1 pad) and
        their scores ``rvec [Qc, T]`` (0 pad)."""
        tpos, in_h, r = b.tpos[rows], b.in_h[rows], b.r[rows]
        Qc, J = tpos.shape
        slot = torch.where(in_h, tpos, T)
        hthread = torch.full((Qc, T + 1), -1, dtype=torch.int64, device=self.device)
        hthread.scatter_(1, slot, torch.arange(J, device=self.device).expand(Qc, J).clone())
        rvec = torch.zeros(Qc, T + 1, dtype=self.dtype, device=self.device)
        rvec.scatter_(1, slot, torch.where(in_h, r, 0.0))
        return hthread[:, :T], rvec[:, :T]

    def _features(self, bridge: Tensor, alpha: Tensor, lt: Tensor, cvalid: Tensor, rvec: Tensor,
                  gid: Tensor) -> Tensor:
        """Unit features ``f [Qc, U, 7]``: (1, alpha, r~ of its thread, bridge, head_sim, temporal,
        position); bridge = clip(max cos to a candidate of *another* thread, 0, 1), 0 if none."""
        thr = torch.gather(rvec, 1, lt.clamp(min=0))
        f = torch.stack([torch.ones_like(alpha), alpha, thr, bridge, self.head_sim[gid], self.temporal[gid],
                         self.position[gid]], dim=2)
        return torch.where(cvalid[:, :, None], f, 0.0)

    def _gravity(self, b: _Batch, rows: Tensor, hthread: Tensor, rvec: Tensor, T: int, tau) -> Tensor:
        """``gravity [Qc, T] = sum_j r~_j exp(-Dhead[j, k] / tau)`` over the H_q threads.

        ``Dhead`` is Floyd-Warshall over ``[Qc, T, T]``: edge cost ``c_hop + (1 - w_H)`` between
        neighbourhood threads (scatter-amin from the neighbour lists), 0 on the diagonal, all
        infinite off the diagonal without cross-thread support.
        """
        cfg = self.cfg
        Qc = len(rows)
        hvalid = hthread >= 0
        Dh = torch.full((Qc, T, T + 1), POS_INF, dtype=self.dtype, device=self.device)
        if cfg.cross_thread:
            gh = torch.where(hvalid, b.toff[rows][:, None] + hthread, self.dummy_thread)
            nb, w = self.nbr[gh], self.nbw[gh]  # [Qc, T, D]
            tpos = b.tpos[rows]
            posk = torch.gather(tpos, 1, nb.clamp(min=0).flatten(1)).view_as(nb)
            posk = torch.where((nb >= 0) & (posk >= 0), posk, T)
            Dh.scatter_reduce_(2, posk, cfg.c_hop + (1.0 - w), reduce="amin", include_self=True)
        Dh = Dh[:, :, :T]
        eye = torch.eye(T, dtype=torch.bool, device=self.device)[None] & hvalid[:, :, None]
        Dh = torch.where(eye, torch.zeros((), dtype=self.dtype, device=self.device), Dh)
        if cfg.cross_thread:
            for m in range(T):
                Dh = torch.minimum(Dh, Dh[:, :, m:m + 1] + Dh[:, m:m + 1, :])
        tau = tau[:, :, None] if isinstance(tau, Tensor) else tau  # per-query [Qc, 1, 1]
        contrib = torch.where(hvalid[:, :, None], rvec[:, :, None] * torch.exp(-Dh / tau), 0.0)
        return contrib.sum(dim=1)

    def _kernel(self, b: _Batch, rows: Tensor, cand: Tensor, S: Tensor | None, E: Tensor | None, gid: Tensor,
                lt: Tensor, cvalid: Tensor):
        """Support ``K [Qc, U, U]`` = clip((cos - k_shift) / (1 - k_shift), 0, 1), unit diagonal,
        zero across threads without cross-thread support; or the identity. Returns ``(K, E, identity)``
        for ``greedy_select``: on CUDA with the plain clipped cosine, ``K`` is left to the kernel
        (computed blockwise from ``E``). With tables, ``K`` is a gather from ``ktab``."""
        cfg = self.cfg
        if cfg.kernel == "identity":
            return None, None, True
        U = cand.shape[1]
        pair = cvalid[:, :, None] & cvalid[:, None, :]
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        if self.ktab is not None:
            bank = b.bidx[rows]
            n = self.n_units[bank][:, None, None]
            K = torch.take(self.ktab, self.koff[bank][:, None, None] + cand[:, :, None] * n + cand[:, None, :])
            return torch.where(pair, K, zero), None, False
        if self.device.type == "cuda" and cfg.k_shift == 0.0 and cfg.cross_thread:
            return None, E, False
        K = torch.clamp((S - cfg.k_shift) / (1.0 - cfg.k_shift), 0.0, 1.0)
        if not cfg.cross_thread:
            K = torch.where(lt[:, :, None] == lt[:, None, :], K, 0.0)
        K = torch.where(torch.eye(U, dtype=torch.bool, device=self.device)[None], 1.0, K)
        return torch.where(pair, K, zero), None, False


def _bridge_from_similarity(S: Tensor, lt: Tensor, cvalid: Tensor) -> Tensor:
    """bridge ``[Qc, U]`` from the candidate cosines ``S [Qc, U, U]`` (no tables)."""
    other = (lt[:, :, None] != lt[:, None, :]) & cvalid[:, None, :]
    bridge = torch.where(other, S, NEG_INF).amax(dim=2)
    return torch.clamp(torch.where(torch.isfinite(bridge), bridge, 0.0), 0.0, 1.0)


def greedy_lazy_batched(pi: Tensor, K: Tensor, rho: Tensor, delta: Tensor, alpha: Tensor, thread: Tensor,
                        thread_mass: Tensor, valid: Tensor, budget: Tensor, w_cov: float = 1.0, w_role: float = 1.0,
                        w_aff: float = 1.0, w_thr: float = 1.0, stop_coverage: float = 2.0, max_steps: int = 16,
                        k: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    """Batched lazy greedy: the picks of plain greedy (``greedy_select_torch``) at a fraction of
    its ``Q * U * U`` work per step.

    Same arguments and returns as :func:`~trawmem_gpu.select.batched_ops.greedy_select` (``K``
    materialized, ``[Q, U, U]``); the four weights may also be per-query ``[Q, 1]`` tensors.
    Every step after the first evaluates the exact gain of only the ``k`` units with the
    largest stale upper bounds (``[Q, k, U]`` work); the best of them is
    taken when its gain beats the next bound by a margin of a few ulps, which by submodularity
    (gains only shrink, in floating point too, as they are computed by the same expression)
    proves no other unit could win or tie. Queries where that fails -- exact or near ties
    included -- get a full ``[U, U]`` evaluation for that step, so ties break to the lowest
    index exactly as in plain greedy.
    """
    valid = valid.bool()
    Q, U = pi.shape
    dev, dtype = pi.device, torch.promote_types(pi.dtype, torch.float32)
    R = rho.shape[-1]
    pair = valid[:, :, None] & valid[:, None, :]
    K = torch.where(pair, K.to(dtype), 0.0)
    piv = torch.where(valid, pi.to(dtype), 0.0)
    rho, delta, alpha = rho.to(dtype), delta.to(dtype), alpha.to(dtype)
    T = thread_mass.shape[1]
    in_range = valid & (thread >= 0) & (thread < T)
    tcol = torch.where(in_range, thread + 1, 0)  # column 0 = no thread
    unit_mass = torch.gather(torch.cat([torch.zeros(Q, 1, dtype=dtype, device=dev), thread_mass.to(dtype)], 1), 1,
                             tcol)
    hit = torch.zeros(Q, T + 1, dtype=torch.bool, device=dev)
    limit = torch.minimum(budget.to(dev), valid.sum(1)).clamp(min=0, max=max(int(max_steps), 0))
    sel = torch.full((Q, max_steps), -1, dtype=torch.int64, device=dev)
    gains_out = torch.zeros(Q, max_steps, dtype=dtype, device=dev)
    n_sel = torch.zeros(Q, dtype=torch.int64, device=dev)
    c = torch.zeros(Q, U, dtype=dtype, device=dev)
    m = torch.zeros(Q, R, dtype=dtype, device=dev)
    avail = valid.clone()
    active = torch.ones(Q, dtype=torch.bool, device=dev)
    qidx = torch.arange(Q, device=dev)
    ar = torch.arange(U, device=dev)
    margin = 64 * torch.finfo(dtype).eps
    # objective weights as [Q, 4] (scalars or per-query [Q, 1] tensors)
    W = torch.stack([torch.as_tensor(w, dtype=dtype, device=dev).reshape(-1).expand(Q)
                     for w in (w_cov, w_role, w_aff, w_thr)], dim=1)

    def gains(rows: Tensor | None, cols: Tensor | None) -> Tensor:
        """Exact gains (the expression of ``greedy_select_torch``): of units ``cols [Q, k]`` of
        every query, or (cols None) of every unit of queries ``rows`` (None = all queries)."""
        if cols is not None:
            flat = (qidx[:, None] * U + cols).flatten()  # row copies (index_select) beat a gather
            take = lambda x: x.reshape(Q * U, x.shape[2]).index_select(0, flat).view(Q, cols.shape[1], x.shape[2])
            Kc, rc = take(K), take(rho)
            tc, um, al, av = (torch.gather(x, 1, cols) for x in (tcol, unit_mass, alpha, avail))
            pv, cc, dd, mm, hh, ww = piv, c, delta, m, hit, W
        else:
            sub = (lambda x: x) if rows is None else (lambda x: x[rows])
            Kc, rc, tc, um, al, av = (sub(x) for x in (K, rho, tcol, unit_mass, alpha, avail))
            pv, cc, dd, mm, hh, ww = (sub(x) for x in (piv, c, delta, m, hit, W))
        cov = (pv[:, None, :] * (Kc - cc[:, None, :]).clamp_min(0)).sum(-1)
        role = (dd[:, None, :] * (rc - mm[:, None, :]).clamp_min(0)).sum(-1)
        thr = torch.where(torch.gather(hh, 1, tc), 0.0, um)
        g = ww[:, 0:1] * cov + ww[:, 1:2] * role + ww[:, 2:3] * al + ww[:, 3:4] * thr
        return torch.where(av, g, float("-inf"))

    def argbest(g: Tensor, cols: Tensor) -> tuple[Tensor, Tensor]:
        bv = g.max(dim=1).values
        return bv, torch.where(g == bv[:, None], cols, U).min(dim=1).values  # lowest index on ties

    ub = gains(None, None) if U else torch.zeros(Q, 0, dtype=dtype, device=dev)
    for t in range(max_steps):
        active = active & (t < limit)
        if U == 0 or not bool(active.any()):
            break
        if t == 0:
            bval, best = argbest(ub, ar.expand(Q, U))
        else:
            kk = min(k, U)
            top = torch.topk(ub, min(kk + 1, U), dim=1)
            cols = top.indices[:, :kk]
            bound = top.values[:, kk] if U > kk else torch.full((Q,), float("-inf"), dtype=dtype, device=dev)
            g = gains(None, cols)
            ub.scatter_(1, cols, g)
            bval, best = argbest(g, cols)
            ok = (bound == float("-inf")) | (bval > bound + margin * (1.0 + bound.abs()))
            redo = (active & ~ok).nonzero().flatten()
            if len(redo):
                full = gains(redo, None)
                ub[redo] = full
                bv, bi = argbest(full, ar.expand(len(redo), U))
                bval, best = bval.clone(), best.clone()
                bval[redo], best[redo] = bv, bi
        best = torch.where(active, best, 0).clamp(max=U - 1)
        act2 = active[:, None]
        sel[:, t] = torch.where(active, best, sel[:, t])
        gains_out[:, t] = torch.where(active, bval, 0.0)
        n_sel += active.to(torch.int64)
        avail[qidx, best] &= ~active
        ub[qidx, best] = torch.where(active, float("-inf"), ub[qidx, best])
        rowsel = qidx * U + best
        c = torch.where(act2, torch.maximum(c, K.reshape(Q * U, U).index_select(0, rowsel)), c)
        m = torch.where(act2, torch.maximum(m, rho.reshape(Q * U, R).index_select(0, rowsel)), m)
        tb = tcol[qidx, best]
        hit[qidx, tb] |= active
        hit[:, 0] = False
        active = active & ((piv * c).sum(dim=1) < stop_coverage)
    return sel, gains_out.to(torch.float32), n_sel


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


def _compact(mask: Tensor, width: int, fill: int) -> Tensor:
    """``[Q, width]`` column indices of the True entries of each row of ``mask``, ascending,
    padded with ``fill`` (a cumsum + scatter compaction, no sort)."""
    Q, N = mask.shape
    pos = torch.where(mask, torch.cumsum(mask.to(torch.int64), dim=1) - 1, width)
    out = torch.full((Q, width + 1), fill, dtype=torch.int64, device=mask.device)
    out.scatter_(1, pos, torch.arange(N, device=mask.device).expand(Q, N).contiguous())
    return out[:, :width]


def _topk_mask(x: Tensor, k: int, valid: Tensor) -> Tensor:
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


def _ranks(x: Tensor, mask: Tensor) -> Tensor:
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
    return _ranks_from_keys(key, unique=False, pad_key=pad).to(x.dtype)


def _ranks_from_keys(key: Tensor, unique: bool, pad_key: int | None = None) -> Tensor:
    """Ranks (1-based, ascending key, ties to the lower index) from ``[Q, N]`` int64 keys.

    ``unique``: the keys already hold the column index in their low 32 bits (so no two are
    equal). Entries keyed ``>= pad_key`` (padding, ranked last) may come in any order among
    themselves. On CPU, NumPy sorts the keys with the index packed into their low bits (a plain
    vectorized int64 sort, ~3x torch's stable sort): the low ``b`` bits of a key are replaced by
    the column index, so equal keys order by index; rows where two keys differ only in those
    low bits (values within ~2^-40 relative, or exact ties) are re-sorted stably by torch.
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
    ranks = torch.empty(Q, N, dtype=torch.int64, device=key.device)
    ranks.scatter_(1, order, torch.arange(1, N + 1, device=key.device).expand(Q, N))
    return ranks


def _rrf_fast_ok(cos: Tensor, lex) -> bool:
    """The compiled RRF rows apply: CPU float64 cosines, numba, BM25 scores that are float32 values."""
    if (cos.device.type != "cpu" or cos.dtype != torch.float64 or lex is None or _numba_kernels() is None
            or compiled_front.kernels() is None):
        return False
    N = cos.shape[1]
    if N == 0 or N >= (1 << 31) or lex.shape != tuple(cos.shape):
        return False
    return bool(np.array_equal(lex.astype(np.float32).astype(np.float64), lex))


def _rrf_cpu(cos: np.ndarray, n: np.ndarray, lex: np.ndarray, k: float) -> np.ndarray:
    """``alpha [Q, N]`` of the ``rrf`` affinity (0 on padding) by the compiled front's per-query
    RRF (:func:`~.compiled_front._rrf_row`): the same float64 operations as the torch path of
    ``_affinity``, ranks from a bucket sort (cosines) and a radix sort (BM25 float32 bits)."""
    lex32 = np.ascontiguousarray(lex, dtype=np.float32)
    out = np.zeros(cos.shape)
    compiled_front.kernels()[3](np.ascontiguousarray(cos), np.ascontiguousarray(n, dtype=np.int64), lex32,
                                lex32.view(np.int32), float(k), out)
    return out


def _ranks_positive(x: Tensor) -> Tensor:
    """``[Q, N]`` 1-based descending ranks of the positive entries of each row (ties to the lower
    index), as :func:`_ranks` gives them (positives rank before every other entry); arbitrary
    elsewhere. Scores that are float32 values (BM25 from bm25s) get unique int64 keys (float32
    bits, then the index), so no tie pass is needed."""
    Q, N = x.shape
    pos = x > 0
    xf = torch.where(pos, x, 0.0).to(torch.float32)
    if N >= (1 << 31) or not bool(torch.equal(xf.to(x.dtype), torch.where(pos, x, 0.0))):
        return _ranks(x, pos)  # not float32 scores: the general path
    bits = xf.view(torch.int32).to(torch.int64)  # non-negative floats: bits are monotone
    key = (((1 << 31) - 1 - bits) << 32) | torch.arange(N, device=x.device)
    return _ranks_from_keys(key, unique=True).to(x.dtype)


def in_thread_distances(head_sim: np.ndarray, thread_offsets: np.ndarray, c_head: float, c_step: float) -> np.ndarray:
    """``[N]`` d_in(v) = min_u c_head (1 - cos(h, e_u)) + c_step |u - v| over v's thread
    (the reference's ``BankContext.in_thread_dist``, vectorized over padded ``[J, L, L]``)."""
    lens = np.diff(thread_offsets)
    L = int(lens.max())
    ar = np.arange(L)
    valid = ar[None, :] < lens[:, None]
    idx = np.where(valid, thread_offsets[:-1, None] + ar[None, :], 0)
    a = np.where(valid, c_head * (1.0 - head_sim[idx]), np.inf)  # [J, L(u)]
    steps = c_step * np.abs(ar[:, None] - ar[None, :])  # [L(v), L(u)]
    d = (a[:, None, :] + steps[None]).min(axis=2)  # [J, L(v)]
    return d[valid]


# ----------------------------------------------------------------------------------------------
# Compiled CPU greedy (numba, optional): one query per loop iteration, K read from the tables
# ----------------------------------------------------------------------------------------------
_NUMBA_STATE: dict = {}


def _stage6_loop(cand, n_cand, lt, alpha, hthread, rvec, n_h, tpos, uoff, toff, koff, nb, boff, jb, Mq, delta, P,
                 budget, limit, ktab, btab, head_sim, temporal, position, d_in, nbr, nbw, T_R, c_hop, cross_thread,
                 identity, k_shift, stop_coverage, sel, n_sel):  # pragma: no cover - compiled by numba
    """Stage 6 for a chunk of queries, one query after another: features (bridge from ``btab``),
    head-graph gravity (Floyd-Warshall over the neighbourhood), role softmax, priorities and the
    greedy, with ``K(u, v)`` read from ``ktab`` into a per-query ``[n, n]`` scratch.

    The math is the torch path's (:meth:`SelectionEngine._features`, ``_gravity``,
    :func:`~trawmem_gpu.select.batched_ops.role_priority_torch`, ``greedy_select_torch``);
    only float summation orders differ. ``P [Q, 7]`` = (lambda_m, lambda_r, tau, w_cov, w_role,
    w_aff, w_thr) per query.

    Greedy (lazy, exact): gains are computed at one site (the coverage sum by one compiled
    function, one summation order per query; the other terms in a fixed order), so a computed
    gain never grows as the state grows (monotone rounding) and stale values are true upper
    bounds. The heap starts from upper bounds of the step-0 gains
    that need no ``K`` row: ``K(u, v) <= clip((btab[u, j] - k_shift) / (1 - k_shift))`` for every
    unit ``v`` of thread ``j`` (``btab`` holds the thread max of the same cosines ``ktab`` clips;
    1 in u's own thread), so ``cov(u) <= sum_j mass_j * that``, padded by a relative 1e-6 for
    rounding (all weights are >= 0). Keys order by (bound descending, index ascending); the top
    is taken once its value is fresh for the step, else it is evaluated (its ``K`` row gathered
    from ``ktab`` on first use) and sifted down: the plain greedy's pick, ties to the lowest
    index. On the LoCoMo dev banks (U ~ 140, B = 16) this evaluates ~190 gains per query instead
    of ~310 (every unit at step 0, then re-evaluations) and skips a few K rows.
    """
    Q, U = cand.shape
    T = hthread.shape[1]
    R = Mq.shape[1]
    F = Mq.shape[2]
    D = nbr.shape[1]
    Kc = np.empty(max(U * U, 1))
    rho = np.empty((max(U, 1), R))
    pq = np.empty(max(U, 1))
    um = np.empty(max(U, 1))
    c = np.empty(max(U, 1))
    m = np.empty(max(R, 1))
    hk = np.empty(max(U, 1))
    hi = np.empty(max(U, 1), dtype=np.int64)
    fresh = np.empty(max(U, 1), dtype=np.int64)
    loaded = np.zeros(max(U, 1), dtype=np.bool_)
    kub = np.empty(max(U * T, 1))
    hit = np.zeros(max(T, 1), dtype=np.bool_)
    Dh = np.empty((max(T, 1), max(T, 1)))
    grav = np.empty(max(T, 1))
    mass = np.empty(max(T, 1))
    f = np.empty(F)
    lg = np.empty(R)
    inv_ks = 1.0 / (1.0 - k_shift)  # bounds only: the 1e-6 margin covers the ulp
    for q in range(Q):
        n = n_cand[q]
        lim = limit[q]
        if n <= 0 or lim <= 0:
            continue
        nt = n_h[q]
        lam_m, lam_r, tau = P[q, 0], P[q, 1], P[q, 2]
        cq = cand[q, :n]
        # --- gravity: Floyd-Warshall over the nt neighbourhood threads -------------------------
        for i in range(nt):
            for j in range(nt):
                Dh[i, j] = np.inf
            Dh[i, i] = 0.0
        if cross_thread:
            for i in range(nt):
                g = toff[q] + hthread[q, i]
                for e in range(D):
                    k = nbr[g, e]
                    if k < 0:
                        continue
                    p = tpos[q, k]
                    if p >= 0 and p != i:
                        w = c_hop + (1.0 - nbw[g, e])
                        if w < Dh[i, p]:
                            Dh[i, p] = w
            for mm in range(nt):
                dm = Dh[mm, :nt]
                for i in range(nt):
                    dim = Dh[i, mm]
                    if dim == np.inf:
                        continue
                    di = Dh[i, :nt]
                    for j in range(nt):
                        di[j] = min(di[j], dim + dm[j])
        for k in range(nt):
            grav[k] = 0.0
            mass[k] = 0.0
            hit[k] = False
        for j in range(nt):
            rj = rvec[q, j]
            for k in range(nt):
                if Dh[j, k] != np.inf:
                    grav[k] += rj * np.exp(-Dh[j, k] / tau)
        # --- features, role softmax, priorities -----------------------------------------------
        kappa = 1.0 / max(1, budget[q])
        wsum = 0.0
        for u in range(n):
            gl = uoff[q] + cq[u]
            t = lt[q, u]
            brow = boff[q] + cq[u] * jb[q]
            br = -np.inf
            kr = kub[u * T:(u + 1) * T]  # K(u, v) <= kr[j] for every unit v of neighbourhood thread j
            for j in range(nt):
                if j != t:
                    x = btab[brow + hthread[q, j]]
                    if x > br:
                        br = x
                    if identity or not cross_thread:
                        kr[j] = 0.0
                    else:
                        y = (x - k_shift) * inv_ks  # the table's K expression at the thread max (to an ulp)
                        kr[j] = 0.0 if y < 0.0 else (1.0 if y > 1.0 else y)
                else:
                    kr[j] = 1.0
            br = 0.0 if br == -np.inf else min(max(br, 0.0), 1.0)
            f[0] = 1.0
            f[1] = alpha[q, u]
            f[2] = rvec[q, t]
            f[3] = br
            f[4] = head_sim[gl]
            f[5] = temporal[gl]
            f[6] = position[gl]
            mx = -np.inf
            for r in range(R):
                acc = 0.0
                for k in range(F):
                    acc += Mq[q, r, k] * f[k]
                lg[r] = acc / T_R
                if lg[r] > mx:
                    mx = lg[r]
            den = 0.0
            for r in range(R):
                lg[r] = np.exp(lg[r] - mx)
                den += lg[r]
            phi = 0.0
            for r in range(R):
                rho[u, r] = lg[r] / den
                phi += rho[u, r] * delta[q, r]
            cost = d_in[gl] + lam_m * (1.0 - alpha[q, u]) + lam_r * (1.0 - phi)
            w = min(kappa, grav[t] * np.exp(-cost / tau))
            pq[u] = w
            wsum += w
        for u in range(n):
            pq[u] = pq[u] / wsum if wsum > 0 else 0.0
            mass[lt[q, u]] += pq[u]
        for u in range(n):
            um[u] = mass[lt[q, u]]
        # --- greedy ---------------------------------------------------------------------------
        base = koff[q]
        nbq = nb[q]
        for u in range(n):  # heap keys: upper bounds of the step-0 gains (c = 0, m = 0)
            kr = kub[u * T:(u + 1) * T]
            ubc = 0.0
            if identity:
                ubc = pq[u]
            else:
                for j in range(nt):
                    ubc += mass[j] * kr[j]
            role = 0.0
            for r in range(R):
                role += delta[q, r] * rho[u, r]
            # every term is >= 0 (weights are); the relative margin covers both sides' rounding,
            # float32 tables included (a K entry rounds up by at most ~2 float32 ulps)
            hk[u] = (P[q, 3] * ubc + P[q, 4] * role + P[q, 5] * alpha[q, u] + P[q, 6] * um[u]) * (1.0 + 1e-6)
            hi[u] = u
            c[u] = 0.0
            fresh[u] = -1
            loaded[u] = False
        for i in range(n // 2 - 1, -1, -1):
            _sift_down(hk, hi, n, i)
        for r in range(R):
            m[r] = 0.0
        size = n
        for step in range(lim):
            best = -1
            while size > 0:
                u = hi[0]
                if fresh[u] == step:  # an exact gain of this step on top: the plain greedy's pick
                    best = u
                    size -= 1
                    hk[0] = hk[size]
                    hi[0] = hi[size]
                    _sift_down(hk, hi, size, 0)
                    break
                if not loaded[u]:  # K row of u over the candidates, gathered on first use
                    dst = Kc[u * n:(u + 1) * n]
                    if identity:
                        for v in range(n):
                            dst[v] = 1.0 if u == v else 0.0
                    else:
                        krow = ktab[base + cq[u] * nbq:base + (cq[u] + 1) * nbq]
                        for v in range(n):
                            dst[v] = krow[cq[v]]
                    loaded[u] = True
                # the only gain evaluation site: coverage by the compiled row function, then the
                # role, affinity and thread terms, always in this order
                cv = _cov_row(Kc[u * n:(u + 1) * n], pq, c)
                role = 0.0
                for r in range(R):
                    y = rho[u, r] - m[r]
                    if y > 0.0:
                        role += delta[q, r] * y
                g = (P[q, 3] * cv + P[q, 4] * role + P[q, 5] * alpha[q, u]
                     + P[q, 6] * (um[u] if not hit[lt[q, u]] else 0.0))
                fresh[u] = step
                hk[0] = g
                _sift_down(hk, hi, size, 0)
            if best < 0:
                break
            sel[q, step] = best
            n_sel[q] = step + 1
            kb = Kc[best * n:(best + 1) * n]
            for v in range(n):
                if kb[v] > c[v]:
                    c[v] = kb[v]
            cov = 0.0
            if stop_coverage <= 1.0 + 1e-9:  # above 1 the check never fires (sum pq = 1, c <= 1)
                for v in range(n):
                    cov += pq[v] * c[v]
            for r in range(R):
                if rho[best, r] > m[r]:
                    m[r] = rho[best, r]
            hit[lt[q, best]] = True
            if not cov < stop_coverage:
                break


def _sift_down(hk, hi, size, i):  # pragma: no cover - compiled by numba
    """Restore the heap order (key descending, then index ascending) below node ``i``."""
    while True:
        a = 2 * i + 1
        if a >= size:
            return
        b = a + 1
        if b < size and (hk[b] > hk[a] or (hk[b] == hk[a] and hi[b] < hi[a])):
            a = b
        if hk[a] > hk[i] or (hk[a] == hk[i] and hi[a] < hi[i]):
            hk[i], hk[a] = hk[a], hk[i]
            hi[i], hi[a] = hi[a], hi[i]
            i = a
        else:
            return


def _cov_row(krow, pq, c):  # pragma: no cover - compiled by numba
    """Coverage gain ``sum_v pq[v] max(K(u, v) - c[v], 0)`` of one candidate (``krow``: its
    ``K`` row). Compiled with reassociation so the sum vectorizes; called from one site, so
    each query's gains share one summation order (see :func:`_stage6_loop`)."""
    cov = 0.0
    for v in range(krow.shape[0]):
        cov += pq[v] * max(krow[v] - c[v], 0.0)
    return cov


def _numba_kernels():
    """The compiled greedy loop, or None when numba is not importable (compiled once, cached
    on disk next to this file when the directory is writable).

    Compiled without ``parallel=True`` on purpose: numba's OpenMP threading layer shares the
    OpenMP runtime with torch and leaves torch running more threads than it was given (measured:
    every later torch stage ~10x slower on a 2-core machine). One loop over the chunk's queries;
    it releases the GIL, so the engine runs chunks on Python worker threads instead.
    """
    if "loop" in _NUMBA_STATE:
        return _NUMBA_STATE["loop"]
    _NUMBA_STATE["loop"] = None
    try:
        import numba
    except Exception:  # noqa: BLE001 - any import failure means: no compiled CPU greedy
        return None
    global _cov_row, _sift_down
    # fastmath "reassoc" lets LLVM vectorize the coverage sum; the row function is compiled
    # once and called from one site, so each query still has one fixed summation order.
    _cov_row = numba.njit(cache=True, fastmath={"reassoc", "nsz", "contract"})(_cov_row)
    _sift_down = numba.njit(cache=True)(_sift_down)
    _NUMBA_STATE["loop"] = numba.njit(cache=True, nogil=True)(_stage6_loop)  # nogil: worker threads
    return _NUMBA_STATE["loop"]


def _numba_dots():
    """The compiled own-bank dot-product loop (:func:`~.compiled_front._own_dots_flat`), or None
    without numba."""
    k = compiled_front.kernels() if _numba_kernels() is not None else None
    return None if k is None else k[2]


def stage6_numba(args: dict, cfg: SelectConfig) -> tuple[np.ndarray, np.ndarray]:
    """Run :func:`_stage6_loop` on ``args`` (NumPy arrays or CPU tensors, named as its
    parameters; the tables from :meth:`SelectionEngine._stage6_tables`) with the scalars of
    ``cfg``: ``(sel [Q, cfg.budget] candidate slots (-1 pad), n_sel [Q])``."""
    loop = _numba_kernels()
    if loop is None:
        raise RuntimeError("the compiled CPU stage needs numba")
    Q = args["cand"].shape[0]
    sel = np.full((Q, cfg.budget), -1, dtype=np.int64)
    n_sel = np.zeros(Q, dtype=np.int64)
    a = {k: np.ascontiguousarray(v.detach().numpy() if isinstance(v, Tensor) else v) for k, v in args.items()}
    loop(a["cand"], a["n_cand"], a["lt"], a["alpha"], a["hthread"], a["rvec"], a["n_h"], a["tpos"], a["uoff"],
         a["toff"], a["koff"], a["nb"], a["boff"], a["jb"], a["Mq"], a["delta"], a["P"], a["budget"], a["limit"],
         a["ktab"], a["btab"], a["head_sim"], a["temporal"], a["position"], a["d_in"], a["nbr"], a["nbw"],
         float(cfg.T_R), float(cfg.c_hop), bool(cfg.cross_thread), cfg.kernel == "identity", float(cfg.k_shift),
         float(cfg.stop_coverage), sel, n_sel)
    return sel, n_sel
