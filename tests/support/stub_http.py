"""A scripted HTTP server on 127.0.0.1 for the client's tests: request i gets ``answers[i]`` (the
last one again past the end), written raw, so a test can send any status, header or body
(JSON of the wrong shape, bytes that are not JSON), or trickle it one byte at a time.

It stops by itself: each connection is closed after one answer, a trickle ends when its bytes
are sent, when the client hangs up or when the stub is shut down, and the server answers at most
``max_requests`` requests (later ones are dropped unanswered)."""
from __future__ import annotations

import asyncio
import functools
import json
import ssl
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Answer:
    """One raw answer: ``body`` bytes as they are, anything else JSON-encoded; ``trickle_s`` > 0
    sends one byte every ``trickle_s`` seconds from byte ``trickle_from`` of the whole answer
    (status line included: 0 trickles the headers too); ``delay_s`` waits before answering."""

    status: int = 200
    body: object = b""
    headers: dict = field(default_factory=dict)
    trickle_s: float = 0.0
    trickle_from: int = 0
    delay_s: float = 0.0

    def raw(self) -> bytes:
        body = self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()
        head = [f"HTTP/1.1 {self.status} Stub", "Content-Type: application/json",
                f"Content-Length: {len(body)}", "Connection: close",
                *(f"{k}: {v}" for k, v in self.headers.items())]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Stub:
    url: str
    answers: list[Answer]
    seen: list[tuple[str, str, bytes]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def _write(wfile, a: Answer, stop: threading.Event) -> None:
    raw = a.raw()
    if a.delay_s and stop.wait(a.delay_s):
        return
    if not a.trickle_s:
        wfile.write(raw)
        return
    wfile.write(raw[:a.trickle_from])
    for i in range(a.trickle_from, len(raw)):
        if stop.wait(a.trickle_s):
            return
        wfile.write(raw[i:i + 1])


@contextmanager
def stub_http(answers: list[Answer], max_requests: int = 1000):
    """A :class:`Stub` serving ``answers`` (a list the test may change between calls)."""
    stub = Stub("", list(answers))

    class H(BaseHTTPRequestHandler):
        def _answer(self):
            n = int(self.headers.get("content-length") or 0)
            stub.seen.append((self.command, self.path, self.rfile.read(n)))
            self.close_connection = True
            if len(stub.seen) > max_requests or stub.stop.is_set():
                return
            a = stub.answers[min(len(stub.seen), len(stub.answers)) - 1]
            try:
                _write(self.wfile, a, stub.stop)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client hung up (its deadline): the trickle ends here

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    stub.url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        yield stub
    finally:
        stub.stop.set()
        srv.shutdown()
        srv.server_close()


@functools.cache
def _tls():
    return ssl.create_default_context()  # built once: a client's own costs tens of ms, per client


def call(side: str, url: str, name: str, *args, **client_kw):
    """``Client(url, **client_kw).name(*args)`` (``side`` "sync") or the same on an ``AsyncClient``
    ("async"), on an httpx client as the client's own but for a shared TLS context; closed after."""
    import httpx

    from trawmem_gpu import client as tc
    from trawmem_gpu.client.transport import deadline_transport

    if side == "sync":
        with httpx.Client(transport=deadline_transport(verify=_tls())) as http, tc.Client(url, http=http,
                                                                                         **client_kw) as c:
            return getattr(c, name)(*args)

    async def go():
        async with httpx.AsyncClient(verify=_tls()) as http, tc.AsyncClient(url, http=http, **client_kw) as c:
            return await getattr(c, name)(*args)
    return asyncio.run(go())


def timed(fn, *args, **kw):
    """(the exception ``fn`` raised or None, seconds it took)."""
    t0 = time.monotonic()
    try:
        fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - the tests look at which one
        return e, time.monotonic() - t0
    return None, time.monotonic() - t0
