"""The compact buffers of a loaded bank's turns (``store.turn_columns.TurnColumns`` reads them).

One :class:`Columns` holds N turns as arrays instead of N ``Turn`` objects: the texts and the ids
as one UTF-8 buffer each with int64 offsets, the speakers, timestamps (session dates) and
``stored_at`` strings interned as int32 codes into small tables, sessions and parsed times as
int64, captions and metadata (rare) as sparse maps from row to value. A turn costs about 40 bytes
plus its text's and id's UTF-8 bytes, against about 0.8 KiB as Python objects (measured in
docs/scaling.md, "Compact vectors"). Columns never change once built.
"""
from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np

from ..data.dates import naive_utc
from ..data.types import Turn

EPOCH = datetime(1970, 1, 1)
NO_TIME = np.iinfo(np.int64).min
"""The ``time`` column's value for a turn without a parsed time."""
_US = timedelta(microseconds=1)


def time_code(t: datetime | None) -> int:
    """``t`` (naive, or aware: as its naive UTC time) as microseconds since 1970 (exact for every
    ``datetime``); :data:`NO_TIME` for None."""
    if t is None:
        return int(NO_TIME)
    return (naive_utc(t) - EPOCH) // _US


def time_of(code: int) -> datetime | None:
    """The inverse of :func:`time_code`."""
    return None if code == NO_TIME else EPOCH + timedelta(microseconds=int(code))


class OutsideColumns(ValueError):
    """A turn holds a value the columns cannot (a session past 64 bits): its reader keeps a list
    of turns instead, which ``Bank.validate`` then refuses in its own words."""


class _Strings:
    """Many strings as one UTF-8 buffer (uint8) and offsets ([n + 1] int64)."""

    __slots__ = ("buf", "off")

    def __init__(self, buf: np.ndarray, off: np.ndarray):
        self.buf, self.off = buf, off

    @classmethod
    def of(cls, parts: list[bytes]) -> "_Strings":
        off = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=off[1:])
        return cls(np.frombuffer(b"".join(parts), dtype=np.uint8).copy(), off)

    def __getitem__(self, i: int) -> str:
        return self.buf[self.off[i]:self.off[i + 1]].tobytes().decode("utf-8")

    def block(self, lo: int, hi: int) -> list[str]:
        """Strings ``lo:hi`` (one copy of their bytes, then a slice each: what iteration reads)."""
        off = self.off[lo:hi + 1].tolist()
        b = self.buf[off[0]:off[-1]].tobytes()
        o0 = off[0]
        return [b[a - o0:c - o0].decode("utf-8") for a, c in zip(off[:-1], off[1:])]

    def take(self, idx: np.ndarray) -> "_Strings":
        """The strings of rows ``idx`` (in that order) as a new buffer: nothing of the others stays."""
        lo, hi = self.off[idx], self.off[idx + 1]
        n = hi - lo
        off = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(n, out=off[1:])
        pos = np.repeat(lo - off[:-1], n) + np.arange(int(off[-1]), dtype=np.int64)
        return _Strings(self.buf[pos], off)

    @staticmethod
    def concat(parts: list["_Strings"]) -> "_Strings":
        bufs, offs, base = [], [np.zeros(1, dtype=np.int64)], 0
        for p in parts:
            bufs.append(p.buf[p.off[0]:p.off[-1]])
            offs.append(p.off[1:] - p.off[0] + base)
            base += int(p.off[-1] - p.off[0])
        return _Strings(np.concatenate(bufs) if bufs else np.zeros(0, np.uint8), np.concatenate(offs))

    def nbytes(self) -> int:
        return self.buf.nbytes + self.off.nbytes


