"""Turns a command-line LLM spec into a cached backend (see ``trawmem_gpu.llm``)."""
from __future__ import annotations


def llm_from_args(spec: str | None, cache_path=None):
    """``None`` -> None (no LLM configured); else a backend from the spec, wrapped in the cache."""
    if not spec or spec == "none":
        return None
    from .llm.cache import CachedBackend
    from .llm.spec import backend_from_spec
    from .encode.cache import default_cache_dir

    backend = backend_from_spec(spec)
    return CachedBackend(backend, cache_path or default_cache_dir() / "llm.sqlite")
