"""OpenAI-compatible ``/v1/chat/completions`` backend over httpx (bounded async concurrency)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Optional

import httpx

from trawmem_gpu.dictconfig import with_keywords
from trawmem_gpu.errors import ConfigError, name_list
from trawmem_gpu.http_headers import retry_after_s
from trawmem_gpu.llm.base import LLMBackend, LLMRequestError, LLMResult, Secret

log = logging.getLogger(__name__)

API_KEY_ENV = ("TRAWMEM_API_KEY", "OPENAI_API_KEY")
"""Environment variables read, in order, when no api_key is passed."""

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[^\s'\"]+")
REFUSED = "the model refused the request"
"""How a refused request's error begins (a reply with ``refusal`` or a content-filter stop)."""


@dataclass(frozen=True)
class HTTPOptions:
    """How an :class:`OpenAIHTTPBackend` sends its requests."""

    concurrency: int = 16
    """Requests of a batch in flight at once (>= 1)."""
    timeout_s: float = 60
    """Bound on each attempt as a whole: connect, send, wait, read (> 0)."""
    max_retries: int = 4
    """Retries of a transient failure (connect error, timeout, 429, 5xx)."""
    backoff_s: float = 0.5
    """The first retry's wait, doubled each retry (``Retry-After`` overrides it)."""
    max_backoff_s: float = 60.0
    """The longest wait between two attempts."""
    progress: bool = True
    """A progress bar over a batch."""
    raise_if_all_failed: bool = True
    """Raise :class:`LLMRequestError` when every request of a batch fails (server down)."""
    deadline_s: Optional[float] = None
    """Bound on all requests of the backend together, from its first chat request (None: none)."""


