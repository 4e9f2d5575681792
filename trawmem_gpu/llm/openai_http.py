"""OpenAI-compatible ``/v1/chat/completions`` backend over httpx, fitted to the endpoint it talks to.

Requests stream (``stream: true``) where the server streams, so an abandoned request is
cancelled by closing its stream; a server that answers with a plain body is read as one and its
requests are never sent twice while they may still run. How many requests go at once, how long
one may take and how the reply's JSON schema is sent are learned per endpoint
(``llm.endpoint``)."""
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
from trawmem_gpu.errors import ConfigError
from trawmem_gpu.http_headers import retry_after_s
from trawmem_gpu.llm.base import LLMBackend, LLMRequestError, LLMResult, Secret
from trawmem_gpu.llm.endpoint import MAX_AUTO_CONCURRENCY, context_from_error, endpoint_state, \
    estimate_tokens, is_constraint_error, is_context_error
from trawmem_gpu.llm.openai_models import check_models
from trawmem_gpu.llm.openai_transport import RETRY_STATUS, Slot, WaitedOut, send_attempt
from trawmem_gpu.llm.openai_wire import CONTEXT_EXCEEDED, REFUSED, BadResponse, HTTPStatusError, Interrupted, \
    Reply, response_format

log = logging.getLogger(__name__)

API_KEY_ENV = ("TRAWMEM_API_KEY", "OPENAI_API_KEY")
"""Environment variables read, in order, when no api_key is passed."""
CONSTRAINTS = ("schema", "json")
"""``constrain``: send each structured call's JSON schema, or JSON mode alone."""

_BEARER_RE = re.compile(r"(?i)(bearer\s+)[^\s'\"]+")
__all__ = ["OpenAIHTTPBackend", "HTTPOptions", "REFUSED", "CONTEXT_EXCEEDED"]


@dataclass(frozen=True)
class HTTPOptions:
    """How an :class:`OpenAIHTTPBackend` sends its requests."""

    concurrency: Optional[int] = None
    """Requests in flight at once to the endpoint (>= 1), from every batch and backend of the
    process together; None: fitted to the endpoint (one for a server that answers one at a time,
    up to 16 for one that serves several at once)."""
    timeout_s: Optional[float] = None
    """Seconds a request may run on the server (sent to answered, never its wait in this client's
    queue) before it is abandoned; None: derived per request from its prompt, its reply budget
    and the endpoint's measured speeds (``llm.endpoint.EndpointState.time_limit``)."""
    max_retries: int = 4
    """Retries of a transient failure (connect error, timeout, 429, 5xx, an interrupted stream)."""
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
    stream: bool = True
    """Stream replies (an abandoned request is then cancelled on the server by closing its stream)."""
    context_tokens: Optional[int] = None
    """The model's context in tokens (None: as ``GET /models`` lists it, or learned from an overflow)."""
    constrain: str = "schema"
    """``schema``: structured calls send their JSON schema (constrained decoding); ``json``: JSON mode only."""


