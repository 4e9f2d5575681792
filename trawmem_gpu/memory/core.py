"""The core a :class:`~trawmem_gpu.memory.Memory` and a server share: one collection's banks,
the query encoder, one selection engine, and the append and forget paths.

:class:`MemoryCore` holds the parts; who calls them on which thread is the caller's: ``Memory``
serializes engine calls behind one lock, the server runs them on its single batch worker (see
``serve/service.py``). Both select through the one engine client (``select.client.select``,
handed ``engines``), as the CLI does, so the library, the CLI and the server pick the same units
for the same question.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from ..encode.base import Encoder
from ..errors import ConfigError
from ..select.config import SelectConfig
from ..store.view import check_layers, parse_units
from .banks import AppendResult, BankRegistry, ForgetResult, check_bank_id
from .resident import Resident, bank_nbytes
from .engines import ServedEngine
from .erase import clear_journal, erase_copies, pause_point, pending_journals
from .answers import bank_summary
from .quarantine import cause_of
from .scope import forget_within

log = logging.getLogger(__name__)


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


def forget_in_process_texts() -> None:
    """Drop the process's text-keyed caches (rendered lines, token counts of lines, word stems):
    after a forget none of them may keep a forgotten text."""
    from ..select.lexical import _stem, _unit_tokens
    from ..select.text_features import _temporal
    from ..tokens import clear_counts
    from ..select.workspace import date_label, unit_line

    for f in (unit_line, date_label, _stem, _unit_tokens, _temporal):
        f.cache_clear()
    clear_counts()


@dataclass(frozen=True)
class EngineSpec:
    """What the one selection engine of a :class:`MemoryCore` runs (:func:`served_engine`)."""

    select_cfg: SelectConfig | None = None
    """The method (None: ``SelectConfig()``)."""
    threads: int | None = None
    """CPU threads of the engine (None: its default)."""
    head: object = None
    """A learned role head for the engine (``head.load_head``), or None."""
    units: tuple | list = ("turns",)
    """The layers the engine selects from (``store.view.unit_view``; default the turns)."""
    method: str = "trawmem"
    """``trawmem``, or ``trimem`` (TriMem's retrieval: ``select.trimem.method.TriMemEngine``)."""


class MemoryCore:
    """Banks, encoder and engine of one collection.

    :param path: the collection directory (created empty when missing)
    :param encoder: an encoder spec (``"minilm"``, ``"hf:/dir"``) or an :class:`Encoder`; default:
        the collection's own build config's, else ``"minilm"``
    :param engine: what the engine runs (:class:`EngineSpec`: method, threads, head, units)
    :param owns: which bank ids this process serves (a Ray shard serves a slice)
    :param caches: cache files a forget scrubs besides the default ones (``memory.erase``)
    :param create: create a missing collection (else a ``BankError``)
    :param embedding_cache: keep query vectors in the on-disk embedding cache (True: the default
        one, or a file path); off by default
    :param max_resident_bytes: open banks lazily and let the least recently used go past this many
        bytes (``memory.resident``); None: every bank is loaded at start and stays
    """

    def __init__(self, path, *, encoder: str | Encoder | None = None, engine: EngineSpec = EngineSpec(),
                 owns: Callable[[str], bool] = lambda bank_id: True, caches=(), create: bool = True,
                 embedding_cache: bool | str = False, max_resident_bytes: int | None = None):
        from ..encode import get_encoder

        if max_resident_bytes is not None and (isinstance(max_resident_bytes, bool) or
                                               not isinstance(max_resident_bytes, int) or max_resident_bytes < 0):
            raise ConfigError(f"`max_resident_bytes` must be a number of bytes >= 0 or None, got {max_resident_bytes!r}")
        self.registry = BankRegistry(path, owns, create, lazy=max_resident_bytes is not None)
        self.resident = Resident(max_resident_bytes)
        """The banks held in memory and their bytes (``memory.resident``)."""
        self.lock = threading.RLock()
        """The engine's lock: held for every engine call and engine refresh (``Memory``'s calls, the
        server's batches), and for letting a bank in the engine go."""
        self._in_use: set[str] = set()
        """The banks of the engine call running (:meth:`ensure`): never let go by an admission."""
        self._opening = 0
        """Set while the engine's owner opens a bank (it may wait for that bank's lock): an
        admission then waits no longer for the engine (:meth:`admit`)."""
        self._publishing: dict[str, int] = {}
        """Appends in flight per bank until their tables are published (:meth:`publishing`)."""
        self._publishing_lock = threading.Lock()
        if self.registry.lazy:
            self.registry.admit = self.admit
        self.encoder_spec = encoder if isinstance(encoder, str) else self.registry.build_config("minilm").encoder
        enc = encoder if isinstance(encoder, Encoder) else get_encoder(self.encoder_spec, cache=embedding_cache)
        coll_enc = self.registry.encoder_id
        if coll_enc is not None and enc.id != coll_enc:
            raise ConfigError(f"the collection {path} was encoded with {coll_enc!r}, the query encoder "
                              f"is {enc.id!r}; set `encoder` to the collection's encoder")
        self.encoder = enc if isinstance(enc, LockedEncoder) else LockedEncoder(enc)
        self.dim = int(enc.dim)
        self.caches = tuple(caches) + ((embedding_cache,) if isinstance(embedding_cache, str) else ())
        self.finished = self.finish_pending()
        """Summaries of the killed forgets this open finished (before anything was served)."""
        self.engines = served_engine(self.registry.banks(), engine.select_cfg, engine.threads, engine.head,
                                     engine.units, engine.method, vectors=self.registry.coll.vectors)
        for bank_id, cause in self.engines.rejected.items():  # banks that load but do not prepare
            self.registry.quarantine(bank_id, cause)
        for bank_id, bank in self.registry.banks().items():
            self.resident.touch(bank_id, bank_nbytes(bank, None) + self.engines.table_bytes.get(bank_id, 0))

    @property
    def path(self):
        return self.registry.coll.path

    @property
    def headings(self):
        return self.engines.cfg.headings

    def append(self, bank_id: str, records, encoder: Encoder | None = None, llm=None, layers=None) -> AppendResult:
        """Validate, build and persist turns (``BankRegistry.append``: a list of records, all or
        nothing, or a ``memory.turns.AppendBatch``, answered per item) with ``encoder`` (default:
        the query encoder; a server may give appends an instance of their own); the engine is not
        touched. ``llm``: for a bank built with LLM segmentation or heads. A bank the engine could
        not select from afterwards (``units`` with a layer it lacks) is refused before anything is
        written (``store.view.check_layers``). ``layers``: the layer steps of an add
        (``BankRegistry.append``)."""
        if len(parse_units(self.engines.units)) > 1 and bank_id not in self.registry.quarantined:
            check_bank_id(bank_id)
            check_layers(self.registry.get(bank_id), self.engines.units, bank_id)
        return self.registry.append(bank_id, records, encoder or self.encoder, self.encoder_spec, llm, layers)

    def forget_stored(self, bank_id: str, turn_ids: list[str] | None, llm=None,
                      encoder: Encoder | None = None, outputs=(), where=None) -> ForgetResult:
        """Rewrite (or delete) the stored bank without the turns (``encoder`` as for :meth:`append`;
        ``outputs``: the score outputs :meth:`erase_copies` will scrub, journaled first); the
        engine and caches are not touched. ``where``: the filter of a key bound to one
        (:func:`forget_within`)."""
        forget = lambda ids: self.registry.forget(bank_id, ids, encoder or self.encoder, llm, outputs)  # noqa: E731
        return forget(turn_ids) if where is None else forget_within(self.registry, bank_id, turn_ids, where, forget)

    def erase_copies(self, res: ForgetResult, outputs=()) -> dict:
        """Scrub every cache copy of what ``res`` forgot (and the ``outputs``: those given, and
        those its journal names), then close its journal: call after the engine no longer
        selects from the old bank."""
        pause_point("stored")
        counts = erase_copies(res.erasure, self.caches, outputs)
        forget_in_process_texts()
        clear_journal(self.path, res.erasure.bank_id)
        return counts

    def finish_pending(self) -> list[dict]:
        """Finish every forget of a bank this process serves that a kill left unfinished (its
        journal), before the engine exists: the bank is rewritten (or removed) as the forget
        would have, and every copy it names (caches, score outputs) is scrubbed. A bank whose
        pending forget cannot be finished is quarantined (its copies are scrubbed all the same,
        and the journal stays for a later whole-bank forget). Returns the forgets' summaries."""
        done = []
        for e in pending_journals(self.path):
            if not self.registry.owns(e.bank_id):
                continue
            if e.bank_id in self.registry.quarantined and not e.whole:
                erase_copies(e, self.caches)
                continue
            try:
                res = self.registry.forget(e.bank_id, None if e.whole else [], self.encoder)
            except Exception as x:  # noqa: BLE001 - that bank fails alone
                erase_copies(e, self.caches)
                self.registry.quarantine(e.bank_id, f"an interrupted forget of it could not be finished "
                                                    f"({cause_of(x, self.path)})")
                continue
            summary = self.forget_summary(res, self.erase_copies(res))
            self.registry.finished(res.erasure)
            log.warning("finished an interrupted forget of bank %r (%d turns%s)", e.bank_id,
                        len(summary["forgotten"]), ", the bank is gone" if summary["deleted"] else "")
            done.append(summary)
        return done

    def sync_engine(self, bank_id: str, prepared=None, keep=()) -> None:
        """Make the engine select from the registry's current bank ``bank_id`` (engine-owner thread;
        its tables are admitted as the bank is: :meth:`admit`; ``keep``: the call's other banks)."""
        with self.lock:
            while True:
                bank = self._open(bank_id)  # opened here, if it is not in memory (admitted)
                if bank is None or self.engines.banks.get(bank_id) is bank:
                    return
                with self.resident.room:
                    if self.registry.lazy and self.registry.banks().get(bank_id) is not bank:
                        continue  # let go by an admission meanwhile: opened again
                    self.evict(keep={bank_id, *keep}, but=bank_id)
                    nbytes = bank_nbytes(bank)  # while the engine holds the bank it replaces: an append's counts from it
                    self.engines.refresh(bank, prepared)
                    self.resident.touch(bank_id, nbytes + self.engines.table_bytes.get(bank_id, 0))
                    return

    def _open(self, bank_id: str):
        """``registry.get`` on the engine's owner thread (it may wait for the bank's lock, held by
        an admission of that bank: :meth:`admit` does not wait for the engine meanwhile)."""
        self._opening += 1
        try:
            return self.registry.get(bank_id)
        finally:
            self._opening -= 1

    def admit(self, bank_id: str, make, replacing: bool = False):
        """Bring bank ``bank_id`` into memory (a lazy registry's open, or the bank an append
        publishes): let the least recently used banks go until those held, in-use ones counted,
        fit the budget (``replacing``: the copy ``bank_id`` replaces counted too, as the engine
        still holds it), then ``make()`` (returns the bank, or None) and count its bytes. One bank
        at a time (``Resident.room``): the banks held stay within the budget plus one bank's size.

        Any thread. Banks in the engine go only between engine calls: while another thread's
        engine call holds what must go, this waits for it to end (``Resident.room`` released
        meanwhile), unless that thread opens a bank (it may wait for this one's lock). What is in
        use (an append's bank, the engine's last bank) is counted and kept: no wait for it."""
        but = None if replacing else bank_id
        with self.resident.room:
            while True:
                self.evict(keep={bank_id}, but=but)
                if not self.resident.over({bank_id}, but) or self._opening:
                    break
                if self.lock.acquire(blocking=False):  # no engine call runs: what is left is in use
                    self.lock.release()
                    break
                self.resident.room.wait(0.01)  # an engine call runs: room when it ends (polled)
            bank = make()
            if bank is not None:
                old = self.engines.banks.get(bank_id)  # the copy the engine selects from until it refreshes
                stale = bank_nbytes(old) if old is not None and old is not bank else 0
                self.resident.touch(bank_id, bank_nbytes(bank) + stale + self.engines.table_bytes.get(bank_id, 0))
            return bank

    def warm(self, bank_id: str):
        """Open ``bank_id`` if it is not in memory (a lazy registry) and prepare its engine tables:
        the slow part of a cold bank's first query, for any thread but the engine owner's, which
        then only publishes them (:meth:`ensure`). Returns the prepared tables (None: nothing to do)."""
        if bank_id in self.engines.banks:
            return None
        bank = self.registry.get(bank_id)
        return None if bank is None else self.engines.prepare(bank)

    @contextlib.contextmanager
    def publishing(self, bank_id: str):
        """Hold while an append of ``bank_id`` runs to its publish (:meth:`sync_engine` with the
        tables it prepared on its own thread). Meanwhile :meth:`ensure` keeps the copy of that bank
        the engine holds (the append is not answered yet, so no caller expects its turns): the
        engine's thread would otherwise see the registry's new bank first and build its tables
        itself, every other bank's queries waiting behind that build."""
        with self._publishing_lock:
            self._publishing[bank_id] = self._publishing.get(bank_id, 0) + 1
        try:
            yield
        finally:
            with self._publishing_lock:
                n = self._publishing.pop(bank_id) - 1
                if n:
                    self._publishing[bank_id] = n

    def ensure(self, bank_ids, prepared: dict | None = None) -> None:
        """Make the engine select from the current banks ``bank_ids`` (opening the ones not in memory;
        ``prepared``: bank id -> :meth:`warm`'s tables), mark them used, and let the least recently used banks go past the resident budget (never these).
        Engine-owner thread."""
        prepared = prepared or {}
        with self.lock:
            self._in_use = set(bank_ids)
            try:
                for b in dict.fromkeys(bank_ids):
                    if b not in self._publishing or b not in self.engines.banks or b in prepared:
                        self.sync_engine(b, prepared.get(b), keep=self._in_use)
                    if b in self.engines.banks:
                        self.resident.touch(b)
                self.evict(keep=self._in_use)
            finally:  # in the engine now: no admission lets them go while the caller holds the lock
                self._in_use = set()

    def touch(self, bank_id: str) -> None:
        """Count a bank read outside the engine (its turns, an append) as used, with its bytes."""
        bank = self.registry.get(bank_id)
        if bank is not None:
            self.resident.touch(bank_id, bank_nbytes(bank) + self.engines.table_bytes.get(bank_id, 0))

    def evict(self, keep=(), but: str | None = None) -> list[str]:
        """Let the least recently used banks go until the resident banks fit the budget (none of
        ``keep`` nor of the engine call running; ``but``: not counted, ``Resident.over``; the engine
        keeps at least one bank; a bank whose append or forget runs is kept, counted). A bank in
        the engine goes only when this thread holds the engine's lock or gets it at once (an
        admission on another thread waits for no engine call here). Returns their ids."""
        gone = []
        if self.resident.max_bytes is None:
            return gone
        owner = self.lock.acquire(blocking=False)
        try:
            with self.resident.room:  # no bank enters the engine meanwhile (sync_engine)
                # another thread's engine call runs, or the engine's last bank: only banks outside it go
                fixed = not owner or len(self.engines.banks) <= 1 or self.engines._engine is None
                held = {*keep, *self._in_use, *(self.engines.banks if fixed else ())}
                while True:
                    over = self.resident.over(held, but)
                    for b in over:
                        if self._let_go(b):
                            gone.append(b)
                        else:
                            held.add(b)  # in use: the next banks in line go instead
                    if all(b in gone for b in over):
                        return gone
        finally:
            if owner:
                self.lock.release()

    def _let_go(self, b: str) -> bool:
        """Drop bank ``b`` from the engine and the registry (:meth:`evict`, under its locks): False
        when it stays in memory (the engine's last bank, or an append or forget of it runs: then its
        engine tables go, if it has some, and it is counted without them)."""
        in_engine = b in self.engines.banks
        if in_engine and not self.engines.evict(b):
            return False
        if self.registry.evict(b):
            self.resident.drop(b)
            return True
        kept = self.registry.banks().get(b)
        if kept is None:
            self.resident.drop(b)
            return True
        if in_engine:
            self.resident.touch(b, bank_nbytes(kept))
        return False

    def prepare_forget(self, res: ForgetResult):
        """The tables of the bank a forget left (any thread; None when the bank is gone)."""
        return None if res.bank is None else self.engines.prepare(res.bank)

    def sync_forget(self, res: ForgetResult, prepared=None) -> None:
        """Make the engine select from the bank as it now is (the forget's, or a later append's;
        dropped when gone) and purge its tables of the old bank's rows (engine-owner thread)."""
        bank_id = res.erasure.bank_id
        if res.erasure.turn_ids or res.erasure.whole:
            with self.lock:
                bank = self._open(bank_id)
                with self.resident.room:
                    self.engines.forget(bank_id, bank, prepared)
        else:  # nothing was forgotten; the bank as stored may still be newer (an append beside)
            self.sync_engine(bank_id, prepared)

    def forget_summary(self, res: ForgetResult, counts: dict, where=None) -> dict:
        """The answer of a forget; ``where``: a bound caller's filter, whose ``n_units`` counts only
        the turns passing it (its ``forgotten`` is already its own: :func:`forget_within`)."""
        n = 0 if res.bank is None else bank_summary(res.bank, where)["n_units"]
        return {"bank_id": res.erasure.bank_id, "forgotten": res.forgotten, "missing": res.missing,
                "deleted": res.bank is None, "n_units": n, **counts}


def served_engine(banks: dict, select_cfg: SelectConfig | None = None, threads: int | None = None,
                  head=None, units=("turns",), method: str = "trawmem", vectors: str = "float32") -> ServedEngine:
    """The one engine over ``banks`` (bank id -> bank) with the method ``select_cfg``, selecting
    from their unit views for ``units``; ``method="trimem"``: TriMem's retrieval over the banks'
    facts (``select.trimem.method.TriMemEngine``; the stored banks in, workspaces without thread headings).
    ``vectors``: the collection's vector storage (``store.vectors``), the engine's ``vectors``."""
    cfg = select_cfg or SelectConfig()
    if method == "trimem":
        from dataclasses import replace

        from ..select.trimem.method import TriMemEngine

        return ServedEngine(banks, replace(cfg, headings="none"), TriMemEngine, units)

    def make(banks, scfg):
        from ..select.engine import SelectionEngine

        return SelectionEngine(banks, scfg, head=head, **({"threads": threads} if threads else {}),
                               **({"vectors": vectors} if vectors != "float32" else {}))

    return ServedEngine(banks, cfg, make, units)
