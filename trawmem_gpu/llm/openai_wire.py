"""The OpenAI chat-completions wire format: the ``response_format`` of a structured request, and
the reply read from a JSON body or from a server-sent event stream (``stream: true``)."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Callable, Optional

from trawmem_gpu.errors import loads_json

REFUSED = "the model refused the request"
"""How a refused request's error begins (a reply with ``refusal`` or a content-filter stop)."""
CONTEXT_EXCEEDED = "the prompt and its reply budget exceed the model's context"
"""How the error of a request too long for the model's context begins (it is not retried as it is:
the caller sends a shorter one)."""


class BadResponse(Exception):
    """A 200 response whose body is not a chat completion."""


class HTTPStatusError(Exception):
    """A non-200 response: its status, body text and ``Retry-After`` header."""

    def __init__(self, status: int, text: str, retry_after: Optional[str] = None) -> None:
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status, self.text, self.retry_after = status, text, retry_after


class Interrupted(Exception):
    """A stream that ended without a finish reason: the server cut it short (llama.cpp's server
    stops a streaming request when the next one arrives) or the connection dropped."""


@dataclass
class Reply:
    """What one successful response said."""

    text: str
    finish_reason: Optional[str]
    prompt_tokens: Optional[int]
    """As the server reported them (None: it did not)."""
    completion_tokens: Optional[int]
    chunks: int = 0
    """Content chunks of a stream (one token each on llama.cpp)."""
    first_token_s: Optional[float] = None
    """Seconds from sending to the first streamed token."""
    refusal: Optional[str] = None


def schema_name(schema: dict) -> str:
    """A name for a schema (OpenAI's ``json_schema.name``): its title, else a digest."""
    title = schema.get("title") if isinstance(schema, dict) else None
    if isinstance(title, str) and title.replace("_", "").isalnum():
        return title[:64]
    raw = json.dumps(schema, sort_keys=True).encode()
    return "reply_" + hashlib.sha256(raw).hexdigest()[:12]


def response_format(form: str, schema: Optional[dict]) -> Optional[dict]:
    """The ``response_format`` of a structured request: ``form`` one of ``endpoint.SCHEMA_FORMS``
    (``json`` or no schema: plain JSON mode)."""
    if schema is None or form == "json":
        return {"type": "json_object"}
    if form == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": schema_name(schema), "schema": schema, "strict": True}}
    return {"type": "json_object", "schema": schema}


def parse_completion(data: dict) -> Reply:
    """A JSON chat-completion body as a :class:`Reply` (``BadResponse`` when it is none)."""
    try:
        choice = data["choices"][0]
        msg = choice.get("message") or {}
        text = msg.get("content")
        if text is None:
            text = choice.get("text") or ""
        usage = data.get("usage") or {}
        refusal = msg.get("refusal") or ("content filter" if choice.get("finish_reason") == "content_filter" else None)
        return Reply(str(text), choice.get("finish_reason"), _int(usage.get("prompt_tokens")),
                     _int(usage.get("completion_tokens")), refusal=refusal)
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise BadResponse(f"malformed completion response ({type(e).__name__}): {str(data)[:200]}") from None


def _int(v) -> Optional[int]:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


async def read_stream(resp, t0: float, on_first: Callable[[], None]) -> Reply:
    """Read a server-sent event stream of chat-completion chunks into one :class:`Reply`
    (``on_first`` called at the first content token). A stream without a finish reason raises
    :class:`Interrupted`; an ``error`` event, :class:`HTTPStatusError`."""
    parts: list[str] = []
    finish = refusal = None
    ptoks = ctoks = None
    chunks = 0
    first_s = None
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue  # comments (": ping"), event names, blank separators
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            data = loads_json(payload)
        except ValueError:
            raise BadResponse(f"malformed stream event: {payload[:200]}") from None
        if not isinstance(data, dict):
            raise BadResponse(f"malformed stream event: {payload[:200]}")
        if data.get("error"):
            err = data["error"]
            raise HTTPStatusError(int(err.get("code") or 500) if isinstance(err, dict) and
                                  str(err.get("code", "")).isdigit() else 500, json.dumps(err)[:500])
        usage = data.get("usage") or {}
        ptoks = _int(usage.get("prompt_tokens")) or ptoks
        ctoks = _int(usage.get("completion_tokens")) or ctoks
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            if piece:
                if first_s is None:
                    first_s = time.perf_counter() - t0
                    on_first()
                parts.append(str(piece))
                chunks += 1
            refusal = delta.get("refusal") or refusal
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    if finish is None and refusal is None:
        raise Interrupted("the stream ended before the reply was complete (no finish reason)")
    if finish == "content_filter":
        refusal = refusal or "content filter"
    return Reply("".join(parts), finish, ptoks, ctoks, chunks, first_s, refusal)
