"""A loaded bank's turns as a read-only sequence over compact columns (``store.columns``).

``store.files.load_bank`` gives a bank's ``turns`` as a :class:`TurnColumns` instead of a list of
``Turn`` objects: the columns hold the fields as arrays and a ``Turn`` is made only when one is
read (``turns[i]``, iteration, a slice's items), equal to the stored one but a new object each
time. It behaves as the list did for every reader: ``len``, indexes (negative too), slices (a
slice of step 1 is a view sharing the columns; another step is a list), iteration, ``==`` with any
sequence of turns (item by item), ``+`` (a list or a view with a longer tail). An append keeps the
columns and adds its turns as a short list tail (:func:`appended`); a forget takes the kept rows
into new columns (:func:`taken`) so a forgotten turn's bytes leave with the old bank.

Identity: a made ``Turn`` is never the stored object, so "the same turns" between two banks is
:func:`common_prefix` (the same rows of the same columns, or the same tail objects), not ``is``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..data.types import lexical_line
from .columns import Columns, time_of


BLOCK = 4096
"""Rows made into ``Turn`` objects at a time while iterating."""


class TurnColumns(Sequence):
    """Rows ``lo:hi`` of :class:`~.columns.Columns`, then ``tail`` (a tuple of ``Turn``)."""

    __slots__ = ("cols", "lo", "hi", "tail")

    def __init__(self, cols: Columns, lo: int = 0, hi: int | None = None, tail=()):
        self.cols, self.lo = cols, int(lo)
        self.hi = len(cols) if hi is None else int(hi)
        self.tail = tuple(tail)

    @classmethod
    def of(cls, turns) -> "TurnColumns":
        """``turns`` (an iterable of plain ``Turn``) as columns; a :class:`TurnColumns` with a tail
        is compacted into one set of columns (its rows copied, not made into ``Turn`` objects)."""
        if isinstance(turns, TurnColumns):
            if not turns.tail:
                return turns
            return cls(Columns.concat([(turns.cols, turns.lo, turns.hi), (Columns.of(turns.tail), 0, len(turns.tail))]))
        return cls(Columns.of(turns))

    @property
    def n_rows(self) -> int:
        """How many of the turns are column rows (the rest is the tail)."""
        return self.hi - self.lo

    def __len__(self) -> int:
        return self.hi - self.lo + len(self.tail)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._slice(i)
        n, nr = len(self), self.hi - self.lo
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"turn indices must be integers or slices, not {type(i).__name__}")
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"turn index {i} out of range for {n} turns")
        return self.cols.turn(self.lo + i) if i < nr else self.tail[i - nr]

    def _slice(self, s: slice):
        a, b, step = s.indices(len(self))
        if step != 1:
            return [self[i] for i in range(a, b, step)]
        b = max(a, b)
        nr = self.hi - self.lo
        return TurnColumns(self.cols, self.lo + min(a, nr), self.lo + min(b, nr),
                           self.tail[max(a - nr, 0):max(b - nr, 0)])

    def __iter__(self):
        for s in range(self.lo, self.hi, BLOCK):
            yield from self.cols.block(s, min(s + BLOCK, self.hi))
        yield from self.tail

    def __reversed__(self):
        yield from reversed(self.tail)
        turn = self.cols.turn
        for i in range(self.hi - 1, self.lo - 1, -1):
            yield turn(i)

    def __eq__(self, other) -> bool:
        if not isinstance(other, (Sequence, TurnColumns)) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __add__(self, other):
        return appended(self, list(other))

    def __radd__(self, other):
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"TurnColumns({len(self)} turns: {self.hi - self.lo} rows, {len(self.tail)} in the tail)"

    def texts(self) -> list[str]:
        """Every turn's ``text``, read from the columns (no ``Turn`` made for a row)."""
        return self.cols.texts.block(self.lo, self.hi) + [x.text for x in self.tail]

    def sessions(self) -> np.ndarray:
        """[len] int64 every turn's ``session``."""
        tail = np.fromiter((t.session for t in self.tail), dtype=np.int64, count=len(self.tail))
        return np.concatenate([self.cols.session[self.lo:self.hi], tail])

    def ids(self) -> list[str]:
        """Every turn's id."""
        return self.cols.ids.block(self.lo, self.hi) + [x.turn_id for x in self.tail]

    def field(self, name: str) -> list:
        """Every turn's ``name`` (:func:`field_of`; a reader that may not import the store asks this)."""
        return field_of(self, name)

    def ids_with_prefix(self, prefix: str) -> list[str]:
        """The ids that start with ``prefix``, in order (the rows' found in the ids buffer without
        decoding the others)."""
        c, p = self.cols.ids, prefix.encode("utf-8")
        start, n = c.off[self.lo:self.hi], np.diff(c.off[self.lo:self.hi + 1])
        ok = n >= len(p)
        if len(c.buf):
            for k, byte in enumerate(p):
                ok &= c.buf[np.minimum(start + k, len(c.buf) - 1)] == byte
        return [c[int(r)] for r in np.flatnonzero(ok) + self.lo] + \
            [t.turn_id for t in self.tail if t.turn_id.startswith(prefix)]

    def id_map(self) -> "TurnIds":
        return TurnIds(self)

    def nbytes(self) -> int:
        """Bytes of the columns' arrays (all rows, shared by every view of them)."""
        return self.cols.nbytes()


