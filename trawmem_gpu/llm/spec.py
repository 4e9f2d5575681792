"""Build a backend from a command-line spec string."""
from __future__ import annotations

import re
from typing import Optional

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.llm.base import LLMBackend, NoLLM

SPEC_HELP = "none | http(s)://HOST:PORT/v1[@MODEL] | vllm:MODEL_PATH"
"""Accepted spec forms, for CLI help texts."""

_HTTP_RE = re.compile(r"^(https?://[^/@\s]+)(/[^@\s]*)?(?:@(\S+))?$", re.IGNORECASE)


def parse_http_spec(spec: str) -> tuple[str, Optional[str]]:
    """``(base_url, model or None)`` from ``http(s)://HOST:PORT[/path][@MODEL]``.

    A URL without a path gets ``/v1``; a trailing slash is dropped.
    """
    m = _HTTP_RE.match(spec.strip())
    if not m:
        raise ConfigError(f"LLM spec {spec!r}: expected {SPEC_HELP}")
    host, path, model = m.group(1), (m.group(2) or "").rstrip("/"), m.group(3)
    if not path:
        path = "/v1"
    return host + path, (model or None)


def backend_from_spec(spec: Optional[str], **options) -> LLMBackend:
    """``None``/``"none"`` -> NoLLM; ``http(s)://HOST:PORT/v1[@MODEL]`` -> OpenAIHTTPBackend;
    ``vllm:MODEL_PATH`` -> VLLMOfflineBackend. ``options`` go to the backend's constructor
    (e.g. ``concurrency``, ``timeout_s`` for HTTP; engine kwargs for vLLM).
    """
    if spec is None:
        return NoLLM()
    if not isinstance(spec, str):
        raise ConfigError(f"LLM spec must be a string, got {type(spec).__name__}")
    s = spec.strip()
    if s == "" or s.lower() == "none":
        return NoLLM()
    low = s.lower()
    if low.startswith(("http://", "https://")):
        from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend

        base_url, model = parse_http_spec(s)
        return OpenAIHTTPBackend(base_url, model=model, **options)
    if low.startswith("vllm:"):
        path = s[len("vllm:"):].strip()
        if not path:
            raise ConfigError(f"LLM spec {spec!r}: vllm: needs a model path or id (vllm:MODEL_PATH)")
        from trawmem_gpu.llm.vllm_offline import VLLMOfflineBackend

        return VLLMOfflineBackend(path, **options)
    raise ConfigError(f"unknown LLM spec {spec!r}: expected {SPEC_HELP}")
