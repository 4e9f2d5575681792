"""LLM backends (OpenAI-compatible HTTP, offline vLLM, none), response cache, prompts and parsing.

Build a backend from a CLI spec with :func:`backend_from_spec`; wrap it in
:class:`CachedBackend` to make reruns free. What a client learns of its server (concurrency,
speed, context, schema form) is ``endpoint``; every structured call goes through
``structured.ask`` with its prompt's JSON schema; what an output must pass to be used is
``grounding``; :class:`LLMWork` reports what a block of work cost (docs/llm.md).
"""
from trawmem_gpu.llm.base import (
    FakeBackend,
    LLMBackend,
    LLMRequestError,
    LLMResult,
    LLMWork,
    NoLLM,
    StageUsage,
    UsageMeter,
)
from trawmem_gpu.llm.cache import CachedBackend, ResponseCache, cache_key
from trawmem_gpu.llm.spec import SPEC_HELP, backend_from_spec

__all__ = [
    "LLMBackend", "LLMResult", "LLMRequestError", "NoLLM", "FakeBackend", "UsageMeter", "StageUsage", "LLMWork",
    "CachedBackend", "ResponseCache", "cache_key", "backend_from_spec", "SPEC_HELP",
    "OpenAIHTTPBackend", "VLLMOfflineBackend",
]


def __getattr__(name):  # lazy: httpx / vllm are imported only when asked for
    if name == "OpenAIHTTPBackend":
        from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend

        return OpenAIHTTPBackend
    if name == "VLLMOfflineBackend":
        from trawmem_gpu.llm.vllm_offline import VLLMOfflineBackend

        return VLLMOfflineBackend
    raise AttributeError(name)
