"""Export and import of one bank through the server (``GET /v1/banks/{bank_id}/export``,
``POST /v1/banks/{bank_id}/import``): the service's side, run on its append threads.

The format and both directions are ``memory.export``'s (``export`` / ``import_``, the same code as
``Memory.export`` and ``trawmem import``); :class:`ServedMemory` gives them the part of ``Memory``
they call, over the service's own core: a bank's turns and facts appended in one commit as an
append request's turns are (``memory.export_commit``: the append encoder, the bank's write lock,
the engine refreshed on the batch worker before the answer). The export is streamed in pieces
made on an append thread from one revision of the bank; the import reads the request body's
lines as it takes them (:func:`body_lines`, a byte bound per line).
"""
from __future__ import annotations

import asyncio

from ..errors import InputError
from ..memory.export import LineTooLong
from .batcher import ShuttingDown


class BodyTooLarge(LineTooLong):
    """An import's body past ``max_body_bytes`` (413), seen as it is read."""


class BodyTimeout(InputError):
    """An import's body not received within ``body_timeout_s`` (408)."""


class ServedMemory:
    """The members of ``Memory`` that ``memory.export`` uses, over a ``SelectionService``."""

    def __init__(self, service, where=None):
        self.s, self.where = service, where
        self._core = service.core

    @property
    def path(self):
        return self._core.path

    @property
    def encoder_id(self) -> str:
        return self._core.encoder.id

    def turns(self, bank_id: str) -> list:
        bank = self._core.registry.get(bank_id)
        if bank is None:
            raise self._core.registry.absent(bank_id)
        self._core.touch(bank_id)
        return list(bank.turns)

    def _publish(self, bank_id: str, bank) -> None:
        prepared = self.s.engines.prepare(bank)  # here, on the append thread
        self.s.worker.submit(self.s._sync_bank, bank_id, prepared).result()  # published between batches

    @property
    def llm(self):
        return self.s.llm

    def _import_encoder(self):
        return self.s.append_encoder()

    def add_facts(self, bank_id: str, facts) -> dict:
        from ..memory.facts import add_facts

        res = add_facts(self._core.registry, bank_id, facts, self.s.append_encoder())
        self._publish(bank_id, res["bank"])
        return {"bank_id": bank_id, "added": res["added"]}


CHUNK_BYTES = 16 << 10
"""An export is sent in pieces of about this many bytes (each made on an append thread)."""


def export_chunks(service, bank_id: str, where=None, vectors: bool = False):
    """Bank ``bank_id`` as an export (header and the bank) in pieces of about :data:`CHUNK_BYTES`,
    made as they are taken, from the revision read here (``memory.export._snapshot``: a later append
    or forget does not change what is sent); only the turns passing ``where`` (and the facts whose
    sources all do); ``UnknownBank`` here, before any piece, when there is no such bank."""
    from ..memory.export import _snapshot, export_lines

    mem = ServedMemory(service, where)
    mem.turns(bank_id)  # UnknownBank / QuarantinedBank before any line is made
    lines = export_lines(mem, [bank_id], where, vectors, snaps={bank_id: _snapshot(mem, bank_id)})
    return _pieces(lines)


def _pieces(lines):
    buf, n = [], 0
    for line in lines:
        b = line.encode("utf-8")
        buf.append(b)
        n += len(b)
        if n >= CHUNK_BYTES:
            yield b"".join(buf)
            buf, n = [], 0
    if buf:
        yield b"".join(buf)


async def regrouped(pieces, size: int):
    """The byte pieces of the async iterator ``pieces`` joined into pieces of about ``size`` bytes
    (never split): what crosses a process boundary per call (an export under ``--http-workers``,
    ``remote.Streamed``; from a Ray shard, ``ray_app.BankShard.export_bank``)."""
    buf, n = [], 0
    async for p in pieces:
        buf.append(p)
        n += len(p)
        if n >= size:
            yield b"".join(buf)
            buf, n = [], 0
    if buf:
        yield b"".join(buf)


