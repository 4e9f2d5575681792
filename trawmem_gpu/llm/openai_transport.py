"""One attempt of a request to an OpenAI-compatible server (``llm.openai_http``): the endpoint's
place in flight it holds, its send (streamed where the server streams, else plain) and the wait for
its answer that never sends a request twice while it may still run.

The functions take the backend (:class:`~trawmem_gpu.llm.openai_http.OpenAIHTTPBackend`) for its
options, its endpoint's state and its deadline; the retries around an attempt are the backend's."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Optional

from trawmem_gpu.aio import within
from trawmem_gpu.errors import loads_json
from trawmem_gpu.llm.openai_wire import BadResponse, HTTPStatusError, Reply, parse_completion, read_stream

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})
"""HTTP statuses of a transient failure: the request (or ``GET /models``) is tried again."""
_IDS = itertools.count()


class WaitedOut(asyncio.TimeoutError):
    """A request waited for ``max_retries + 1`` limits without an answer (never sent again)."""


class Slot:
    """One of the endpoint's places in flight (``EndpointState.try_enter``), shared by every batch
    and backend of the process that sends to it; waited for by polling (another thread's batch
    may give it back), given back on leaving, whatever ended the request."""

    POLL_S = 0.02
    """Seconds between two looks for a free place."""

    def __init__(self, state, configured: Optional[int]) -> None:
        self.state, self.configured = state, configured

    async def __aenter__(self) -> int:
        while (others := self.state.try_enter(self.configured)) is None:
            await asyncio.sleep(self.POLL_S)
        return others

    async def __aexit__(self, *exc) -> None:
        self.state.leave()


async def send_attempt(backend: "OpenAIHTTPBackend", client, url: str, body: dict, limit: float,
                       others: int) -> tuple[Reply, float]:
    """Send one attempt, streamed where the server streams (closed at ``limit``: the server
    stops it), else plain; returns the reply and its seconds. Until a reply shows that the
    server streams, a request without an answer is waited for (:func:`wait_reply`), as a plain one."""
    rid = next(_IDS)
    t0 = time.perf_counter()
    stream = backend.options.stream and backend.state.streams is not False
    if stream:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        backend.state.started(rid, others)
    streamed = False
    task = asyncio.ensure_future(client.send(client.build_request("POST", url, json=body), stream=True))
    try:
        resp = await wait_reply(backend, task, limit, soft=not (stream and backend.state.streams))
        try:
            if resp.status_code != 200:
                raise HTTPStatusError(resp.status_code, (await resp.aread()).decode("utf-8", "replace"),
                                      resp.headers.get("retry-after"))
            left = max(0.05, limit - (time.perf_counter() - t0))
            if "text/event-stream" not in resp.headers.get("content-type", ""):
                if stream:
                    backend.state.streams = False  # a server that ignores `stream`: plain from now on
                return parse_completion(completion_json(await within(resp.aread(), left))), \
                    time.perf_counter() - t0
            streamed = True
            backend.state.saw_stream()
            reply = await within(read_stream(resp, t0, lambda: backend.state.first_token(rid)), left)
            return reply, time.perf_counter() - t0
        finally:
            await resp.aclose()
    finally:
        if stream:
            backend.state.finished(rid, streamed)

async def wait_reply(backend: "OpenAIHTTPBackend", task, limit: float, soft: bool):
    """``task``'s response (its headers). ``soft`` (a reply that may not be cancellable: the
    server does not stream, or has not shown that it does): a timeout waits for it again, up
    to ``max_retries`` times, rather than sending it twice (:class:`WaitedOut` after the last)."""
    t0 = time.perf_counter()
    try:
        waits = backend.max_retries + 1 if soft else 1
        for k in range(waits):
            left = backend._remaining()
            if left is not None and left <= 0:  # the deadline, not the waits, ended it
                raise asyncio.TimeoutError()
            done, _ = await asyncio.wait({task}, timeout=limit if left is None else min(limit, left))
            if done:
                return task.result()
            if k < waits - 1:
                log.warning("LLM request still running after %.0fs; waiting for it (not sending it again)",
                            time.perf_counter() - t0)
        raise WaitedOut() if soft and waits > 1 else asyncio.TimeoutError()
    finally:
        if not task.done():
            task.cancel()


def completion_json(raw: bytes):
    try:
        data = loads_json(raw)
    except ValueError:
        raise BadResponse(f"malformed completion response: {raw[:200]!r}") from None
    if not isinstance(data, dict):
        raise BadResponse(f"malformed completion response: {raw[:200]!r}")
    return data
