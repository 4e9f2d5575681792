"""The encoder interface: texts -> L2-normalized float32 vectors."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import numpy as np


class Encoder(ABC):
    """Maps texts to unit vectors. Queries may get an instruction prefix (``is_query=True``)."""

    id: str
    """Stable identifier (model and pooling): bank files and the embedding cache key on it."""
    dim: int

    @abstractmethod
    def _encode_batch(self, texts: list[str], is_query: bool) -> np.ndarray:
        """[n] texts -> [n, dim] float32, not necessarily normalized."""

    def encode(self, texts: list[str], *, is_query: bool = False, batch_size: int = 64,
               progress: bool = False, desc: str = "encode",
               on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """[n] texts -> [n, dim] float32 L2-normalized rows, in input order.

        :param on_batch: called with the number of texts after each encoded batch (progress)
        """
        from tqdm.auto import tqdm

        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        # Sort by length so batches pad little; write back in input order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        starts = range(0, len(texts), batch_size)
        for s in tqdm(starts, desc=desc, disable=not progress, unit="batch"):
            idx = order[s:s + batch_size]
            v = self._encode_batch([texts[i] for i in idx], is_query)
            norms = np.linalg.norm(v, axis=1, keepdims=True)
            if not np.all(np.isfinite(v)) or np.any(norms == 0):
                raise ValueError(f"encoder {self.id} produced a NaN or zero vector")
            out[idx] = v / norms
            if on_batch is not None:
                on_batch(len(idx))
        return out
