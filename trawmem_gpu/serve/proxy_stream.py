"""The chat-completions proxy's side toward the upstream inference server (:mod:`.proxy` is the
route): one pooled ``httpx.AsyncClient``, the ``/tokenize`` probe, and forwarding with the
upstream's answer passed back as it came (its status, its body; a stream's bytes unchanged)
while the answer's text is read off it for the append.

Errors the proxy answers itself are in OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``): the upstream did not answer in time (504),
could not be reached (502). An upstream error (a 429, a 500) is the upstream's own status and body.
"""
from __future__ import annotations

import json
import logging
import os
import time

import httpx
from fastapi.responses import Response, StreamingResponse

from ..errors import loads_json

log = logging.getLogger(__name__)

PASSED_HEADERS = ("content-type", "cache-control", "retry-after", "x-request-id")
"""The upstream's response headers the proxy passes back (the others are hop-by-hop or its own)."""


TOKENIZE = {"/tokenize": lambda text: {"content": text, "prompt": text},
            "/extras/tokenize": lambda text: {"input": text}}
"""The upstream's tokenize endpoints tried, in order, and each one's body (llama.cpp's and vLLM's
servers, then llama-cpp-python's)."""


def openai_error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict | None = None) -> Response:
    """An error answer in OpenAI's shape, naming the field at fault in ``param``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return Response(json.dumps(body), status_code=status, media_type="application/json", headers=headers)


class ProxyRefusal(Exception):
    """A proxied request refused before anything was forwarded (answered by :func:`openai_error`)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def response(self) -> Response:
        kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}.get(
            self.status, "invalid_request_error")
        return openai_error(self.status, self.message, self.param, kind, self.code, self.headers)


