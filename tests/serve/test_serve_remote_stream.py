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


def test_a_ray_shard_streams_its_export_in_joined_pieces(monkeypatch):
    """The Ray shard's side (``BankShard.export_bank``, a generator read through
    ``handle.options(stream=True)``): None, then the pieces joined to about ``STREAM_BYTES``; an
    unknown bank: its refusal alone. The ingress's reader (``ray_app._streamed``) cancels the
    shard's stream when it stops early, and not after reading it to the end."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from trawmem_gpu.serve import ray_app

    monkeypatch.setattr(remote, "STREAM_BYTES", 400)
    shard = ray_app.BankShard.func_or_class.__new__(ray_app.BankShard.func_or_class)
    shard.service = _Service(25)

    class Gen:  # a Ray Serve response generator: async iterable, cancel()
        def __init__(self, items):
            self.items, self.cancelled = list(items), False

        def __aiter__(self):
            return self

        async def __anext__(self):
            if not self.items:
                raise StopAsyncIteration
            return self.items.pop(0)

        def cancel(self):
            self.cancelled = True

    async def main():
        got = [p async for p in shard.export_bank("b")]
        refused = [p async for p in shard.export_bank("x")]
        whole, early = Gen([b"a", b"b"]), Gen([b"a", b"b", b"c"])
        read = [p async for p in ray_app._streamed(whole)]
        it = ray_app._streamed(early)
        first = await it.__anext__()
        await it.aclose()
        return got, refused, whole, read, early, first

    got, refused, whole, read, early, first = asyncio.run(main())
    assert got[0] is None and [len(p) for p in got[1:]] == [400, 400, 200]
    assert b"".join(got[1:]) == b"".join(shard.service.piece(i) for i in range(25))
    assert len(refused) == 1 and refused[0]["error"] == "refused"
    assert read == [b"a", b"b"] and not whole.cancelled
    assert first == b"a" and early.cancelled
