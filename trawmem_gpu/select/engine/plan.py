"""The engine's execution plan: every ``auto`` of :class:`~trawmem_gpu.select.config.EngineConfig`
resolved once, at construction, against the device, the installed libraries, the method's
config and the banks."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from ...errors import ConfigError
from .._jit import HAS_NUMBA
from ..config import EngineConfig, SelectConfig
from ..steps.candidates import uses_bm25
from ..steps.priority import HAS_TRITON
from .tables import Layout, table_bytes_needed


@dataclass(frozen=True)
class Plan:
    device: torch.device
    dtype: torch.dtype
    backend: str
    """``compiled`` (numba loops per query, CPU) or ``tensor`` (torch ops over padded batches)."""
    front: str
    """Steps 1-3: ``compiled`` or ``tensor``."""
    kernels: str
    """Tensor backend ops: ``triton`` or ``torch``."""
    optimizer: str
    """Tensor backend maximizer: ``lazy`` or ``plain``."""
    sim: str
    threads: int
    chunk_elems: int
    tables: bool
    """The per-bank K and bridge tables are built."""
    seed_search: str
    lexical: bool
    """The affinity reads BM25."""

    heads: bool
    """The seeds read the head vectors."""
    relevance: bool
    """The ``learned`` affinity's per-unit indices are stored."""

    def layout(self, dim: int) -> Layout:
        return Layout(self.device, self.dtype, dim, self.tables, self.lexical, self.heads, self.relevance)


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


def resolve(ec: EngineConfig, cfg: SelectConfig, banks) -> Plan:
    device = torch.device(ec.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cpu = device.type == "cpu"
    dtype = {"auto": torch.float64 if cpu else torch.float32, "float32": torch.float32,
             "float64": torch.float64}[ec.dtype]
    kernels = ec.kernels
    if kernels == "auto":
        kernels = "triton" if (not cpu and HAS_TRITON and _kernels_importable()) else "torch"
    tables = table_bytes_needed(banks, cfg, dtype.itemsize) <= ec.table_bytes
    compiled_ok = cpu and kernels != "triton" and tables and HAS_NUMBA
    backend = ec.backend if ec.backend != "auto" else ("compiled" if compiled_ok else "tensor")
    if backend == "compiled" and not compiled_ok:
        raise ConfigError("backend='compiled' needs a CPU device, numba, kernels other than 'triton', and the "
                          "per-bank tables (banks too large for table_bytes)")
    why = compiled_front_applies(cfg, dtype, ec.sim) if backend == "compiled" else "the backend is 'tensor'"
    if ec.front == "compiled" and why:
        raise ConfigError(f"front='compiled' does not apply: {why}")
    front = "compiled" if (why is None and ec.front != "tensor") else "tensor"
    optimizer = ec.optimizer if ec.optimizer != "auto" else ("lazy" if cpu else "plain")
    threads = ec.threads if ec.threads is not None else torch.get_num_threads()
    chunk = ec.chunk_elems or (1 << 19 if cpu else 1 << 24)
    return Plan(device, dtype, backend, front, kernels, optimizer, ec.sim, int(threads), int(chunk), tables,
                ec.seed_search, uses_bm25(cfg), cfg.seed_score != "best_unit", cfg.affinity == "learned")