class OpenAIHTTPBackend(LLMBackend):
    """Chat completions against an OpenAI-compatible server (vLLM serve, llama.cpp, OpenAI...).

    Requests in a batch run concurrently (at most ``concurrency`` in flight); transient failures
    (connect errors, timeouts, 429, 5xx) are retried with exponential backoff, honouring
    ``Retry-After``. A request that still fails yields an ``LLMResult`` with ``error`` set; if
    every request of a batch fails, :class:`LLMRequestError` is raised (server down). The API key
    is masked in every message, log line and repr.

    ``timeout_s`` bounds each attempt as a whole (connect, send, wait, read); ``deadline_s``, when
    set, bounds all requests of this backend together, counted from its first chat request:
    attempts and backoff sleeps never run past it, and requests still queued fail at once with
    a "deadline" error (failed requests are never cached, so a rerun retries them).
    :meth:`check` asks ``GET /models`` first, so a wrong URL, key or model stops a run before any
    other work.
    """

    name = "openai-http"

    def __init__(self, base_url: str, model: Optional[str] = None, api_key: Optional[str] = None,
                 options: Optional[HTTPOptions] = None, **kw) -> None:
        """``options``: :class:`HTTPOptions`; its fields can be given as keywords too, over it."""
        o = with_keywords("OpenAIHTTPBackend", HTTPOptions, options, kw)
        concurrency, timeout_s, max_retries, backoff_s = o.concurrency, o.timeout_s, o.max_retries, o.backoff_s
        max_backoff_s, progress, raise_if_all_failed, deadline_s = o.max_backoff_s, o.progress, \
            o.raise_if_all_failed, o.deadline_s
        super().__init__()
        if not isinstance(base_url, str) or not re.match(r"^https?://[^/\s]+", base_url):
            raise ConfigError(f"base_url must start with http:// or https://, got {base_url!r}")
        if int(concurrency) < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency!r}")
        if float(timeout_s) <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        if int(max_retries) < 0 or float(backoff_s) < 0:
            raise ConfigError("max_retries and backoff_s must be >= 0")
        if deadline_s is not None and float(deadline_s) <= 0:
            raise ConfigError(f"deadline_s must be > 0, got {deadline_s!r}")
        self.base_url = base_url.rstrip("/")
        self._model = model or None
        if api_key is None:
            api_key = next((os.environ[k] for k in API_KEY_ENV if os.environ.get(k)), None)
        self._key = Secret(api_key)
        self.concurrency = int(concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.progress = bool(progress)
        self.raise_if_all_failed = bool(raise_if_all_failed)
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        self._deadline: Optional[float] = None  # time.monotonic() value, set at the first chat request
        self._json_mode_ok = True

    # -- helpers ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (
            f"OpenAIHTTPBackend(base_url={self.base_url!r}, model={self._model!r}, "
            f"api_key={'***' if self._key else None}, concurrency={self.concurrency}, "
            f"timeout_s={self.timeout_s}, max_retries={self.max_retries})"
        )

    def _scrub(self, text: object) -> str:
        return _BEARER_RE.sub(r"\1***", self._key.scrub(text))

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json"}
        key = self._key.reveal()
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _delay(self, attempt: int, retry_after: Optional[float]) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff_s)
        d = self.backoff_s * (2 ** attempt)
        return min(d * (1.0 + 0.1 * random.random()), self.max_backoff_s)

    def describe(self) -> dict:
        return {"backend": self.name, "model": self.model, "base_url": self.base_url}

    @property
    def endpoint(self) -> str:
        """The server (cache keys): the base URL, scheme and host in lower case, no trailing slash."""
        scheme, rest = self.base_url.split("://", 1)
        host, sep, path = rest.partition("/")
        return f"{scheme.lower()}://{host.lower()}{sep}{path}".rstrip("/")

    @property
    def model(self) -> str:
        """Model id; when not given, the first id listed by ``GET /v1/models`` (fetched once)."""
        if self._model is None:
            self.check()
        return self._model

    def check(self) -> None:
        """``GET {base_url}/models``: the server answers, accepts the key, and serves the model.

        Sets the model to the first one listed when none was given. Raises ``ConfigError`` for a
        refused key (HTTP 401/403) or a model the server does not list, ``LLMRequestError`` when
        the server cannot be reached after the retries. A server without ``/models`` (404) is
        accepted when a model was named.
        """
        url = f"{self.base_url}/models"
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            try:
                with httpx.Client(timeout=self.timeout_s) as client:
                    r = client.get(url, headers=self._headers())
                if r.status_code in (401, 403):
                    how = "the API key from TRAWMEM_API_KEY / OPENAI_API_KEY" if self._key else "no API key"
                    raise ConfigError(self._scrub(
                        f"the LLM server at {self.base_url} refused {how} (HTTP {r.status_code} from GET /models); "
                        f"set TRAWMEM_API_KEY (or OPENAI_API_KEY) to a key it accepts"))
                if r.status_code == 404 and self._model is not None:
                    log.warning("%s has no /models endpoint; cannot check the key and model up front", self.base_url)
                    return
                if r.status_code == 200:
                    data = r.json().get("data") or []
                    ids = [str(d["id"]) for d in data if isinstance(d, dict) and d.get("id")]
                    if self._model is None:
                        if not ids:
                            raise LLMRequestError(f"GET {url} listed no models; pass MODEL as URL@MODEL")
                        self._model = ids[0]
                    elif ids and self._model not in ids:
                        raise ConfigError(f"model {self._model!r} is not served at {self.base_url} (it serves "
                                          f"{name_list(ids)}); fix the @MODEL part of the LLM spec")
                    return
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code not in _RETRY_STATUS:
                    break
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            except (ValueError, AttributeError) as e:  # bad JSON
                if isinstance(e, ConfigError):
                    raise
                last = f"bad JSON from /models: {e}"
                break
            if attempt < self.max_retries:
                time.sleep(self._delay(attempt, None))
        raise LLMRequestError(self._scrub(f"could not reach the LLM server: GET {url} failed ({last})"))

    def _remaining(self) -> Optional[float]:
        """Seconds left before the deadline (None without one)."""
        return None if self._deadline is None else self._deadline - time.monotonic()

    # -- chat ------------------------------------------------------------------------------
    def _chat(self, batch, *, max_tokens, temperature, json_mode, desc, on_result):
        model = self.model  # resolve before going async
        if self.deadline_s is not None and self._deadline is None:
            self._deadline = time.monotonic() + self.deadline_s
        coro_fn = lambda: self._achat(batch, model, max_tokens, temperature, json_mode, desc, on_result)  # noqa: E731
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            results = asyncio.run(coro_fn())
        else:  # called from inside an event loop (e.g. a notebook): run in a worker thread
            with concurrent.futures.ThreadPoolExecutor(1) as ex:
                results = ex.submit(lambda: asyncio.run(coro_fn())).result()
        if self.raise_if_all_failed and results and all(r.error is not None and not r.error.startswith(REFUSED)
                                                        for r in results):  # refusals: the server works
            raise LLMRequestError(self._scrub(
                f"all {len(results)} requests to {self.base_url} failed; first error: {results[0].error}"
            ))
        return results

    async def _achat(self, batch, model, max_tokens, temperature, json_mode, desc, on_result):
        from tqdm.auto import tqdm

        sem = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        results: list[Optional[LLMResult]] = [None] * len(batch)
        bar = tqdm(total=len(batch), desc=desc or "llm", disable=not self.progress or len(batch) < 2, leave=False)
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s), limits=limits,
                                     headers=self._headers()) as client:

            async def one(i: int, conv: list[dict]) -> None:
                r = await self._one(client, sem, conv, model, max_tokens, temperature, json_mode)
                results[i] = r
                bar.update(1)
                if on_result is not None:
                    on_result(i, r)

            try:
                await asyncio.gather(*(one(i, c) for i, c in enumerate(batch)))
            finally:
                bar.close()
        return results  # type: ignore[return-value]

    async def _one(self, client, sem, conv, model, max_tokens, temperature, json_mode) -> LLMResult:
        url = f"{self.base_url}/chat/completions"
        last_err = "no attempt"
        attempt = 0
        for attempt in range(self.max_retries + 1):
            body = {"model": model, "messages": conv, "max_tokens": max_tokens, "temperature": temperature}
            if json_mode and self._json_mode_ok:
                body["response_format"] = {"type": "json_object"}
            retry_after = None
            try:
                async with sem:
                    left = self._remaining()
                    if left is not None and left <= 0:
                        last_err = f"deadline of {self.deadline_s:g}s passed (`deadline_s`)"
                        break
                    limit = self.timeout_s if left is None else min(self.timeout_s, left)
                    t0 = time.perf_counter()
                    resp = await asyncio.wait_for(client.post(url, json=body, timeout=limit), limit)
                latency = time.perf_counter() - t0
                if resp.status_code == 200:
                    return self._parse_ok(resp, latency)
                last_err = f"HTTP {resp.status_code}: {resp.text[:300]}"
                if resp.status_code == 400 and "response_format" in body:
                    # server without JSON mode: drop it for this backend and retry at once
                    self._json_mode_ok = False
                    log.warning("%s rejected response_format; retrying without JSON mode", self.base_url)
                    continue
                if resp.status_code not in _RETRY_STATUS:
                    break
                retry_after = retry_after_s(resp.headers.get("retry-after"))
            except (httpx.TimeoutException, asyncio.TimeoutError) as e:
                last_err = f"timeout after {limit:g}s ({type(e).__name__}; `timeout_s`)"
            except httpx.TransportError as e:
                last_err = f"{type(e).__name__}: {e}"
            except _BadResponse as e:
                last_err = str(e)
                break
            if attempt < self.max_retries:
                delay = self._delay(attempt, retry_after)
                left = self._remaining()
                if left is not None and delay >= left:
                    last_err += f"; deadline of {self.deadline_s:g}s reached before the next retry"
                    break
                log.warning("LLM request failed (%s); retry %d/%d in %.2fs",
                            self._scrub(last_err), attempt + 1, self.max_retries, delay)
                await asyncio.sleep(delay)
        err = self._scrub(f"{last_err} (after {attempt + 1} attempt(s))")
        log.warning("LLM request gave up: %s", err)
        return LLMResult(text="", error=err)

    def _parse_ok(self, resp: httpx.Response, latency: float) -> LLMResult:
        try:
            data = resp.json()
            choice = data["choices"][0]
            msg = choice.get("message") or {}
            text = msg.get("content")
            refusal = msg.get("refusal")
            if refusal or choice.get("finish_reason") == "content_filter":
                # a refused request is a failed one: never cached, and the caller falls back
                why = " ".join(str(refusal or "content filter").split())[:200]
                return LLMResult(text="", latency_s=latency, error=f"{REFUSED} ({why})")
            if text is None:
                text = choice.get("text") or ""
            usage = data.get("usage") or {}
            return LLMResult(
                text=str(text),
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                latency_s=latency,
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise _BadResponse(f"malformed completion response ({type(e).__name__}): {resp.text[:200]}") from None


class _BadResponse(Exception):
    """A 200 response whose body is not a chat completion."""
