"""The sync client's wall-clock bound: a transport whose every socket operation waits at most
until the current call's deadline.

httpx's timeouts are per operation (each read may wait ``timeout``), so a server that sends one
byte just before each read would time out holds a call for as long as it likes. Here the
network backend under httpx's own connection pool (:class:`httpx.HTTPTransport`) is wrapped:
each connect, TLS handshake, read and write is given ``min(its timeout, what is left of the
call)``, and one that would start past the deadline fails at once as httpx's own timeout. The
deadline is a context variable the client sets for the length of a call (:func:`deadline_at`),
so calls in other threads sharing one ``Client`` each keep their own, and a connection reused
from the pool serves whichever call holds it. With no call's deadline set (an ``httpx.Client``
used directly), the transport is httpx's own.
"""
from __future__ import annotations

import contextvars
import time
from contextlib import contextmanager
from typing import Iterator

import httpcore
import httpx

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("trawmem_client_deadline", default=None)


@contextmanager
def deadline_at(end: float) -> Iterator[None]:
    """Socket operations of this context (thread) wait at most until ``end`` (``time.monotonic()``)."""
    token = _DEADLINE.set(end)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _clamp(timeout: float | None, error: type[Exception]) -> float | None:
    end = _DEADLINE.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise error("the call's deadline has passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _clamp(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend):
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _Stream(self._inner.connect_tcp(host, port, _clamp(timeout, httpcore.ConnectTimeout), local_address,
                                               socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _Stream(self._inner.connect_unix_socket(path, _clamp(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def deadline_transport(**kw) -> httpx.HTTPTransport:
    """``httpx.HTTPTransport(**kw)``, its socket operations cut to the current call's deadline:
    give it to an ``httpx.Client`` of your own (``http=``) to keep :class:`~.Client`'s bound."""
    transport = httpx.HTTPTransport(**kw)
    pool = getattr(transport, "_pool", None)
    if isinstance(getattr(pool, "_network_backend", None), httpcore.NetworkBackend):
        pool._network_backend = _Backend(pool._network_backend)
    return transport


def is_bounded(transport) -> bool:
    """Whether ``transport`` cuts its socket operations to the call's deadline (an httpx upgrade
    that moved the pool's backend would make this False: the tests check it)."""
    return isinstance(getattr(getattr(transport, "_pool", None), "_network_backend", None), _Backend)
