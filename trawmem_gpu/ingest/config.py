"""Build configuration: every Stage-1 choice in one dataclass, one docstring per field."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..dictconfig import DictFields
from ..errors import ConfigError


@dataclass
class BuildConfig(DictFields):
    """How conversations become banks (threads, heads, vectors, thread graph)."""

    segmentation: Literal["embedding", "fixed", "llm"] = "embedding"
    """Thread segmentation: TextTiling-style over turn vectors, fixed windows (the paper's
    "Fixed Seg." ablation), or LLM event boundaries (falls back to ``embedding`` per session on
    malformed output)."""
    window: int = 2
    """Turns on each side of a gap whose mean vectors are compared (embedding segmentation)."""
    depth_std: float = -0.5
    """A gap is a boundary candidate when its TextTiling depth is at least
    ``mean(depth) - depth_std * std(depth)`` over the session's gaps (and ``min_depth``)."""
    min_depth: float = 0.05
    """Absolute floor on the depth of a boundary."""
    min_thread_len: int = 3
    """Shortest thread the embedding segmenter makes (shorter sessions stay whole)."""
    max_thread_len: int = 12
    """Longest thread; longer segments are split at their weakest gap."""
    fixed_size: int = 6
    """Turns per thread with ``segmentation="fixed"``."""
    head_sentences: int = 1
    """Turns quoted in an extractive head (the most central ones, in source order)."""
    head_words: int = 16
    """Words kept of each quoted turn in an extractive head."""
    heads: Literal["extractive", "llm"] = "extractive"
    """Head writer; ``llm`` falls back to extractive per thread on malformed output."""
    knn: int = 5
    """Semantic edges: each head's k nearest other heads (faiss inner product)..."""
    knn_threshold: float = 0.5
    """...kept when their cosine is at least this."""
    encoder: str = "minilm"
    """``minilm`` (embedded all-MiniLM-L6-v2) or ``hf:/local/path`` (transformers, last-token
    pooling with a query instruction, e.g. Qwen3-Embedding-0.6B)."""
    encode_batch_size: int = 64
    """Texts per encoder forward pass."""

    def __post_init__(self):
        if self.segmentation not in ("embedding", "fixed", "llm"):
            raise ConfigError(f"{self.segmentation=} must be 'embedding', 'fixed' or 'llm'")
        if self.heads not in ("extractive", "llm"):
            raise ConfigError(f"{self.heads=} must be 'extractive' or 'llm'")
        for name in ("window", "min_thread_len", "max_thread_len", "fixed_size", "head_sentences",
                     "head_words", "encode_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 1")
        if self.knn < 0:
            raise ConfigError(f"{self.knn=} must be >= 0")
        if self.min_thread_len > self.max_thread_len:
            raise ConfigError(f"{self.min_thread_len=} exceeds {self.max_thread_len=}")
        if not -1.0 <= self.knn_threshold <= 1.0:
            raise ConfigError(f"{self.knn_threshold=} must lie in [-1, 1]")

    KIND = "build config"
