"""Batched TrawMem selection: many queries over many banks in one pass.

:class:`SelectionEngine` picks, for a batch of (bank id, question, vector[, date]), exactly what
:func:`~trawmem_gpu.select.reference.select_reference` picks for each, with every step run over
the whole batch. Its parts:

* ``tables.py``: per-bank, query-independent tables in one store, with per-bank refresh
  (:meth:`SelectionEngine.replace_bank`, :meth:`SelectionEngine.remove_bank`) that concurrent
  readers see atomically (a query batch reads one snapshot, counted while it runs: a grown bank
  is written over its own rows, only those that changed, while none runs; ``publish.py``);
* ``plan.py``: how it runs (:class:`~trawmem_gpu.select.config.EngineConfig`), resolved once;
* ``batch.py``: a call's queries as one checked, typed batch; the query-bank similarities;
* ``tensor.py``: the steps' torch variants over padded batches (Triton kernels on CUDA);
* ``compiled.py``: the steps' numba variants, one query at a time (the CPU default).

Bank isolation is structural: a query's units and threads are addressed by its bank's offsets
into the store, never by ids another bank could share.

Memory (dominant terms): the unit vectors (``d`` floats per unit), per-unit scalars, the K and
bridge tables of the banks of at most ``EngineConfig.table_max_units`` units (``N_b^2 + N_b J_b``
floats each; a larger bank has none and forms its queries' K per query, ``pool.py``), neighbour
lists ``threads * D`` pairs; per batch ``Q * N`` (affinity) and ``Q * J`` (thread scores) floats; per
chunk ``Qc * U * T`` (compiled) or ``Qc * U * U`` (tensor) floats. Nothing grows faster than linearly
in one bank's size. :meth:`SelectionEngine.nbytes` counts what the engine holds.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Sequence

import numpy as np
import torch

from ...store.bank import Bank
from ..workspace import Workspace, assemble, fit_to_tokens
from ..config import EngineConfig, SelectConfig
from ..heap import trim_heap
from ..params import QueryParams
from ..steps import roles as step4
from . import compiled, shortlist, tensor
from .batch import Timer, make_batch
from .masks import roles_count, stage_bridge
from .plan import Plan, resolve
from .pool import candidate_gram, query_kernel
from .tables import Snapshot, TableStore

__all__ = ["SelectionEngine", "EngineConfig"]


class SelectionEngine:
    """Batched Stage-2 selection over a set of banks (see the module docstring).

    :param banks: the banks this engine serves (ids must be unique)
    :param cfg: the method (its ablation is applied once, here); what each query asks for (B, H,
        T) is not the engine's: it comes with every call (:class:`~trawmem_gpu.select.params.QueryParams`)
    :param head: optional learned role head; used only if it has ``role_matrices`` (and its
        per-query weights if it has ``weights_batch``; see ``steps.roles.demand``)
    :param engine: how it runs (:class:`~trawmem_gpu.select.config.EngineConfig`)
    :param options: :class:`EngineConfig` fields overriding ``engine`` (``device="cpu"``, ``threads=1``, ...)
    """

    def __init__(self, banks: list[Bank], cfg: SelectConfig | None = None, head=None,
                 engine: EngineConfig | None = None, **options):
        ec = (engine or EngineConfig()).with_overrides(**options)
        if not banks:
            raise ValueError("SelectionEngine needs at least one bank")
        self.cfg = (cfg or SelectConfig()).resolved()
        self.head = head if (head is not None and hasattr(head, "role_matrices")) else None
        self.engine_config = ec
        self.plan: Plan = resolve(ec, self.cfg, banks)
        self._store = TableStore(list(banks), self.cfg, self.plan.layout(banks[0].unit_vecs.shape[1], banks))
        trim_heap(sum(b.n_units for b in banks))  # the build's freed temporaries back to the system
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._pool_lock = threading.Lock()
        self._meta: dict = {}
        """bank id -> (bank object, its metadata columns): filters' columns, kept across calls."""
        self.last_timings: dict[str, float] = {}
        self.warm_up(indexes=False)  # the compiled pass only some approximate queries reach: not in their latency

    # ------------------------------------------------------------------------------------------
    # the banks
    # ------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.plan.device

    @property
    def dtype(self) -> torch.dtype:
        return self.plan.dtype

    @property
    def threads(self) -> int:
        """Worker threads of the compiled backend (``EngineConfig.threads``, resolved)."""
        return self.plan.threads

    @property
    def snapshot(self) -> Snapshot:
        """The current banks' tables (immutable; replaced whole by a refresh)."""
        return self._store.snapshot

    @property
    def banks(self) -> list[Bank]:
        return self._store.snapshot.banks

    @property
    def bank_ids(self) -> list[str]:
        return list(self._store.snapshot.index)

    def warm_up(self, indexes: bool = True) -> list[str]:
        """Pay the first-use costs of the banks searched approximately now instead of in a query's
        latency (``shortlist.warm_up``): the compiled pass a query with many BM25 postings takes
        (done at build and after :meth:`replace_bank`) and, with ``indexes``, each such bank's
        approximate index (otherwise built by its first query). Returns those banks' ids."""
        snap = self._store.snapshot
        return [snap.banks[b].bank_id for b in shortlist.warm_up(snap, self.plan, indexes)]

    def prepare_bank(self, bank: Bank):
        """Build ``bank``'s tables without publishing them (any thread, any time): hand the result
        to :meth:`replace_bank` to publish it cheaply, e.g. on a thread that must not stall."""
        return self._store.prepare(bank)

    def replace_bank(self, bank: Bank, prepared=None) -> None:
        """Add ``bank``, or replace the stored bank with its id. Only that bank's tables are built
        (or taken from ``prepared``, :meth:`prepare_bank` of this bank on this engine); a
        ``select_units`` call running meanwhile (any thread) sees the old bank or the new one,
        never a mix. Safe to call from several threads (writers are serialized)."""
        self._store.put(bank, prepared)
        self._meta.pop(bank.bank_id, None)
        self.warm_up(indexes=False)  # a bank grown past ann_min_units

    def remove_bank(self, bank_id: str) -> None:
        """Drop the bank ``bank_id`` (``KeyError`` if unknown; the last bank cannot be removed).
        Calls running meanwhile finish on the banks they started with."""
        self._store.remove(bank_id)
        self._meta.pop(bank_id, None)

    def purge(self) -> None:
        """After :meth:`replace_bank` / :meth:`remove_bank` of a forgotten bank: rebuild the
        tables without the dead rows and overwrite the old buffers (no table keeps a row of the
        old bank). Call only while no ``select_units`` runs on this engine."""
        self._store.purge()
        self._meta.clear()  # no column of a forgotten turn's metadata stays

    def wipe(self) -> None:
        """Overwrite every table buffer (the engine's last bank forgotten: the engine is dropped
        after this and must not select again)."""
        self._store.wipe()
        self._meta.clear()

    # ------------------------------------------------------------------------------------------
    # selection
    # ------------------------------------------------------------------------------------------
    def select(self, bank_ids: list[str], questions: list[str], Z, dates: list[datetime | None] | None = None,
               params: QueryParams | Sequence[QueryParams] | None = None, where=None,
               masks=None) -> list[Workspace]:
        """Workspaces (selected units grouped under their heads) for a batch of queries
        (arguments as :meth:`select_units`)."""
        with self._store.reading() as snap:  # counted: a refresh does not write in place meanwhile
            keep = self.masks_of(bank_ids, where, masks, snap)
            picks = self._select(snap, bank_ids, questions, Z, dates, params, keep)
        return [assemble(snap.infos[snap.index[b]].bank, q, p, self.cfg.headings, k)
                for b, q, p, k in zip(bank_ids, questions, picks, keep or [None] * len(picks))]

    def select_units(self, bank_ids: list[str], questions: list[str], Z,
                     dates: list[datetime | None] | None = None,
                     params: QueryParams | Sequence[QueryParams] | None = None, where=None,
                     masks=None) -> list[list[int]]:
        """Selected bank-local unit indices per query, in pick order.

        :param bank_ids: ``Q`` bank ids (unknown ids raise ``KeyError``)
        :param questions: ``Q`` question texts (BM25 and demand features)
        :param Z: ``[Q, d]`` unit-norm query vectors (NumPy or torch; NaN/inf raise ``ValueError``)
        :param dates: optional ``Q`` datetimes (or None): each query's "now", for J's date-dependent terms
        :param params: what the queries ask for (B, H, T): one :class:`QueryParams` for all, one
            per query (any mix runs in this one call, on the same tables), or None = the defaults
        :param where: a filter over the units' metadata (``data.filters``; a ``Filter`` or its
            JSON) for every query, one per query (None entries: none), or None
        :param masks: per query a ``[N_b]`` bool unit mask (or None), the primitive ``where``
            becomes; with both, a unit must pass both. A masked query selects exactly what it would
            over its bank restricted to the units that pass (``select.restrict``); a query none of
            whose units passes selects nothing
        """
        with self._store.reading() as snap:  # counted: a refresh does not write in place meanwhile
            # unit masks alone (the engine client's: a filter made into masks once) are checked by make_batch
            keep = masks if where is None else self.masks_of(bank_ids, where, masks, snap)
            return self._select(snap, bank_ids, questions, Z, dates, params, keep)

    def masks_of(self, bank_ids: list[str], where=None, masks=None, snap: Snapshot | None = None) -> list | None:
        """Each query's unit mask from ``where`` and ``masks`` (see :meth:`select_units`), or None
        when no query has one; a bank's metadata columns are kept across calls (per bank object)."""
        if where is None and masks is None:
            return None
        from ..restrict import as_mask, filter_masks

        snap = snap or self._store.snapshot
        banks = [snap.infos[snap.bank_index(b)].bank for b in bank_ids]
        out = filter_masks(banks, where, self._meta) if where is not None else [None] * len(banks)
        if masks is not None:
            masks = list(masks)
            if len(masks) != len(banks):
                raise ValueError(f"{len(banks)} queries but {len(masks)} unit masks")
            for i, (b, m) in enumerate(zip(banks, masks)):
                m = as_mask(m, b.n_units, f"masks[{i}]")
                if m is not None:
                    out[i] = m if out[i] is None else (out[i] & m)
        return None if all(m is None for m in out) else out

    def _select(self, snap: Snapshot, bank_ids, questions, Z, dates, params, masks=None) -> list[list[int]]:
        if len(bank_ids) == 0 and len(questions) == 0:
            return []
        batch = make_batch(snap, bank_ids, questions, Z, dates, self.plan.device, self.plan.dtype, params, self.cfg,
                           masks)
        self.last_timings = {}
        timer = Timer(self.last_timings, self.plan.device)
        empty = [] if batch.masks is None else [q for q, m in enumerate(batch.masks) if m is not None and not m.any()]
        if empty:  # no unit passes: nothing to select (the others run as one batch)
            rest = np.setdiff1d(np.arange(len(batch)), empty)
            picks: list = [[] for _ in range(len(batch))]
            for q, p in zip(rest.tolist(), self._picks(snap, batch.take(rest), timer) if len(rest) else []):
                picks[q] = p
        else:
            picks = self._picks(snap, batch, timer)
        if np.isfinite(batch.sizes["capacity"]).any():  # the rendering against T
            t0 = time.perf_counter()
            infos = snap.infos
            keep = batch.masks or [None] * len(batch)
            picks = [p if qp.token_budget is None else
                     fit_to_tokens(infos[b].bank, p, qp.token_budget, self.cfg.headings, costs=infos[b].costs, keep=k)
                     for b, p, qp, k in zip(batch.bidx.tolist(), picks, batch.params, keep)]
            timer.add({"fit_tokens": time.perf_counter() - t0})
        return picks

    def _picks(self, snap: Snapshot, batch, timer: Timer) -> list[list[int]]:
        plan = self.plan
        if plan.backend == "compiled" and plan.front == "compiled" and all(snap.infos[b].plain for b in
                                                                            set(batch.bidx.tolist())):
            return compiled.select(snap, plan, self.cfg, self.head, batch, self._worker_pool(len(batch)), timer)
        return batch.per_group(lambda sub: self._picks_tensor_front(snap, sub, timer))

    def _picks_tensor_front(self, snap: Snapshot, batch, timer: Timer) -> list[list[int]]:
        """Steps 1-3 with the tensor front for queries of one ``QueryParams.shape_key`` (and all
        with or all without a token budget), then steps 4-7 per chunk."""
        plan, cfg = self.plan, self.cfg
        qp = batch.params[0]
        loc = tensor.localize(snap, plan, cfg, batch, timer, qp)
        dem = step4.demand(batch.questions, cfg, self.head)
        timer.lap("text")
        out: list[list[int] | None] = [None] * len(batch)
        square = plan.backend != "compiled"
        unit_cap, pool, capacity = (batch.sizes[k] for k in ("unit_cap", "pool", "capacity"))
        for rows in tensor.chunks(loc, square, plan.chunk_elems):
            r = rows.cpu().numpy()
            c = tensor.chunk_of(snap, cfg, loc, rows, torch.as_tensor(pool[r], device=plan.device))
            if plan.backend == "compiled":  # the tensor front, then the compiled steps 4-7
                cols = {k: getattr(c, k).cpu().numpy() for k in ("bidx", "cand", "n_cand", "lt", "alpha", "hthread",
                                                                 "rvec", "n_h", "tpos")}
                if c.masked is not None:  # a thread a mask cut: those queries' bridge from their candidates
                    cols.update(stage_bridge(snap, cols, c.masked.cpu().numpy() & roles_count(dem.W[r])))
                timer.lap("roles")
                sel, n_sel = compiled.run_stage(snap, cfg, compiled.stage_batch(
                    snap, cfg, cols, dem.Mq[r], dem.delta[r], dem.W[r], batch.now[r], unit_cap[r], pool[r],
                    capacity[r]))
                sel, n_sel = torch.from_numpy(sel), torch.from_numpy(n_sel)
                timer.lap("greedy")
            else:
                t = lambda a, dt=plan.dtype: torch.as_tensor(a[r], dtype=dt, device=plan.device)
                sel, n_sel = tensor.select_chunk(snap, plan, cfg, c, t(dem.W), (t(dem.delta), t(dem.Mq)),
                                                 t(batch.now, torch.float64), timer,
                                                 torch.as_tensor(unit_cap[r], device=plan.device),
                                                 None if qp.token_budget is None else t(capacity))
            units = torch.gather(c.cand, 1, sel.to(c.cand.device).clamp(min=0)).tolist()
            for q, u, n in zip(r.tolist(), units, n_sel.tolist()):
                out[q] = u[:n]
        timer.lap("output")
        return out  # type: ignore[return-value]

    def _worker_pool(self, Q: int) -> ThreadPoolExecutor | None:
        workers = max(1, min(self.plan.threads, Q))
        if workers <= 1:
            return None
        with self._pool_lock:  # callers may share one engine across their own threads
            if self._pool is None or self._pool_size < workers:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool, self._pool_size = ThreadPoolExecutor(workers, thread_name_prefix="trawmem"), workers
            return self._pool

    # ------------------------------------------------------------------------------------------
    # parts, for benchmarks
    # ------------------------------------------------------------------------------------------
    def candidate_sets(self, bank_ids: list[str], questions: list[str], Z,
                       params: QueryParams | Sequence[QueryParams] | None = None) -> list[np.ndarray]:
        """The candidate units U_q (bank-local ids, ascending) of each query: steps 1-3 only, by the
        front :meth:`select_units` runs (the compiled front's shortlist for large banks included)."""
        if not len(bank_ids):
            return []
        with self._store.reading() as snap:
            return self._candidate_sets(snap, bank_ids, questions, Z, params)

    def _candidate_sets(self, snap, bank_ids, questions, Z, params) -> list[np.ndarray]:
        batch = make_batch(snap, bank_ids, questions, Z, None, self.plan.device, self.plan.dtype, params, self.cfg)
        if self.plan.front == "compiled" and all(snap.infos[b].plain for b in set(batch.bidx.tolist())):
            return compiled.candidates(snap, self.plan, self.cfg, self.head, batch)  # as select runs them

        def steps_1_3(sub):
            loc = tensor.localize(snap, self.plan, self.cfg, sub, Timer({}, self.plan.device), sub.params[0])
            cand, n = loc.cand.cpu().numpy(), loc.n_cand.cpu().tolist()
            return [cand[i, :k].copy() for i, k in enumerate(n)]

        return batch.per_group(steps_1_3)

    def candidate_kernel(self, bank_id: str, cand: np.ndarray) -> np.ndarray:
        """``K [U, U]`` (float64 NumPy) of candidate units ``cand`` of bank ``bank_id``: the support
        kernel the greedy maximizes coverage of."""
        with self._store.reading() as snap:
            return self._candidate_kernel(snap, bank_id, cand)

    def _candidate_kernel(self, snap, bank_id: str, cand) -> np.ndarray:
        i = snap.bank_index(bank_id)
        c = torch.as_tensor(np.asarray(cand, dtype=np.int64), device=self.device)
        if self.cfg.kernel == "identity":
            return np.eye(len(c))
        if snap.off.tab[i]:
            n = int(snap.off.nu[i])
            return torch.take(snap.t["ktab"], int(snap.off.koff[i]) + c[:, None] * n + c[None, :]).double().cpu().numpy()
        lt = snap.t["unit_thread"][int(snap.off.uo[i]) + c]
        cand = np.asarray(cand, dtype=np.int64)
        return query_kernel(snap, self.cfg, i, cand, candidate_gram(snap, i, cand), lt).double().cpu().numpy()

    def table_nbytes(self) -> int:
        """Bytes held by the per-bank K and bridge tables (0 when they are not built)."""
        return self._store.snapshot.nbytes(("ktab", "btab")) if self.plan.tables else 0

    def nbytes(self) -> int:
        """Bytes of every table the engine holds (vectors, unit and thread tables, K, bridge, BM25)."""
        return self._store.snapshot.nbytes()

    def close(self) -> None:
        """Stop the worker threads (an engine is also usable without calling this)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool, self._pool_size = None, 0