def sse_text(buf: bytes) -> str:
    """The answer text of an OpenAI server-sent-events stream: every ``data:`` event's
    ``choices[0].delta.content``, joined (events that are not JSON, or carry none, add nothing)."""
    out = []
    for line in buf.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            continue
        try:
            ev = loads_json(data)
            piece = ev["choices"][0]["delta"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
        if isinstance(piece, str):
            out.append(piece)
    return "".join(out)


def completion_text(raw: bytes) -> str:
    """The answer text of a (non-streamed) chat completion: ``choices[0].message.content`` ("" if none)."""
    try:
        text = loads_json(raw)["choices"][0]["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""
    return text if isinstance(text, str) else ""


class Upstream:
    """The inference server behind the proxy: ``base`` is its OpenAI base URL (``.../v1``); its own
    key is read from the environment variable ``key_env`` (never the caller's)."""

    def __init__(self, base: str, key_env: str, timeout_s: float, metrics=None):
        self.base = base.rstrip("/")
        self.root = self.base[:-3] if self.base.endswith("/v1") else self.base
        self.key_env, self.timeout_s, self.metrics = key_env, timeout_s, metrics
        self._client: httpx.AsyncClient | None = None
        self._tokenize: str | bool | None = None  # the endpoint's path; None: not probed yet, False: none

    @property
    def client(self) -> httpx.AsyncClient:
        """The pooled client (made on first use, inside the server's event loop)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s),
                                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def headers(self) -> dict:
        out = {"content-type": "application/json", "accept-encoding": "identity"}
        key = os.environ.get(self.key_env, "")
        if key:
            out["authorization"] = f"Bearer {key}"
        return out

    async def _count(self, path: str, text: str) -> int | None:
        """``text``'s token count from the upstream's tokenize endpoint ``path`` (None: none there)."""
        try:
            r = await self.client.post(self.root + path, json=TOKENIZE[path](text), headers=self.headers())
            data = loads_json(r.content) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        n = data.get("count") if isinstance(data, dict) else None
        if n is None and isinstance(data, dict) and isinstance(data.get("tokens"), list):
            n = len(data["tokens"])
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    async def count_tokens(self, text: str) -> int | None:
        """``text``'s length in the model's own tokens from the upstream's tokenize endpoint
        (:data:`TOKENIZE`: llama.cpp's and vLLM's ``POST /tokenize``, llama-cpp-python's
        ``POST /extras/tokenize``); None where the upstream has none (probed once: the first
        endpoint that answers is the one asked from then on, and an upstream without one is not
        asked again) or the call fails."""
        if self._tokenize is False:
            return None
        if self._tokenize is None:
            for path in TOKENIZE:
                n = await self._count(path, text)
                if n is not None:
                    self._tokenize = path
                    break
            else:
                self._tokenize = False
            log.info("upstream %s: tokenize endpoint %s", self.root, self._tokenize or "absent")
            return n if self._tokenize else None
        return await self._count(self._tokenize, text)

    def _observe(self, t0: float, outcome: str) -> None:
        if self.metrics is not None and self.metrics.proxy_requests is not None:
            self.metrics.proxy_upstream_seconds.observe(time.perf_counter() - t0)
            self.metrics.proxy_requests.labels(outcome).inc()

    def _failed(self, e: httpx.HTTPError, t0: float) -> Response:
        if isinstance(e, httpx.TimeoutException):
            self._observe(t0, "timeout")
            return openai_error(504, f"the upstream did not answer within {self.timeout_s:g} s (the server's "
                                     "`upstream_timeout_s`)", kind="timeout", code="upstream_timeout")
        self._observe(t0, "unreachable")
        return openai_error(502, f"the upstream could not be reached ({type(e).__name__})", kind="api_error",
                            code="upstream_unreachable")

    def _passed(self, r: httpx.Response) -> dict:
        return {k: v for k, v in r.headers.items() if k.lower() in PASSED_HEADERS}

    async def forward(self, body: dict, extra_headers: dict, done) -> Response:
        """``body`` sent to ``/chat/completions`` and its answer passed back; ``done(text)`` is
        called with the answer's text once a 200 answer is complete (not on errors)."""
        t0 = time.perf_counter()
        payload = json.dumps(body).encode()
        try:
            r = await self.client.post(self.base + "/chat/completions", content=payload, headers=self.headers())
        except httpx.HTTPError as e:
            return self._failed(e, t0)
        self._observe(t0, "ok" if r.status_code == 200 else "upstream_error")
        if r.status_code == 200:
            done(completion_text(r.content))
        return Response(r.content, status_code=r.status_code, headers={**self._passed(r), **extra_headers})

    async def stream(self, body: dict, extra_headers: dict, done) -> Response:
        """As :meth:`forward`, for ``stream: true``: the upstream's bytes go back as they arrive,
        unchanged; an error status is answered with its whole body."""
        t0 = time.perf_counter()
        req = self.client.build_request("POST", self.base + "/chat/completions", content=json.dumps(body).encode(),
                                        headers=self.headers())
        try:
            r = await self.client.send(req, stream=True)
        except httpx.HTTPError as e:
            return self._failed(e, t0)
        if r.status_code != 200:
            try:
                raw = await r.aread()
            except httpx.HTTPError as e:
                return self._failed(e, t0)
            finally:
                await r.aclose()
            self._observe(t0, "upstream_error")
            return Response(raw, status_code=r.status_code, headers={**self._passed(r), **extra_headers})

        async def relay():
            seen, outcome = [], "ok"
            try:
                async for chunk in r.aiter_raw():
                    seen.append(chunk)
                    yield chunk
            except httpx.HTTPError as e:  # cut mid-stream: the client sees the stream end early
                outcome = "timeout" if isinstance(e, httpx.TimeoutException) else "unreachable"
                log.warning("upstream stream cut: %s", type(e).__name__)
            finally:
                await r.aclose()
                self._observe(t0, outcome)
            if outcome == "ok":
                done(sse_text(b"".join(seen)))

        return StreamingResponse(relay(), status_code=200, headers={**self._passed(r), **extra_headers})
