"""The served banks: loaded from a collection at start, extended by appends.

An append runs on an append thread, serialized per bank (two appends to one bank never
interleave; appends to different banks run side by side): the request's turns are validated
in full, the new bank is computed (``build.update_bank``, or ``build.build_banks`` for a first
append, which creates the bank) and written through ``Collection.update`` (under the
collection's own bank lock, against the bank as stored, atomic and durable: a new bank
directory renamed into place, then the index), and only then published here. Anything rejected
before the write leaves the bank as it was.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..construct import build_banks, update_bank
from ..config import BuildConfig
from ..data.fields import id_field
from ..data.types import Conversation
from ..encode.base import Encoder
from ..errors import InputError
from ..store import Bank, Collection
from .turns import parse_turns

MAX_BANK_ID = 256


class DuplicateTurns(InputError):
    """Turn ids that the bank already holds (HTTP 409)."""


def check_bank_id(bank_id: str) -> None:
    """The store's rule for ids (non-empty, no control characters), and at most 256 characters."""
    id_field(bank_id, "bank_id", "bank id")
    if len(bank_id) > MAX_BANK_ID:
        raise InputError(f"bank id is {len(bank_id)} characters; the limit is {MAX_BANK_ID}")


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


class BankRegistry:
    """Bank id -> current bank, plus the append path (thread-safe)."""

    def __init__(self, path: str | Path, owns=lambda bank_id: True):
        """:param owns: which bank ids this process serves (a Ray shard serves a slice).

        A missing collection is created empty (``created`` says so; banks come with appends)."""
        self.coll = Collection(path, create=True)
        self.created = self.coll.create_empty()
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
        for b in self._banks.values():
            if b.build_config:
                return BuildConfig.from_dict(b.build_config)
        return BuildConfig(encoder=encoder_spec)

    def _bank_lock(self, bank_id: str) -> threading.Lock:
        with self._lock:
            return self._bank_locks.setdefault(bank_id, threading.Lock())

    def append(self, bank_id: str, records: list[dict], encoder: Encoder, encoder_spec: str) -> AppendResult:
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
                if again:  # parse the new ones again, continuing from the bank's last turn
                    fresh = [r for r, t in zip(records, turns) if t.turn_id not in known]
                    turns = parse_turns(bank_id, fresh, last) if fresh else []
            done.update(created=old is None, appended=len(turns), stats={}, old=old,
                        stored=[t.turn_id for t in turns], already_stored=again)
            if not turns:
                return None  # all stored already: nothing to write
            if old is not None:
                cfg = BuildConfig.from_dict(old.build_config) if old.build_config else self.build_config(encoder_spec)
                bank, stats = update_bank(old, turns, cfg, encoder)
            else:
                conv = Conversation(bank_id, turns, tuple(dict.fromkeys(t.speaker for t in turns)))
                (bank,), stats = build_banks([conv], self.build_config(encoder_spec), encoder, progress=False)
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
