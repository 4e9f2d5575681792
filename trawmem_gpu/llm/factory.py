"""Turns a command-line LLM spec (and the ``--llm-*`` options) into a checked, cached backend."""
from __future__ import annotations

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_RETRIES = 4


def llm_options(a) -> dict:
    """Backend options from the ``--llm-*`` flags of namespace ``a`` (absent flags: defaults)."""
    return {"timeout_s": getattr(a, "llm_timeout", DEFAULT_TIMEOUT_S),
            "max_retries": getattr(a, "llm_retries", DEFAULT_RETRIES),
            "deadline_s": getattr(a, "llm_deadline", None)}


def llm_from_args(spec: str | None, cache_path=None, *, check: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                  max_retries: int = DEFAULT_RETRIES, deadline_s: float | None = None):
    """``None`` -> None (no LLM configured); else a backend from the spec, wrapped in the
    response cache. HTTP backends get the timeout, retry and deadline options; ``check=True``
    asks the server first (``GET /models``: reachable, key accepted, model served)."""
    if not spec or spec == "none":
        return None
    from ..paths import default_cache_dir
    from .cache import CachedBackend
    from .spec import backend_from_spec

    http = spec.strip().lower().startswith(("http://", "https://"))
    opts = {"timeout_s": timeout_s, "max_retries": max_retries, "deadline_s": deadline_s} if http else {}
    backend = backend_from_spec(spec, **opts)
    if check:
        try:
            backend.check()
        except BaseException:
            backend.close()
            raise
    return CachedBackend(backend, cache_path or default_cache_dir() / "llm.sqlite")
