"""Approximate nearest-neighbour search (faiss) for a large bank: its units' shortlist (step 3's
candidate search, ``engine/shortlist.py``) and its heads (step 1's head seeds, ``seeds.HeadIndex``).

Below ``EngineConfig.ann_min_units`` units a bank is searched exactly (a GEMM over all its rows);
at or above it, an index over the bank's vectors answers instead, and every vector it proposes is
re-scored exactly (float64 dot products) by the caller. The index is chosen and trained by size:

``hnsw``
    ``IndexHNSWFlat`` (32 links per node, ``efConstruction`` 80) for fewer than
    :data:`IVF_MIN_VECTORS` vectors: no training, and ``efSearch`` per call (``SearchParametersHNSW``,
    at least ``k``).
``ivf``
    ``IndexIVFScalarQuantizer`` with float16 codes (:data:`IVF_FLOAT32_CODES`; a float32
    collection's too) over an ``IndexFlatIP`` coarse quantizer with ``nlist`` = the power of two
    nearest ``4 sqrt(n)`` (:func:`ivf_lists`), trained on at most ``TRAIN_PER_LIST * nlist``
    vectors drawn with a fixed seed (k-means), each list's codes written at once
    (:func:`file_lists`), ``nprobe`` per call (``SearchParametersIVF``). On a
    CUDA host with faiss GPUs the trained index is copied to the GPU (``index_cpu_to_gpu``); the
    CPU index stays the reference twin.

With a compact collection (``vectors``: ``float16``, ``int8`` or ``pq``, ``store/vectors.py``) the
index holds faiss codes instead of a float32 copy: scalar-quantizer codes (``IndexHNSWSQ`` /
``IndexIVFScalarQuantizer``) or, for ``pq`` on an IVF index of at least
``store.vectors.PQ_MIN_VECTORS`` vectors, product-quantizer codes (``IndexIVFPQ``, ``d / 8`` bytes
a vector: :attr:`VectorIndex.codes` says which it holds), searched on the codes; the proposals are
re-ranked in float32 (:meth:`VectorIndex.search`) and the caller re-scores every proposal exactly
from the engine's table, so the codes only change which units are proposed.

Growth without a rebuild: :meth:`VectorIndex.grown` is the index of an appended bank (the faiss
index gains the new units' vectors; the ids the append replaced are masked out), and
:meth:`VectorIndex.remove` masks ids: faiss's HNSW cannot delete a node, so a removed-mask is read
during every search (an ``IDSelectorBitmap`` of the live vectors in the call's search parameters)
and a masked vector is never proposed. The index is held in memory only (nothing of it is written
to disk).

Search parameters travel with each call (faiss style), never set on the shared index, so one
index serves concurrent queries with any settings. Inner product over unit vectors (cosine).
"""
from __future__ import annotations

import copy
import importlib.util
import threading
from dataclasses import dataclass

import numpy as np

from ..heap import trim_heap
from ...store.vectors import BYTES_PER_DIM, PQ_MIN_VECTORS, check_vectors, pq_subvectors, sq_type

