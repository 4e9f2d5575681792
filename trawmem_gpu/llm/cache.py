"""On-disk response cache (sqlite3) wrapping any backend; resumable after a crash.

A reply is keyed on the request (model, messages, max_tokens, temperature, JSON mode) and on the
endpoint that answered it (``LLMBackend.endpoint``: an HTTP server's base URL), so servers serving
a model of the same name never share replies. A reply the caller's parser rejects (``accept``
of :meth:`LLMBackend.chat`) is never stored, and a stored one it rejects is dropped and sent
again.
"""
from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Optional

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.llm.base import LLMBackend, LLMResult

log = logging.getLogger(__name__)

CACHE_FORMAT = 2
"""Version of the table layout (2: replies keyed on the endpoint too, its column beside the
model's). A format-1 file is upgraded in place: its replies, keyed without the endpoint, cannot be
told apart by server and are deleted. A file of any other version is refused."""


def schema_digest(schema: Optional[dict]) -> Optional[str]:
    """sha256 hex of a JSON schema's canonical text (None for none)."""
    if schema is None:
        return None
    raw = json.dumps(schema, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def cache_key(model: Optional[str], messages: list[dict], max_tokens: int, temperature: float, json_mode: bool,
              endpoint: Optional[str] = None, schema: Optional[dict] = None) -> str:
    """sha256 hex of the request fields that determine the response and of the ``endpoint`` that
    answers it (None: the format-1 key, without one). A request whose decoding is constrained
    to a JSON ``schema`` keys on the schema too (a request without one keys as it always did)."""
    payload = {
        "model": model,
        "messages": [{k: m[k] for k in sorted(m)} for m in messages],
        "max_tokens": int(max_tokens),
        "temperature": float(temperature),
        "json_mode": bool(json_mode),
    }
    if endpoint is not None:
        payload["endpoint"] = str(endpoint)
    if schema is not None and json_mode:
        payload["schema"] = schema_digest(schema)
    raw = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class ResponseCache:
    """sqlite3 key -> response store; one commit per stored response."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, model TEXT, text TEXT,"
                " prompt_tokens INTEGER, completion_tokens INTEGER, created REAL, endpoint TEXT)"
            )
            if "finish" not in {r[1] for r in self._db.execute("PRAGMA table_info(responses)")}:
                # why a reply stopped (``length``: cut at its token limit); NULL for replies stored before
                self._db.execute("ALTER TABLE responses ADD COLUMN finish TEXT")
            row = self._db.execute("SELECT v FROM meta WHERE k='format'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('format', ?)", (str(CACHE_FORMAT),))
            elif row[0] == "1":
                self._upgrade_from_1()
            elif row[0] != str(CACHE_FORMAT):
                raise ConfigError(f"LLM cache {self.path} has format {row[0]}, expected {CACHE_FORMAT}")
            self._db.commit()
        except sqlite3.DatabaseError as e:
            raise ConfigError(f"LLM cache {self.path} is not a usable sqlite file: {e}") from None

    def _upgrade_from_1(self) -> None:
        """Format 1 -> 2: add the endpoint column, delete the replies (keyed without the endpoint)."""
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(responses)")}
        self._db.execute("PRAGMA secure_delete=ON")
        n = self._db.execute("DELETE FROM responses").rowcount
        if "endpoint" not in cols:
            self._db.execute("ALTER TABLE responses ADD COLUMN endpoint TEXT")
        self._db.execute("UPDATE meta SET v=? WHERE k='format'", (str(CACHE_FORMAT),))
        if n:
            log.warning("LLM cache %s was written without the server of each reply (format 1); its %d "
                        "replies cannot be told apart by server and were deleted", self.path, n)

    def get(self, key: str) -> Optional[LLMResult]:
        """Cached result (cached=True) or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT text, prompt_tokens, completion_tokens, finish FROM responses WHERE key=?", (key,)
            ).fetchone()
        if row is None:
            return None
        return LLMResult(text=row[0], prompt_tokens=row[1] or 0, completion_tokens=row[2] or 0,
                         latency_s=0.0, cached=True, finish_reason=row[3])

    def put(self, key: str, model: Optional[str], result: LLMResult, endpoint: Optional[str] = None) -> None:
        """Store a successful result and commit at once."""
        if result.error is not None:
            return
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (key, model, text, prompt_tokens, completion_tokens, created,"
                " endpoint, finish) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, model, result.text, int(result.prompt_tokens), int(result.completion_tokens), time.time(),
                 endpoint, result.finish_reason),
            )
            self._db.commit()

    def delete(self, key: str) -> None:
        """Drop the reply stored under ``key`` (if any) and commit."""
        with self._lock:
            self._db.execute("DELETE FROM responses WHERE key=?", (key,))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()


