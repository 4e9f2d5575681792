"""Turns a command-line LLM spec (and the ``--llm-*`` options) into a checked, cached backend."""
from __future__ import annotations

DEFAULT_TIMEOUT_S = None
"""No fixed limit: each request's is derived from its prompt, its reply budget and the server's
measured speeds (``llm.endpoint.EndpointState.time_limit``)."""
DEFAULT_RETRIES = 4

_OPTIONS = {"llm_timeout": ("timeout_s", DEFAULT_TIMEOUT_S), "llm_retries": ("max_retries", DEFAULT_RETRIES),
            "llm_deadline": ("deadline_s", None), "llm_concurrency": ("concurrency", None),
            "llm_context": ("context_tokens", None), "llm_constrain": ("constrain", "schema"),
            "strict_llm": ("strict", False)}
"""Flag dest -> (``llm_from_args`` keyword, default)."""


def llm_options(a) -> dict:
    """Backend options from the ``--llm-*`` flags (and ``--strict-llm``) of namespace ``a``
    (absent flags: defaults); ``--llm-concurrency auto`` is None (fitted to the endpoint)."""
    out = {}
    for dest, (kw, default) in _OPTIONS.items():
        v = getattr(a, dest, default)
        out[kw] = None if v == "auto" else v
    return out


def llm_from_args(spec: str | None, cache_path=None, *, check: bool = False, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                  max_retries: int = DEFAULT_RETRIES, deadline_s: float | None = None, concurrency: int | None = None,
                  context_tokens: int | None = None, constrain: str = "schema", strict: bool = False):
    """``None`` -> None (no LLM configured); else a backend from the spec, wrapped in the
    response cache. HTTP backends get the timeout, retry, deadline, concurrency, context and
    constraint options; ``check=True`` asks the server first (``GET /models``: reachable, key
    accepted, model served); ``strict``: any fallback from its output is an error (``--strict-llm``)."""
    if not spec or spec == "none":
        return None
    from ..paths import default_cache_dir
    from .cache import CachedBackend
    from .spec import backend_from_spec

    http = spec.strip().lower().startswith(("http://", "https://"))
    opts = {"timeout_s": timeout_s, "max_retries": max_retries, "deadline_s": deadline_s, "concurrency": concurrency,
            "context_tokens": context_tokens, "constrain": constrain} if http else {}
    backend = backend_from_spec(spec, **opts)
    if not http and hasattr(backend, "constrain"):
        backend.constrain = constrain
    if check:
        try:
            backend.check()
        except BaseException:
            backend.close()
            raise
    cached = CachedBackend(backend, cache_path or default_cache_dir() / "llm.sqlite")
    cached.strict = bool(strict)
    return cached
