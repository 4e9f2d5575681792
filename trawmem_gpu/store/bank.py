"""The in-memory bank: units, threads (CSR over units), heads, vectors and the thread graph."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from ..data.types import Turn
from .turn_columns import TurnColumns, duplicate_id, held_values


SESSION_MIN, SESSION_MAX = -(2 ** 63), 2 ** 63 - 1
"""The sessions a bank can hold: what the engine's int64 tables hold (the turn schema's own bound
is narrower)."""


@dataclass
class Bank:
    """All threads, units and the thread graph of one memory owner.

    Threads are contiguous runs of units in source order: thread ``j`` holds units
    ``thread_offsets[j]:thread_offsets[j+1]``. Edges are stored in both directions, sorted by
    (src, dst).
    """

    bank_id: str
    turns: Sequence[Turn]
    """A list of turns, or a loaded bank's :class:`~.turn_columns.TurnColumns` (read-only, compact)."""
    thread_offsets: np.ndarray
    """[J+1] int64 CSR offsets of threads over units."""
    heads: list[str]
    head_kind: list[str]
    """Per thread: ``extractive`` or ``llm``."""
    unit_vecs: np.ndarray
    """[N, d] float32, L2-normalized."""
    head_vecs: np.ndarray
    """[J, d] float32, L2-normalized."""
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_w: np.ndarray
    edge_kind: np.ndarray
    encoder_id: str
    build_config: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    """Build bookkeeping (timings, fallbacks); not part of the bank's identity."""
    facts: tuple = ()
    """The facts layer (``store.facts.Fact``), kept beside the turns; not units unless a unit view
    (``store.view.unit_view``) makes them so."""
    fact_vecs: np.ndarray | None = None
    """[F, d] float32, L2-normalized (the bank's encoder, ``Fact`` embed text); None when no facts."""
    profiles: tuple = ()
    """The profiles layer (``store.facts.ProfileSection``, one per person and section)."""
    profile_vecs: np.ndarray | None = None
    """[P, d] float32, L2-normalized; None when no profiles."""
    layer_sources: dict = field(default_factory=dict)
    """Where each layer came from (``{"facts": "locomo"}``): an ``--update`` continues with it."""
    units: tuple[str, ...] = ("turns",)
    """The layers that are units here: ``("turns",)`` for a stored bank; a unit view's tuple, whose
    ``turns`` then also hold the fact and profile units (``store.view``)."""
    support_src: np.ndarray | None = None
    support_dst: np.ndarray | None = None
    """A unit view's support links (unit ``support_src[k]`` restates unit ``support_dst[k]``: a fact
    and a source turn, a profile section and a fact), read by the support kernel K; None: none."""
    knn_sims: np.ndarray | None = None
    knn_ids: np.ndarray | None = None
    """[J, k] each thread's k nearest other heads (``store.graph.knn_table``: similarity float32,
    thread id int64, -1 = none), which the semantic edges derive from and an append updates
    (``store.graph.update_knn``); None where not known (a bank of format 2, a synthetic bank):
    the next write computes it."""
    extends: object = field(default=None, compare=False, repr=False)
    """How this bank extends the bank it was computed from (``store.segments.Extension``, set by
    an append): the store writes it as a segment beside that bank's files; None: a bank of its own."""
    more_layers: dict = field(default_factory=dict)
    """The items and vectors (``{name: (items, vecs)}``) of the layers without fields of their own
    here (``store.layers``: a new layer needs no field; facts and profiles have theirs)."""

    @property
    def n_units(self) -> int:
        return len(self.turns)

    @property
    def n_threads(self) -> int:
        return len(self.thread_offsets) - 1

    @property
    def unit_thread(self) -> np.ndarray:
        """[N] int64 thread index of each unit."""
        return np.repeat(np.arange(self.n_threads, dtype=np.int64), np.diff(self.thread_offsets))

    def thread_units(self, j: int) -> range:
        return range(int(self.thread_offsets[j]), int(self.thread_offsets[j + 1]))

    @property
    def is_view(self) -> bool:
        """A unit view over more layers than the turns (never stored: ``store.files`` refuses it)."""
        return tuple(self.units) != ("turns",)

    def turn_map(self) -> dict:
        """Turn id -> turn (of a repeated id, the last), made once per bank object: its turns never
        change. An append hands the bank it returns the map of the bank it appended to with the
        new turns added (``ingest.builder.update_bank``), so a write to a large bank does not walk
        every turn to find its ids."""
        got = self.__dict__.get("_turn_map")
        if got is None:
            got = self.__dict__["_turn_map"] = self.turns.id_map() if isinstance(self.turns, TurnColumns) \
                else {t.turn_id: t for t in self.turns}
        return got

    def index_of(self) -> dict[str, int]:
        """turn id -> unit index."""
        return {t.turn_id: i for i, t in enumerate(self.turns)}

    def validate(self, since: tuple[int, int] = (0, 0)) -> None:
        """Structural invariants; raises ``ValueError`` naming the first broken one.

        :param since: ``(units, threads)``: the bank extends a validated bank of that many units
            and threads (an append), so the per-unit and per-thread checks of values (sessions,
            finite vectors, head kinds) run over the new ones only; the checks of the whole
            (ids, tiling, counts, edges) always run."""
        N, J = self.n_units, self.n_threads
        u0, j0 = since
        off = self.thread_offsets
        if N == 0 or J == 0:
            raise ValueError(f"bank {self.bank_id!r} is empty")
        if isinstance(self.turns, TurnColumns):  # no dict of every turn: the columns' id hashes
            dup = duplicate_id(self.turns)
        else:
            dup = None if len(self.turn_map()) == N else \
                next(i for i, c in Counter(t.turn_id for t in self.turns).items() if c > 1)
        if dup is not None:
            raise ValueError(f"bank {self.bank_id!r}: duplicate turn id {dup!r}")
        self._validate_values(u0)
        if off[0] != 0 or off[-1] != N or np.any(np.diff(off) <= 0):
            raise ValueError(f"bank {self.bank_id!r}: thread offsets do not tile the units (empty thread?)")
        lo = int(off[j0]) if j0 < J else N
        sess = self.turns[lo:].sessions() if isinstance(self.turns, TurnColumns) \
            else np.fromiter((t.session for t in self.turns[lo:]), dtype=np.int64, count=N - lo)
        start = np.zeros(N - lo, dtype=bool)
        start[off[j0:-1] - lo] = True
        cross = np.nonzero((sess[1:] != sess[:-1]) & ~start[1:])[0]
        if len(cross):
            j = int(np.searchsorted(off, lo + int(cross[0]) + 1, side="right")) - 1
            raise ValueError(f"bank {self.bank_id!r}: thread {j} crosses a session")
        if self.unit_vecs.shape[0] != N or self.head_vecs.shape[0] != J or len(self.heads) != J \
                or len(self.head_kind) != J:
            raise ValueError(f"bank {self.bank_id!r}: vector/head counts do not match units/threads")
        if not all(isinstance(h, str) for h in self.heads[j0:]) or not set(self.head_kind[j0:]) <= {"extractive", "llm"}:
            raise ValueError(f"bank {self.bank_id!r}: heads must be strings of kind 'extractive' or 'llm'")
        if not (len(self.edge_src) == len(self.edge_dst) == len(self.edge_w) == len(self.edge_kind)):
            raise ValueError(f"bank {self.bank_id!r}: edge arrays differ in length")
        for name, first in (("unit_vecs", u0), ("head_vecs", j0)):
            a = getattr(self, name)
            if not np.all(np.isfinite(a[first:])):
                raise ValueError(f"bank {self.bank_id!r}: {name} holds NaN or inf")
        self._validate_layers()
        if len(self.edge_src) and (min(self.edge_src.min(), self.edge_dst.min()) < 0
                                   or self.edge_src.max() >= J or self.edge_dst.max() >= J):
            raise ValueError(f"bank {self.bank_id!r}: an edge names an unknown thread")
        if self.knn_ids is not None and (self.knn_ids.shape[0] != J or self.knn_sims is None
                                         or self.knn_sims.shape != self.knn_ids.shape
                                         or (self.knn_ids.size and (self.knn_ids.min() < -1 or self.knn_ids.max() >= J))):
            raise ValueError(f"bank {self.bank_id!r}: the nearest-head table does not match the threads")

    def _validate_values(self, since: int = 0) -> None:
        """Every turn's session (from unit ``since`` on) is an integer the engine's int64 tables hold."""
        for t in held_values(self.turns, since):
            s = t.session
            if not isinstance(s, Integral) or isinstance(s, bool) or not SESSION_MIN <= s <= SESSION_MAX:
                raise ValueError(f"bank {self.bank_id!r}: turn {t.turn_id!r} has session {s!r}, outside the "
                                 f"64-bit integers [{SESSION_MIN}, {SESSION_MAX}] the engine's tables hold")

    def validate_stored(self, since: tuple[int, int] = (0, 0)) -> None:
        """:meth:`validate`, and what a stored bank holds besides: naive times (UTC), so the times
        of all the banks of a collection compare (``store.files`` checks it on write and load)."""
        self.validate(since)
        for t in held_values(self.turns, since[0]):
            if t.time is not None and t.time.utcoffset() is not None:
                raise ValueError(f"bank {self.bank_id!r}: turn {t.turn_id!r} has the timezone-aware time "
                                 f"{t.time.isoformat()}; a stored bank holds naive times (UTC)")

    def _validate_layers(self) -> None:
        """Every layer (``store.layers``): vectors that match its items, unique ids that are no turn
        ids, links to turns / units of the layers it requires that exist, and its own checks."""
        from .layers import LAYER_BY_NAME, LAYERS

        d = self.unit_vecs.shape[1]
        have = []
        for x in LAYERS:
            items, vecs = x.items(self), x.vecs(self)
            n = len(items)
            if (vecs is None) != (n == 0) or (vecs is not None and vecs.shape != (n, d)):
                raise ValueError(f"bank {self.bank_id!r}: {x.name} and {x.tensor} do not match "
                                 f"({n} {x.name}, vectors {None if vecs is None else vecs.shape})")
            if vecs is not None and not np.all(np.isfinite(vecs)):
                raise ValueError(f"bank {self.bank_id!r}: {x.tensor} holds NaN or inf")
            if n:
                have.append((x, items))
        if not have:
            return
        turn_ids = {m for t in self.turns for m in (getattr(t, "members", None) or (t.turn_id,))}  # bursts: members
        ids_of = {}
        for x, items in have:
            ids = [x.unit_id(it) for it in items]
            ids_of[x.name] = set(ids)
            if x.check is not None:
                x.check(self, items, ids)
            if len(set(ids)) != len(ids):
                dup = next(i for i, c in Counter(ids).items() if c > 1)
                raise ValueError(f"bank {self.bank_id!r}: duplicate {x.noun} id {dup!r}")
            if turn_ids & set(ids):
                raise ValueError(f"bank {self.bank_id!r}: {x.noun} id {sorted(turn_ids & set(ids))[0]!r} is also a "
                                 f"turn id")
            known = set().union(*(ids_of.get(r, ()) for r in x.requires)) if x.requires else turn_ids
            noun = LAYER_BY_NAME[x.requires[0]].noun if x.requires else "turn"
            for it in items:
                bad = [c for c in x.cites(it) if c not in known]
                if bad:
                    raise ValueError(f"bank {self.bank_id!r}: {x.noun} {x.unit_id(it)!r} cites {noun} {bad[0]!r}, "
                                     f"which the bank does not hold")
