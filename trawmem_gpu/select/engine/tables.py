"""The store of the engine's per-bank tables (built by ``engine.bank_tables``) for many banks.

The store (:class:`TableStore`) keeps every bank's arrays side by side in growable buffers, one
per table, so the batched steps address any query's bank by offsets: unit ``i`` of bank ``b`` is
row ``uo[b] + i``, thread ``j`` row ``to[b] + j`` (row 0 is a dummy thread without neighbours),
``K_b[i, j]`` entry ``koff[b] + i * N_b + j``. No step can reach another bank's rows.

Per-bank refresh: :meth:`TableStore.put` builds the new bank's arrays (an append's from the held
bank's, ``engine/extend.py``), appends them past the end of every buffer (growing a buffer into a
new, larger one when full) and publishes a new :class:`Snapshot`; :meth:`TableStore.remove`
publishes one without the bank. A query batch reads one snapshot from start to end, counted
(:meth:`TableStore.reading`), so concurrent readers see the old bank or the new one, never a mix:
appends only write rows no published snapshot reads, and a buffer that grows or is compacted is a
new buffer (old snapshots keep the old one alive). While no batch reads, a bank that grows is
written over its own rows instead, only those that changed (``engine/publish.py``): a snapshot
is immutable while it is read. Rows of replaced or removed banks are reclaimed by a compaction
once they outweigh the live rows.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ...store.bank import Bank
from ..steps.candidates import BM25Store
from ..terms import UNIT_ATTRIBUTES
from .bank_tables import HOST_GROUPS, TABLES, BankInfo, Hole, Layout, build_bank, table_dtype
from .extend import EXTENDED
from .publish import kept_rows, write_in_place


class Offsets(NamedTuple):
    """Per stored bank (NumPy int64 ``[B]``, or torch on the device): first unit row ``uo``, first
    thread row ``to``, ``ktab`` / ``btab`` entry offsets, BM25 entry and column offsets, units and
    threads, and ``tab`` 1 where the bank's ``ktab`` / ``btab`` are stored (0: formed per query)."""

    uo: object
    to: object
    koff: object
    boff: object
    nz0: object
    col0: object
    nu: object
    nt: object
    tab: object


def _zeros(shape: tuple, dtype: torch.dtype, device, fill) -> Tensor:
    """A buffer of ``fill``; on the CPU a fill of 0 is NumPy's ``calloc``-backed zeros, whose pages
    stay unallocated until written (the rows of a :class:`Hole` cost no resident memory)."""
    if fill == 0 and torch.device(device).type == "cpu":
        return torch.from_numpy(np.zeros(shape, dtype=torch.empty(0, dtype=dtype).numpy().dtype))
    return torch.full(shape, fill, dtype=dtype, device=device)


class _Segment:
    """One growable table: a buffer of ``cap`` rows, ``end`` of them written, but for the row
    ranges ``holes`` (``[a, b)``, ascending: :class:`Hole` rows, never written or copied)."""

    def __init__(self, shape: tuple, dtype: torch.dtype, device, fill, cap: int):
        self.shape, self.dtype, self.device, self.fill = shape, dtype, device, fill
        self.buf = _zeros((max(cap, 1), *shape), dtype, device, fill)
        self.end = 0
        self.holes: list[tuple[int, int]] = []

    def append(self, rows) -> int:
        """Write ``rows`` (NumPy, torch or a :class:`Hole`) past the end, into a new, larger (or,
        for neighbour lists, wider) buffer when they do not fit; returns their first row."""
        n = len(rows)
        hole = isinstance(rows, Hole)
        wide = not hole and len(self.shape) and rows.ndim > 1 and rows.shape[1] > self.shape[0]
        if wide or self.end + n > self.buf.shape[0]:
            cap = max(2 * self.buf.shape[0], self.end + n) if self.end + n > self.buf.shape[0] else self.buf.shape[0]
            self._regrow(cap, (rows.shape[1],) if wide else self.shape)
        if hole:
            self.add_hole(self.end, self.end + n)
        elif n:
            t = rows if isinstance(rows, Tensor) else torch.as_tensor(np.ascontiguousarray(rows))
            t = t.to(device=self.device, dtype=self.dtype)
            if len(self.shape):
                self.buf[self.end:self.end + n, :t.shape[1]] = t
            else:
                self.buf[self.end:self.end + n] = t
        start = self.end
        self.end += n
        return start

    def add_hole(self, a: int, b: int) -> None:
        """Mark rows ``[a, b)`` a hole (merged with one ending at ``a``)."""
        if b <= a:
            return
        if self.holes and self.holes[-1][1] == a:
            self.holes[-1] = (self.holes[-1][0], b)
        else:
            self.holes.append((a, b))
            self.holes.sort()

    def written(self) -> list[tuple[int, int]]:
        """The row ranges ``[a, b)`` below ``end`` that are not holes."""
        out, a = [], 0
        for h0, h1 in self.holes:
            if h0 > a:
                out.append((a, min(h0, self.end)))
            a = max(a, h1)
        if self.end > a:
            out.append((a, self.end))
        return [(x, y) for x, y in out if y > x]

    def hole_rows(self) -> int:
        """Rows reserved as holes (never written, so never resident)."""
        return sum(h1 - h0 for h0, h1 in self.holes)

    def in_hole(self, a: int, b: int) -> bool:
        """Whether rows ``[a, b)`` lie in one hole (an empty range does)."""
        return b <= a or any(h0 <= a and b <= h1 for h0, h1 in self.holes)

    def clear(self) -> None:
        """Overwrite every written row with the fill value (holes hold nothing)."""
        for a, b in self.written():
            self.buf[a:b] = self.fill

    def _regrow(self, cap: int, shape: tuple) -> None:
        new = _zeros((cap, *shape), self.dtype, self.device, self.fill)
        for a, b in self.written():
            if len(shape):
                new[a:b, :self.shape[0]] = self.buf[a:b]
            else:
                new[a:b] = self.buf[a:b]
        self.buf, self.shape = new, shape


