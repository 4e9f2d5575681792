"""Export and import of one bank through the server (``GET /v1/banks/{bank_id}/export``,
``POST /v1/banks/{bank_id}/import``): the service's side, run on its append threads.

The format and both directions are ``memory.export``'s (``export`` / ``import_``, the same code as
``Memory.export`` and ``trawmem import``); :class:`ServedMemory` gives them the part of ``Memory``
they call, over the service's own core: turns appended as an append request's are (the append
encoder, the bank's write lock, the engine refreshed on the batch worker before the answer) and
facts added by ``memory.facts``.
"""
from __future__ import annotations

import asyncio
import io

from ..errors import InputError
from .batcher import ShuttingDown


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


def export_lines(service, bank_id: str, where=None) -> bytes:
    """Bank ``bank_id`` as an export (header and the bank), only the turns passing ``where`` (and the
    facts whose sources all do); ``UnknownBank`` when there is no such bank."""
    from ..memory.export import export

    mem = ServedMemory(service, where)
    mem.turns(bank_id)  # UnknownBank / QuarantinedBank before any line is written
    out = io.StringIO()
    export(mem, out, [bank_id], where)
    return out.getvalue().encode("utf-8")


def import_lines(service, bank_id: str, body: bytes, where=None) -> dict:
    """Import ``body`` (an export of bank ``bank_id`` alone) into the bank: the import's result for
    it (``memory.export.import_``: stored, already_stored, refused per item, facts). ``InputError``
    naming the line and field of bad input (nothing of the bank written)."""
    from ..memory.export import import_

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"body: not UTF-8 (byte {e.start})") from None
    res = import_(ServedMemory(service, where), text.splitlines(keepends=True), bank=bank_id, where=where)
    if not res["banks"]:
        return {"bank_id": bank_id, "stored": 0, "already_stored": 0, "refused": [], "facts": 0}
    return res["banks"][0]


class ServedPortable:
    """``export_bank`` and ``import_bank`` of ``serve.service.SelectionService`` (mixed into it):
    :func:`export_lines` and :func:`import_lines` on one of its append threads."""

    async def export_bank(self, bank_id: str, where=None) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(self.appender, export_lines, self, bank_id, where)

    async def import_bank(self, bank_id: str, body: bytes, where=None, quota=None) -> dict:
        """The import, the engine refreshed between batches, counted as an append in flight
        (QueueFull past ``quota.max_appends``)."""
        if self.batcher.closing:
            raise ShuttingDown("the server is shutting down")
        with self.appends_in_flight.hold(None if quota is None else quota.key,
                                         None if quota is None else quota.max_appends):
            return await asyncio.get_running_loop().run_in_executor(self.appender, import_lines, self, bank_id,
                                                                    body, where)
