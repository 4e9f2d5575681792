"""The selection service of one process: encoder, banks, engines and the dynamic batcher.

The HTTP app (``app.py``) and each Ray Serve shard (``ray_app.py``) drive one of these. Work
runs on three thread pools, never on the event loop:

* the *batch worker* (one thread) runs every batch and every engine refresh, so refreshes and
  selections never interleave. A batch's queries with a ``question_vector`` go first, in an
  engine call of their own, and are answered without waiting for the encoder call of the
  batch's other queries (one encoder call, then one engine call for those);
* *assembly threads* turn each selection into its response body (workspace grouping, rendering,
  token count) from the bank object the engine selected from, while the worker starts the next
  batch (grouping and rendering cost more CPU per query than the selection);
* *append threads* validate, build and persist appended turns (serialized per bank by the
  registry); the engine refresh that follows is handed to the batch worker, and the append
  answers only after it, so a client reads its own writes. A forget runs the same way, then
  scrubs the caches on the append thread (``memory.core.MemoryCore``). The write path is
  :class:`.writes.WritePath`. An export or import of one bank (``serve.portable.ServedPortable``,
  mixed in) runs there too.

The banks, the encoder, the engine and the append / forget paths are the Memory core's
(``trawmem_gpu.memory``), the same as ``Memory`` and ``trawmem query`` use.

Queries and appends (and forgets) encode with separate encoder instances, and appends encode in
chunks that give way to running query batches (:mod:`.lanes`): an append never holds what a query
waits for. Per-key limits (:class:`~.keys.Quota`) bound each key's queued queries, its share of
a batch and its appends in flight; assembly takes the keys' jobs round robin.

Each encoder instance is behind its own lock (a transformers tokenizer is not safe to call from
two threads at once); appends and forgets share the append instance.
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

from ..encode.base import Encoder
from ..errors import UnknownBank  # noqa: F401 - the one UnknownBank, for the serve modules
from ..memory.answers import bank_rows, bank_summary
from ..memory.core import EngineSpec, MemoryCore
from ..memory.history import unit_history
from ..memory.result import SelectedWorkspace, units_seen
from ..select import client
from ..select.config import SelectConfig
from ..select.params import QueryParams
from ..tokens import count_tokens_cached
from .batcher import DynamicBatcher, InFlight, Later, ShuttingDown
from .config import ServeConfig, default_threads
from .keys import Quota
from .lanes import AppendEncoder, FairPool, QueryFirst, chain, lower_priority
from .portable import ServedPortable
from .writes import WritePath, freeze_heap

log = logging.getLogger(__name__)


@dataclass(eq=False)
class SelectItem:
    """One query of a batch (already validated): a ``select.client.Request`` (its fields, read by
    the engine client as they are) plus what the server keeps beside it."""

    bank_id: str
    question: str
    vector: np.ndarray | None
    """Unit-norm query vector from the client, or None to encode ``question``."""
    params: QueryParams
    """What the query asks for: the request's fields over the server's defaults
    (``select.params.merge_params``, as every front builds it)."""
    date: datetime | None = None
    arrived: float = 0.0
    """``time.perf_counter()`` at arrival."""
    key: object = None
    """Whose query this is (the tenant; set by :meth:`SelectionService.select`): assembly is fair
    across keys."""
    where: object = None
    """The filter the query selects under (``data.filters.Filter``: the request's AND its key's), or None."""
    as_of: str | None = None
    """ISO date whose facts the workspace shows (None: the current ones): a dated engine over its
    banks (``ServedEngine.dated``, by the engine client)."""
    bound: bool = False  # asked by a key bound to a filter: ``bank_n_units`` counts the units passing ``where``


def _brings_vector(it: SelectItem) -> bool:
    """The batcher's ``ahead``: a query with its own vector runs (and is answered) before its
    batch's encoder call."""
    return it.vector is not None


def _os_thread_name(name: str):
    """Executor initializer: give the OS thread a name (``top -H``, ``/proc/PID/task/*/comm``), Linux only."""
    def init():
        try:
            import ctypes

            ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        except (OSError, AttributeError):  # pragma: no cover - not Linux
            pass

    return init