@dataclass(frozen=True, eq=False)
class _Entry:
    info: BankInfo
    start: dict
    count: dict


class Snapshot:
    """An immutable view of the stored banks: their infos, offsets and the table buffers.

    ``t[name]`` is the full buffer of table ``name`` (device tensor; the BM25 tables on the
    CPU); ``np[name]`` its NumPy view on a CPU engine. Lazily, per snapshot: the head index of
    the head seeds and the NumPy structures of the compiled backend.
    """

    def __init__(self, entries: list[_Entry], segments: dict[str, _Segment], device):
        self.infos: tuple[BankInfo, ...] = tuple(e.info for e in entries)
        self.index: dict[str, int] = {e.info.bank.bank_id: i for i, e in enumerate(entries)}
        groups = {g for _, g, _, _ in TABLES}
        col = {g: np.array([e.start[g] for e in entries], dtype=np.int64) for g in groups}
        self.off = Offsets(col["unit"], col["thread"], col["k"], col["b"], col["nz"], col["col"],
                           np.array([i.n_units for i in self.infos], dtype=np.int64),
                           np.array([i.n_threads for i in self.infos], dtype=np.int64),
                           np.array([i.tables for i in self.infos], dtype=np.int64))
        self.off_t = Offsets(*(torch.as_tensor(a, device=device) for a in self.off))
        self.rows = {name: s.end for name, s in segments.items()}
        self._holes = {name: s.hole_rows() for name, s in segments.items()}
        self.t: dict[str, Tensor] = {name: s.buf for name, s in segments.items()}
        self.np: dict[str, np.ndarray] = {name: b.numpy() for name, b in self.t.items() if b.device.type == "cpu"}
        self.dummy_thread = 0
        self.mapped = np.array([i.mapped for i in self.infos], dtype=bool)
        """Per bank: its unit vectors are its own (``BankInfo.mapped``), not ``unit_vecs`` rows."""
        self.max_units = int(self.off.nu.max())
        self.max_threads = int(self.off.nt.max())
        self._lock = threading.Lock()
        self._lazy: dict = {}

    @property
    def banks(self) -> list[Bank]:
        return [i.bank for i in self.infos]

    def bank_index(self, bank_id: str) -> int:
        try:
            return self.index[bank_id]
        except KeyError:
            raise KeyError(f"unknown bank id {bank_id!r}") from None

    def unit_cap(self, bidx: np.ndarray, threads: np.ndarray) -> np.ndarray:
        """``[Q]`` most candidates each query can have: the units of its bank's ``threads[q]``
        longest threads (``threads``: the most threads its neighbourhood may hold)."""
        flat, start = self.lazy("long_threads", self._long_threads)  # every bank's J + 1 entries, side by side
        bidx = np.asarray(bidx, dtype=np.int64)
        return flat[start[bidx] + np.minimum(np.asarray(threads, dtype=np.int64), self.off.nt[bidx])]

    def _long_threads(self) -> tuple[np.ndarray, np.ndarray]:
        flat = np.concatenate([i.long_threads for i in self.infos]).astype(np.int64)
        start = np.concatenate([[0], np.cumsum([len(i.long_threads) for i in self.infos])[:-1]]).astype(np.int64)
        return flat, start

    def lazy(self, key: str, build):
        """``build()`` once per snapshot (thread-safe), e.g. the head index."""
        with self._lock:
            if key not in self._lazy:
                self._lazy[key] = build()
            return self._lazy[key]

    def nbytes(self, names=None) -> int:
        """Bytes the tables ``names`` (None: all) hold: their buffers less the rows of their holes
        (``bank_tables.Hole``: address space never written, so never resident)."""
        return sum(held_bytes(b, self._holes.get(n, 0)) for n, b in self.t.items() if names is None or n in names)

    def postings(self, i: int) -> np.ndarray | None:
        """Bank ``i``'s ``bm_idx`` rows (its BM25 postings' units, a view), where its info keeps
        a lean index (``BM25Index.lean``: the table holds its only copy); else None."""
        bm = self.infos[i].bm25
        if bm is None or not bm.is_lean:
            return None
        nz0 = int(self.off.nz0[i])
        return self.np["bm_idx"][nz0:nz0 + int(bm.model.scores["indptr"][-1])]

    def unit_rows(self, i: int) -> dict | None:
        """Bank ``i``'s rows of the host tables ``extend.EXTENDED`` names (views), where its info
        keeps no arrays of its own (``bank_tables.store_holds``); else None."""
        if self.infos[i].arrays or any(name not in self.np for name in EXTENDED):
            return None
        uo, n = int(self.off.uo[i]), int(self.off.nu[i])
        return {name: self.np[name][uo:uo + n] for name in EXTENDED}

    @property
    def bm25(self) -> "BM25View":
        """The banks' BM25 vocabularies and score matrices, for the batched BM25 of step 3."""
        return self.lazy("bm25", lambda: BM25View(
            [i.vocab for i in self.infos], [i.plain for i in self.infos],
            BM25Store(self.np["bm_data"], self.np["bm_idx"], self.np["bm_ptr"], self.off.col0, self.off.nz0), {}))


