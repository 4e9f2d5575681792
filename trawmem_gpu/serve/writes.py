"""The write path of a :class:`~.service.SelectionService`: appends and forgets.

Appends and forgets run on the *append threads* (validate, build, persist: the Memory core's
``append`` / ``forget_stored``, serialized per bank by the registry), with their own encoder
instance whose chunks give way to query batches (:mod:`.lanes`). The new bank's engine tables are
prepared there too; the batch worker only publishes them, between batches, and the call answers
after that, so a client reads its own writes. Until then the engine selects from the bank as it
was (``MemoryCore.publishing``). A forget then waits for the assembly of workspaces of the old
bank and scrubs the caches on an append thread.
"""
from __future__ import annotations

import asyncio
import time

from ..memory.answers import append_answer
from .batcher import ShuttingDown
from .keys import Quota
from .lanes import AppendEncoder


def freeze_heap() -> None:
    """Move every object alive now (banks, engines, models) out of the cyclic garbage collector's
    reach (``gc.freeze``). Without it each full collection walks millions of long-lived objects:
    under load that was over a third of the event loop's time. Acyclic garbage is still freed by
    reference counting; a replaced bank is acyclic."""
    import gc

    gc.collect()
    gc.freeze()


class WritePath:
    """Appends and forgets, for :class:`~.service.SelectionService` (its core, pools, encoder and metrics)."""

    def append_encoder(self) -> AppendEncoder:
        """The encoder of appends and forgets: a second instance of the query encoder's model,
        loaded on first use (on its thread), in chunks that give way to query batches."""
        with self._append_encoder_lock:
            if self._append_encoder is None:
                from ..encode import get_encoder
                from ..memory.core import LockedEncoder

                inner = self.encoder if self._given_encoder else LockedEncoder(
                    get_encoder(self.encoder_spec, cache=False, fresh=True))
                self._append_encoder = AppendEncoder(inner, self.cfg.append_chunk, self.query_first.wait_idle)
            return self._append_encoder

    async def append(self, bank_id: str, records, quota: Quota | None = None) -> dict:
        """Append turns (records, all or nothing; a ``memory.turns.AppendBatch``, per item): the bank's
        counts and each item's outcome (``memory.answers.append_answer``). QueueFull past ``quota.max_appends``."""
        if self.batcher.closing:
            raise ShuttingDown("the server is shutting down")
        with self.appends_in_flight.hold(None if quota is None else quota.key,
                                         None if quota is None else quota.max_appends):
            return await self._append(bank_id, records)

    async def _append(self, bank_id: str, records: list[dict]) -> dict:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        with self.core.publishing(bank_id):  # batches select from the bank before it meanwhile
            res = await loop.run_in_executor(self.appender, lambda: self.core.append(
                bank_id, records, self.append_encoder(), self.llm))
            t1 = t2 = time.perf_counter()
            if res.bank is not None:
                # the new bank's tables: built on the append thread, only published by the batch worker
                prepared = await loop.run_in_executor(self.appender, self.engines.prepare, res.bank)
                t1 = time.perf_counter()
                await loop.run_in_executor(self.worker, self._sync_bank, bank_id, prepared)
                t2 = time.perf_counter()
        if self.metrics is not None:
            self.metrics.appended.inc(res.appended)
            self.metrics.engine_builds.set(self.engines.builds)
        return {**append_answer(bank_id, res, getattr(records, "scope", None)),
                "timings": {"build_and_write_ms": round((t1 - t0) * 1e3, 3),
                            "engine_refresh_ms": round((t2 - t1) * 1e3, 3)}}

    async def forget(self, bank_id: str, turn_ids: list[str] | None, where=None) -> dict:
        """Forget turns of a bank (None: the whole bank) in the files, the engine and the caches
        (``MemoryCore``): the rewrite and the cache scrub on an append thread, the engine's
        refresh and purge on the batch worker (between batches); answers after all three."""
        if self.batcher.closing:
            raise ShuttingDown("the server is shutting down")
        loop = asyncio.get_running_loop()  # where: a key's filter (memory.scope.forget_within)
        res = await loop.run_in_executor(self.appender, lambda: self.core.forget_stored(
            bank_id, turn_ids, self.llm, encoder=self.append_encoder(), where=where))
        prepared = await loop.run_in_executor(self.appender, self.core.prepare_forget, res)
        await loop.run_in_executor(self.worker, self.core.sync_forget, res, prepared)
        await self._assembly_drained()  # workspaces of the old bank are rendered before the caches go
        counts = await loop.run_in_executor(self.appender, self.core.erase_copies, res)
        return self.core.forget_summary(res, counts, where)

    async def _assembly_drained(self) -> None:
        """Return once every assembly job submitted so far has finished (queued or running)."""
        futs = self.assembler.outstanding()
        if futs:
            await asyncio.wait([asyncio.wrap_future(f) for f in futs])

    def _sync_bank(self, bank_id: str, prepared: dict | None = None) -> None:
        """On the batch worker: the engine uses the registry's bank ``bank_id`` (``prepared``: its tables)."""
        before = self.engines.banks.get(bank_id)
        self.core.sync_engine(bank_id, prepared)
        if self.engines.banks.get(bank_id) is not before:
            freeze_heap()