class OpenAIHTTPBackend(LLMBackend):
    """Chat completions against an OpenAI-compatible server (vLLM serve, llama.cpp, OpenAI...).

    Transient failures (connect errors, timeouts, 429, 5xx, interrupted streams) are retried with
    exponential backoff, honouring ``Retry-After``; a timed-out stream is closed (the server stops
    it) before the retry, and a timed-out plain request is waited for again, never sent twice. A
    request that still fails yields an ``LLMResult`` with ``error`` set; if every request of a
    batch fails, :class:`LLMRequestError` is raised (server down). A reply cut at its token
    limit carries ``finish_reason="length"``; a prompt too long for the model fails at once with
    :data:`CONTEXT_EXCEEDED` (the model's context is learned from the error). Structured calls
    send their JSON schema in the form the endpoint takes; a server that refuses schemas gets
    JSON mode (reported once), and a request refused for JSON mode is sent again without it
    (that request only). The API key is masked in every message, log line and repr.
    """

    name = "openai-http"
    takes_schema = True

    def __init__(self, base_url: str, model: Optional[str] = None, api_key: Optional[str] = None,
                 options: Optional[HTTPOptions] = None, **kw) -> None:
        """``options``: :class:`HTTPOptions`; its fields can be given as keywords too, over it."""
        o = with_keywords("OpenAIHTTPBackend", HTTPOptions, options, kw)
        super().__init__()
        if not isinstance(base_url, str) or not re.match(r"^https?://[^/\s]+", base_url):
            raise ConfigError(f"base_url must start with http:// or https://, got {base_url!r}")
        if o.concurrency is not None and int(o.concurrency) < 1:
            raise ConfigError(f"`concurrency` must be >= 1, got {o.concurrency!r}")
        for name in ("timeout_s", "deadline_s"):
            v = getattr(o, name)
            if v is not None and not float(v) > 0:
                raise ConfigError(f"`{name}` must be > 0, got {v!r}")
        if int(o.max_retries) < 0 or float(o.backoff_s) < 0:
            raise ConfigError("`max_retries` and `backoff_s` must be >= 0")
        if o.constrain not in CONSTRAINTS:
            raise ConfigError(f"`constrain` must be one of {', '.join(CONSTRAINTS)}, got {o.constrain!r}")
        self.base_url = base_url.rstrip("/")
        self._model = model or None
        if api_key is None:
            api_key = next((os.environ[k] for k in API_KEY_ENV if os.environ.get(k)), None)
        self._key = Secret(api_key)
        self.options = o
        self.concurrency = None if o.concurrency is None else int(o.concurrency)
        self.timeout_s = None if o.timeout_s is None else float(o.timeout_s)
        self.max_retries = int(o.max_retries)
        self.deadline_s = None if o.deadline_s is None else float(o.deadline_s)
        self.progress = bool(o.progress)
        self.state = endpoint_state(self.endpoint)
        if o.context_tokens:
            self.state.learn_context(int(o.context_tokens), "given")
        self._deadline: Optional[float] = None  # time.monotonic() value, set at the first chat request

    # -- helpers ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"OpenAIHTTPBackend(base_url={self.base_url!r}, model={self._model!r}, "
                f"api_key={'***' if self._key else None}, concurrency={self.concurrency}, "
                f"timeout_s={self.timeout_s}, max_retries={self.max_retries})")

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
            return min(retry_after, self.options.max_backoff_s)
        d = self.options.backoff_s * (2 ** attempt)
        return min(d * (1.0 + 0.1 * random.random()), self.options.max_backoff_s)

    def describe(self) -> dict:
        return {"backend": self.name, "model": self.model, "base_url": self.base_url,
                "constrain": self.options.constrain, "endpoint": self.state.describe()}

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

    def schema_sent(self, schema: Optional[dict]) -> Optional[dict]:
        """None with ``constrain="json"`` (JSON mode alone), else ``schema``."""
        return None if self.options.constrain == "json" else schema

    @property
    def context_tokens(self) -> Optional[int]:
        """The model's context in tokens, when known (given, listed, or learned from an overflow)."""
        return self.state.context_tokens

    def check(self) -> None:
        """``GET {base_url}/models``: the server answers, accepts the key, and serves the model
        (:func:`check_models`: the model set when none was given, its context when listed)."""
        check_models(self)

    def _remaining(self) -> Optional[float]:
        """Seconds left before the deadline (None without one)."""
        return None if self._deadline is None else self._deadline - time.monotonic()

    # -- chat ------------------------------------------------------------------------------
    def _chat(self, batch, *, max_tokens, temperature, json_mode, desc, on_result, schema=None):
        model = self.model  # resolve before going async
        if self.deadline_s is not None and self._deadline is None:
            self._deadline = time.monotonic() + self.deadline_s
        if self.options.constrain == "json":
            schema = None
        coro_fn = lambda: self._achat(batch, model, max_tokens, temperature, json_mode, schema, desc,  # noqa: E731
                                      on_result)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            results = asyncio.run(coro_fn())
        else:  # called from inside an event loop (e.g. a notebook): run in a worker thread
            with concurrent.futures.ThreadPoolExecutor(1) as ex:
                results = ex.submit(lambda: asyncio.run(coro_fn())).result()
        if self.options.raise_if_all_failed and results and all(
                r.error is not None and not r.error.startswith((REFUSED, CONTEXT_EXCEEDED)) for r in results):
            raise LLMRequestError(self._scrub(
                f"all {len(results)} requests to {self.base_url} failed; first error: {results[0].error}"))
        return results

    async def _achat(self, batch, model, max_tokens, temperature, json_mode, schema, desc, on_result):
        from tqdm.auto import tqdm

        limiter = Slot(self.state, self.concurrency)
        most = self.concurrency or MAX_AUTO_CONCURRENCY
        limits = httpx.Limits(max_connections=most, max_keepalive_connections=most)
        results: list[Optional[LLMResult]] = [None] * len(batch)
        bar = tqdm(total=len(batch), desc=desc or "llm", disable=not self.progress or len(batch) < 2, leave=False)
        async with httpx.AsyncClient(timeout=None, limits=limits, headers=self._headers()) as client:

            async def one(i: int, conv: list[dict]) -> None:
                body = {"model": model, "messages": conv, "max_tokens": max_tokens, "temperature": temperature}
                r = await self._one(client, limiter, body, json_mode, schema)
                results[i] = r
                bar.update(1)
                if on_result is not None:
                    on_result(i, r)

            try:
                await asyncio.gather(*(one(i, c) for i, c in enumerate(batch)))
            finally:
                bar.close()
        return results  # type: ignore[return-value]

    def _format(self, json_mode: bool, schema, plain: bool) -> tuple[Optional[dict], str]:
        """The request's ``response_format`` (None: none) in the form the endpoint takes, and that form."""
        if not json_mode or plain:
            return None, "none"
        form = (self.state.schema_form or "json_schema") if schema is not None else "json"
        return response_format(form, schema), form

    async def _one(self, client, limiter, base: dict, json_mode: bool, schema) -> LLMResult:
        """One request, with its retries (the class docstring)."""
        url = f"{self.base_url}/chat/completions"
        last_err, attempt, tries, plain = "no attempt", 0, 0, False
        ptoks = self.state.prompt_tokens(base["messages"])
        while tries < self.max_retries + 4:  # + the few re-sends that only change the request's form
            tries += 1
            body = dict(base)
            fmt, form = self._format(json_mode, schema, plain)
            if fmt is not None:
                body["response_format"] = fmt
            retry_after, again_now = None, False
            async with limiter as others:
                left = self._remaining()
                if left is not None and left <= 0:
                    last_err = f"deadline of {self.deadline_s:g}s passed (`deadline_s`)"
                    break
                limit = self.timeout_s or self.state.time_limit(ptoks, base["max_tokens"])
                limit = limit if left is None else min(limit, left)
                try:
                    reply, secs = await send_attempt(self, client, url, body, limit, others)
                    return self._result(reply, secs, base["messages"], ptoks, attempt)
                except HTTPStatusError as e:
                    last_err = f"HTTP {e.status}: {e.text[:300]}"
                    if e.status in (400, 422) and is_context_error(e.text):
                        self.state.learn_context(context_from_error(e.text), "an overflow error")
                        last_err = f"{CONTEXT_EXCEEDED} ({self.state.context_tokens or '?'} tokens): {e.text[:200]}"
                        break
                    if e.status in (400, 422, 500) and fmt is not None and is_constraint_error(e.text):
                        # (llama-cpp-python answers a response_format it does not know with HTTP 500)
                        if form == "json":
                            plain = True  # JSON mode refused: this request goes without it
                            log.warning("%s refused JSON mode for a request; sending it without",
                                        self.base_url)
                        else:
                            self.state.refuse_form(form, e.text)
                        continue
                    if e.status not in RETRY_STATUS:
                        break
                    retry_after = retry_after_s(e.retry_after)
                except Interrupted as e:
                    self.state.interrupted()
                    last_err, again_now = f"interrupted: {e}", True
                except WaitedOut:  # waited for already: never sent twice
                    last_err = (f"timeout after {limit:g}s, then waited for again up to {self.max_retries} "
                                f"times (a request is never sent twice while it may still run; `timeout_s`)")
                    break
                except (httpx.TimeoutException, asyncio.TimeoutError) as e:
                    last_err = f"timeout after {limit:g}s ({type(e).__name__}; `timeout_s`)"
                except httpx.TransportError as e:
                    last_err = f"{type(e).__name__}: {e}"
                except BadResponse as e:
                    last_err = str(e)
                    break
            if attempt >= self.max_retries:
                break
            delay = 0.0 if again_now else self._delay(attempt, retry_after)
            attempt += 1
            left = self._remaining()
            if left is not None and delay >= left:
                last_err += f"; deadline of {self.deadline_s:g}s reached before the next retry"
                break
            log.warning("LLM request failed (%s); retry %d/%d in %.2fs", self._scrub(last_err), attempt,
                        self.max_retries, delay)
            await asyncio.sleep(delay)
        err = self._scrub(f"{last_err} (after {attempt + 1} attempt(s))")
        log.warning("LLM request gave up: %s", err)
        return LLMResult(text="", error=err, retries=attempt)

    def _result(self, reply: Reply, secs: float, messages: list, ptoks: int, attempt: int) -> LLMResult:
        if reply.refusal:  # a refused request is a failed one: never cached, and the caller falls back
            why = " ".join(str(reply.refusal).split())[:200]
            return LLMResult(text="", latency_s=secs, error=f"{REFUSED} ({why})", retries=attempt)
        estimated = reply.prompt_tokens is None or reply.completion_tokens is None
        p = reply.prompt_tokens if reply.prompt_tokens is not None else ptoks
        c = reply.completion_tokens if reply.completion_tokens is not None else reply.chunks
        self.state.observe(int(p or 0), int(c or 0), reply.first_token_s, secs,
                           estimate_tokens(messages) if reply.prompt_tokens else 0)
        return LLMResult(text=reply.text, prompt_tokens=int(p or 0), completion_tokens=int(c or 0), latency_s=secs,
                         finish_reason=reply.finish_reason, retries=attempt, tokens_estimated=estimated)