class BM25View(NamedTuple):
    vocabs: list
    plain: list
    store: BM25Store
    words: dict
    """``{bank: {raw word: column}}``: the questions' words mapped to this snapshot's BM25 columns
    (``steps.candidates.bm25_columns``' ``maps``), kept across calls like ``lexical._stem``'s
    cache: a word is stemmed and looked up once per snapshot, not once per call."""


class TableStore:
    """Every bank's tables side by side (see the module docstring); ``snapshot`` is the current
    :class:`Snapshot`, replaced as a whole by :meth:`put` and :meth:`remove`."""

    def __init__(self, banks: list[Bank], cfg, layout: Layout):
        if not banks:
            raise ValueError("SelectionEngine needs at least one bank")
        ids = [b.bank_id for b in banks]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"bank ids must be unique (repeated: {dup[:5]})")
        self.cfg, self.layout = cfg, layout
        self._lock = threading.Lock()
        built = [build_bank(b, cfg, layout) for b in banks]
        size = {"unit": sum(i.n_units for i, _ in built), "thread": 1 + sum(i.n_threads for i, _ in built)}
        n = lambda a, name: 0 if a.get(name) is None else len(a[name])
        size.update({g: sum(n(a, name) for _, a in built) for g, name in
                     (("k", "ktab"), ("b", "btab"), ("nz", "bm_data"), ("col", "bm_ptr"))})
        width = max([a["nbr"].shape[1] for _, a in built] + [1])
        self._segments = self._new_segments(size, width)
        self._segments_append_dummy()
        self._entries: dict[str, _Entry] = {}
        self._dead = self._readers = 0
        for info, arrays in built:
            self._entries[info.bank.bank_id] = self._append(info, arrays)
        self.snapshot = Snapshot(list(self._entries.values()), self._segments, layout.device)

    def _new_segments(self, size: dict, width: int) -> dict[str, _Segment]:
        lay = self.layout
        shapes = {"unit_vecs": (lay.dim,), "head_vecs": (lay.dim if lay.heads else 0,), "attrs": (len(UNIT_ATTRIBUTES),),
                  "rel_idx": (3 if lay.relevance else 0,),
                  "nbr": (width,),
                  "nbw": (width,)}
        return {name: _Segment(shapes.get(name, ()), table_dtype(kind, lay), "cpu" if group in HOST_GROUPS else lay.device, fill,
                               size[group] + (1 if group == "thread" else 0))
                for name, group, kind, fill in TABLES}

    def _segments_append_dummy(self) -> None:
        for name, group, _, fill in TABLES:  # row 0 of the thread tables: a thread without neighbours
            if group == "thread":
                s = self._segments[name]
                s.append(np.full((1, *s.shape), fill, dtype=np.float64 if name != "nbr" else np.int64))

    def _append(self, info: BankInfo, arrays: dict) -> _Entry:
        start, count = {}, {}
        for name, group, _, _ in TABLES:
            rows = arrays.get(name)
            if rows is None:  # a table this engine does not build (no K / bridge tables, no BM25)
                rows = np.zeros((0, *self._segments[name].shape))
            s = self._segments[name].append(rows)
            if group not in start:
                start[group], count[group] = s, len(rows)
        return _Entry(info, start, count)

    def prepare(self, bank: Bank) -> tuple[BankInfo, dict]:
        """The slow half of :meth:`put`, ``bank``'s own tables, from any thread (nothing is published);
        from the tables of the bank it grew from where it is an append to it (``engine/extend.py``)."""
        with self.reading() as snap:  # no bank's rows are written over in place while its postings are read
            i = snap.index.get(bank.bank_id)
            if i is None:
                return build_bank(bank, self.cfg, self.layout)
            return build_bank(bank, self.cfg, self.layout, snap.infos[i], snap.postings(i), snap.unit_rows(i))

    def put(self, bank: Bank, prepared: tuple[BankInfo, dict] | None = None) -> None:
        """Add ``bank``, or replace the stored bank of the same id; publishes a new snapshot.
        ``prepared``: :meth:`prepare`'s result for this very bank, so only the publish runs here."""
        if prepared is not None and prepared[0].bank is not bank:
            raise ValueError(f"the prepared tables are for another bank object than {bank.bank_id!r}")
        info, arrays = prepared or self.prepare(bank)  # outside the lock: the slow part
        with self._lock:
            old = self._entries.get(bank.bank_id)
            counts = None if old is None or self._readers else \
                write_in_place(self._segments, TABLES, old.start, old.count, arrays, kept_rows(old.info.bank, bank))
            entry = self._append(info, arrays) if counts is None else _Entry(info, old.start, counts)
            entries = dict(self._entries)
            entries[bank.bank_id] = entry  # a replaced bank keeps its position (index)
            if old is not None and counts is None:
                self._dead += _rows(old)
            self._publish(entries)

    @contextmanager
    def reading(self):
        """The current snapshot, counted as read until the block ends: :meth:`put` writes a bank's
        rows in place only while nothing reads (``engine/publish.py``). Every select reads through it."""
        with self._lock:
            snap = self.snapshot
            self._readers += 1
        try:
            yield snap
        finally:
            with self._lock:
                self._readers -= 1

    def remove(self, bank_id: str) -> None:
        """Drop the bank ``bank_id`` (KeyError if unknown); the last bank cannot be removed."""
        with self._lock:
            if bank_id not in self._entries:
                raise KeyError(f"unknown bank id {bank_id!r}")
            if len(self._entries) == 1:
                raise ValueError(f"cannot remove {bank_id!r}: an engine holds at least one bank")
            entries = {k: v for k, v in self._entries.items() if k != bank_id}
            self._dead += _rows(self._entries[bank_id])
            self._publish(entries)

    def _publish(self, entries: dict[str, _Entry]) -> None:
        live = sum(_rows(e) for e in entries.values())
        if self._dead > live:
            entries = self._compact(entries)
        self._entries = entries
        self.snapshot = Snapshot(list(entries.values()), self._segments, self.layout.device)

    def _compact(self, entries: dict[str, _Entry]) -> dict[str, _Entry]:
        """Copy the live banks' rows into fresh buffers (old snapshots keep the old ones)."""
        old = self._segments
        size = {g: sum(e.count[g] for e in entries.values()) for g in {g for _, g, _, _ in TABLES}}
        size["thread"] += 1
        self._segments = self._new_segments(size, old["nbr"].shape[0])
        self._segments_append_dummy()
        out = {}
        for bid, e in entries.items():
            start = {}
            for name, group, _, _ in TABLES:
                a, n = e.start[group], e.count[group]
                rows = Hole(n) if name == "unit_vecs" and e.info.mapped else old[name].buf[a:a + n]
                s = self._segments[name].append(rows)
                start.setdefault(group, s)
            out[bid] = _Entry(e.info, start, e.count)
        self._dead = 0
        return out

    def purge(self) -> None:
        """Compact the live banks into fresh buffers and overwrite every old buffer with its fill
        value, so no table holds a row of a removed or replaced bank (forgetting). Only while no
        query reads an older snapshot (they read the old buffers)."""
        with self._lock:
            old = list(self._segments.values())
            self._entries = self._compact(dict(self._entries))
            self.snapshot = Snapshot(list(self._entries.values()), self._segments, self.layout.device)
            for seg in old:
                seg.clear()

    def wipe(self) -> None:
        """Overwrite every buffer with its fill value: the store is done with (its last bank
        forgotten); nothing may select from it afterwards."""
        with self._lock:
            for seg in self._segments.values():
                seg.clear()

    def nbytes(self) -> int:
        return self.snapshot.nbytes()

    def held_nbytes(self) -> dict[str, int]:
        """Per table, the bytes its buffer holds less its holes' rows (``bank_tables.Hole``: reserved
        address space, never written, so never resident)."""
        return {name: held_bytes(seg.buf, seg.hole_rows()) for name, seg in self._segments.items()}