def import_lines(service, bank_id: str, lines, where=None, max_bank_lines: int | None = None) -> dict:
    """Import ``lines`` (an export of bank ``bank_id`` alone: an iterable of byte lines, or the
    body's bytes) into the bank: the import's result for it (``memory.export.import_``: stored,
    already_stored, refused per item, facts). ``InputError`` naming the line and field of bad input
    (nothing of the bank written)."""
    from ..memory.export import MAX_BANK_LINES, import_

    if isinstance(lines, (bytes, bytearray)):
        lines = bytes(lines).splitlines(keepends=True)
    res = import_(ServedMemory(service, where), lines, bank=bank_id, where=where,
                  max_bank_lines=max_bank_lines or MAX_BANK_LINES)
    if not res["banks"]:
        return {"bank_id": bank_id, "stored": 0, "already_stored": 0, "refused": [], "facts": 0}
    return res["banks"][0]


async def body_lines(chunks, cap: int):
    """The lines of an async iterable of byte ``chunks`` (a request body), each yielded as it is
    complete; a line over ``cap`` bytes is refused as soon as that many bytes of it arrived
    (``LineTooLong`` naming its number), not gathered whole."""
    buf, n = bytearray(), 0
    async for c in chunks:
        buf += c
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            n += 1
            if i + 1 > cap:
                raise LineTooLong(f"line {n}: longer than {cap} bytes (the limit of a line)")
            yield bytes(buf[:i + 1])
            del buf[:i + 1]
        if len(buf) > cap:
            raise LineTooLong(f"line {n + 1}: longer than {cap} bytes (the limit of a line)")
    if buf:
        yield bytes(buf)


def _pull(loop, agen):
    """The items of async iterator ``agen`` (on ``loop``), taken one at a time from a thread."""
    while True:
        try:
            yield asyncio.run_coroutine_threadsafe(agen.__anext__(), loop).result()
        except StopAsyncIteration:
            return


class ServedPortable:
    """``export_bank`` and ``import_bank`` of ``serve.service.SelectionService`` (mixed into it):
    :func:`export_chunks` and :func:`import_lines` on its append threads."""

    async def export_bank(self, bank_id: str, where=None, vectors: bool = False):
        """An async iterator of the export's pieces, each made on an append thread as the response
        takes it (``UnknownBank`` raised here, before the first)."""
        loop = asyncio.get_running_loop()
        gen = await loop.run_in_executor(self.appender, export_chunks, self, bank_id, where, vectors)
        return _stream(loop, self.appender, gen)

    async def import_bank(self, bank_id: str, body, where=None, quota=None) -> dict:
        """The import (``body``: the bytes, or an async iterator of byte lines, read from an append
        thread as the import takes them), the engine refreshed between batches, counted as an
        append in flight (QueueFull past ``quota.max_appends``)."""
        if self.batcher.closing:
            raise ShuttingDown("the server is shutting down")
        loop = asyncio.get_running_loop()
        lines = body if isinstance(body, (bytes, bytearray)) else _pull(loop, body)
        with self.appends_in_flight.hold(None if quota is None else quota.key,
                                         None if quota is None else quota.max_appends):
            return await loop.run_in_executor(self.appender, import_lines, self, bank_id, lines, where)


async def _stream(loop, pool, gen):
    end = object()
    while True:
        piece = await loop.run_in_executor(pool, next, gen, end)
        if piece is end:
            return
        yield piece


async def joined(pieces) -> bytes:
    """An export's pieces or an import's lines (an async iterator, or bytes) as one ``bytes``: what
    crosses a process boundary (the Ray shards, the engine process of ``--http-workers``), held
    whole there (at most ``max_body_bytes`` for an import)."""
    if isinstance(pieces, (bytes, bytearray)):
        return bytes(pieces)
    return b"".join([p async for p in pieces])
