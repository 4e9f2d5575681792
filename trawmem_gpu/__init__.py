"""trawmem_gpu: task-oriented role-adaptive workspaces (TrawMem) for agent memory.

Pipeline, one subpackage per stage: ``data`` (ingest conversations) -> ``build`` (threads,
heads, vectors, thread graph) -> ``store`` (banks on disk, packed collections) -> ``select``
(reference and batched selection) -> ``workspace`` (assembly, rendering) -> ``eval`` / ``serve``.
"""

__version__ = "0.1.0"
