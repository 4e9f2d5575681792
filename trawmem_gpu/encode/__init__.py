"""Encoders behind one interface, and an on-disk embedding cache."""
from __future__ import annotations

from functools import lru_cache

from ..errors import ConfigError
from .base import Encoder
from .cache import CachedEncoder, EmbeddingCache
from .hf import HFEncoder, minilm_encoder

__all__ = ["Encoder", "CachedEncoder", "EmbeddingCache", "HFEncoder", "minilm_encoder", "get_encoder"]


@lru_cache(maxsize=4)
def _load(spec: str) -> Encoder:
    if spec == "minilm":
        return minilm_encoder()
    if spec.startswith("hf:"):
        return HFEncoder(spec[3:], pooling="last_token")
    if spec.startswith("hf-mean:"):
        return HFEncoder(spec[8:], pooling="mean")
    raise ConfigError(f"unknown encoder {spec!r}: use 'minilm', 'hf:/path/to/model' (last-token pooling) "
                      "or 'hf-mean:/path/to/model'")


def get_encoder(spec: str = "minilm", cache: bool | str = True) -> Encoder:
    """Encoder from a spec string, wrapped in the on-disk cache unless ``cache=False``."""
    enc = _load(spec)
    if cache is False:
        return enc
    return CachedEncoder(enc, EmbeddingCache(None if cache is True else cache))