def appended(turns, new) -> Sequence:
    """``turns`` then ``new`` (a list of turns): a :class:`TurnColumns` grows its tail (the columns
    are shared, not copied); any other sequence becomes a list as before."""
    if isinstance(turns, TurnColumns):
        return TurnColumns(turns.cols, turns.lo, turns.hi, turns.tail + tuple(new))
    return list(turns) + list(new)


def taken(turns, idx) -> Sequence:
    """The turns at ``idx`` (ascending unit indices): for a :class:`TurnColumns` new columns holding
    only those rows (and its tail's kept turns), sharing no buffer with the old ones; else a list."""
    if not isinstance(turns, TurnColumns):
        return [turns[int(i)] for i in idx]
    idx = np.asarray(idx, dtype=np.int64)
    nr = turns.n_rows
    rows, rest = idx[idx < nr], idx[idx >= nr]
    out = TurnColumns(turns.cols.take(rows + turns.lo))
    return TurnColumns.of(appended(out, [turns.tail[int(i) - nr] for i in rest])) if len(rest) else out


def as_stored(turns) -> Sequence:
    """A bank's ``turns`` for a ``Bank``: a :class:`TurnColumns` as it is, anything else a list."""
    return turns if isinstance(turns, TurnColumns) else list(turns)


def common_prefix(a, b, start: int = 0) -> int:
    """The largest ``m >= start`` such that ``a[i]`` and ``b[i]`` are the same stored turn for every
    ``start <= i < m``: the same object, or the same row of the same columns (what ``is`` answered
    for two lists of turns; a made ``Turn`` is never the same object)."""
    n, m = min(len(a), len(b)), start
    if isinstance(a, TurnColumns) and isinstance(b, TurnColumns):
        if a.cols is b.cols and a.lo == b.lo:
            rows = min(a.n_rows, b.n_rows)
            if m < rows:
                m = rows
            if a.n_rows != b.n_rows:
                return min(m, n)
            while m < n and a.tail[m - rows] is b.tail[m - rows]:
                m += 1
            return m
        return m if m < n else n
    if isinstance(a, TurnColumns) or isinstance(b, TurnColumns):
        return min(m, n)
    while m < n and a[m] is b[m]:
        m += 1
    return m


def duplicate_id(turns) -> str | None:
    """An id that two of ``turns`` share (the first repeated, in order), or None."""
    if not isinstance(turns, TurnColumns):
        seen = set()
        for t in turns:
            if t.turn_id in seen:
                return t.turn_id
            seen.add(t.turn_id)
        return None
    h, _, _ = turns.cols.hashes()
    tail = np.fromiter((hash(t.turn_id) for t in turns.tail), dtype=np.int64, count=len(turns.tail))
    hs = np.concatenate([h[turns.lo:turns.hi], tail])
    order = np.argsort(hs, kind="stable")
    eq = np.flatnonzero(hs[order][1:] == hs[order][:-1])
    seen: set = set()
    for i in np.unique(np.concatenate([order[eq], order[eq + 1]])).tolist():  # equal hashes: compare ids
        tid = turns[i].turn_id
        if tid in seen:
            return tid
        seen.add(tid)
    return None


