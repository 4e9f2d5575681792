"""The service's selection engine: one set of bank tables, whatever the requests ask for.

Budgets, hops and token budgets travel with each query (``select.params.QueryParams``), so one
:class:`~trawmem_gpu.select.engine.SelectionEngine` answers every request, and a batch mixing
any (B, H, T) is one engine call. Its tables are built once per bank (at start, or on the first
append of a bank) and refreshed bank by bank.

After a forget, :meth:`ServedEngine.forget` publishes the bank without the forgotten turns (or
drops it) and purges the old rows from every table.

After an append, :meth:`ServedEngine.prepare` builds the new bank's tables on the append's own
thread (from the held bank's: only what the new turns change is computed, ``select/engine/extend.py``),
and :meth:`ServedEngine.refresh` publishes them through the engine's ``replace_bank`` (over the
bank's own rows, only those that changed: ``select/engine/publish.py``).
:class:`ServedEngine` is touched only from the service's single batch worker thread (``prepare``
excepted, which publishes nothing), so a refresh and a selection never interleave: every query of
a batch sees one consistent set of banks (the old bank or the new one, never a mix), and
workspaces are assembled from the very bank object the engine selected from
(:meth:`ServedEngine.bank`).
"""
from __future__ import annotations

from typing import Callable

from ..select.config import SelectConfig
from ..select.engine import SelectionEngine
from ..store.bank import Bank


