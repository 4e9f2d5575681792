"""The selection service of one process: encoder, banks, engines and the dynamic batcher.

The HTTP app (``app.py``) and each Ray Serve shard (``ray_app.py``) drive one of these. Work
runs on three thread pools, never on the event loop:

* the *batch worker* (one thread) runs every batch (one encoder call for the queries without
  a ``question_vector``, one engine call per (budget, hops, token_budget) group) and every engine refresh, so
  refreshes and selections never interleave;
* *assembly threads* turn each selection into its response body (workspace grouping, rendering,
  token count) from the bank object the engine selected from, while the worker starts the next
  batch (grouping and rendering cost more CPU per query than the selection);
* *append threads* validate, build and persist appended turns (serialized per bank by the
  registry); the engine refresh that follows is handed to the batch worker, and the append
  answers only after it, so a client reads its own writes.

Queries and appends encode with separate encoder instances, and appends encode in chunks that
give way to running query batches (:mod:`.lanes`): an append never holds what a query waits for.
Per-key limits (:class:`~.keys.Quota`) bound each key's queued queries and appends in flight.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from ..encode import get_encoder
from ..encode.base import Encoder
from ..errors import ConfigError, UnknownBank
from ..select.config import SelectConfig
from ..select.params import QueryParams
from ..tokens import TOKENIZER_NAME, count_tokens_cached
from ..workspace import assemble
from .batcher import DynamicBatcher, InFlight, Later
from .config import ServeConfig, default_threads
from .engines import ServedEngine, query_params, select_units
from .keys import Quota
from .lanes import AppendEncoder, FairPool, QueryFirst
from .registry import BankRegistry

log = logging.getLogger("trawmem.serve")


@dataclass(eq=False)
class SelectItem:
    """One query of a batch (already validated)."""

    bank_id: str
    question: str
    vector: np.ndarray | None
    """Unit-norm query vector from the client, or None to encode ``question``."""
    budget: int | None
    """B (None: no unit cap, under a token budget)."""
    hops: int
    date: datetime | None = None
    arrived: float = 0.0
    """``time.perf_counter()`` at arrival."""
    token_budget: int | None = None
    """T (None: no token budget)."""
    key: object = None
    """Whose query this is (the tenant; set by :meth:`SelectionService.select`): assembly is fair
    across keys."""

    @property
    def params(self) -> QueryParams:
        """The query's ``QueryParams`` (checked; ``ConfigError`` when out of range)."""
        return query_params(self.budget, self.hops, self.token_budget)


def _os_thread_name(name: str):
    """Executor initializer: give the OS thread a name (``top -H``, ``/proc/PID/task/*/comm``), Linux only."""
    def init():
        try:
            import ctypes

            ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        except (OSError, AttributeError):  # pragma: no cover - not Linux
            pass

    return init


def freeze_heap() -> None:
    """Move every object alive now (banks, engines, models) out of the cyclic garbage collector's
    reach (``gc.freeze``). Without it each full collection walks millions of long-lived objects:
    under load that was over a third of the event loop's time. Acyclic garbage is still freed by
    reference counting; a replaced bank is acyclic."""
    import gc

    gc.collect()
    gc.freeze()


class LockedEncoder(Encoder):
    """An encoder whose calls are serialized (a transformers tokenizer is not safe to call from
    two threads at once)."""

    def __init__(self, inner: Encoder):
        self.inner, self.id, self.dim = inner, inner.id, inner.dim
        self.lock = threading.Lock()

    def _encode_batch(self, texts, is_query):  # pragma: no cover - encode() is overridden
        return self.inner._encode_batch(texts, is_query)

    def encode(self, texts, **kw):
        with self.lock:
            return self.inner.encode(texts, **kw)


