"""Stage 1, ingest: conversations become banks.

Threads per session (``segment``, ``llm_threads``), their heads (``heads``), unit and head vectors,
the thread graph (``store.graph.build_edges``), ``update_bank`` and ``forget`` (``builder``,
``history``, ``forget``), the build configuration (``config.BuildConfig``) and the bank cache of
the harnesses (``cache``); the facts and profiles layers beside the turns (``layers``).
"""
from .builder import build_banks, update_bank

__all__ = ["build_banks", "update_bank"]