IVF_MIN_VECTORS = 1 << 16
"""Indexes over at least this many vectors are IVF (trained k-means lists), smaller ones HNSW."""
TRAIN_PER_LIST = 64
"""Training vectors per IVF list (faiss warns below 39)."""
RERANK_FETCH = 2
"""A compact index proposes this many times ``k`` vectors by its codes, re-ranked exactly (float32)
to the ``k`` best: a near-tie the quantized distance moved past ``k`` comes back."""
PQ_RERANK_FETCH = 4
"""The same for product-quantizer codes (``pq``), whose distances are coarser: on a 10^5-unit bank
(d = 384, 100 topics, 40 queries, ``nprobe`` 64) the 1,024 best after the re-rank kept 0.9886 of
exact search's 1,024 best at 2x and 0.9891 at 4x and 8x, as much as ``int8`` codes at 2x (0.9891,
the lists probed being the limit; ``benchmarks/results/pq_recall_1e5.json``); on noisier vectors
4x is not enough (``tests/select/test_compact_vectors.py``: 0.924 at d = 32)."""
IVF_FLOAT32_CODES = "float16"
"""The codes an IVF index over a ``float32`` collection holds: ``float16`` (faiss's
``ScalarQuantizer.QT_fp16``, not re-ranked) or ``float32`` (``IndexIVFFlat``, a float32 copy).
An IVF search reads every vector of the lists it probes (12 MB a query at 10^6 units of d = 384,
``nprobe`` 32): bound by memory bandwidth, so half the bytes is most of half the time (one
thread, 40 queries of the 10^6 bank: 1.35 -> 1.05 ms a search, ``benchmarks/results/ivf_codes_1e6.json``),
and half the index's memory. Every caller re-scores the proposals exactly from the float32
vectors (the shortlist's float64 cosines), so the codes only decide which units are proposed, and
fp16's rounding (a relative 2^-11) moves less than the lists an IVF search leaves unprobed: there
the 1,024 proposals were the flat index's 1,024 on every query."""
IVF_QUANTIZER16 = True
"""An IVF index of float16 codes on the CPU reads its centroids as float16 too (the coarse
quantizer an ``IndexScalarQuantizer`` of ``QT_fp16`` over the k-means centroids, trained in float32
as before): every search scans all ``nlist`` centroids (6.3 MB at 10^6 units of d = 384). 40
queries x 3 rounds at 10^6: 1.034 -> 0.925 ms a search, the same 1,024 proposals on every query
(``ivf_codes_q16_1e6.json``). A GPU copy keeps the float32 centroids (faiss's GPU IVF indexes
take a flat quantizer)."""
HNSW_LINKS = 32
HNSW_EF_CONSTRUCTION = 80
FILED_LISTS = True
"""An IVF index is built with each list's codes written at once, in one allocation of its size
(:func:`file_lists`); False: faiss's ``add``, which appends vector by vector, so each list's
buffer grows by doubling and lands wherever the allocator has room. The lists hold the same ids
and codes in the same order either way; at 10^6 units of d = 384 the filed lists answer a query
0.12 ms sooner (``benchmarks/results/large_bank_sweep.json``, ``ab_stop61.filed_lists``)."""
FILE_CHUNK = 1 << 16
"""Vectors encoded per step of :func:`file_lists` (its transient codes: this many codes)."""


@dataclass(frozen=True)
class AnnParams:
    """The search settings of one call (``EngineConfig.ann_nprobe`` / ``ann_ef_search``)."""

    nprobe: int
    """IVF lists probed."""
    ef_search: int
    """HNSW candidate list (raised to ``k`` when smaller)."""


LISTS_PER_ROOT = 4.0
"""IVF lists per square root of the vectors indexed (:func:`ivf_lists`)."""


