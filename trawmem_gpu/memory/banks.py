"""The banks of a Memory (and of a server): loaded from a collection at start, extended by
appends, shrunk by forgets.

An append runs on an append thread, serialized per bank (two appends to one bank never
interleave; appends to different banks run side by side): the request's turns are validated
in full, the new bank is computed (``build.update_bank``, or ``build.build_banks`` for a first
append, which creates the bank) and written through ``Collection.update`` (under the
collection's own bank lock, against the bank as stored, atomic and durable: a new bank
directory renamed into place, then the index), and only then published here. Anything rejected
before the write leaves the bank as it was.

A forget runs the same way (serialized with the bank's appends): the bank less the turns
(``construct.forget.without_turns``) is written through ``Collection.update``, or the bank is
deleted (``Collection.delete``) when no turn is left; before the write, what is to be erased
from the caches is journaled (``memory.erase``), and the caller erases it (``MemoryCore``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..construct import build_banks, update_bank
from ..construct.forget import without_turns
from ..config import BuildConfig
from ..data.fields import check_order, id_field
from ..data.types import MAX_ID_CHARS, Conversation
from ..encode.base import Encoder
from ..errors import DuplicateTurns, InputError, UnknownBank
from ..store import Bank, Collection
from .erase import Erasure, pause_point, read_journal, write_journal
from .turns import parse_turns



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


def _same_turn(a, b) -> bool:
    """Whether two turns of one id carry the same content (what a client sent: the session is
    derived, so it is not compared)."""
    return (a.speaker, a.text, a.timestamp, a.caption) == (b.speaker, b.text, b.timestamp, b.caption)


@dataclass
class ForgetResult:
    bank: Bank | None
    """The bank as it now is (None: no turn is left, the bank is gone)."""
    erasure: Erasure
    """What is to be erased from every other copy (a rerun's includes the unfinished one's)."""
    forgotten: list[str]
    missing: list[str]
    """Turn ids asked for that the bank does not hold (forgotten before, or never there)."""


class BankRegistry:
    """Bank id -> current bank, plus the append and forget paths (thread-safe)."""

    def __init__(self, path: str | Path, owns=lambda bank_id: True, create: bool = True):
        """:param owns: which bank ids this process serves (a Ray shard serves a slice).

        A missing collection is created empty (``created`` says so; banks come with appends),
        unless ``create=False`` (a ``BankError`` then)."""
        self.coll = Collection(path, create=create)
        self.created = self.coll.create_empty() if create else False
        self.owns = owns
        self._banks: dict[str, Bank] = {b: self.coll.load(b) for b in self.coll.bank_ids if owns(b)}
        self._lock = threading.Lock()
        self._bank_locks: dict[str, threading.Lock] = {}
        self.version = 0

    def __contains__(self, bank_id: str) -> bool:
        return bank_id in self._banks

    def get(self, bank_id: str) -> Bank | None:
        return self._banks.get(bank_id)

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
        return BuildConfig(encoder=encoder_spec)

    def _bank_lock(self, bank_id: str) -> threading.Lock:
        with self._lock:
            return self._bank_locks.setdefault(bank_id, threading.Lock())

    def append(self, bank_id: str, records: list[dict], encoder: Encoder, encoder_spec: str,
               llm=None) -> AppendResult:
        """Validate, build, persist and publish; raises ``InputError`` (nothing changed) on bad turns.

        The read-modify-write goes through ``Collection.update``, under the bank's lock, from the
        bank as stored (another process may have appended since this one loaded it).

        Idempotent: turns whose ids the bank holds already *with the same content* are a retry of
        an append whose answer was lost; they are reported in ``already_stored`` and not stored
        again, and the rest are appended. An id the bank holds with other content raises
        ``DuplicateTurns`` (409), with nothing appended.
        """
        check_bank_id(bank_id)
        done: dict = {}

        def extend(old: Bank | None) -> Bank | None:
            last = old.turns[-1] if old is not None else None
            turns = parse_turns(bank_id, records, last)
            again: list = []
            if old is not None:
                known = {t.turn_id: t for t in old.turns}
                dup = [t.turn_id for t in turns if t.turn_id in known and not _same_turn(t, known[t.turn_id])]
                if dup:
                    raise DuplicateTurns(f"bank {bank_id!r} already holds turn ids {dup[:10]}"
                                         f"{' ...' if len(dup) > 10 else ''} with other content; nothing was appended")
                again = [t.turn_id for t in turns if t.turn_id in known]
            pos = list(range(len(records)))
            if again:  # parse the new ones again, continuing from the bank's last turn
                held = set(again)
                pos = [i for i, t in enumerate(turns) if t.turn_id not in held]
                turns = parse_turns(bank_id, [records[i] for i in pos], last) if pos else []
            prev = last  # the new ones in time order (a retried turn, dated before the bank's last, is left out above)
            for i, t in zip(pos, turns):
                check_order(t, prev, f"turns[{i}]")
                prev = t
            done.update(created=old is None, appended=len(turns), stats={}, old=old,
                        stored=[t.turn_id for t in turns], already_stored=again)
            if not turns:
                return None  # all stored already: nothing to write
            if old is not None:
                cfg = BuildConfig.from_dict(old.build_config) if old.build_config else self.build_config(encoder_spec)
                bank, stats = update_bank(old, turns, cfg, encoder, llm)
            else:
                conv = Conversation(bank_id, turns, tuple(dict.fromkeys(t.speaker for t in turns)))
                (bank,), stats = build_banks([conv], self.build_config(encoder_spec), encoder, llm, progress=False)
            done["stats"] = stats
            return bank

        with self._bank_lock(bank_id):
            bank = self.coll.update(bank_id, extend)
            if bank is None:  # nothing new: keep the bank published, unless the stored one differs
                cur = self._banks.get(bank_id)
                bank = cur if cur is not None and cur.n_units == done["old"].n_units else done["old"]
            with self._lock:
                self._banks[bank_id] = bank
                self.version += 1
            return AppendResult(bank, done["created"], done["appended"], done["stats"], done["stored"],
                                done["already_stored"])

    def forget(self, bank_id: str, turn_ids: list[str] | None, encoder: Encoder, llm=None) -> ForgetResult:
        """Rebuild the bank without ``turn_ids`` (None: the whole bank), persist and publish;
        ``UnknownBank`` when the collection holds no such bank and no forget of it is pending."""
        done: dict = {}
        path = self.coll.path

        def shrink(old: Bank | None) -> Bank | None:
            if old is None:
                raise UnknownBank(bank_id)
            # an unfinished forget's turns go too (it may have been killed before the bank changed)
            ids = None if turn_ids is None else list(dict.fromkeys([*turn_ids, *(pending.turn_ids if pending else ())]))
            if ids is None:
                new, st = None, {"missing": [], "forgotten": old.n_units}
            else:
                new, st = without_turns(old, ids, encoder, llm)
                asked = set(turn_ids)
                st["missing"] = [t for t in st["missing"] if t in asked]
            e = Erasure.of(old, new, ids or (), self.coll.banks.get(bank_id))
            if e.turn_ids:
                write_journal(path, e)  # before the bank changes: a killed forget is finished by a rerun
                pause_point("journaled")
            done.update(new=new, erasure=e, missing=st["missing"])
            return new if new is not None and new is not old else None

        with self._bank_lock(bank_id):
            pending = read_journal(path, bank_id)
            self.coll.refresh()
            if bank_id not in self.coll:
                if pending is None:
                    raise UnknownBank(bank_id)
                done.update(new=None, erasure=pending, missing=list(turn_ids or ()))
            else:
                self.coll.update(bank_id, shrink)
            e = done["erasure"].merged(pending)
            if done["new"] is None:
                self.coll.delete(bank_id, e.dirname)
            bank = done["new"]
            with self._lock:
                if bank is None:
                    self._banks.pop(bank_id, None)
                elif self.owns(bank_id):
                    self._banks[bank_id] = bank
                self.version += 1
            return ForgetResult(bank, e, [t for t in e.turn_ids if t not in done["missing"]], done["missing"])
