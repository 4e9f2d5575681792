"""Selection engines for the service, one per (budget, hops, token_budget), refreshed bank by bank.

A :class:`~trawmem_gpu.select.engine.SelectionEngine` is built for one ``SelectConfig``, and a
request's ``budget`` / ``hops`` / ``token_budget`` change the config (B or T also sets the seed
count and the neighbourhood cap; T adds the units' token costs). So the service keeps one engine
per distinct (B, H, T) asked for: the default (B, H, T) engine is built at start and never evicted; others are built on first use and the least
recently used is dropped beyond ``max_engines`` (each holds its own tables of the banks: memory
grows with ``max_engines``). A batch mixing several (B, H) makes one engine call per group.

After an append, :meth:`EngineSet.prepare` builds the new bank's tables for every engine on the
append's own thread, and :meth:`EngineSet.refresh` publishes them through each engine's
``replace_bank`` (rebuilding them only for an engine created in between). :class:`EngineSet` is touched only
from the service's single batch worker thread, so a refresh and a selection never interleave:
every query of a batch sees one consistent set of banks (the old bank or the new one, never a
mix), and workspaces are assembled from the very bank object the engine selected from
(:meth:`EngineSet.bank`).
"""
from __future__ import annotations

import collections
from dataclasses import replace
from datetime import datetime
from typing import Callable

from ..select.config import SelectConfig
from ..select.engine import SelectionEngine
from ..store.bank import Bank


class EngineSet:
    """Engines keyed by (budget, hops, token_budget) over one mutable set of banks.

    :param banks: bank id -> bank (the set is owned here after construction)
    :param base: the selection config every engine derives from (its budget / hops / token_budget are
        the defaults)
    :param max_engines: engines kept at once (the default one included)
    :param make: engine factory ``(banks, cfg) -> SelectionEngine``
    """

    def __init__(self, banks: dict[str, Bank], base: SelectConfig, max_engines: int,
                 make: Callable[[list[Bank], SelectConfig], SelectionEngine] | None = None):
        self.banks = dict(banks)
        self.base = base
        self.default_key = (base.budget, base.hops, base.token_budget)
        self.max_engines = max(1, int(max_engines))
        self.make = make or (lambda banks, cfg: SelectionEngine(banks, cfg))
        self._engines: collections.OrderedDict[tuple, SelectionEngine] = collections.OrderedDict()
        self.builds = 0

    def config(self, budget: int | None, hops: int, token_budget: int | None = None) -> SelectConfig:
        """The base config with B, H and T replaced (``SelectConfig`` checks them)."""
        return replace(self.base, budget=budget, hops=int(hops), token_budget=token_budget)

    def get(self, budget: int | None, hops: int, token_budget: int | None = None) -> SelectionEngine:
        """The engine for (budget, hops, token_budget) (None: no unit cap / no token budget), built on
        first use; needs at least one bank."""
        key = (None if budget is None else int(budget), int(hops), None if token_budget is None else int(token_budget))
        eng = self._engines.get(key)
        if eng is None:
            eng = self.make(list(self.banks.values()), self.config(*key))
            self.builds += 1
            self._engines[key] = eng
            while len(self._engines) > self.max_engines:
                victim = next((k for k in self._engines if k != self.default_key), None)
                if victim is None or victim == key:
                    break
                del self._engines[victim]
        self._engines.move_to_end(key)
        return eng

    @property
    def keys(self) -> list[tuple]:
        return list(self._engines)

    def prepare(self, bank: Bank) -> dict:
        """``bank``'s new tables for every engine kept now: the slow part of :meth:`refresh`, for
        any thread (an append's own), so the batch worker only publishes them."""
        return {key: (eng, eng.prepare_bank(bank)) for key, eng in list(self._engines.items())}

    def refresh(self, bank: Bank, prepared: dict | None = None) -> None:
        """Make every engine select from ``bank`` (new, or replacing the bank of that id), with
        :meth:`prepare`'s tables where they were built for this bank by the same engine."""
        self.banks[bank.bank_id] = bank
        prepared = prepared or {}
        for key, eng in self._engines.items():
            p = prepared.get(key)
            ok = p is not None and p[0] is eng and p[1][0].bank is bank
            eng.replace_bank(bank, p[1] if ok else None)  # that bank's tables only

    def bank(self, bank_id: str) -> Bank:
        """The bank every engine here selects from for ``bank_id``."""
        return self.banks[bank_id]


def select_units(engine: SelectionEngine, bank_ids: list[str], questions: list[str], Z,
                 dates: list[datetime | None]) -> tuple[list[list[int]], bool]:
    """``engine.select_units`` with each query's date (its "now"); returns (picks, whether any
    query carried a date)."""
    used = any(d is not None for d in dates)
    return engine.select_units(bank_ids, questions, Z, dates=dates if used else None), used