def ivf_lists(n: int) -> int:
    """IVF lists for ``n`` vectors: the power of two nearest ``LISTS_PER_ROOT sqrt(n)``, at most ``n / 39``."""
    nl = 1 << max(0, int(round(np.log2(max(LISTS_PER_ROOT * np.sqrt(max(n, 1)), 1.0)))))
    return int(max(1, min(nl, n // 39)))


class _LabelTail:
    """A growable buffer of labels shared by a line of grown indexes: each object reads a prefix
    (``labels = buf[:m]``) and only an object whose prefix ends at ``used`` may write past it, so an
    append costs its own vectors (amortized), and an older object's prefix never changes."""

    __slots__ = ("buf", "used")

    def __init__(self, buf: np.ndarray, used: int):
        self.buf, self.used = buf, used


class VectorIndex:
    """An approximate inner-product index over ``vecs [n, d]`` (see the module docstring).

    :param kind: ``auto`` (by size), ``hnsw`` or ``ivf``
    :param use_gpu: copy an IVF index to a GPU when faiss has one (HNSW stays on the CPU)
    :param vectors: the codes it holds (``store.vectors``): ``float32`` (a flat copy), ``float16``
        or ``int8`` (scalar-quantizer codes, trained on ``vecs``), ``pq`` (product-quantizer codes
        where the index is IVF over at least ``PQ_MIN_VECTORS`` vectors, else ``int8``: :attr:`codes`)
    :param rerank: compact codes only: the float vectors ``[n, d]`` (not copied: a bank's
        memory-mapped float32 vectors) that re-rank :data:`RERANK_FETCH` times ``k`` proposals of
        the codes exactly before the ``k`` best are returned (None: ``vecs`` as given)
    """

    def __init__(self, vecs: np.ndarray, kind: str = "auto", use_gpu: bool = False, seed: int = 0,
                 vectors: str = "float32", rerank: np.ndarray | None = None):
        import faiss

        x = np.ascontiguousarray(vecs, dtype=np.float32)
        n, d = x.shape
        self.gpu = False
        self.n, self.d = n, d
        self.vectors = check_vectors(vectors)
        self.rerank = None if self.vectors == "float32" else (vecs if rerank is None else rerank)
        """The float vectors a compact index re-ranks its proposals with (None: float32 codes)."""
        self._live: tuple | None = None  # (live mask, its packed bits) of the labels, made on first search
        self.labels: np.ndarray | None = None
        """``[m]`` int64: the id (a bank-local unit) of each of the first ``m`` vectors of the faiss
        index this object reads, ``-1`` for one removed or not its own (None: vector ``i`` is id
        ``i``, all ``n`` of them)."""
        self._tail: _LabelTail | None = None  # the buffer :attr:`labels` is a prefix of, shared by the grown line
        self.kind = kind if kind != "auto" else ("ivf" if n >= IVF_MIN_VECTORS else "hnsw")
        pq = self.vectors == "pq" and self.kind == "ivf" and n >= PQ_MIN_VECTORS
        self.codes = _codes(self.vectors, self.kind, pq)
        """The codes the faiss index holds (:func:`_codes`)."""
        self.code_size = pq_subvectors(d) if pq else BYTES_PER_DIM[self.codes] * d
        """Bytes of one vector's code."""
        flat = self.codes == "float32"
        self.quantizer16 = False
        """An IVF index whose coarse quantizer holds float16 centroids (:data:`IVF_QUANTIZER16`)."""
        if self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(d, HNSW_LINKS, faiss.METRIC_INNER_PRODUCT) if flat else \
                faiss.IndexHNSWSQ(d, sq_type(faiss, self.codes), HNSW_LINKS, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            if not flat:
                index.train(x)  # the scalar quantizer's ranges (int8: each dimension's min / max)
            index.add(x)
            self.nlist = 0
        elif self.kind == "ivf":
            self.nlist = ivf_lists(n)
            quantizer = faiss.IndexFlatIP(d)
            if pq:  # 8 bits (256 centroids) per sub-vector, residuals to the list's centroid encoded
                index = faiss.IndexIVFPQ(quantizer, d, self.nlist, self.code_size, 8, faiss.METRIC_INNER_PRODUCT)
            elif flat:
                index = faiss.IndexIVFFlat(quantizer, d, self.nlist, faiss.METRIC_INNER_PRODUCT)
            else:
                index = faiss.IndexIVFScalarQuantizer(quantizer, d, self.nlist, sq_type(faiss, self.codes),
                                                      faiss.METRIC_INNER_PRODUCT)
            rng = np.random.default_rng(seed)
            m = min(n, TRAIN_PER_LIST * self.nlist)
            index.train(x if m == n else x[np.sort(rng.choice(n, size=m, replace=False))])
            self.quantizer16 = self.codes == "float16" and IVF_QUANTIZER16 and not use_gpu
            if self.quantizer16:  # the trained centroids searched as float16 (:data:`IVF_QUANTIZER16`)
                centroids = quantizer.reconstruct_n(0, quantizer.ntotal)
                quantizer = faiss.IndexScalarQuantizer(d, sq_type(faiss, "float16"), faiss.METRIC_INNER_PRODUCT)
                quantizer.train(centroids)
                quantizer.add(centroids)
                index.quantizer = quantizer
            if FILED_LISTS:
                file_lists(index, x)
            else:
                index.add(x)
            self._quantizer = quantizer  # the IVF index does not own it from Python
            if use_gpu:
                cpu_type = type(index)
                index = _to_gpu(faiss, index)
                self.gpu = not isinstance(index, cpu_type)
        else:
            raise ValueError(f"kind must be 'auto', 'hnsw' or 'ivf', got {kind!r}")
        self.index = index
        self.lock = threading.Lock()  # GPU indexes are not safe to search from several threads
        trim_heap(n)  # training's copies and k-means buffers back to the system

    def nbytes(self) -> int:
        """Bytes the index holds (its codes of the vectors: a float32 copy or compact codes; the
        HNSW links, or the IVF ids and centroids; the labels of a grown index)."""
        m = self.n if self.labels is None else len(self.labels)
        centroids = (2 if self.quantizer16 else 4) * self.nlist * self.d
        links = 2 * HNSW_LINKS * 4 * m if self.kind == "hnsw" else 8 * m + centroids
        return self.code_size * m + links + (0 if self.labels is None else self.labels.nbytes)

    def grown(self, vecs: np.ndarray, start: int, rerank: np.ndarray | None = None) -> "VectorIndex":
        """This index for a bank that keeps ids ``[0, start)`` as they are and whose ids from
        ``start`` on are ``vecs [m, d]`` (an append: the bank's units from ``start``), without a
        rebuild: the faiss index gains ``vecs`` (HNSW links them into its graph, IVF files them in
        their nearest lists; compact codes with the ranges trained at build time), the vectors of the
        old ids past ``start`` are masked out. A new object over the same faiss index: this one
        still answers for the old bank (it never proposes the added vectors), so a query of an
        older snapshot reads its own ids. Under the index's lock: a concurrent search waits.
        ``rerank``: a compact index's float vectors of the whole new bank (``[start + m, d]``)."""
        x = np.ascontiguousarray(vecs, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"vecs must be [m, {self.d}], got {list(x.shape)}")
        if not 0 <= start <= self.n:
            raise ValueError(f"start must lie in [0, {self.n}] (got {start})")
        with self.lock:
            before = int(self.index.ntotal)
            total = before + len(x)
            tail = self._tail
            if (start == self.n and tail is not None and self.labels is not None and len(self.labels) == before
                    and tail.used == before):  # a plain append at the end of the line: write past it
                if len(tail.buf) < total:  # doubling: each label is copied O(1) times over the appends
                    buf = np.empty(max(total, 2 * len(tail.buf)), dtype=np.int64)
                    buf[:before] = tail.buf[:before]
                    tail = _LabelTail(buf, before)
            else:  # ids replaced (start < n), another object's vectors in between, or a first append
                buf = np.empty(max(total, 2 * before), dtype=np.int64)
                own = np.arange(self.n) if self.labels is None else self.labels
                buf[:len(own)] = np.where(own < start, own, -1)  # vectors of other objects stay -1
                buf[len(own):before] = -1
                tail = _LabelTail(buf, before)
            tail.buf[before:total] = np.arange(start, start + len(x))
            tail.used = total  # this object's prefix [:before] is never written again
            self.index.add(x)
        out = copy.copy(self)
        out.labels, out.n, out._live, out._tail = tail.buf[:total], start + len(x), None, tail
        if self.rerank is not None:
            if rerank is None or len(rerank) != out.n:
                raise ValueError(f"a compact index grows with the new bank's {out.n} float vectors (rerank=)")
            out.rerank = rerank
        return out

    def remove(self, ids) -> None:
        """Mark ``ids`` removed from this object: never proposed again (a removed-mask read during
        every search: faiss's HNSW cannot delete nodes; the same mask serves IVF)."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n):
            raise ValueError(f"ids must lie in [0, {self.n}) (got {int(ids.min())}..{int(ids.max())})")
        with self.lock:
            labels = np.arange(self.n) if self.labels is None else self.labels.copy()
            labels[np.isin(labels, ids)] = -1
            self.labels, self._live, self._tail = labels, None, None  # its own copy: the next append copies it

    def search(self, Z: np.ndarray, k: int, params: AnnParams, keep: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """See :meth:`_search`; a compact index proposes :data:`RERANK_FETCH` (product-quantizer
        codes: :data:`PQ_RERANK_FETCH`) times ``k`` by its codes and returns the ``k`` of largest
        exact inner product with :attr:`rerank` (float32 scores; ties to the lower id)."""
        if self.rerank is None:
            return self._search(Z, k, params, keep)
        k = int(min(k, self.n))
        D, I = self._search(Z, (PQ_RERANK_FETCH if self.codes == "pq" else RERANK_FETCH) * k, params, keep)
        z = np.asarray(Z, dtype=np.float32)
        ok = I >= 0
        rows = np.asarray(self.rerank[np.where(ok, I, 0).ravel()], dtype=np.float32).reshape(*I.shape, self.d)
        exact = np.where(ok, np.einsum("qkd,qd->qk", rows, z), -np.inf).astype(np.float32)
        order = np.lexsort((np.where(ok, I, np.iinfo(np.int64).max), -exact), axis=1)[:, :k]
        I, D = np.take_along_axis(I, order, 1), np.take_along_axis(exact, order, 1)
        return np.where(np.isfinite(D), D, -np.inf).astype(np.float32), np.where(np.isfinite(D), I, -1)

    def _search(self, Z: np.ndarray, k: int, params: AnnParams, keep: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """``(scores [Q, k] float32, ids [Q, k] int64)`` of the ``k`` best proposals per query
        (``-1`` ids where fewer were found), with ``params`` for this call only. ``keep``: ``[n]``
        bool, only those vectors may be proposed (a filter's unit mask): faiss's
        ``IDSelectorBitmap`` in the call's search parameters; a GPU index (no selectors) searches
        unfiltered and drops the others, so it may propose fewer. A grown or removed-from index
        (:attr:`labels`) passes its own live vectors the same way and maps them to their ids."""
        import faiss

        k = int(min(k, self.n))
        z = np.ascontiguousarray(Z, dtype=np.float32)
        if self.kind == "hnsw":
            sp = faiss.SearchParametersHNSW(efSearch=int(max(params.ef_search, k)))
        else:
            sp = faiss.SearchParametersIVF(nprobe=int(min(params.nprobe, self.nlist)))
        if keep is not None:
            keep = np.asarray(keep, dtype=bool)
        with self.lock:  # labels and the faiss index's size as of this search (grown / remove take the lock)
            if self.labels is None and self.index.ntotal > self.n:  # grown since: only its own n vectors
                self.labels = np.arange(self.n)
            labels = self.labels
            bits = None
            if labels is not None and keep is None:  # its live vectors, packed once per object
                if self._live is None:
                    live = labels >= 0
                    self._live = (live, np.packbits(live, bitorder="little"))
                keep, bits = self._live
            elif labels is not None:  # the vectors this object may propose: its live ids, kept
                keep = (labels >= 0) & keep[np.maximum(labels, 0)]
            if keep is not None:
                bits = np.packbits(keep, bitorder="little") if bits is None else bits  # alive through the search
                if not self.gpu:  # the bitmap's size in bytes: vectors past it are never members
                    sp.sel = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))
            if self.gpu:  # a GPU IVF index takes its nprobe as a setting (set and searched under the lock)
                self.index.nprobe = sp.nprobe
                D, I = self.index.search(z, k)
            else:
                D, I = self.index.search(z, k, params=sp)
        if keep is not None and self.gpu:
            inside = (I >= 0) & (I < len(keep))
            I = np.where(inside & keep[np.clip(I, 0, len(keep) - 1)], I, -1)
        if labels is not None:
            I = np.where(I >= 0, labels[np.clip(I, 0, len(labels) - 1)], -1)
        return D, I


def file_lists(index, x: np.ndarray) -> None:
    """Add ``x [n, d]`` (float32, C-contiguous) to the empty trained IVF ``index`` as faiss's ``add``
    would (each vector to its nearest list by ``index.quantizer``, ids ``0..n-1``, encoded by the
    index's own ``encode_vectors``, a list's vectors in id order), but writing each list's entries
    in one call (``add_entries``: one allocation of the list's size), lists in order, encoding at
    most :data:`FILE_CHUNK` vectors at a time."""
    import faiss

    n = len(x)
    if index.ntotal != 0:
        raise ValueError("file_lists fills an empty index")
    if n == 0:
        return
    assign = index.quantizer.search(x, 1)[1][:, 0]  # int64 labels
    if (assign < 0).any():
        raise ValueError("the coarse quantizer left vectors without a list")
    order = np.argsort(assign, kind="stable")  # by list, ids ascending within one
    ends = np.cumsum(np.bincount(assign, minlength=index.nlist))
    inv, cs = index.invlists, index.code_size
    lo = 0
    while lo < index.nlist:
        start = int(ends[lo - 1]) if lo else 0
        hi = int(np.searchsorted(ends, start + FILE_CHUNK, side="right"))
        hi = max(hi, lo + 1)  # at least one list, however long
        stop = int(ends[hi - 1])
        ids = np.ascontiguousarray(order[start:stop])
        lists = np.ascontiguousarray(assign[ids])
        codes = np.empty((len(ids), cs), np.uint8)
        if len(ids):
            xs = np.ascontiguousarray(x[ids])
            index.encode_vectors(len(ids), faiss.swig_ptr(xs), faiss.swig_ptr(lists), faiss.swig_ptr(codes))
        at = start
        for lst in range(lo, hi):
            m = int(ends[lst]) - at
            if m:
                k = at - start
                inv.add_entries(lst, m, faiss.swig_ptr(ids[k:k + m]), faiss.swig_ptr(codes[k:k + m]))
            at += m
        lo = hi
    index.ntotal = n


def _codes(vectors: str, kind: str, pq: bool) -> str:
    """The codes an index of ``kind`` over a collection's ``vectors`` holds: ``pq`` where product
    quantized, ``int8`` where ``pq`` falls back to scalar codes, :data:`IVF_FLOAT32_CODES` for an IVF
    index over ``float32`` vectors, else ``vectors``."""
    if pq:
        return "pq"
    if vectors == "pq":
        return "int8"
    return IVF_FLOAT32_CODES if vectors == "float32" and kind == "ivf" else vectors


def _to_gpu(faiss, index):
    """``index`` on GPU 0 when faiss has GPUs and torch has CUDA, else ``index``."""
    if faiss_gpus() <= 0:
        return index
    res = faiss.StandardGpuResources()
    gpu = faiss.index_cpu_to_gpu(res, 0, index)
    gpu._trawmem_res = res  # keep the resources alive with the index
    return gpu


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
    import torch

    if not faiss_available() or not torch.cuda.is_available():
        return 0
    try:
        return int(_faiss().get_num_gpus())
    except Exception:  # noqa: BLE001 - a faiss without GPU support
        return 0
