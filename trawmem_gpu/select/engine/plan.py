"""The engine's execution plan, the one dispatcher: every choice of how a call runs (backend, the
steps 1-3 front, propagation, the RRF rows, the priority and greedy ops, the maximizer) is made
here, once, at construction, against the device, the installed libraries, the method's config
(its terms included) and the banks. The backends read the plan and never choose for themselves;
an explicit :class:`~trawmem_gpu.select.config.EngineConfig` choice that cannot run is a
``ConfigError``, never a silent switch. The native paths (NumPy reference, torch ops) are the
specification every other path is tested against."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np
import torch

from ...errors import ConfigError
from .._jit import HAS_NUMBA
from ..config import EngineConfig, SelectConfig
from ..terms import COVERAGE_TERMS, fused_terms
from ..steps.candidates import uses_bm25
from ..steps.priority import HAS_TRITON
from ..steps.seeds import faiss_available
from .bank_tables import Layout, table_bytes_needed


@dataclass(frozen=True)
class Plan:
    device: torch.device
    dtype: torch.dtype
    backend: str
    """``compiled`` (numba loops per query, CPU) or ``tensor`` (torch ops over padded batches)."""
    front: str
    """Steps 1-3: ``compiled`` (for a batch whose banks all keep bm25s' plain score matrices, the
    compiled loop's input; the tensor front otherwise) or ``tensor``."""
    kernels: str
    """Tensor backend ops: ``triton`` or ``torch``."""
    optimizer: str
    """Tensor backend maximizer: ``lazy`` or ``plain``."""
    sim: str
    threads: int
    chunk_elems: int
    tables: bool
    """The per-bank K and bridge tables are built (for banks of at most ``table_units`` units)."""
    seed_search: str
    lexical: bool
    """The affinity reads BM25."""

    heads: bool
    """The seeds read the head vectors."""
    relevance: bool
    """The ``learned`` affinity's per-unit indices are stored."""
    propagation: str = "torch"
    """Step 2 on the tensor front: ``compiled`` (numba, one query at a time: the compiled backend's)
    or ``torch``."""
    rrf_rows: str = "torch"
    """The ``rrf`` affinity on the tensor front: ``compiled`` (numba rows; used for a batch whose
    BM25 scores are float32 values, as bm25s' plain score matrices give, the torch ops otherwise) or
    ``torch``."""
    greedy_tokens: str = "torch"
    """The greedy op of queries with a token budget: always the torch ops (``torch``) on the tensor
    backend: the Triton kernel has no knapsack; the compiled greedy has it (``compiled``)."""
    table_units: int | None = None
    """``EngineConfig.table_max_units``: a larger bank gets no K and bridge tables."""
    ann_min_units: int | None = None
    """Banks of at least this many units are searched approximately (``EngineConfig.ann_min_units``;
    None: never). The fields below are ``EngineConfig``'s ``ann_*`` (``resolve`` copies them)."""
    ann_shortlist: int = 0
    ann_nprobe: int = 0
    ann_ef_search: int = 0
    ann_kind: str = "auto"
    ann_vectors: str = "float32"
    """``EngineConfig.vectors``: the codes of the approximate unit index."""

    def layout(self, dim: int, banks=()) -> Layout:
        """The tables' layout for vectors of width ``dim``; ``banks``: the engine's first banks, whose
        unit vectors all float32 on a float64 CPU engine store ``unit_vecs`` as float32 (exact). On
        a float64 CPU engine with the compiled front, a bank on the approximate path
        (``ann_min_units``) with float32 vectors keeps them in the bank (``Layout.mapped_units``)."""
        cpu64 = self.device.type == "cpu" and self.dtype == torch.float64
        f32 = cpu64 and bool(banks) and all(b.unit_vecs.dtype == np.float32 for b in banks)
        w32 = cpu64 and bool(banks) and all(b.edge_w.dtype == np.float32 for b in banks)  # Layout.w_dtype
        mapped = self.ann_min_units if cpu64 and self.front == "compiled" else None
        return Layout(self.device, self.dtype, dim, self.tables, self.lexical, self.heads, self.relevance,
                      table_units=self.table_units, vec_dtype=torch.float32 if f32 else None, mapped_units=mapped,
                      w_dtype=torch.float32 if w32 else None)


def _kernels_importable() -> bool:
    try:
        return importlib.util.find_spec("trawmem_gpu.kernels") is not None
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        return False


def compiled_front_applies(cfg: SelectConfig, dtype: torch.dtype, sim: str) -> str | None:
    """None when the compiled steps 1-3 reproduce the tensor ones for ``cfg``, else why not."""
    if cfg.affinity not in ("rrf", "learned") or cfg.seed_score != "best_unit":
        return "it needs affinity='rrf' or 'learned' and seed_score='best_unit'"
    if dtype != torch.float64:
        return "it computes in float64"
    if sim not in ("auto", "grouped", "dots"):
        return "it needs sim in ('auto', 'grouped', 'dots')"
    return None


def fused_terms_apply(fused: tuple[str, ...], cfg: SelectConfig) -> str | None:
    """None when every coverage term of J that counts for ``cfg`` is among the ``fused`` ones whose
    pieces a fast path holds (``terms.fused_terms``), else why not. A term whose weight is 0
    counts for nothing (0 * gain adds exactly +0.0, and a learned head scales the config's weights,
    so it stays 0)."""
    live = tuple(t.name for t in COVERAGE_TERMS if float(getattr(cfg, t.weight, 0.0)) != 0.0)
    extra = [n for n in live if n not in fused]
    if extra:
        return f"it computes the coverage terms {list(fused)} inline; J also has {extra}"
    return None


EXACT_MS = (0.255, 6.60e-5, 3.36e-7)
"""One query's exact CPU milliseconds on one thread as ``a + N (b + c d)`` for a bank of ``N``
units of width ``d`` (the similarity GEMM costs ``c`` per unit and dimension, the rest of steps
1-3 ``b`` per unit) ..."""
APPROX_MS = (2.86, 2.75e-7, 5.73e-9)
"""... and its approximate ones, the same form: least squares (relative errors) over the exact and
approximate p50s of the same banks, ``python -m benchmarks run scale-query``'s approximate points
(``benchmarks/scale_bench/query.py``, ``switch_model``): ``benchmarks/results/scale_query_stop60.json``'s
``switch``, 10^4 to 10^6 units at d = 64 and 384, one topic per 1,000 units (the approximate
cost is nearly flat, 2.4-5.0 ms).
Refit them from a new run when either path changes."""
ANN_SPEEDUP = 2.0
"""``auto`` searches approximately where exact search costs at least this many times as much."""


def ann_threshold(d: int, exact=EXACT_MS, approx=APPROX_MS, speedup: float = ANN_SPEEDUP) -> int | None:
    """``EngineConfig.ann_min_units="auto"`` for vectors of width ``d``: the smallest bank whose
    exact search costs ``speedup`` times the approximate one by the fits (``exact`` / ``approx``:
    ``(a, b, c)`` of ``a + N (b + c d)`` ms), or None where it never does (every bank exact)."""
    d = max(int(d), 1)
    fixed = speedup * approx[0] - exact[0]
    slope = (exact[1] + exact[2] * d) - speedup * (approx[1] + approx[2] * d)
    if fixed <= 0.0:
        return 1
    return int(np.ceil(fixed / slope)) if slope > 0.0 else None


def _ann_min_units(ec: EngineConfig, banks) -> int | None:
    if ec.ann_min_units is None or not faiss_available():
        return None
    if ec.ann_min_units != "auto":
        return int(ec.ann_min_units)
    dims = [int(b.unit_vecs.shape[1]) for b in (banks or []) if getattr(b, "unit_vecs", None) is not None]
    return ann_threshold(max(dims) if dims else 384)


def resolve(ec: EngineConfig, cfg: SelectConfig, banks) -> Plan:
    device = torch.device(ec.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cpu = device.type == "cpu"
    dtype = {"auto": torch.float64 if cpu else torch.float32, "float32": torch.float32,
             "float64": torch.float64}[ec.dtype]
    triton_terms = fused_terms_apply(fused_terms("triton"), cfg)
    kernels = ec.kernels
    if kernels == "auto":
        kernels = "triton" if (not cpu and HAS_TRITON and _kernels_importable() and not triton_terms) else "torch"
    elif kernels == "triton" and triton_terms:
        raise ConfigError(f"kernels='triton' does not apply: {triton_terms}")
    tables = ec.table_bytes > 0 and (table_bytes_needed(banks, cfg, dtype.itemsize, ec.table_max_units)
                                     <= ec.table_bytes)
    compiled_terms = fused_terms_apply(fused_terms("numba"), cfg)
    compiled_ok = cpu and kernels != "triton" and HAS_NUMBA and not compiled_terms
    backend = ec.backend if ec.backend != "auto" else ("compiled" if compiled_ok else "tensor")
    if backend == "compiled" and not compiled_ok:
        why = compiled_terms or "it needs a CPU device, numba and kernels other than 'triton'"
        raise ConfigError(f"backend='compiled' does not apply: {why}")
    why = compiled_front_applies(cfg, dtype, ec.sim) if backend == "compiled" else "the backend is 'tensor'"
    if ec.front == "compiled" and why:
        raise ConfigError(f"front='compiled' does not apply: {why}")
    front = "compiled" if (why is None and ec.front != "tensor") else "tensor"
    optimizer = ec.optimizer if ec.optimizer != "auto" else ("lazy" if cpu else "plain")
    threads = ec.threads if ec.threads is not None else torch.get_num_threads()
    chunk = ec.chunk_elems or (1 << 19 if cpu else 1 << 24)
    compiled = backend == "compiled"
    rrf_rows = "compiled" if (cpu and dtype == torch.float64 and HAS_NUMBA and cfg.affinity == "rrf") else "torch"
    return Plan(device, dtype, backend, front, kernels, optimizer, ec.sim, int(threads), int(chunk), tables,
                ec.seed_search, uses_bm25(cfg), cfg.seed_score != "best_unit", cfg.affinity == "learned",
                propagation="compiled" if compiled else "torch", rrf_rows=rrf_rows,
                greedy_tokens="compiled" if compiled else "torch", table_units=ec.table_max_units,
                ann_min_units=_ann_min_units(ec, banks), ann_shortlist=ec.ann_shortlist,
                ann_nprobe=ec.ann_nprobe, ann_ef_search=ec.ann_ef_search, ann_kind=ec.ann_index,
                ann_vectors=ec.vectors)