def _serve_llm(cfg: ServeConfig, metrics):
    """The backend of ``cfg.llm`` (None without one), its work counted in ``metrics``; the server
    is asked at the first append that needs it."""
    if not cfg.llm:
        return None
    from ..llm.factory import llm_from_args

    llm = llm_from_args(cfg.llm)
    if metrics is not None:
        metrics.watch_llm(llm)
    return llm


def warm_up(service: "SelectionService") -> list[str]:
    """One query encode and, with a bank, one selection and a token count, so the first request
    does not pay for the model's, the engine's and the tokenizer's first call; and every bank
    searched approximately gets its index now (``SelectionEngine.warm_up``), not in the latency of
    its first request (seconds at 10^6 units). Returns those banks' ids."""
    t0 = time.perf_counter()
    service.encoder.encode(["warm-up question"], is_query=True)
    banks, indexed = service.engines.banks, []
    if banks:
        bid = next(iter(banks))
        z = service.encoder.encode(["What happened first?"], is_query=True)
        client.select(service.engines, [client.Request(bid, "What happened first?", service.defaults, z[0])])
        count_tokens_cached("warm-up")
        engine_warm_up = getattr(service.engines.engine, "warm_up", None)  # TriMem's engine has none
        if engine_warm_up is not None:
            indexed = engine_warm_up(indexes=True)
    log.info("warm-up took %.1f s%s", time.perf_counter() - t0,
             f" (approximate indexes of {len(indexed)} bank(s) built)" if indexed else "")
    return indexed


async def open_cold(service: "SelectionService", items) -> None:
    """Open the cold banks of ``items`` and prepare their tables on the loader thread (a lazy
    registry), so no batch waits for a bank to load; the batch worker publishes them."""
    if service.registry.lazy:
        loop = asyncio.get_running_loop()
        for bid in dict.fromkeys(it.bank_id for it in items):
            if bid not in service.engines.banks:
                service._warm[bid] = await loop.run_in_executor(service.loader, service.core.warm, bid)


