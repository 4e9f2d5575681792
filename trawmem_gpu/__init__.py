"""trawmem_gpu: task-oriented role-adaptive workspaces (TrawMem) for agent memory.

``from trawmem_gpu import Memory`` is the Python API (``docs/python-api.md``); it is loaded on
first use, so ``import trawmem_gpu`` stays light.

Pipeline, one subpackage per stage (docs/architecture.md): ``data`` (conversations) ->
``encode`` (vectors) -> ``store`` (the bank's schema and files) -> ``ingest`` (Stage 1: threads,
heads, vectors, thread graph, facts and profiles) -> ``select`` (Stage 2: TrawMem, TriMem's
retrieval, the baselines, the workspace) -> the fronts: ``eval``, ``head``, ``score``, ``memory``
(the Python API), ``serve``, ``client``, ``mcp`` and ``cli``.
"""

__version__ = "0.1.0"

_LAZY = {"AsyncMemory": "trawmem_gpu.memory", "Memory": "trawmem_gpu.memory", "SelectedWorkspace": "trawmem_gpu.memory", "Turn": "trawmem_gpu.data.types"}
__all__ = ["AsyncMemory", "Memory", "SelectedWorkspace", "Turn", "__version__"]


def __getattr__(name: str):
    """The lazily exported names (PEP 562): imported when first asked for."""
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trawmem_gpu' has no attribute {name!r}")