class CachedBackend(LLMBackend):
    """Wraps ``inner``: identical requests are answered from ``path`` without being sent.

    Results from the cache carry ``cached=True`` (and their original token counts). Only
    successful responses that the caller's ``accept`` takes (the module docstring) are stored, each committed as it arrives, so a crashed run resumes
    where it stopped. Identical requests within one batch are sent once.
    """

    def __init__(self, inner: LLMBackend, path: str | Path) -> None:
        super().__init__()
        self.inner = inner
        self.cache = ResponseCache(path)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    filters_replies = True
    takes_schema = True

    @property
    def model(self) -> Optional[str]:
        return self.inner.model

    @property
    def context_tokens(self) -> Optional[int]:
        """The inner backend's model context in tokens, when known."""
        return getattr(self.inner, "context_tokens", None)

    def schema_sent(self, schema: Optional[dict]) -> Optional[dict]:
        return self.inner.schema_sent(schema)

    @property
    def state(self):
        """The inner backend's endpoint state (``llm.endpoint``), when it has one."""
        return getattr(self.inner, "state", None)

    @property
    def endpoint(self) -> Optional[str]:
        return self.inner.endpoint

    def describe(self) -> dict:
        d = dict(self.inner.describe())
        d["cache"] = str(self.cache.path)
        return d

    def check(self) -> None:
        self.inner.check()

    def __repr__(self) -> str:
        return f"CachedBackend({self.inner!r}, path={str(self.cache.path)!r})"

    def _chat(self, batch, *, max_tokens, temperature, json_mode, desc, on_result, accept=None, schema=None):
        model, endpoint = self.inner.model, self.inner.endpoint
        schema = self.inner.schema_sent(schema) if json_mode else None
        keys = [cache_key(model, conv, max_tokens, temperature, json_mode, endpoint, schema) for conv in batch]
        ok = (lambda i, r: r.error is None) if accept is None else \
            (lambda i, r: r.error is None and bool(accept(i, r.text)))
        results: list[Optional[LLMResult]] = [None] * len(batch)
        first_of: dict[str, int] = {}
        miss: list[int] = []  # batch indices to send (first occurrence of each key)
        for i, k in enumerate(keys):
            hit = self.cache.get(k)
            if hit is not None and not ok(i, hit):  # kept before its parser was asked: send it again
                self.cache.delete(k)
                hit = None
            if hit is not None:
                results[i] = hit
                if on_result is not None:
                    on_result(i, hit)
            elif k in first_of:
                continue
            else:
                first_of[k] = i
                miss.append(i)
        if miss:
            def store(j: int, r: LLMResult) -> None:
                i = miss[j]
                if ok(i, r):
                    self.cache.put(keys[i], model, r, endpoint)
                results[i] = r
                if on_result is not None:
                    on_result(i, r)

            sent = self.inner.chat([batch[i] for i in miss], max_tokens=max_tokens, temperature=temperature,
                                   json_mode=json_mode, desc=desc, on_result=store, schema=schema)
            for j, r in enumerate(sent):  # in case the inner backend skipped on_result
                if results[miss[j]] is None:
                    store(j, r)
        for i, k in enumerate(keys):  # in-batch duplicates share the first response
            if results[i] is None:
                src = results[first_of[k]]
                dup = LLMResult(src.text, src.prompt_tokens, src.completion_tokens, 0.0,
                                cached=src.error is None, error=src.error, finish_reason=src.finish_reason)
                results[i] = dup
                if on_result is not None:
                    on_result(i, dup)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        self.cache.close()
        self.inner.close()
