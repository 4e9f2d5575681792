"""Encoders behind one interface, and an on-disk embedding cache."""
from __future__ import annotations

import importlib.util
import os
from functools import lru_cache

from ..errors import ConfigError
from .base import Encoder
from .cache import CachedEncoder, EmbeddingCache
from .hf import HFEncoder, minilm_encoder

__all__ = ["Encoder", "CachedEncoder", "EmbeddingCache", "HFEncoder", "minilm_encoder", "get_encoder"]


RUNTIMES = ("torch", "onnx", "auto")


def encoder_runtime() -> str:
    """``TRAWMEM_ENCODER_RUNTIME``: ``torch`` (default), ``onnx`` (ONNX Runtime on the CPU for
    mean-pooling encoders, same vectors within 1e-5, faster on CPUs) or ``auto`` (onnx where
    it applies and onnxruntime is installed, else torch)."""
    rt = os.environ.get("TRAWMEM_ENCODER_RUNTIME", "torch").strip().lower() or "torch"
    if rt not in RUNTIMES:
        raise ConfigError(f"TRAWMEM_ENCODER_RUNTIME={rt!r}: use one of {', '.join(RUNTIMES)}")
    return rt


@lru_cache(maxsize=4)
def _load(spec: str, runtime: str = "torch") -> Encoder:
    if spec == "minilm":
        enc = minilm_encoder()
    elif spec.startswith("hf:"):
        enc = HFEncoder(spec[3:], pooling="last_token")
    elif spec.startswith("hf-mean:"):
        enc = HFEncoder(spec[8:], pooling="mean")
    else:
        raise ConfigError(f"unknown encoder {spec!r}: use 'minilm', 'hf:/path/to/model' (last-token pooling) "
                          "or 'hf-mean:/path/to/model'")
    if runtime == "torch" or enc.device != "cpu" or enc.pooling != "mean":
        return enc  # CUDA hosts keep torch (fp16); the ONNX path serves mean pooling
    if runtime == "auto" and importlib.util.find_spec("onnxruntime") is None:
        return enc
    from .onnx import OnnxEncoder

    return OnnxEncoder(enc)


def get_encoder(spec: str = "minilm", cache: bool | str = True, fresh: bool = False) -> Encoder:
    """Encoder from a spec string (runtime from ``TRAWMEM_ENCODER_RUNTIME``), wrapped in the
    on-disk cache unless ``cache=False``. ``fresh``: a new instance of the model, not the one the
    process shares (for a thread that must never wait on another's calls; the server's appends)."""
    enc = (_load.__wrapped__ if fresh else _load)(spec, encoder_runtime())
    if cache is False:
        return enc
    return CachedEncoder(enc, EmbeddingCache(None if cache is True else cache))
