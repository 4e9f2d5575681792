"""On-disk embedding cache keyed by (encoder id, query flag, text): sqlite3 from the stdlib.

sqlite gives atomic commits and concurrent readers for free; vectors are stored as raw
float32 bytes.
"""
from __future__ import annotations

import collections
import hashlib
import os
import sqlite3
from pathlib import Path

import numpy as np

from .base import Encoder


def default_cache_dir() -> Path:
    return Path(os.environ.get("TRAWMEM_CACHE", Path.home() / ".cache" / "trawmem_gpu"))


class EmbeddingCache:
    def __init__(self, path: str | Path | None = None):
        path = Path(path) if path else default_cache_dir() / "embeddings.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(str(path), timeout=60)
        self.db.execute("CREATE TABLE IF NOT EXISTS emb (k TEXT PRIMARY KEY, v BLOB)")
        self.db.commit()

    @staticmethod
    def key(encoder_id: str, is_query: bool, text: str) -> str:
        return hashlib.sha256(f"{encoder_id}\x00{int(is_query)}\x00{text}".encode()).hexdigest()

    def get_many(self, keys: list[str], dim: int) -> dict[str, np.ndarray]:
        out = {}
        for s in range(0, len(keys), 500):
            chunk = keys[s:s + 500]
            q = f"SELECT k, v FROM emb WHERE k IN ({','.join('?' * len(chunk))})"
            for k, v in self.db.execute(q, chunk):
                a = np.frombuffer(v, dtype=np.float32)
                if a.shape == (dim,):
                    out[k] = a
        return out

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        self.db.executemany("INSERT OR REPLACE INTO emb (k, v) VALUES (?, ?)",
                            [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items.items()])
        self.db.commit()


class CachedEncoder(Encoder):
    """Wraps an encoder; texts already in the cache are not encoded again."""

    def __init__(self, inner: Encoder, cache: EmbeddingCache | None):
        self.inner, self.cache = inner, cache
        self.id, self.dim = inner.id, inner.dim
        self.hits = self.misses = 0

    def _encode_batch(self, texts, is_query):  # pragma: no cover - encode() is overridden
        return self.inner._encode_batch(texts, is_query)

    def encode(self, texts, *, is_query=False, batch_size=64, progress=False, desc="encode", on_batch=None):
        """As :meth:`Encoder.encode`; each batch's vectors are committed to the cache as soon as
        it is encoded, so an interrupted call loses at most one batch. ``on_batch`` counts the
        texts found in the cache at once, then each encoded batch."""
        from tqdm.auto import tqdm

        texts = list(texts)
        if self.cache is None:
            return self.inner.encode(texts, is_query=is_query, batch_size=batch_size, progress=progress, desc=desc,
                                     on_batch=on_batch)
        keys = [EmbeddingCache.key(self.id, is_query, t) for t in texts]
        found = self.cache.get_many(list(dict.fromkeys(keys)), self.dim)
        todo = list(dict.fromkeys(t for t, k in zip(texts, keys) if k not in found))
        pending = sum(1 for k in keys if k not in found)
        self.hits += len(texts) - pending
        self.misses += len(todo)
        if on_batch is not None and len(texts) > pending:
            on_batch(len(texts) - pending)
        todo.sort(key=len)  # batches of similar length pad little (as the inner encoder sorts)
        left = collections.Counter(k for k in keys if k not in found)  # repeats count when encoded
        for s in tqdm(range(0, len(todo), batch_size), desc=desc, disable=not progress, unit="batch"):
            batch = todo[s:s + batch_size]
            vecs = self.inner.encode(batch, is_query=is_query, batch_size=batch_size)
            new = {EmbeddingCache.key(self.id, is_query, t): v for t, v in zip(batch, vecs)}
            self.cache.put_many(new)
            found.update(new)
            if on_batch is not None:
                on_batch(sum(left[k] for k in new))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, k in enumerate(keys):
            out[i] = found[k]
        return out
