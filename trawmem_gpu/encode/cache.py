"""On-disk embedding cache keyed by (encoder id, query flag, text): sqlite3 from the stdlib.

sqlite gives atomic commits and concurrent readers for free; vectors are stored as raw
float32 bytes.

The cache is disposable: a file sqlite calls corrupt or not a database (truncated, bit-flipped,
garbage), or a database of another schema, is set aside beside it (``embeddings.sqlite.bad-N``,
with its journal files), a one-line note says so (on stderr, from a command: ``..notes``), and an empty cache takes its place,
filled again as texts are encoded. This happens when the cache is opened or whenever a read or
write finds the damage; never fatal (``build``, ``query``, ``score`` go on).
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import logging
import os
import sqlite3
from pathlib import Path

import numpy as np

from ..notes import note
from ..paths import default_cache_dir
from .base import Encoder

log = logging.getLogger(__name__)

_SCHEMA = [("table", "emb"), ("index", "sqlite_autoindex_emb_1")]
"""What ``sqlite_master`` of a cache holds (a database with anything else is someone else's)."""


def _corrupt(e: sqlite3.DatabaseError) -> bool:
    """A damaged file (SQLITE_CORRUPT, SQLITE_NOTADB: plain ``DatabaseError``), not a locked,
    read-only or full one (``OperationalError``), which recreating the file would not cure."""
    name = getattr(e, "sqlite_errorname", None)  # Python >= 3.11
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) if name else type(e) is sqlite3.DatabaseError


class ForeignCache(sqlite3.DatabaseError):
    """The cache file is a database of another schema."""


class EmbeddingCache:
    def __init__(self, path: str | Path | None = None):
        path = Path(path) if path else default_cache_dir() / "embeddings.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.set_aside: list[Path] = []
        """Damaged files this cache moved out of the way (see the module docstring)."""
        self._recovering(self._open)

    def _open(self) -> None:
        self.db = sqlite3.connect(str(self.path), timeout=60)
        st = os.stat(self.path)
        self._ident = (st.st_dev, st.st_ino)
        self.db.execute("CREATE TABLE IF NOT EXISTS emb (k TEXT PRIMARY KEY, v BLOB)")
        self.db.commit()
        have = self.db.execute("SELECT type, name FROM sqlite_master ORDER BY type DESC, name").fetchall()
        cols = [r[1] for r in self.db.execute("PRAGMA table_info(emb)")]
        if have != _SCHEMA or cols != ["k", "v"]:
            raise ForeignCache(f"a database of another schema ({', '.join(n for _, n in have)})")

    def _recovering(self, op):
        """``op()``; when it finds the file damaged or foreign, set the file aside, open an empty
        cache and run ``op()`` once more."""
        try:
            return op()
        except sqlite3.DatabaseError as e:
            if not (isinstance(e, ForeignCache) or _corrupt(e)):
                raise
            self._set_aside(e)
        return op()

    def _set_aside(self, err: Exception) -> None:
        from filelock import FileLock

        with FileLock(str(self.path) + ".lock"):  # one process moves it; the others see it gone
            if getattr(self, "db", None) is not None:
                self.db.close()
            try:
                st = os.stat(self.path)
                same = (st.st_dev, st.st_ino) == getattr(self, "_ident", (st.st_dev, st.st_ino))
            except FileNotFoundError:
                same = False
            if same:  # still the file found damaged (not one another process put in its place)
                aside = next(p for p in (self.path.with_name(f"{self.path.name}.bad-{i}") for i in itertools.count(1))
                             if not p.exists())
                os.replace(self.path, aside)
                for suffix in ("-journal", "-wal", "-shm"):
                    j = self.path.with_name(self.path.name + suffix)
                    if j.exists():
                        os.replace(j, aside.with_name(aside.name + suffix))
                self.set_aside.append(aside)
                note(log, f"trawmem: note: the embedding cache {self.path} is unreadable ({err}); set aside as "
                     f"{aside.name}, starting an empty one (texts are encoded again)")
            self._open()

    @staticmethod
    def key(encoder_id: str, is_query: bool, text: str) -> str:
        return hashlib.sha256(f"{encoder_id}\x00{int(is_query)}\x00{text}".encode()).hexdigest()

    def get_many(self, keys: list[str], dim: int) -> dict[str, np.ndarray]:
        def get():
            out = {}
            for s in range(0, len(keys), 500):
                chunk = keys[s:s + 500]
                q = f"SELECT k, v FROM emb WHERE k IN ({','.join('?' * len(chunk))})"
                for k, v in self.db.execute(q, chunk):
                    a = np.frombuffer(v, dtype=np.float32) if isinstance(v, bytes) else None
                    if a is not None and a.shape == (dim,) and np.isfinite(a).all():
                        out[k] = a
            return out
        return self._recovering(get)

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        rows = [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items.items()]

        def put():
            try:
                self.db.executemany("INSERT OR REPLACE INTO emb (k, v) VALUES (?, ?)", rows)
                self.db.commit()
            except sqlite3.DatabaseError:
                try:
                    self.db.rollback()
                except sqlite3.Error:
                    pass
                raise
        self._recovering(put)


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
