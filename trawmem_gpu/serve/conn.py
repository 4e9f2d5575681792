"""Connection limits of the HTTP server: a cap on open connections and a header timeout.

uvicorn bounds idle keep-alive connections (``timeout_keep_alive``) but not a connection that
never finishes its request headers: a client can open hundreds and trickle a byte a second
(slow headers), or open them and send nothing. Its ``limit_concurrency`` answers 503 to *every*
request once that many connections are open, the victims' requests on their open connections
included. :func:`bounded_protocol` gives uvicorn's HTTP protocol (httptools when installed, the
server's default, else h11) two bounds instead:

* **connection cap** (``max_connections``): a connection opened while that many are open is
  closed at once; the open ones keep being served;
* **header timeout** (``header_timeout_s``): from the moment a connection opens, and from the
  first byte of each later request on it, its headers must be complete within the timeout, or it
  gets ``408`` and is closed. Each connection's timer runs for a share of the timeout drawn at
  random between ``1 - HEADER_SPREAD`` and 1 (:func:`header_delay`): hundreds of slow connections
  opened together would otherwise all be closed in one pass of the event loop, and reopened
  together by their client, at every timeout, a pause for every other tenant's requests; spread
  over a quarter of the timeout, they cost as much, a few at a time.

The body's own deadline (``body_timeout_s``) is the ASGI edge's (:class:`.app._Edge`), which
reads every body before the route sees it.
"""
from __future__ import annotations

import asyncio
import random
import socket

_408_BODY = b'{"detail": "request headers not complete within the header timeout"}'
_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(_408_BODY)).encode() + b"\r\nconnection: close\r\n\r\n" + _408_BODY)


HEADER_SPREAD = 0.25
"""Largest share of the header timeout a connection's timer may be shortened by (:func:`header_delay`)."""


def header_delay(timeout_s: float, draw=random.random) -> float:
    """Seconds a connection's header timer runs: ``timeout_s`` shortened by a random share of at
    most :data:`HEADER_SPREAD` (never longer than the timeout). Legitimate clients send their
    headers in milliseconds, so the shorter timers cost them nothing."""
    return timeout_s * (1.0 - HEADER_SPREAD * draw())


def _base_protocol() -> type:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # pragma: no cover - no httptools: h11 (the header timeout covers new connections only)
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def _no_delay(transport) -> None:
    """Turn Nagle's algorithm off on an accepted TCP connection (``TCP_NODELAY``).

    uvicorn writes a response's head and its body in separate writes; with Nagle on, the body waits
    for the client's acknowledgement of the head, which a client delays by up to 40 ms (delayed ACK):
    every request after the first on a kept-alive connection then took 40-48 ms, even ``/healthz``.
    The event loop (uvloop here) leaves the option as the listening socket had it."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # pragma: no cover - a socket closed under us: nothing to tune
            pass


def bounded_protocol(cfg) -> type:
    """uvicorn's HTTP protocol class with ``cfg.max_connections`` and ``cfg.header_timeout_s``."""
    base = _base_protocol()
    cap, header_s = int(cfg.max_connections), float(cfg.header_timeout_s)

    class BoundedHTTP(base):
        max_connections = cap
        header_timeout_s = header_s
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            full = len(self.connections) >= self.max_connections
            _no_delay(transport)
            super().connection_made(transport)
            if full:  # over the cap: this new one goes, the open ones stay
                transport.close()
                return
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:  # a request's first byte (httptools)
            super().on_message_begin()
            if self._header_timer is None:  # a later request on a kept-alive connection
                self._arm_header_timer()

        def on_headers_complete(self) -> None:
            self._cancel_header_timer()
            super().on_headers_complete()

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_delay(self.header_timeout_s), self._header_late)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being answered (h11 gives no headers-complete hook)
            self.transport.write(_408)
            self.transport.close()

    if not hasattr(base, "on_headers_complete"):  # h11: no parser callbacks; the timer covers a new connection
        def handle_events(self) -> None:
            base.handle_events(self)
            if self.cycle is not None:
                self._cancel_header_timer()

        BoundedHTTP.handle_events = handle_events
    return BoundedHTTP
