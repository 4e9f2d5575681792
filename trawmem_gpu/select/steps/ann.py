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
    ``IndexIVFFlat`` over an ``IndexFlatIP`` coarse quantizer with ``nlist`` = the power of two
    nearest ``4 sqrt(n)`` (:func:`ivf_lists`), trained on at most ``TRAIN_PER_LIST * nlist``
    vectors drawn with a fixed seed (k-means), ``nprobe`` per call (``SearchParametersIVF``). On a
    CUDA host with faiss GPUs the trained index is copied to the GPU (``index_cpu_to_gpu``); the
    CPU index stays the reference twin.

Search parameters travel with each call (faiss style), never set on the shared index, so one
index serves concurrent queries with any settings. Inner product over unit vectors (cosine).
"""
from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass

import numpy as np

IVF_MIN_VECTORS = 1 << 16
"""Indexes over at least this many vectors are IVF (trained k-means lists), smaller ones HNSW."""
TRAIN_PER_LIST = 64
"""Training vectors per IVF list (faiss warns below 39)."""
HNSW_LINKS = 32
HNSW_EF_CONSTRUCTION = 80


@dataclass(frozen=True)
class AnnParams:
    """The search settings of one call (``EngineConfig.ann_nprobe`` / ``ann_ef_search``)."""

    nprobe: int
    """IVF lists probed."""
    ef_search: int
    """HNSW candidate list (raised to ``k`` when smaller)."""


def ivf_lists(n: int) -> int:
    """IVF lists for ``n`` vectors: the power of two nearest ``4 sqrt(n)``, at most ``n / 39``."""
    nl = 1 << max(0, int(round(np.log2(max(4.0 * np.sqrt(max(n, 1)), 1.0)))))
    return int(max(1, min(nl, n // 39)))


class VectorIndex:
    """An approximate inner-product index over ``vecs [n, d]`` (see the module docstring).

    :param kind: ``auto`` (by size), ``hnsw`` or ``ivf``
    :param use_gpu: copy an IVF index to a GPU when faiss has one (HNSW stays on the CPU)
    """

    def __init__(self, vecs: np.ndarray, kind: str = "auto", use_gpu: bool = False, seed: int = 0):
        import faiss

        x = np.ascontiguousarray(vecs, dtype=np.float32)
        n, d = x.shape
        self.gpu = False
        self.n, self.d = n, d
        self.kind = kind if kind != "auto" else ("ivf" if n >= IVF_MIN_VECTORS else "hnsw")
        if self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(d, HNSW_LINKS, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            index.add(x)
            self.nlist = 0
        elif self.kind == "ivf":
            self.nlist = ivf_lists(n)
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, self.nlist, faiss.METRIC_INNER_PRODUCT)
            rng = np.random.default_rng(seed)
            m = min(n, TRAIN_PER_LIST * self.nlist)
            index.train(x if m == n else x[np.sort(rng.choice(n, size=m, replace=False))])
            index.add(x)
            self._quantizer = quantizer  # the IVF index does not own it from Python
            if use_gpu:
                index = _to_gpu(faiss, index)
                self.gpu = not isinstance(index, faiss.IndexIVFFlat)
        else:
            raise ValueError(f"kind must be 'auto', 'hnsw' or 'ivf', got {kind!r}")
        self.index = index
        self.lock = threading.Lock()  # GPU indexes are not safe to search from several threads

    def nbytes(self) -> int:
        """Bytes the index holds (its float32 copy of the vectors, the HNSW links)."""
        links = 2 * HNSW_LINKS * 4 * self.n if self.kind == "hnsw" else 8 * self.n + 4 * self.nlist * self.d
        return 4 * self.n * self.d + links

    def search(self, Z: np.ndarray, k: int, params: AnnParams, keep: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(scores [Q, k] float32, ids [Q, k] int64)`` of the ``k`` best proposals per query
        (``-1`` ids where fewer were found), with ``params`` for this call only. ``keep``: ``[n]``
        bool, only those vectors may be proposed (a filter's unit mask): faiss's
        ``IDSelectorBitmap`` in the call's search parameters; a GPU index (no selectors) searches
        unfiltered and drops the others, so it may propose fewer."""
        import faiss

        k = int(min(k, self.n))
        z = np.ascontiguousarray(Z, dtype=np.float32)
        if self.kind == "hnsw":
            sp = faiss.SearchParametersHNSW(efSearch=int(max(params.ef_search, k)))
        else:
            sp = faiss.SearchParametersIVF(nprobe=int(min(params.nprobe, self.nlist)))
        if keep is not None:
            keep = np.asarray(keep, dtype=bool)
            bits = np.packbits(keep, bitorder="little")  # alive through the search below
            if not self.gpu:
                sp.sel = faiss.IDSelectorBitmap(self.n, faiss.swig_ptr(bits))
        with self.lock:
            if self.gpu:  # a GPU IVF index takes its nprobe as a setting (set and searched under the lock)
                self.index.nprobe = sp.nprobe
                D, I = self.index.search(z, k)
            else:
                D, I = self.index.search(z, k, params=sp)
        if keep is not None and self.gpu:
            I = np.where((I >= 0) & keep[np.maximum(I, 0)], I, -1)
        return D, I


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