class SelectionService(WritePath, ServedPortable):
    """One process's banks and engines behind a dynamic batcher.

    :param cfg: serving options
    :param owns: bank ids this process serves (all by default; a Ray shard passes its slice)
    :param select_cfg: the method (default ``SelectConfig()``)
    :param params: the query parameters of a request that gives none (default ``QueryParams()``):
        :attr:`defaults`, under a request's fields (``select.params.merge_params``), per query,
        on the same engine
    :param encoder: an encoder to use instead of loading ``cfg.encoder`` (then appends share it,
        behind its lock, as there is no second instance to load)
    """

    ASSEMBLY_THREADS = 2
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
        # the Memory core: banks (registry), query encoder and engine, the append and forget paths
        self.core = MemoryCore(cfg.collection, encoder=encoder or cfg.encoder, owns=owns,
                               engine=EngineSpec(select_cfg, threads, units=cfg.units, method=cfg.method),
                               max_resident_bytes=cfg.max_resident_bytes)
        self.registry, self.encoder, self.engines = self.core.registry, self.core.encoder, self.core.engines
        self.encoder_spec, self.dim = self.core.encoder_spec, self.core.dim
        self.llm = _serve_llm(cfg, metrics)
        """The LLM of appends to and forgets from banks built with LLM segmentation or heads (``--llm``)."""
        self.defaults = params or QueryParams()
        """The server's default ``QueryParams`` (the collection default of the merge rule)."""
        self._given_encoder = encoder is not None and not isinstance(encoder, str)
        self._append_encoder: AppendEncoder | None = None
        self._append_encoder_lock = threading.Lock()
        self.append_encoder_loaded: asyncio.Future | None = None
        """The background load of the append encoder that :meth:`start` begins (None before)."""
        self.query_first = QueryFirst()
        self.appends_in_flight = InFlight()
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="trawmem-batch", initializer=_os_thread_name("tm-batch"))
        self.appender = ThreadPoolExecutor(2, thread_name_prefix="trawmem-append",
                                           initializer=chain(_os_thread_name("tm-append"), lower_priority))
        # cold banks are opened and their tables prepared here (--max-resident-bytes), off the batch worker
        self.loader, self._warm = ThreadPoolExecutor(1, initializer=_os_thread_name("tm-load")), {}
        # Workspaces are assembled (rendered, token-counted) here, beside the next batch's encoder
        # and engine calls; the batch worker only encodes and selects.
        self.assembler = FairPool(self.ASSEMBLY_THREADS, initializer=_os_thread_name("tm-assemble"))
        self.batcher = DynamicBatcher(self.process_batch, max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1e3,
                                      max_queue=cfg.max_queue, executor=self.worker, on_batch=self._on_batch,
                                      ahead=_brings_vector)
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
            await loop.run_in_executor(self.worker, warm_up, self)
        freeze_heap()
        self.ready = True
        # the append encoder (a second model instance) loads now, off the loop, so no append pays it
        self.append_encoder_loaded = loop.run_in_executor(self.appender, self.append_encoder)

    async def stop(self) -> None:
        """Drain: refuse new queries, answer everything queued or running, finish appends."""
        self.ready = False
        await self.batcher.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.appender.shutdown, True)
        await loop.run_in_executor(None, self.loader.shutdown, True)
        await loop.run_in_executor(None, self.worker.shutdown, True)
        await loop.run_in_executor(None, self.assembler.shutdown, True)
        import gc

        gc.unfreeze()  # let interpreter shutdown finalize everything again

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

    def bank_info(self, bank_id: str, where=None) -> dict | None:
        """A bank's counts (None: no such bank; ``QuarantinedBank`` for a quarantined one) as ``where`` sees it."""
        bank = self.registry.get(bank_id)
        if bank is None and bank_id in self.registry.quarantined:
            raise self.registry.absent(bank_id)
        self.core.touch(bank_id)  # a lazy bank opened here counts as used (the next batch lets it go)
        return None if bank is None else self.bank_summary(bank, where)

    def history(self, bank_id: str, unit_id: str, where=None) -> list[dict] | None:
        """A unit's events as ``where`` sees them (``memory.history.unit_history``; None: no such unit)."""
        evs = unit_history(self.registry, bank_id, unit_id, where)
        self.core.touch(bank_id)
        return evs

    async def select(self, items: list[SelectItem], batch: bool = False, quota: Quota | None = None) -> list[dict]:
        """Workspaces for ``items`` through the batcher; raises UnknownBank (before queueing; naming
        ``requests[i]`` when ``batch``), QueueFull (also past ``quota.max_queued``),
        DeadlineExceeded or ShuttingDown."""
        for i, it in enumerate(items):
            if it.bank_id not in self.registry:
                raise self.registry.absent(it.bank_id, f"requests[{i}]: " if batch else "")
        await open_cold(self, items)
        if quota is None:
            return await self.batcher.submit(items, self.cfg.timeout_s)
        for it in items:
            it.key = quota.key
        return await self.batcher.submit(items, self.cfg.timeout_s, key=quota.key, key_limit=quota.max_queued,
                                         key_share=quota.batch_share)

    bank_summary = staticmethod(bank_summary)

    def bank_list(self) -> list[dict]:
        """Every bank's counts; a quarantined bank with 0 and ``quarantined``: the cause."""
        return bank_rows(self.registry)

    # ------------------------------------------------------------------------------------------
    # the batch function (batch worker thread)
    # ------------------------------------------------------------------------------------------
    def process_batch(self, items: list[SelectItem]) -> list:
        """One encoder call (for the items without a vector; the batcher hands a batch's vector
        queries over in a call of their own, first) and one engine call per ``as_of`` day (one for
        a batch without, the usual case) for ``items``, whatever (budget, hops, token_budget) they
        ask for, through the engine client (``select.client.select``); per item a
        :class:`~.batcher.Later` of its response body (assembled on the pool, in a few chunks) or
        the exception. Append chunks wait meanwhile."""
        with self.query_first.running(), self.core.lock:  # the engine's lock (memory.core: admissions)
            return self._process_batch(items)

    def _process_batch(self, items: list[SelectItem]) -> list:
        t_start = time.perf_counter()
        n = len(items)
        bids = list(dict.fromkeys(it.bank_id for it in items))
        seen = {b: self.engines.banks.get(b) for b in bids}  # a bank an append created: its refresh runs here
        self.core.ensure(bids, {b: self._warm.pop(b) for b in bids if b in self._warm})  # opens, publishes, evicts
        if any(self.engines.banks.get(b) is not seen[b] for b in bids):
            freeze_heap()
        Z = client.vectors(items, lambda qs: self.encoder.encode(qs, is_query=True, batch_size=self.cfg.encode_chunk),
                           self.dim)
        t_enc = time.perf_counter() - t_start
        out: list = [None] * n
        idx = []
        for i, it in enumerate(items):
            if it.bank_id in self.engines.banks:
                idx.append(i)
            else:  # its files would not open (quarantined), or it went: fails only this query
                out[i] = self.registry.absent(it.bank_id)
        t_sel = 0.0
        if idx:
            ts = time.perf_counter()
            # a SelectItem is a select.client.Request (its fields); a day's failure fails its queries only
            every = len(idx) == n
            got = client.select(self.engines, items if every else [items[i] for i in idx], Z=Z if every else Z[idx],
                                isolate=True)
            t_sel = time.perf_counter() - ts
            failed = [g for g in got if isinstance(g, Exception)]
            for e in dict.fromkeys(failed):
                log.error("engine call failed for %d of a batch of %d", failed.count(e), len(idx), exc_info=e)
            self._answer(items, idx, got, out, t_start, t_enc, t_sel, n)
        if self.metrics is not None:
            m = self.metrics.batch_seconds
            m.labels("encode").observe(t_enc)
            m.labels("select").observe(t_sel)
            m.labels("total").observe(time.perf_counter() - t_start)
        return out

    def _answer(self, items, idx, got, out, t_start, t_enc, t_sel, n) -> None:
        """Hand the selections ``got`` of queries ``idx`` to the assembly pool: ``out[i]`` becomes a
        ``Later`` (or the exception of a query whose engine call failed)."""
        jobs, done = [], []
        for i, sel in zip(idx, got):
            if isinstance(sel, Exception):
                out[i] = sel
                continue
            it = items[i]
            timings = {"queue_ms": round((t_start - it.arrived) * 1e3, 3) if it.arrived else None,
                       "encode_ms": round(t_enc * 1e3, 3) if it.vector is None else 0.0,
                       "select_ms": round(t_sel * 1e3, 3), "batch_size": n}
            # sel.bank: the bank the engine just selected from, taken there: a refresh may follow before assembly
            jobs.append((it, sel.bank, sel.units, sel.dated, timings, sel.keep))
            done.append(i)
        if not jobs:
            return
        # a few chunks per key, one pool job and one event-loop wake-up each; the pool takes
        # them round robin across keys
        size = -(-len(jobs) // self.ASSEMBLY_CHUNKS)
        by_key: dict = {}
        for k, i in enumerate(done):
            by_key.setdefault(items[i].key, []).append(k)
        for key, ks in by_key.items():
            for c in range(0, len(ks), size):
                part = ks[c:c + size]
                fut = self.assembler.submit(key, self._workspaces, [jobs[k] for k in part])
                for j, k in enumerate(part):
                    out[done[k]] = Later(fut, j)

    def _workspaces(self, jobs: list[tuple]) -> list:
        """Response bodies for a chunk of queries; a query whose assembly fails gets its exception."""
        out = []
        for job in jobs:
            try:
                out.append(workspace_body(self, *job))
            except Exception as e:  # noqa: BLE001 - fails only this query
                log.exception("assembling a workspace failed")
                out.append(e)
        return out

    def _on_batch(self, size: int, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.batch_size.observe(size)
            self.metrics.engine_builds.set(self.engines.builds)


def workspace_body(s: SelectionService, it: SelectItem, bank, units: list[int], used: bool, timings: dict,
                   keep=None) -> dict:
    """The response body for one query of ``s``: grouping, rendering and the token count."""
    t0 = time.perf_counter()
    ws = SelectedWorkspace.of(bank, it.question, units, s.engines.cfg.headings, used, keep=keep)
    out = {**ws.to_dict(), "bank_n_units": units_seen(bank, keep if it.bound else None), "budget": it.params.budget,
           "hops": it.params.hops, "token_budget": it.params.token_budget, "where": None if it.where is None else
           it.where.json, "date": it.date.isoformat() if it.date else None, **({"as_of": it.as_of} if it.as_of else {})}
    dt = time.perf_counter() - t0
    out["timings"] = {**timings, "assemble_ms": round(dt * 1e3, 3)}
    if s.metrics is not None:
        s.metrics.assemble_seconds.observe(dt)
    return out