class ServedEngine:
    """One engine over one mutable set of banks.

    :param banks: bank id -> bank (the set is owned here after construction)
    :param cfg: the method every query is selected by
    :param make: engine factory ``(banks, cfg) -> SelectionEngine``
    """

    def __init__(self, banks: dict[str, Bank], cfg: SelectConfig,
                 make: Callable[[list[Bank], SelectConfig], SelectionEngine] | None = None, units=("turns",),
                 as_of: str | None = None):
        from ..store.view import unit_view

        self.units, self.as_of = units, as_of
        """The layers it selects from, and the date whose facts it shows (None: the current ones)."""
        self.view = lambda bank: unit_view(bank, units, as_of)
        """A stored bank as the engine selects from it (``--units``; the bank itself for ``turns``)."""
        self.banks: dict[str, Bank] = {}
        """bank id -> the stored bank the engine serves."""
        self.views: dict[str, Bank] = {}
        """bank id -> that bank's unit view (what the engine selects from and workspaces show)."""
        self.rejected: dict[str, str] = {}
        """bank id -> why that bank of ``banks`` given at start could not be prepared for the
        engine (it is left out; the others are served)."""
        for k, b in banks.items():
            try:
                self.views[k], self.banks[k] = self.view(b), b
            except Exception as e:  # noqa: BLE001 - one bad bank fails alone
                self.rejected[k] = _cause(e)
        self.cfg = cfg
        self.make = make or (lambda banks, cfg: SelectionEngine(banks, cfg))
        self.builds = 0
        """Whole-engine builds since start: 1 (0 while the collection is empty), whatever the requests ask."""
        self.table_bytes: dict[str, int] = {}
        """bank id -> bytes of that bank's tables, as prepared (``memory.resident``; 0 when built
        inside the engine without a separate prepare)."""
        self._engine: SelectionEngine | None = None
        if self.banks:
            self._build_isolating()

    def _build_isolating(self) -> None:
        """Build the engine; when that fails, try each bank alone and leave out (``rejected``)
        those that fail by themselves, so one bank's bad values never keep the others from serving."""
        try:
            self._build()
            return
        except Exception:  # noqa: BLE001 - find the banks that fail alone
            bad = {}
            for k, v in self.views.items():
                try:
                    self.make([v], self.cfg)
                except Exception as e:  # noqa: BLE001
                    bad[k] = _cause(e)
            if not bad:
                raise
        for k, cause in bad.items():
            del self.banks[k], self.views[k]
            self.rejected[k] = cause
        if self.banks:
            self._build()

    def _build(self) -> SelectionEngine:
        self._engine = self.make(list(self.views.values()), self.cfg)
        self.builds += 1
        return self._engine

    @property
    def engine(self) -> SelectionEngine:
        """The engine (built on first use once a bank exists; ``LookupError`` while there is none)."""
        if self._engine is None:
            if not self.banks:
                raise LookupError("no bank to select from")
            self._build()
        return self._engine

    def prepare(self, bank: Bank):
        """``bank``'s new tables (None before the engine exists): the slow part of :meth:`refresh`,
        for any thread (an append's own), so the batch worker only publishes them."""
        eng = self._engine
        if eng is None:
            return None
        view = self.view(bank)
        return eng, eng.prepare_bank(view), bank, view

    def refresh(self, bank: Bank, prepared=None) -> None:
        """Make the engine select from ``bank`` (new, or replacing the bank of that id), with
        :meth:`prepare`'s tables when they were built for this bank by this engine."""
        ok = prepared is not None and prepared[0] is self._engine and prepared[2] is bank
        if not ok and self._engine is not None:
            prepared, ok = self.prepare(bank), True  # built here, so that its bytes are known
        view = prepared[3] if ok else self.view(bank)
        self.banks[bank.bank_id], self.views[bank.bank_id] = bank, view
        self.table_bytes[bank.bank_id] = _tables_nbytes(prepared[1]) if ok else 0
        eng = self._engine
        if eng is None:
            self._build()
            return
        eng.replace_bank(view, prepared[1] if ok else None)  # that bank's tables only

    def evict(self, bank_id: str) -> bool:
        """Stop selecting from ``bank_id`` to free its memory (a bank let go under the resident budget,
        ``memory.resident``; not a forget: no purge). The engine keeps at least one bank: False then."""
        if bank_id not in self.banks or self._engine is None or len(self.banks) == 1:
            return False
        del self.banks[bank_id], self.views[bank_id]
        self.table_bytes.pop(bank_id, None)
        self._engine.remove_bank(bank_id)
        return True

    def forget(self, bank_id: str, bank: Bank | None, prepared=None) -> None:
        """After a forget: select from ``bank`` (the bank less the forgotten turns), or drop
        ``bank_id`` when ``bank`` is None; then purge, so that no engine table, dead rows
        included, keeps a row of the old bank (see ``SelectionEngine.purge``)."""
        if bank is not None:
            self.refresh(bank, prepared)
        elif bank_id in self.banks:
            del self.banks[bank_id], self.views[bank_id]
            self.table_bytes.pop(bank_id, None)
            if not self.banks:  # an engine holds at least one bank: none is left
                if self._engine is not None:
                    self._engine.wipe()  # its buffers would otherwise be freed with the rows in them
                self._engine = None
            elif self._engine is not None:
                self._engine.remove_bank(bank_id)
        if self._engine is not None:
            self._engine.purge()

    def dated(self, banks: dict[str, Bank], day: str) -> "ServedEngine":
        """A throwaway engine like this one over ``banks``, showing the facts valid on ``day``."""
        return ServedEngine(banks, self.cfg, self.make, self.units, day)

    def bank(self, bank_id: str) -> Bank:
        """The bank the engine selects from for ``bank_id`` (its unit view; for TriMem's engine,
        ``select.trimem.method.TriMemEngine.view``)."""
        view = getattr(self._engine, "view", None)
        return view(bank_id) if view is not None else self.views[bank_id]

    def nbytes(self) -> int:
        """Bytes of the engine's tables (0 before it exists)."""
        return 0 if self._engine is None else self._engine.nbytes()


def _tables_nbytes(prepared) -> int:
    """Bytes of ``SelectionEngine.prepare_bank``'s result (its arrays and tensors, however nested)."""
    from .resident import _nbytes

    return _nbytes(prepared)


def _cause(e: BaseException) -> str:
    return f"its tables could not be prepared for the engine ({type(e).__name__}: {e})"