def held_bytes(buf: Tensor, hole_rows: int) -> int:
    """Bytes of ``buf`` less ``hole_rows`` of its rows."""
    n = buf.element_size() * buf.nelement()
    return n - (n // max(buf.shape[0], 1)) * hole_rows


def _rows(e: _Entry) -> int:
    return sum(e.count.values())


def unit_rows(snap: Snapshot, idx) -> Tensor:
    """Rows ``idx`` (an index tensor or a slice) of the ``unit_vecs`` table in the engine's dtype (its
    ``head_sim`` table's): the one way a torch reader reaches unit vectors. The table may hold them
    as float32 on a float64 engine (``Layout.vec_dtype``); the cast of the gathered rows is exact,
    so a product of them is the float64 table's product. Rows of a bank whose vectors are its own
    (``Snapshot.mapped``) are read from them (:func:`mapped_rows`)."""
    if snap.mapped.any():
        if isinstance(idx, slice):
            idx = torch.arange(snap.t["unit_vecs"].shape[0])[idx]
        rows = mapped_rows(snap, idx)
    else:
        rows = snap.t["unit_vecs"][idx]
    return rows.to(snap.t["head_sim"].dtype)


def mapped_rows(snap: Snapshot, idx) -> Tensor:
    """The ``unit_vecs`` table's rows at the global unit rows ``idx`` (any shape; the table's dtype),
    those of mapped banks' units read from their bank's own vectors (float32, as the table's rows)
    and never from the table: its rows for them are a hole, whose every read would fault in a zero
    page (139 candidates' rows cost about 0.2 ms of faults at 10^6 units)."""
    tab = snap.t["unit_vecs"]
    idx = torch.as_tensor(idx)
    flat = np.asarray(idx.cpu().numpy(), dtype=np.int64).reshape(-1)
    order = np.argsort(snap.off.uo, kind="stable")
    b = order[np.searchsorted(snap.off.uo[order], flat, side="right") - 1]
    hit = snap.mapped[b] & (flat - snap.off.uo[b] < snap.off.nu[b])
    if not hit.any():
        return tab[idx]
    out = torch.empty((len(flat), tab.shape[1]), dtype=tab.dtype, device=tab.device)
    rest = np.flatnonzero(~hit)
    if len(rest):
        at = torch.as_tensor(rest, device=tab.device)
        out[at] = tab[torch.as_tensor(flat[rest], device=tab.device)]
    for bank in np.unique(b[hit]).tolist():
        sel = np.flatnonzero(hit & (b == bank))
        vecs, base = unit_block(snap, bank)
        got = np.asarray(vecs[base + flat[sel] - int(snap.off.uo[bank])])  # global rows -> the bank's own
        out[torch.as_tensor(sel, device=out.device)] = torch.as_tensor(got).to(device=out.device, dtype=out.dtype)
    return out.reshape(*idx.shape, tab.shape[1])


def unit_block(snap: Snapshot, bank: int) -> tuple[np.ndarray, int]:
    """``(vecs, base)``: bank ``bank``'s unit ``i`` is row ``base + i`` of ``vecs`` -- the
    ``unit_vecs`` table (NumPy) at the bank's offset, or for a mapped bank (``Snapshot.mapped``)
    its own ``[N, d]`` float32 vectors at 0 (a loaded bank's memory-mapped file: the rows a query
    gathers are read from it; a numba reader sums them in float64 as it does the table's)."""
    if snap.mapped[bank]:
        return np.asarray(snap.infos[bank].bank.unit_vecs), 0
    return snap.np["unit_vecs"], int(snap.off.uo[bank])
