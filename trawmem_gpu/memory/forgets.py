"""The forget path of a :class:`~.banks.BankRegistry`: turns or a whole bank erased from the stored
bank, the history and (through the journal the caller reads) every cache copy.

A forget runs serialized with the bank's appends (the bank's lock): the bank less the turns
(``ingest.forget.without_turns``) is written through ``Collection.update``, whole (no segment,
no compaction's copy outlives it), or the bank is deleted (``Collection.delete``) when no turn
is left; before the write, what is to be erased from the caches is journaled (``memory.erase``),
so a killed forget is finished when the collection is opened next (:meth:`ForgetPath.finished`),
and the caller erases the copies (``MemoryCore``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..encode.base import Encoder
from ..errors import UnknownBank
from ..ingest.forget import without_turns
from ..store import Bank
from .erase import Erasure, pause_point, read_journal, write_journal
from .history import forget_events, held_units
from .quarantine import stored_erasure


@dataclass
class ForgetResult:
    bank: Bank | None
    """The bank as it now is (None: no turn is left, the bank is gone)."""
    erasure: Erasure
    """What is to be erased from every other copy (a rerun's includes the unfinished one's)."""
    forgotten: list[str]
    missing: list[str]
    """Turn ids asked for that the bank does not hold (forgotten before, or never there)."""


class ForgetPath:
    """:meth:`forget` and what it needs, for :class:`~.banks.BankRegistry` (whose collection,
    banks, locks, history and quarantine it uses)."""

    def forget(self, bank_id: str, turn_ids: list[str] | None, encoder: Encoder, llm=None,
               outputs=()) -> ForgetResult:
        """Rebuild the bank without ``turn_ids`` (None: the whole bank), persist and publish.

        The bank is read from disk, not taken from memory: turns this process serves that the
        stored bank no longer holds (a forget from another process beside it) are forgotten here
        too, so the engine drops them and an id among them is reported forgotten, not missing.
        An unfinished forget of the bank (its journal) is finished with it. A quarantined bank
        is forgotten whole only (from what of its files still reads). ``outputs``: the score
        outputs to scrub, journaled with the rest.

        Raises ``UnknownBank`` when the collection holds no such bank and no forget of it is
        pending, ``QuarantinedBank`` for turn ids of a quarantined bank."""
        outputs = [str(Path(p).resolve()) for p in outputs]
        with self._bank_lock(bank_id):
            finished = self._finished.pop(bank_id, None)
            pending = read_journal(self.coll.path, bank_id)
            pending = finished if pending is None else pending.merged(finished)
            self.coll.refresh()
            seen = before = self._banks.get(bank_id)  # before: the bank the events compare (cold: as stored)
            if bank_id not in self.coll:
                if pending is None and seen is None and bank_id not in self.quarantined:
                    raise UnknownBank(bank_id)
                new, e = None, Erasure(bank_id, [], True) if seen is None else Erasure.of(seen, None, ())
            elif turn_ids is None or (pending is not None and pending.whole):
                new, e = None, self._whole(bank_id, seen, outputs)
            elif bank_id in self.quarantined:
                raise self.absent(bank_id)
            else:
                new, e, stored = self._shrink(bank_id, turn_ids, pending, seen, encoder, llm, outputs)
                before = seen if seen is not None else stored
            e = e.merged(pending)
            if new is None:
                self.coll.delete(bank_id, e.dirname)
            with self._lock:
                if new is None:
                    self._banks.pop(bank_id, None)
                    self.quarantined.pop(bank_id, None)
                elif self.owns(bank_id):
                    self._banks[bank_id] = new
                self.version += 1
            if new is None or e.turn_ids:  # no forgotten id left in clear (``memory.history``)
                with self.coll.bank_lock(bank_id):
                    self.history.forget(bank_id, None if new is None else held_units(new),
                                        forget_events(before, new, e.turn_ids))
            gone = set(e.turn_ids)
            return ForgetResult(new, e, list(e.turn_ids), [t for t in turn_ids or () if t not in gone])

    def _whole(self, bank_id: str, seen: Bank | None, outputs: list[str]) -> Erasure:
        """The journaled erasure of the whole stored bank (read leniently: a quarantined bank's
        files may not load) and of the copy this process serves."""
        with self.coll.lock(reading=True):  # never between a writer's two renames
            e = stored_erasure(self.coll.bank_path(bank_id), bank_id, self.coll.banks.get(bank_id),
                               self.coll.encoder_id)
        if seen is not None and not {t.turn_id for t in seen.turns} <= set(e.turn_ids):
            e = e.merged(Erasure.of(seen, None, (), e.dirname))
        e.outputs = list(outputs)
        write_journal(self.coll.path, e)  # before the bank goes: a killed forget is finished later
        pause_point("journaled")
        return e

    def _shrink(self, bank_id: str, turn_ids: list[str], pending: Erasure | None, seen: Bank | None,
                encoder: Encoder, llm, outputs: list[str]) -> tuple[Bank | None, Erasure, Bank]:
        """The stored bank less ``turn_ids`` and the pending forget's turns, written through
        ``Collection.update``; returns (the bank as it now is, or None when no turn is left, the
        erasure, the bank as stored before)."""
        done: dict = {}

        def shrink(old: Bank | None) -> Bank | None:
            if old is None:
                raise UnknownBank(bank_id)
            # an unfinished forget's turns go too (it may have been killed before the bank changed)
            ids = list(dict.fromkeys([*turn_ids, *(pending.turn_ids if pending else ())]))
            new, _ = without_turns(old, ids, encoder, llm)
            e = Erasure.of(old, new, ids, self.coll.banks.get(bank_id))
            held = {t.turn_id for t in old.turns}
            beside = [t.turn_id for t in seen.turns if t.turn_id not in held] if seen is not None else []
            if beside:  # forgotten by another process: this one's copy (the engine's) goes too
                e = e.merged(Erasure.of(seen, old, beside))
            e.outputs = list(outputs)
            if e.turn_ids:
                write_journal(self.coll.path, e)  # before the bank changes: a killed forget is finished later
                pause_point("journaled")
            done.update(new=new, erasure=e, old=old)
            return new if new is not None and new is not old else None

        self.coll.update(bank_id, shrink)
        return done["new"], done["erasure"], done["old"]

    def finished(self, e: Erasure) -> None:
        """Record that opening the collection finished the killed forget ``e`` (see ``_finished``):
        its ids and outputs only, no forgotten text (every copy of those is erased)."""
        with self._lock:
            self._finished[e.bank_id] = Erasure(e.bank_id, list(e.turn_ids), e.whole, dirname=e.dirname,
                                                outputs=list(e.outputs))
