"""Which banks are held in memory, under a byte budget: least recently used first out.

With ``max_resident_bytes`` set (``MemoryOptions.max_resident_bytes``, ``trawmem serve
--max-resident-bytes``), a collection's banks are opened lazily, on their first query, append or
read (``BankRegistry.get``: their base vectors memory-mapped from their files), and when the
banks held pass the budget, the least recently used ones are let go: dropped from the engine's
tables and from the registry (their files stay; the next query opens them again). A bank's bytes
are :func:`bank_nbytes`: its arrays, its turns' text and objects, and the engine's tables of it.
The banks of the call that asks are never let go by it, and the engine keeps at least one bank,
so a budget smaller than one bank still serves (one bank at a time).

The budget holds while calls are in flight, within one bank's size: a bank enters memory (a lazy
open, the bank an append publishes, a bank's engine tables) only through ``MemoryCore.admit``,
one at a time (:attr:`Resident.room`), once the banks held, in-use ones counted, fit the budget
without it (the least recently used let go first). In-use banks are never let go (an append's or
a load's bank, the banks of the engine call running), so they can keep the total above the budget
until they are released; nothing waits for them, so nothing deadlocks, and a bank larger than the
budget still loads (it is then the only one held).

:class:`Resident` is the bookkeeping only; ``MemoryCore`` does the letting go (``evict``), of
banks in the engine only while it holds the engine's lock.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from ..store.layers import LAYERS
from ..store.turn_columns import TurnColumns

TURN_OVERHEAD = 360
"""Bytes a turn holds in memory besides its text (the ``Turn`` object, its id, speaker, date and
their string headers), measured with ``sys.getsizeof`` on LoCoMo turns."""


def _nbytes(x) -> int:
    if x is None:
        return 0
    if hasattr(x, "nbytes"):
        return int(x.nbytes)
    if hasattr(x, "element_size") and hasattr(x, "nelement"):
        return int(x.element_size() * x.nelement())
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0


def bank_nbytes(bank, tables=None) -> int:
    """What ``bank`` holds in memory: its arrays (memory-mapped ones too, as their pages are read),
    its turns (text and :data:`TURN_OVERHEAD`), its heads, and ``tables``: the engine's prepared
    tables of it (any nesting of arrays and tensors; None when not known)."""
    arrays = sum(_nbytes(getattr(bank, f, None)) for f in ("unit_vecs", "head_vecs", "edge_src", "edge_dst",
                                                            "edge_w", "edge_kind", "knn_sims", "knn_ids",
                                                            "thread_offsets",
                                                            *(x.vecs_field for x in LAYERS if x.vecs_field)))
    arrays += _nbytes(getattr(bank, "more_layers", None))  # the other layers' items and vectors (store.layers)
    text = _turns_nbytes(bank) + sum(len(h) + 50 for h in bank.heads)
    return arrays + text + _nbytes(tables)


def _turns_nbytes(bank) -> int:
    """The turns' part of :func:`bank_nbytes`, kept on the bank object (its turns never change); a
    bank appended to another (``extends``) adds its new turns' to that bank's: a write to a large
    bank does not walk every turn to count them. Turns held as columns
    (:class:`~..store.turn_columns.TurnColumns`) count their arrays' bytes and their tail's turns
    as plain ones: a columns row is no ``Turn`` object (:data:`TURN_OVERHEAD` overstated them)."""
    turns = bank.turns
    if isinstance(turns, TurnColumns):
        return turns.nbytes() + sum(len(t.text) + len(t.turn_id) + TURN_OVERHEAD for t in turns.tail)
    got = bank.__dict__.get("_turns_nbytes")
    if got is None:
        base = getattr(getattr(bank, "extends", None), "base", None)
        n0 = base.n_units if base is not None and "_turns_nbytes" in base.__dict__ else 0
        got = (base.__dict__["_turns_nbytes"] if n0 else 0) + sum(
            len(t.text) + len(t.turn_id) + TURN_OVERHEAD for t in bank.turns[n0:])
        bank.__dict__["_turns_nbytes"] = got
    return got


class Resident:
    """Bank id -> bytes, in least-recently-used order, against a budget (thread-safe)."""

    def __init__(self, max_bytes: int | None):
        self.max_bytes = max_bytes
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self.opened = 0
        """Banks opened since start (cold opens)."""
        self.evicted = 0
        """Banks let go since start."""
        self.room = threading.Condition(threading.RLock())
        """Held while a bank is admitted (``MemoryCore.admit``): banks enter memory one at a time."""

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, bank_id: str) -> bool:
        return bank_id in self._sizes

    def touch(self, bank_id: str, nbytes: int | None = None) -> None:
        """``bank_id`` was just used (its bytes, when given, replace what was recorded)."""
        with self._lock:
            if bank_id not in self._sizes:
                self.opened += 1
            if nbytes is not None or bank_id not in self._sizes:
                self._sizes[bank_id] = int(nbytes or 0)
            self._sizes.move_to_end(bank_id)

    def drop(self, bank_id: str) -> None:
        with self._lock:
            if self._sizes.pop(bank_id, None) is not None:
                self.evicted += 1

    def over(self, keep=(), but: str | None = None) -> list[str]:
        """The least recently used banks (oldest first, none of ``keep``) whose going brings the
        total within the budget (empty without a budget); ``but``: a bank not counted in the total
        (the one being admitted, whose bytes are about to change)."""
        if self.max_bytes is None:
            return []
        with self._lock:
            total, out = sum(n for b, n in self._sizes.items() if b != but), []
            for b, n in self._sizes.items():
                if total <= self.max_bytes:
                    break
                if b in keep or b == but:
                    continue
                out.append(b)
                total -= n
            return out