class SelectionService:
    """One process's banks and engines behind a dynamic batcher.

    :param cfg: serving options
    :param owns: bank ids this process serves (all by default; a Ray shard passes its slice)
    :param select_cfg: the method (default ``SelectConfig()``)
    :param params: the query parameters of a request that gives none (default ``QueryParams()``);
        a request's budget / hops / token_budget replace them, per query, on the same engine
    :param encoder: an encoder to use instead of loading ``cfg.encoder`` (then appends share it,
        behind its lock, as there is no second instance to load)
    """

    ASSEMBLY_CHUNKS = 4
    """Assembly jobs per engine call (the pool has 2 threads): few enough that answering costs few
    event-loop wake-ups, enough that the first answers leave before the whole batch is rendered."""

    def __init__(self, cfg: ServeConfig, *, owns=lambda bank_id: True, select_cfg: SelectConfig | None = None,
                 params: QueryParams | None = None, encoder: Encoder | None = None, metrics=None):
        import torch

        threads = cfg.threads or default_threads(cfg.http_workers)
        torch.set_num_threads(threads)
        self.threads = threads
        self.cfg = cfg
        self.metrics = metrics
        self.registry = BankRegistry(cfg.collection, owns)
        self.encoder_spec = cfg.encoder or self.registry.build_config("minilm").encoder
        enc = encoder or get_encoder(self.encoder_spec, cache=False)
        coll_enc = self.registry.encoder_id
        if coll_enc is not None and enc.id != coll_enc:
            raise ConfigError(f"the collection {cfg.collection} was encoded with {coll_enc!r}, the query encoder "
                              f"is {enc.id!r}; set `encoder` to the collection's encoder")
        self.encoder = LockedEncoder(enc)
        self._given_encoder = encoder is not None
        self._append_encoder: AppendEncoder | None = None
        self._append_encoder_lock = threading.Lock()
        self.query_first = QueryFirst()
        self.appends_in_flight = InFlight()
        self.dim = int(enc.dim)
        base = select_cfg or SelectConfig()
        dp = params or QueryParams()
        self.defaults = (dp.budget, dp.hops, dp.token_budget)

        def make(banks, scfg):
            from ..select.engine import SelectionEngine

            return SelectionEngine(banks, scfg, threads=threads)

        self.engines = ServedEngine(self.registry.banks(), base, make)
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="trawmem-batch", initializer=_os_thread_name("tm-batch"))
        self.appender = ThreadPoolExecutor(2, thread_name_prefix="trawmem-append",
                                           initializer=_os_thread_name("tm-append"))
        # Workspaces are assembled (rendered, token-counted) here, beside the next batch's encoder
        # and engine calls; the batch worker only encodes and selects.
        self.assembler = FairPool(2, initializer=_os_thread_name("tm-assemble"))
        self.batcher = DynamicBatcher(self.process_batch, max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1e3,
                                      max_queue=cfg.max_queue, executor=self.worker, on_batch=self._on_batch)
        self.ready = False
        self.started = time.time()

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        import sys

        sys.setswitchinterval(self.cfg.switch_interval_ms / 1e3)
        self.batcher.start()
        loop = asyncio.get_running_loop()
        if self.cfg.warmup:
            await loop.run_in_executor(self.worker, self._warmup)
        freeze_heap()
        self.ready = True

    async def stop(self) -> None:
        """Drain: refuse new queries, answer everything queued or running, finish appends."""
        self.ready = False
        await self.batcher.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.appender.shutdown, True)
        await loop.run_in_executor(None, self.worker.shutdown, True)
        await loop.run_in_executor(None, self.assembler.shutdown, True)
        import gc

        gc.unfreeze()  # let interpreter shutdown finalize everything again

    def _warmup(self) -> None:
        t0 = time.perf_counter()
        self.encoder.encode(["warm-up question"], is_query=True)
        banks = self.engines.banks
        if banks:
            bid = next(iter(banks))
            z = self.encoder.encode(["What happened first?"], is_query=True)
            self.engines.engine.select_units([bid], ["What happened first?"], z, params=query_params(*self.defaults))
            count_tokens_cached("warm-up")
        log.info("warm-up took %.1f s", time.perf_counter() - t0)

    # ------------------------------------------------------------------------------------------
    # requests
    # ------------------------------------------------------------------------------------------
    def has_bank(self, bank_id: str) -> bool:
        return bank_id in self.registry

    @property
    def encoder_id(self) -> str:
        return self.encoder.id

    def queue_depth(self) -> int:
        return self.batcher.depth

    def bank_info(self, bank_id: str) -> dict | None:
        bank = self.registry.get(bank_id)
        return None if bank is None else self.bank_summary(bank)

    async def select(self, items: list[SelectItem], batch: bool = False, quota: Quota | None = None) -> list[dict]:
        """Workspaces for ``items`` through the batcher; raises UnknownBank (before queueing; naming
        ``requests[i]`` when ``batch``), QueueFull (also past ``quota.max_queued``),
        DeadlineExceeded or ShuttingDown."""
        for i, it in enumerate(items):
            if it.bank_id not in self.registry:
                raise UnknownBank(it.bank_id, f"requests[{i}]: " if batch else "")
        if quota is None:
            return await self.batcher.submit(items, self.cfg.timeout_s)
        for it in items:
            it.key = quota.key
        return await self.batcher.submit(items, self.cfg.timeout_s, key=quota.key, key_limit=quota.max_queued,
                                         key_share=quota.batch_share)

    def append_encoder(self) -> AppendEncoder:
        """The appends' encoder: a second instance of the query encoder's model, loaded on the
        first append (on its thread), in chunks that give way to query batches."""
        with self._append_encoder_lock:
            if self._append_encoder is None:
                inner = self.encoder if self._given_encoder else LockedEncoder(
                    get_encoder(self.encoder_spec, cache=False, fresh=True))
                self._append_encoder = AppendEncoder(inner, self.cfg.append_chunk, self.query_first.wait_idle)
            return self._append_encoder

    async def append(self, bank_id: str, records: list[dict], quota: Quota | None = None) -> dict:
        """Append turns (creating the bank on first append); returns the bank's new counts, the
        turn ids stored and those it held already (a retry). QueueFull past ``quota.max_appends``."""
        if self.batcher.closing:
            from .batcher import ShuttingDown

            raise ShuttingDown("the server is shutting down")
        with self.appends_in_flight.hold(None if quota is None else quota.key,
                                         None if quota is None else quota.max_appends):
            return await self._append(bank_id, records)

    async def _append(self, bank_id: str, records: list[dict]) -> dict:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        res = await loop.run_in_executor(self.appender, self._registry_append, bank_id, records)
        # the new bank's engine tables are built here, on the append thread; the batch worker only
        # publishes them, so queries do not wait behind the build
        prepared = await loop.run_in_executor(self.appender, self.engines.prepare, res.bank)
        t1 = time.perf_counter()
        await loop.run_in_executor(self.worker, self._sync_bank, bank_id, prepared)
        t2 = time.perf_counter()
        if self.metrics is not None:
            self.metrics.appended.inc(res.appended)
            self.metrics.engine_builds.set(self.engines.builds)
        return {**self.bank_summary(res.bank), "created": res.created, "appended": res.appended,
                "stored": res.stored, "already_stored": res.already_stored,
                "timings": {"build_and_write_ms": round((t1 - t0) * 1e3, 3),
                            "engine_refresh_ms": round((t2 - t1) * 1e3, 3)}}

    def _registry_append(self, bank_id: str, records: list[dict]):
        return self.registry.append(bank_id, records, self.append_encoder(), self.encoder_spec)

    def _sync_bank(self, bank_id: str, prepared: dict | None = None) -> None:
        """On the batch worker: make the engine use the registry's current bank ``bank_id``
        (``prepared``: :meth:`ServedEngine.prepare` of a bank; ``refresh`` uses only tables of this one)."""
        bank = self.registry.get(bank_id)
        if bank is not None and self.engines.banks.get(bank_id) is not bank:
            self.engines.refresh(bank, prepared)
            freeze_heap()

    @staticmethod
    def bank_summary(bank) -> dict:
        times = [t.time for t in bank.turns if t.time is not None]
        return {"bank_id": bank.bank_id, "n_units": bank.n_units, "n_threads": bank.n_threads,
                "n_sessions": len({t.session for t in bank.turns}),
                "first_date": min(times).isoformat() if times else None,
                "last_date": max(times).isoformat() if times else None}

    def bank_list(self) -> list[dict]:
        return [{"bank_id": b.bank_id, "n_units": b.n_units, "n_threads": b.n_threads}
                for b in self.registry.banks().values()]

    # ------------------------------------------------------------------------------------------
    # the batch function (batch worker thread)
    # ------------------------------------------------------------------------------------------
    def process_batch(self, items: list[SelectItem]) -> list:
        """One encoder call and one engine call for the whole batch, whatever (budget, hops,
        token_budget) its queries ask for; per item a :class:`~.batcher.Later` of its response body
        (assembled on the pool, in a few chunks) or the exception. Append chunks wait meanwhile."""
        with self.query_first.running():
            return self._process_batch(items)

    def _process_batch(self, items: list[SelectItem]) -> list:
        t_start = time.perf_counter()
        n = len(items)
        for bid in dict.fromkeys(it.bank_id for it in items):
            if bid not in self.engines.banks:  # created by an append whose refresh has not run yet
                self._sync_bank(bid)
        Z = np.empty((n, self.dim), dtype=np.float32)
        todo = [i for i, it in enumerate(items) if it.vector is None]
        if todo:
            Z[todo] = self.encoder.encode([items[i].question for i in todo], is_query=True,
                                          batch_size=self.cfg.encode_chunk)
        for i, it in enumerate(items):
            if it.vector is not None:
                Z[i] = it.vector
        t_enc = time.perf_counter() - t_start
        out: list = [None] * n
        idx, params = [], []
        for i, it in enumerate(items):
            try:
                params.append(it.params)
                idx.append(i)
            except ConfigError as e:  # out of range: fails only this query
                out[i] = e
        t_sel = 0.0
        if idx:
            ts = time.perf_counter()
            try:
                picks, used_dates = select_units(self.engines.engine, [items[i].bank_id for i in idx],
                                                 [items[i].question for i in idx], Z[idx],
                                                 [items[i].date for i in idx], params)
            except Exception as e:  # noqa: BLE001 - fail this batch only, keep serving
                log.exception("engine call failed for a batch of %d", len(idx))
                for i in idx:
                    out[i] = e
            else:
                t_sel = time.perf_counter() - ts
                self._answer(items, idx, picks, used_dates, out, t_start, t_enc, t_sel, n)
        if self.metrics is not None:
            m = self.metrics.batch_seconds
            m.labels("encode").observe(t_enc)
            m.labels("select").observe(t_sel)
            m.labels("total").observe(time.perf_counter() - t_start)
        return out

    def _answer(self, items, idx, picks, used_dates, out, t_start, t_enc, t_sel, n) -> None:
        """Hand the picks of queries ``idx`` to the assembly pool: ``out[i]`` becomes a ``Later``."""
        jobs = []
        for i, units in zip(idx, picks):
            it = items[i]
            timings = {"queue_ms": round((t_start - it.arrived) * 1e3, 3) if it.arrived else None,
                       "encode_ms": round(t_enc * 1e3, 3) if it.vector is None else 0.0,
                       "select_ms": round(t_sel * 1e3, 3), "batch_size": n}
            # the bank the engine just selected from, taken here: a refresh may follow before assembly
            jobs.append((it, self.engines.bank(it.bank_id), units, used_dates, timings))
        # a few chunks per key, one pool job and one event-loop wake-up each; the pool takes
        # them round robin across keys
        size = -(-len(jobs) // self.ASSEMBLY_CHUNKS)
        by_key: dict = {}
        for k, i in enumerate(idx):
            by_key.setdefault(items[i].key, []).append(k)
        for key, ks in by_key.items():
            for c in range(0, len(ks), size):
                part = ks[c:c + size]
                fut = self.assembler.submit(key, self._workspaces, [jobs[k] for k in part])
                for j, k in enumerate(part):
                    out[idx[k]] = Later(fut, j)

    def _workspaces(self, jobs: list[tuple]) -> list:
        """Response bodies for a chunk of queries; a query whose assembly fails gets its exception."""
        out = []
        for job in jobs:
            try:
                out.append(self._workspace(*job))
            except Exception as e:  # noqa: BLE001 - fails only this query
                log.exception("assembling a workspace failed")
                out.append(e)
        return out

    def _workspace(self, it: SelectItem, bank, units: list[int], used_dates: bool, timings: dict) -> dict:
        """The response body for one query: grouping, rendering and the token count."""
        t0 = time.perf_counter()
        ws = assemble(bank, it.question, units, self.engines.cfg.headings)
        text = ws.render()
        out = {
            "bank_id": it.bank_id, "bank_n_units": bank.n_units, "question": it.question, "budget": it.budget,
            "hops": it.hops, "token_budget": it.token_budget,
            "date": it.date.isoformat() if it.date else None, "date_used": used_dates,
            "units": [{"id": t.turn_id, "speaker": t.speaker, "date": t.time.isoformat() if t.time else None,
                       "timestamp": t.timestamp, "text": t.text, "caption": t.caption, "thread": b.thread,
                       "session": t.session}
                      for b in ws.blocks for t in b.units],
            "threads": [{"thread": b.thread, "head": b.head} for b in ws.blocks],
            "text": text, "n_tokens": count_tokens_cached(text), "tokenizer": TOKENIZER_NAME,
        }
        dt = time.perf_counter() - t0
        out["timings"] = {**timings, "assemble_ms": round(dt * 1e3, 3)}
        if self.metrics is not None:
            self.metrics.assemble_seconds.observe(dt)
        return out

    def _on_batch(self, size: int, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.batch_size.observe(size)
            self.metrics.engine_builds.set(self.engines.builds)
