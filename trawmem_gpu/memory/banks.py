"""The banks of a Memory (and of a server): loaded from a collection at start, extended by
appends, shrunk by forgets.

An append runs on an append thread, serialized per bank (two appends to one bank never
interleave; appends to different banks run side by side): the request's turns are validated
in full, the new bank is computed (``build.update_bank``, or ``build.build_banks`` for a first
append, which creates the bank) and written through ``Collection.update`` (under the
collection's own bank lock, against the bank as stored, atomic and durable: a new bank
directory renamed into place, then the index), and only then published here. Anything rejected
before the write leaves the bank as it was.

The append path is four steps, each its own: **validate** the request (``parse_turns``, the
duplicate and time-order checks), **compute** the new bank (``ingest.update_bank``: only the
session the turns join is re-segmented, only new text is encoded, the graph is updated where the
new heads change it), **write** it (``Collection.update``: as a segment beside the stored bank's
files, ``store.segments``; merged into a new base by a background compaction, ``store.writes``),
**publish** it (here, then the engine). The write costs what the append adds, not the bank's size.

A forget runs the same way (serialized with the bank's appends): ``memory.forgets`` (the
registry's :class:`~.forgets.ForgetPath`) rewrites or deletes the bank and journals what the
caller then erases from the caches (``MemoryCore``).

Opening: all the banks this process serves are loaded at start, or, ``lazy``, none: each is
loaded on first use (:meth:`BankRegistry.get`) and may be let go (:meth:`BankRegistry.evict`,
``memory.resident``); a bank that fails to load is quarantined when that happens. A lazy open and
an append's publish go through :attr:`BankRegistry.admit` (the resident budget's room is made first).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..ingest import build_banks
from ..ingest.late import add_turns, place
from ..ingest.config import BuildConfig
from ..data.fields import id_field
from ..data.types import MAX_ID_CHARS, Conversation
from ..encode.base import Encoder
from ..errors import InputError, QuarantinedBank, UnknownBank
from ..store import Bank, Collection
from ..store.records import stamped
from ..store.segments import CompactionPolicy
from .erase import Erasure
from .forgets import ForgetPath, ForgetResult  # noqa: F401 - ForgetResult: imported from here too
from .history import HistoryStore, append_events
from .quarantine import cause_of
from .turns import AppendBatch, screen

log = logging.getLogger(__name__)


def check_bank_id(bank_id: str) -> None:
    """The store's rule for ids (a non-empty string, no control characters), and at most
    ``MAX_ID_CHARS``; an ``InputError`` naming ``bank_id`` otherwise."""
    if not isinstance(bank_id, str):
        raise InputError(f"bank_id: expected a bank id string, got {type(bank_id).__name__}")
    if len(bank_id) > MAX_ID_CHARS:
        raise InputError(f"bank id is {len(bank_id)} characters; the limit is {MAX_ID_CHARS}")
    id_field(bank_id, "bank_id", "bank id")


@dataclass
class AppendResult:
    bank: Bank
    created: bool
    appended: int
    stats: dict
    stored: list = field(default_factory=list)
    """Turn ids this append stored."""
    already_stored: list = field(default_factory=list)
    """Turn ids the bank held already with the same content (a retried append): not stored again."""
    items: list = field(default_factory=list)
    """Per item of the request, what was done with it (``memory.turns.AppendItem``)."""


class BankRegistry(ForgetPath):
    """Bank id -> current bank, plus the append and forget paths (thread-safe)."""

    def __init__(self, path: str | Path, owns=lambda bank_id: True, create: bool = True, lazy: bool = False,
                 compaction: CompactionPolicy | None = CompactionPolicy()):
        """:param owns: which bank ids this process serves (a Ray shard serves a slice).
        :param lazy: load no bank at start; each on first use (see the module docstring)
        :param compaction: when appends compact a bank (``store.segments.CompactionPolicy``; None: never)

        A missing collection is created empty (``created`` says so; banks come with appends),
        unless ``create=False`` (a ``BankError`` then)."""
        self.coll = Collection(path, create=create)
        self.coll.compaction = compaction
        self.created = self.coll.create_empty() if create else False
        self.owns = owns
        self.lazy = lazy
        self._banks: dict[str, Bank] = {}
        self.quarantined: dict[str, str] = {}
        """Bank id -> why the bank is not served (its files did not load, or not for the engine):
        the collection's other banks are (``memory.quarantine``)."""
        self.admit = _admit_now
        """How a bank enters memory: ``admit(bank_id, make, replacing=False)`` calls ``make()`` (a
        lazy open, an append's publish) and returns its bank; a lazy ``MemoryCore`` sets its own
        (``MemoryCore.admit``: room under the resident budget first)."""
        for b in () if lazy else self.coll.bank_ids:
            if owns(b):
                try:
                    self._banks[b] = self.coll.load(b)
                except Exception as e:  # noqa: BLE001 - one bad bank fails alone
                    self.quarantined[b] = cause_of(e, self.coll.path)
                    log.warning("bank %r is quarantined: %s", b, self.quarantined[b])
        self._lock = threading.Lock()
        self._bank_locks: dict[str, threading.Lock] = {}
        self._finished: dict[str, Erasure] = {}
        """Bank id -> a killed forget that opening the collection finished (``finish_pending``):
        the next forget of that bank answers as the rerun that finished it."""
        self.version = 0
        self.history = HistoryStore(self.coll.path)
        """Each unit's events (``memory.history``), appended after every write."""

    def __contains__(self, bank_id: str) -> bool:
        """Whether this process serves ``bank_id`` (loaded, or, ``lazy``, in the collection)."""
        if bank_id in self._banks:
            return True
        if not self.lazy or not isinstance(bank_id, str) or bank_id in self.quarantined or not self.owns(bank_id):
            return False
        if bank_id not in self.coll.banks:
            self.coll.refresh()  # a stat when nothing changed: banks other processes added are seen
        return bank_id in self.coll.banks

    def get(self, bank_id: str) -> Bank | None:
        """The bank ``bank_id`` (None: not served); ``lazy``: loaded now if it is not in memory (a bank
        that fails to load is quarantined, and None returned)."""
        bank = self._banks.get(bank_id)
        if bank is not None or not self.lazy or bank_id not in self:
            return bank
        with self._bank_lock(bank_id):
            bank = self._banks.get(bank_id)
            return bank if bank is not None else self.admit(bank_id, lambda: self._open(bank_id))

    def _open(self, bank_id: str) -> Bank | None:
        """Load ``bank_id`` (memory-mapped) and hold it (None: gone, or quarantined now); under its lock."""
        try:
            bank = self.coll.load(bank_id, mmap=True)
        except UnknownBank:
            return None
        except Exception as e:  # noqa: BLE001 - one bad bank fails alone
            self.quarantine(bank_id, cause_of(e, self.coll.path))
            return None
        with self._lock:
            self._banks[bank_id] = bank
            self.version += 1
        return bank

    def evict(self, bank_id: str) -> bool:
        """Let go of a loaded bank (``lazy`` only; its files stay): False while an append or forget
        of it runs (it is kept)."""
        lk = self._bank_lock(bank_id)
        if not self.lazy or not lk.acquire(blocking=False):
            return False
        try:
            with self._lock:
                gone = self._banks.pop(bank_id, None) is not None
                self.version += gone
            return gone
        finally:
            lk.release()

    def ids(self) -> list[str]:
        """Every bank id this process serves (loaded or not), quarantined ones left out."""
        if not self.lazy:
            return list(self.banks())
        self.coll.refresh()
        return [b for b in self.coll.bank_ids if self.owns(b) and b not in self.quarantined]

    def quarantine(self, bank_id: str, cause: str) -> None:
        """Stop serving ``bank_id`` (its files cannot be served: ``cause``); the files are kept."""
        with self._lock:
            self._banks.pop(bank_id, None)
            self.quarantined[bank_id] = cause
            self.version += 1
        log.warning("bank %r is quarantined: %s", bank_id, cause)

    def absent(self, bank_id: str, where: str = "") -> Exception:
        """The error for a bank this registry does not serve: ``QuarantinedBank`` (with its
        cause) or ``UnknownBank``."""
        cause = self.quarantined.get(bank_id)
        return UnknownBank(bank_id, where) if cause is None else QuarantinedBank(bank_id, cause, where)

    def banks(self) -> dict[str, Bank]:
        with self._lock:
            return dict(self._banks)

    @property
    def encoder_id(self) -> str | None:
        return self.coll.encoder_id

    def build_config(self, encoder_spec: str) -> BuildConfig:
        """Build config for banks created by a first append: the collection's own, if it has banks."""
        for b in self.banks().values():  # a copy: appends of other banks publish meanwhile
            if b.build_config:
                return BuildConfig.from_dict(b.build_config)
        if self.lazy:  # none loaded: one bank's metadata says
            from ..store.files import read_meta

            for b in self.coll.bank_ids[:1]:
                try:
                    cfg = read_meta(self.coll.bank_path(b)).get("build_config")
                except Exception:  # noqa: BLE001 - a bad bank says nothing; the default applies
                    cfg = None
                if cfg:
                    return BuildConfig.from_dict(cfg)
        return BuildConfig(encoder=encoder_spec)

    def _bank_lock(self, bank_id: str) -> threading.Lock:
        with self._lock:
            return self._bank_locks.setdefault(bank_id, threading.Lock())

    def append(self, bank_id: str, records: "list[dict] | AppendBatch", encoder: Encoder, encoder_spec: str,
               llm=None, layers=None) -> AppendResult:
        """Validate, build, persist and publish the valid items of ``records`` (a list of turn
        records, all or nothing as before; or an :class:`~.turns.AppendBatch`, answered per item:
        ``memory.turns.screen``). The result's ``bank`` is None when every item of a request for a
        new bank was refused (no bank is made).

        The read-modify-write goes through ``Collection.update``, under the bank's lock, from the
        bank as stored (another process may have appended since this one loaded it); the items are
        checked against that bank.

        Idempotent: turns whose ids the bank holds already *with the same content* are a retry of
        an append whose answer was lost; they are reported in ``already_stored`` and not stored
        again, and the rest are appended. An id the bank holds with other content is refused
        (``DuplicateTurns``, 409, with nothing appended, when the request is atomic). ``layers``: None, or
        ``(old, bank, turns) -> bank`` extending the layers before the write (``ingest.layers.steps.AddLayers``;
        on a bank this append creates only when it has ``on_create = True``: an import's facts).
        """
        check_bank_id(bank_id)
        if bank_id in self.quarantined:
            raise self.absent(bank_id)
        batch = records if isinstance(records, AppendBatch) else AppendBatch(list(records), atomic=True)
        done: dict = {}

        def extend(old: Bank | None) -> Bank | None:
            sc = screen(bank_id, batch, old)  # every item checked against the bank as stored
            turns = sc.turns
            done.update(created=old is None, appended=len(turns), stats={}, old=old, stored=sc.stored,
                        already_stored=sc.already_stored, items=sc.items)
            if not turns:
                return None  # all stored already: nothing to write
            turns = stamped(turns, kept=batch.stored_at)  # when they were stored (``Turn.stored_at``)
            if old is not None:  # at the end, or late ones at their place in time (``ingest.late``)
                cfg = BuildConfig.from_dict(old.build_config) if old.build_config else self.build_config(encoder_spec)
                bank, stats = add_turns(old, turns, sc.late, sc.derived, cfg, encoder, llm)
                bank = layers(old, bank, turns) if layers is not None else bank
            else:
                turns = place([], turns, sc.late, sc.derived) if sc.late else turns
                conv = Conversation(bank_id, turns, tuple(dict.fromkeys(t.speaker for t in turns)))
                (bank,), stats = build_banks([conv], self.build_config(encoder_spec), encoder, llm, progress=False)
                if getattr(layers, "on_create", False):  # an import's facts: written with the new bank
                    bank = layers(None, bank, sc.turns)
            done["stats"] = stats
            return bank

        with self._bank_lock(bank_id):
            bank = self.coll.update(bank_id, extend)
            if bank is None and done["old"] is None:  # every item refused: no bank is made
                return AppendResult(None, False, 0, {}, [], [], done["items"])
            if bank is not None:  # written: its events, appended to the bank's history under its lock
                self._record(bank_id, append_events(done["old"], bank, done["stored"]))
            if bank is None:  # nothing new: keep the bank published, unless the stored one differs
                cur = self._banks.get(bank_id)
                bank = cur if cur is not None and cur.n_units == done["old"].n_units else done["old"]
            self.admit(bank_id, lambda: self._publish(bank_id, bank), replacing=True)
            return AppendResult(bank, done["created"], done["appended"], done["stats"], done["stored"],
                                done["already_stored"], done["items"])

    def _publish(self, bank_id: str, bank: Bank) -> Bank:
        with self._lock:
            self._banks[bank_id] = bank
            self.version += 1
        return bank

    def rewrite(self, bank_id: str, change, events) -> Bank:
        """Bank ``bank_id`` rewritten by ``change(old) -> Bank`` in one ``Collection.update`` under
        its write lock, held as the current bank, and ``events(old, new)`` appended to its history
        (a layer write of its own: ``Memory.add_facts``, an import's facts with nothing to append)."""
        seen: dict = {}

        def run(old):
            seen["old"] = old
            return change(old)

        with self._bank_lock(bank_id):
            bank = self._publish(bank_id, self.coll.update(bank_id, run))
            self._record(bank_id, events(seen["old"], bank))
        return bank

    def _record(self, bank_id: str, events: list[dict]) -> None:
        """Append ``events`` to the bank's history (``memory.history``) under its file lock."""
        if events:
            with self.coll.bank_lock(bank_id):
                self.history.append(bank_id, events)


def _admit_now(bank_id: str, make, replacing: bool = False):
    """:attr:`BankRegistry.admit` without a budget: ``make()`` at once."""
    return make()
