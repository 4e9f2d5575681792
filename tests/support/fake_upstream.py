"""A fake OpenAI-compatible inference server for the chat-completions proxy's tests and benchmark:
a real HTTP server (FastAPI under uvicorn on 127.0.0.1, a daemon thread) that records every
request it receives and answers as :attr:`FakeUpstream.mode` says.

Modes: ``ok`` (a completion, or with ``stream: true`` :data:`SSE_EVENTS` as server-sent events),
``429`` / ``500`` (an error body of its own), ``slow`` (answers after ``delay_s``). ``tokenize``:
whether ``POST /tokenize`` exists (it counts a token per ``chars_per_token`` characters, llama.cpp's
``{"tokens": [...]}``).
"""
from __future__ import annotations

import asyncio
import json
import threading

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

ANSWER = "Ana walked home because her knee hurt."
SSE_EVENTS = ["Ana walked ", "home because ", "her knee hurt."]


def sse_bytes(pieces=SSE_EVENTS) -> bytes:
    """The exact stream the fake sends: one ``data:`` event per piece, then ``[DONE]``."""
    out = [b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n']
    for p in pieces:
        ev = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": p}}]}
        out.append(b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def completion(text: str = ANSWER) -> dict:
    return {"id": "c1", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class FakeUpstream:
    """``with FakeUpstream() as up: up.url`` (``http://127.0.0.1:PORT/v1``); ``up.received``: the
    chat requests as ``(headers, body)``, ``up.tokenized``: the texts sent to ``/tokenize``."""

    def __init__(self, tokenize: bool = True, chars_per_token: int = 4, record: bool = True):
        self.mode, self.delay_s, self.tokenize, self.chars_per_token = "ok", 0.0, tokenize, chars_per_token
        self.record, self.received, self.tokenized = record, [], []
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = json.loads(await request.body())
            if self.record:
                with self.lock:
                    self.received.append((dict(request.headers), body))
            if self.mode == "slow":
                await asyncio.sleep(self.delay_s)
            if self.mode in ("429", "500"):
                return JSONResponse({"error": {"message": f"fake {self.mode}", "type": "fake"}}, int(self.mode),
                                    headers={"retry-after": "7"} if self.mode == "429" else None)
            if body.get("stream"):
                async def events():
                    data = sse_bytes()
                    for i in range(0, len(data), 50):  # in several chunks, as a server flushes them
                        yield data[i:i + 50]
                return StreamingResponse(events(), media_type="text/event-stream")
            return Response(json.dumps(completion()), media_type="application/json")

        @app.post("/tokenize")
        async def tokenize(request: Request):
            if not self.tokenize:
                return JSONResponse({"detail": "Not Found"}, 404)
            text = json.loads(await request.body())["content"]
            with self.lock:
                self.tokenized.append(text)
            return {"tokens": list(range(-(-len(text) // self.chars_per_token)))}

        self.app = app

    def __enter__(self) -> "FakeUpstream":
        from trawmem_gpu.serve.config import ServeConfig
        from trawmem_gpu.serve.server import BackgroundServer

        self.server = BackgroundServer(self.app, ServeConfig(max_connections=4096)).__enter__()
        self.url = self.server.url + "/v1"
        return self

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)