class TurnIds(Mapping):
    """Turn id -> turn over a :class:`TurnColumns` (``Bank.turn_map`` of a loaded bank), without a
    dict of every turn: a row's id is found through the columns' sorted id hashes (``Columns.hashes``,
    made once and shared by every view and append of them), the tail's through a small dict. Of a
    repeated id, the last turn (as the dict was)."""

    def __init__(self, turns: TurnColumns):
        self.turns = turns
        self._tail = {t.turn_id: t for t in turns.tail}

    def __getitem__(self, turn_id):
        if turn_id in self._tail:
            return self._tail[turn_id]
        if not isinstance(turn_id, str):
            raise KeyError(turn_id)
        t = self.turns
        rows = t.cols.rows_of(turn_id)
        rows = rows[(rows >= t.lo) & (rows < t.hi)]
        if not len(rows):
            raise KeyError(turn_id)
        return t.cols.turn(int(rows[-1]))

    def __contains__(self, turn_id) -> bool:
        try:
            self[turn_id]
        except KeyError:
            return False
        return True

    def __len__(self) -> int:
        return len(self.turns)  # a bank's ids are unique (``Bank.validate``)

    def __iter__(self):
        yield from self.turns.ids()

    def ids_with_prefix(self, prefix: str) -> list[str]:
        return self.turns.ids_with_prefix(prefix)

    def extended(self, new) -> "TurnIds":
        """The map of ``appended(self.turns, new)``."""
        return TurnIds(appended(self.turns, list(new)))


def held_values(turns, since: int = 0) -> Sequence:
    """The turns from ``since`` on whose values a check must read: of a :class:`TurnColumns` only
    its tail's (its rows hold int64 sessions and naive times by construction, ``Columns.of``)."""
    if isinstance(turns, TurnColumns):
        return turns.tail[max(since - turns.n_rows, 0):]
    return turns[since:]


FIELDS = ("turn_id", "speaker", "text", "session", "timestamp", "time", "caption", "metadata")


def field_of(turns, name: str) -> list:
    """Every turn's ``name`` (one of :data:`FIELDS`), in order: of a :class:`TurnColumns` read
    from its columns without making a ``Turn`` per row (what the engine build reads), else from
    the turns."""
    if name not in FIELDS:
        raise ValueError(f"field_of reads {', '.join(FIELDS)}; not {name!r}")
    if not isinstance(turns, TurnColumns):
        return [getattr(t, name) for t in turns]
    c, lo, hi = turns.cols, turns.lo, turns.hi
    if name in ("turn_id", "text"):
        rows = (c.ids if name == "turn_id" else c.texts).block(lo, hi)
    elif name in ("speaker", "timestamp"):
        table = c.speakers if name == "speaker" else c.stamps
        rows = [table[k] for k in (c.speaker if name == "speaker" else c.stamp)[lo:hi].tolist()]
    elif name == "session":
        rows = c.session[lo:hi].tolist()
    elif name == "time":
        rows = [time_of(x) for x in c.time[lo:hi].tolist()]
    else:
        rows = [getattr(c, name).get(r) for r in range(lo, hi)]  # the sparse maps: caption, metadata
    return rows + [getattr(t, name) for t in turns.tail]


def embed_texts(turns) -> list[str]:
    """Every turn's ``embed_text()`` (from the columns of a :class:`TurnColumns`: ``Turn.embed_text``'s
    rule, ``data.types.lexical_line``)."""
    if not isinstance(turns, TurnColumns):
        return [t.embed_text() for t in turns]
    return [f"[{st}] {lexical_line(sp, tx, cp)}" for st, sp, tx, cp in
            zip(*(field_of(turns, n) for n in ("timestamp", "speaker", "text", "caption")))]