class Columns:
    """The turns of rows ``0..n-1`` (see the module docstring); built by :meth:`of`."""

    __slots__ = ("ids", "texts", "speaker", "speakers", "session", "stamp", "stamps", "time", "stored",
                 "stored_ats", "caption", "metadata", "_hash", "__weakref__")

    def __len__(self) -> int:
        return len(self.session)

    def __getstate__(self) -> dict:
        """Pickled without the id hash index: ``hash`` of a string differs between processes."""
        return {k: getattr(self, k) for k in self.__slots__ if k not in ("_hash", "__weakref__")}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._hash = None

    @classmethod
    def of(cls, turns) -> "Columns":
        """The columns of ``turns`` (any iterable of ``Turn``, read once; aware times are stored as
        their naive UTC times, as ``store.records.naive_utc_turns`` reads them)."""
        ids, texts, sessions, times = [], [], [], []
        codes = {"speaker": ({}, []), "stamp": ({}, []), "stored": ({None: -1}, [])}
        caption, metadata = {}, {}

        def code(name: str, v) -> int:
            table, out = codes[name]
            c = table.setdefault(v, len(table) - (name == "stored"))
            out.append(c)
            return c

        for i, t in enumerate(turns):
            if type(t) is not Turn:
                raise TypeError(f"turn columns hold plain Turn objects, got {type(t).__name__} at row {i}")
            if type(t.session) is not int:  # a bool or a float would be stored as another int
                raise TypeError(f"turn {t.turn_id!r}: session {t.session!r} is not an int")
            ids.append(t.turn_id.encode("utf-8"))
            texts.append(t.text.encode("utf-8"))
            sessions.append(t.session)
            times.append(time_code(t.time))
            code("speaker", t.speaker), code("stamp", t.timestamp), code("stored", t.stored_at)
            if t.caption is not None:
                caption[i] = t.caption
            if t.metadata is not None:
                metadata[i] = t.metadata
        c = cls.__new__(cls)
        c.ids, c.texts = _Strings.of(ids), _Strings.of(texts)
        try:
            c.session, c.time = np.array(sessions, dtype=np.int64), np.array(times, dtype=np.int64)
        except OverflowError:
            i, s = next((i, s) for i, s in enumerate(sessions) if not -(2 ** 63) <= s < 2 ** 63)
            raise OutsideColumns(f"turn {ids[i].decode('utf-8')!r} has session {s!r}, outside the 64-bit "
                                 f"integers the columns hold") from None
        for name, attr in (("speaker", "speakers"), ("stamp", "stamps"), ("stored", "stored_ats")):
            table, out = codes[name]
            setattr(c, name, np.array(out, dtype=np.int32))
            setattr(c, attr, tuple(k for k in table if k is not None or name != "stored"))
        c.caption, c.metadata, c._hash = caption, metadata, None
        return c

    def turn(self, i: int) -> Turn:
        """Row ``i`` as a new ``Turn`` (equal to the one stored; never the same object)."""
        s = int(self.stored[i])
        return Turn(self.ids[i], self.speakers[self.speaker[i]], self.texts[i], int(self.session[i]),
                    self.stamps[self.stamp[i]], time_of(int(self.time[i])), self.caption.get(i),
                    self.metadata.get(i), None if s < 0 else self.stored_ats[s])

    def block(self, lo: int, hi: int) -> list[Turn]:
        """Rows ``lo:hi`` as new ``Turn`` objects, made from whole columns at once (iteration reads
        blocks of them: :meth:`turn` per row costs several times more)."""
        sp, st, so = self.speakers, self.stamps, self.stored_ats
        cap, meta = self.caption, self.metadata
        tm = [time_of(x) for x in self.time[lo:hi].tolist()]
        return [Turn(i, sp[a], t, s, st[b], w, cap.get(r), meta.get(r), None if c < 0 else so[c])
                for r, i, a, t, s, b, w, c in zip(range(lo, hi), self.ids.block(lo, hi), self.speaker[lo:hi].tolist(),
                                                  self.texts.block(lo, hi), self.session[lo:hi].tolist(),
                                                  self.stamp[lo:hi].tolist(), tm, self.stored[lo:hi].tolist())]

    def take(self, idx) -> "Columns":
        """Rows ``idx`` (ascending or not) as new columns that share no buffer with these: a row
        left out (a forgotten turn) leaves no byte behind in them."""
        idx = np.asarray(idx, dtype=np.int64)
        c = Columns.__new__(Columns)
        c.ids, c.texts = self.ids.take(idx), self.texts.take(idx)
        for name in ("speaker", "session", "stamp", "time", "stored"):
            setattr(c, name, getattr(self, name)[idx].copy())
        c.speakers, c.stamps, c.stored_ats = self.speakers, self.stamps, self.stored_ats
        pos = {int(r): k for k, r in enumerate(idx.tolist())}
        c.caption = {pos[r]: v for r, v in self.caption.items() if r in pos}
        c.metadata = {pos[r]: v for r, v in self.metadata.items() if r in pos}
        c._hash = None
        return _interned_again(c)

    @staticmethod
    def concat(parts: list[tuple["Columns", int, int]]) -> "Columns":
        """Rows ``lo:hi`` of each part, one after another, as new columns."""
        c = Columns.__new__(Columns)
        c.ids = _Strings.concat([_sub(p.ids, lo, hi) for p, lo, hi in parts])
        c.texts = _Strings.concat([_sub(p.texts, lo, hi) for p, lo, hi in parts])
        c.session = np.concatenate([p.session[lo:hi] for p, lo, hi in parts])
        c.time = np.concatenate([p.time[lo:hi] for p, lo, hi in parts])
        for name, attr in (("speaker", "speakers"), ("stamp", "stamps"), ("stored", "stored_ats")):
            table: dict = {}
            out = []
            for p, lo, hi in parts:
                vals = getattr(p, attr)
                remap = np.array([table.setdefault(v, len(table)) for v in vals] + [-1], dtype=np.int32)
                out.append(remap[getattr(p, name)[lo:hi]])  # code -1 (no stored_at) maps to the -1 appended
            setattr(c, name, np.concatenate(out) if out else np.zeros(0, np.int32))
            setattr(c, attr, tuple(table))
        c.caption, c.metadata, base = {}, {}, 0
        for p, lo, hi in parts:
            c.caption.update({r - lo + base: v for r, v in p.caption.items() if lo <= r < hi})
            c.metadata.update({r - lo + base: v for r, v in p.metadata.items() if lo <= r < hi})
            base += hi - lo
        c._hash = None
        return c

    def hashes(self) -> np.ndarray:
        """[n] int64 Python ``hash`` of each row's id, and the rows sorted by it (made once)."""
        if self._hash is None:
            h = np.fromiter(map(hash, self.ids.block(0, len(self))), dtype=np.int64, count=len(self))
            order = np.argsort(h, kind="stable")
            self._hash = (h, order, h[order])
        return self._hash

    def rows_of(self, turn_id: str) -> np.ndarray:
        """The rows (ascending) whose id is ``turn_id``."""
        _, order, sorted_h = self.hashes()
        h = hash(turn_id)
        a, b = np.searchsorted(sorted_h, h, "left"), np.searchsorted(sorted_h, h, "right")
        return np.array(sorted(int(r) for r in order[a:b] if self.ids[int(r)] == turn_id), dtype=np.int64)

    def nbytes(self) -> int:
        """Bytes of the arrays (the small tables and sparse maps not counted)."""
        return self.ids.nbytes() + self.texts.nbytes() + sum(
            getattr(self, n).nbytes for n in ("speaker", "session", "stamp", "time", "stored"))


def _sub(s: _Strings, lo: int, hi: int) -> _Strings:
    return _Strings(s.buf, s.off[lo:hi + 1])


def _interned_again(c: Columns) -> Columns:
    """``c`` with its code tables cut to the values its rows use (a forgotten turn's speaker or
    date leaves no trace in them)."""
    for name, attr in (("speaker", "speakers"), ("stamp", "stamps"), ("stored", "stored_ats")):
        codes, vals = getattr(c, name), getattr(c, attr)
        used = np.unique(codes[codes >= 0])
        remap = np.full(len(vals) + 1, -1, dtype=np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        setattr(c, name, remap[codes])  # -1 indexes the last slot, which stays -1
        setattr(c, attr, tuple(vals[int(u)] for u in used))
    return c
