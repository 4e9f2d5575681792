"""An export crosses the ``--http-workers`` wire as it is read (``serve/remote.py``: ``Streamed``):
the engine process keeps the export's pieces and sends about ``STREAM_BYTES`` per ``stream_next``
call, so neither process holds the whole export; a reader that stops early ends the engine's side.
The wire in one process: the real endpoint and front backend around a fake service."""
from __future__ import annotations

import asyncio
import os
import tempfile

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")

from trawmem_gpu.serve import remote  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from trawmem_gpu.serve.remote import EngineEndpoint, RemoteBackend  # noqa: E402


class _Service:
    """An engine service whose export is ``n`` pieces of 40 bytes, counting those made and noting
    when its generator was closed."""

    ready, dim, encoder_id = True, 4, "fake"

    def __init__(self, n: int):
        from trawmem_gpu.select.params import QueryParams

        self.defaults, self.n, self.made, self.closed = QueryParams(), n, 0, False

    def queue_depth(self) -> int:
        return 0

    def piece(self, i: int) -> bytes:
        return f"{i:08d}".encode() * 4 + b"\n" * 8

    async def export_bank(self, bank_id, where=None, vectors=False):
        if bank_id != "b":
            from trawmem_gpu.errors import UnknownBank

            raise UnknownBank(f"no bank {bank_id!r}")

        async def pieces():
            try:
                for i in range(self.n):
                    self.made += 1
                    yield self.piece(i)
                    await asyncio.sleep(0)
            finally:
                self.closed = True
        return pieces()


def _run(service, body, monkeypatch):
    monkeypatch.setattr(remote, "STREAM_BYTES", 400)  # 10 pieces a call
    path = os.path.join(tempfile.mkdtemp(prefix="tm-stream-"), "e.sock")

    async def main():
        endpoint = EngineEndpoint(service, path)
        await endpoint.start()
        be = RemoteBackend(path, ServeConfig(), on_engine_lost=lambda: None)
        await be.start()
        try:
            return await body(be)
        finally:
            await be.stop()
            await endpoint.close()

    return asyncio.run(main())


def test_an_export_crosses_in_calls_as_it_is_read(monkeypatch):
    svc = _Service(95)
    calls = []

    async def body(be):
        real = be._call

        async def counted(op, *args):
            calls.append(op)
            return await real(op, *args)

        be._call = counted
        it = await be.export_bank("b")
        assert not isinstance(it, bytes)
        first = await it.__anext__()
        made_after_first = svc.made
        rest = [p async for p in it]
        return first, made_after_first, rest

    first, made_after_first, rest = _run(svc, body, monkeypatch)
    assert b"".join([first, *rest]) == b"".join(svc.piece(i) for i in range(95))
    assert len(first) == 400 and made_after_first <= 11  # one call's pieces, not the whole export
    assert calls.count(remote.NEXT) == 11  # 9 calls of 10 pieces, 1 of the last 5, 1 answering the end
    assert svc.closed


def test_a_reader_that_stops_early_ends_the_engines_side(monkeypatch):
    svc = _Service(10_000)

    async def body(be):
        it = await be.export_bank("b")
        got = [await it.__anext__() for _ in range(2)]
        await it.aclose()
        for _ in range(200):  # the close crosses; bounded wait for the engine side to end
            if svc.closed:
                break
            await asyncio.sleep(0.01)
        return got

    got = _run(svc, body, monkeypatch)
    assert len(got) == 2 and svc.closed and svc.made < 100


def test_an_unknown_bank_fails_before_any_piece(monkeypatch):
    from trawmem_gpu.errors import UnknownBank

    async def body(be):
        with pytest.raises(UnknownBank, match="no bank 'x'"):
            await be.export_bank("x")
        return True

    assert _run(_Service(3), body, monkeypatch)
