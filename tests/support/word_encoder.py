"""A deterministic encoder without a model, for store tests: a text's vector is the sum of its
words' hashed random directions (texts sharing words are near), so segmentation and the nearest-head
graph have structure to find, in microseconds."""
from __future__ import annotations

import hashlib

import numpy as np

from trawmem_gpu.encode.base import Encoder


class WordEncoder(Encoder):
    id = "test-words-32"
    dim = 32

    def _encode_batch(self, texts, is_query):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in (t.lower().split() or ["<empty>"]):
                seed = int.from_bytes(hashlib.sha1(w.encode()).digest()[:8], "little")
                out[i] += np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            out[i] += 1e-3  # never a zero vector
        return out
