"""Selection engines for the service, one per (budget, hops), refreshed bank by bank.

A :class:`~trawmem_gpu.select.engine.SelectionEngine` is built for one ``SelectConfig``, and a
request's ``budget`` / ``hops`` change the config (B also sets the seed count and the
neighbourhood cap). So the service keeps one engine per distinct (B, H) asked for: the default
(B, H) engine is built at start and never evicted; others are built on first use and the least
recently used is dropped beyond ``max_engines`` (each holds its own packed copy of the banks:
memory grows with ``max_engines``). A batch mixing several (B, H) makes one engine call per
group.

:class:`EngineSet` is not thread-safe by design: the service touches it only from its single
batch worker thread, so a bank refresh and a selection never interleave, and every query of a
batch sees one consistent set of banks (the old bank or the new one, never a mix); workspaces
are assembled from the very bank object the engine selected from. After an append,
:meth:`EngineSet.prepare` may run on the append thread (the costly part, reads only) and
:meth:`EngineSet.install` on the worker (a swap), so selections keep running meanwhile.
"""
from __future__ import annotations

import collections
import inspect
from dataclasses import replace
from typing import Callable

from ..select.config import SelectConfig
from ..select.engine import SelectionEngine
from ..store.bank import Bank


class EngineSet:
    """Engines keyed by (budget, hops) over one mutable set of banks.

    :param banks: bank id -> bank (the set is owned here after construction)
    :param base: the selection config every engine derives from (its budget / hops are the defaults)
    :param max_engines: engines kept at once (the default one included)
    :param make: engine factory ``(banks, cfg) -> SelectionEngine``
    """

    def __init__(self, banks: dict[str, Bank], base: SelectConfig, max_engines: int,
                 make: Callable[[list[Bank], SelectConfig], SelectionEngine] | None = None):
        self.banks = dict(banks)
        self.base = base
        self.default_key = (base.budget, base.hops)
        self.max_engines = max(1, int(max_engines))
        self.make = make or (lambda banks, cfg: SelectionEngine(banks, cfg))
        self._engines: collections.OrderedDict[tuple[int, int], SelectionEngine] = collections.OrderedDict()
        self.builds = 0

    def config(self, budget: int, hops: int) -> SelectConfig:
        return replace(self.base, budget=int(budget), hops=int(hops))

    def get(self, budget: int, hops: int) -> SelectionEngine:
        """The engine for (budget, hops), built on first use; needs at least one bank."""
        key = (int(budget), int(hops))
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
    def keys(self) -> list[tuple[int, int]]:
        return list(self._engines)

    def refresh(self, bank: Bank) -> None:
        """Make every engine select from ``bank`` (new or replacing the bank of that id)."""
        self.banks[bank.bank_id] = bank
        for key, eng in list(self._engines.items()):
            if hasattr(eng, "replace_bank"):
                eng.replace_bank(bank)  # refreshes that bank's tables only
            else:
                # TEMPORARY until select/ restructure lands: no SelectionEngine.replace_bank yet, so
                # rebuild. Only the default engine is rebuilt now; others are dropped and rebuilt on
                # their next use.
                if key == self.default_key:
                    self._engines[key] = self.make(list(self.banks.values()), eng.cfg)
                    self.builds += 1
                else:
                    del self._engines[key]

    def prepare(self, bank: Bank):
        """Heavy part of a refresh that may run on another thread (reads only); pass the result to
        :meth:`install` on the owning thread. None when the engines refresh in place."""
        if self._in_place():
            return None
        # TEMPORARY until select/ restructure lands: without SelectionEngine.replace_bank a refresh
        # rebuilds the default engine over every bank (seconds on large collections), so it is
        # built here, off the batch worker, and only swapped in by install().
        snapshot = dict(self.banks)
        snapshot[bank.bank_id] = bank
        return snapshot, self.make(list(snapshot.values()), self.config(*self.default_key))

    def install(self, bank: Bank, prepared) -> None:
        """Make the engines use ``bank``, with the engine :meth:`prepare` built when it still fits
        (no other bank changed meanwhile); otherwise refresh here."""
        if prepared is not None:
            snapshot, eng = prepared
            others = {k: v for k, v in snapshot.items() if k != bank.bank_id}
            current = {k: v for k, v in self.banks.items() if k != bank.bank_id}
            if others.keys() == current.keys() and all(current[k] is v for k, v in others.items()):
                self.banks[bank.bank_id] = bank
                self._engines = collections.OrderedDict([(self.default_key, eng)])
                self.builds += 1
                return
        self.refresh(bank)

    def _in_place(self) -> bool:
        eng = self._engines.get(self.default_key)
        return eng is not None and hasattr(eng, "replace_bank")

    def bank(self, bank_id: str) -> Bank:
        """The bank every engine here selects from for ``bank_id`` (workspaces are assembled from
        it; refreshes and selections share one thread, so it is the one the engine just used)."""
        return self.banks[bank_id]


def select_units(engine: SelectionEngine, bank_ids: list[str], questions: list[str], Z, dates) -> tuple[list, bool]:
    """``engine.select_units``, passing per-query dates when the engine takes them.

    Returns (picks, whether the dates were passed).
    """
    if dates is not None and any(d is not None for d in dates) and _takes_dates(engine):
        return engine.select_units(bank_ids, questions, Z, dates=dates), True
    return engine.select_units(bank_ids, questions, Z), False


def _takes_dates(engine: SelectionEngine) -> bool:
    # TEMPORARY until select/ restructure lands: select_units(..., dates=None) is being added.
    try:
        return "dates" in inspect.signature(engine.select_units).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False
