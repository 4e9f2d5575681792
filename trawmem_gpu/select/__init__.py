"""Stage 2 of TrawMem: select a workspace for each query.

Layout (the method reads top-down; every fast path sits beside its reference):

* ``config.py``: ``SelectConfig`` (the method) and ``EngineConfig`` (how the engine runs it);
* ``terms/``: J's terms, one module each (its gain and state update, NumPy and torch, its weight
  and bound), registered by a decorator; the views every backend reads (``terms.TERMS``, ...);
* ``objective.py``: J composed from the terms (weights, the modular part, the gains' one sum order,
  the NumPy ``Objective``) and the K formula;
* ``steps/``: one module per design step, each with its NumPy reference, torch and numba variants;
* ``reference.py``: ``select_reference``, the steps' references composed, one query;
* ``engine/``: ``SelectionEngine``, the batched variants composed, many queries over many banks;
* ``context.py``, ``lexical.py``, ``text_features.py``: per-bank precomputation, BM25, text cues;
* ``baselines.py``: cosine, BM25, RRF hybrid, full context;
* ``workspace.py``: the selected units assembled under their thread headings and rendered, and
  the token costs a token budget reads;
* ``trimem/``: TriMem's retrieval (``--method trimem``): its query plan, the fused fact ranking and
  the units of the bank's unit view it shows.

The names below import lazily (the reference path needs no torch engine).
"""
from __future__ import annotations

_EXPORTS = {
    "SelectConfig": "config", "EngineConfig": "config", "ABLATIONS": "config",
    "select_reference": "reference", "Selection": "reference", "BankContext": "context",
    "SelectionEngine": "engine",
}
__all__ = sorted(_EXPORTS) + ["clear_query_caches"]


def clear_query_caches() -> None:
    """Drop every cache keyed by question text (timing code calls this so that no text work
    carries over between timed calls: a user's new question would miss these caches)."""
    from .steps.roles import demand_features_cached

    demand_features_cached.cache_clear()


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
