"""Publishing a replaced bank's tables where its old rows are: only the rows that differ are written.

:meth:`TableStore.put <trawmem_gpu.select.engine.tables.TableStore.put>` appends a new bank's
rows past the end of every buffer, so a write costs the whole bank. When a bank grows by an
append, almost all of its rows are the old bank's: the unchanged prefix of its units, the threads
it keeps, their neighbour lists. :func:`write_in_place` publishes such a bank over its own rows
instead: a row equal to the one stored is left alone, a changed row is written, rows past the old
end are appended (a buffer that fills grows to twice its size, a new buffer: amortized O(1) per
row). The published tables are the very values :func:`~trawmem_gpu.select.engine.bank_tables.build_bank`
gave, row for row: only fewer bytes are written.

Isolation: it runs only while no select reads the store (``TableStore.reading`` counts them, under
the store's lock, which the write holds: a select that starts meanwhile waits for the new
snapshot), so no query ever reads a row half old, half new. With a select in flight the store
falls back to appending the bank whole, as before. A bank whose rows are not the last of a buffer
and would grow there, or whose neighbour lists widen, or that loses rows (a forget: its old rows
must go through the purge), also takes the append path.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .bank_tables import Hole


def _rows(a, seg) -> Tensor:
    """``a`` (NumPy or torch) as rows of ``seg``: its dtype and device, neighbour lists padded
    with the fill value to the buffer's width."""
    t = a if isinstance(a, Tensor) else torch.as_tensor(np.ascontiguousarray(a))
    t = t.to(device=seg.device, dtype=seg.dtype)
    if len(seg.shape) and t.ndim > 1 and t.shape[1] < seg.shape[0]:
        p = torch.full((t.shape[0], *seg.shape), seg.fill, dtype=seg.dtype, device=seg.device)
        p[:, :t.shape[1]] = t
        t = p
    return t


LOCAL_UNIT = ("unit_vecs", "unit_thread", "head_sim", "temporal", "position", "d_in")
"""Unit tables whose row is a function of the unit's own thread (its units, head vector and text)."""
LOCAL_THREAD = ("head_vecs",)
"""Thread tables whose row is a function of the thread alone."""


def kept_rows(old, new) -> dict[str, int]:
    """Table name -> leading rows of ``new``'s tables known equal to ``old``'s without comparing
    them: where ``new`` is an append to the very bank ``old`` (``engine.extend.kept_prefix``: it
    keeps the old bank's first threads, their units, heads and vectors as they are), the rows of
    those threads' units in :data:`LOCAL_UNIT` and of those threads in :data:`LOCAL_THREAD`.
    Empty otherwise (a unit view computed anew, another bank): every row is compared."""
    from .extend import kept_prefix

    kept = kept_prefix(old, new)
    if kept is None:
        return {}
    u, k = kept
    return {**{n: u for n in LOCAL_UNIT}, **{n: k for n in LOCAL_THREAD}}


def write_in_place(segments: dict, tables: tuple, start: dict, count: dict, arrays: dict,
                   same: dict | None = None) -> dict | None:
    """Write the bank ``arrays`` (``build_bank``'s) over the rows of the stored bank at ``start``
    with ``count`` rows per group, writing only rows that differ (``same``: table name -> leading
    rows known equal, :func:`kept_rows`: neither compared nor written); returns the new counts per
    group, or None (nothing written) when it cannot: a group shrinks, grows where it is not the
    last of its buffer, or a neighbour list is wider than its buffer. Call under the store's lock
    while no select reads it (see the module docstring)."""
    same = same or {}
    new = {}
    for name, group, _, _ in tables:
        a = arrays.get(name)
        if a is not None:
            new.setdefault(group, len(a))
    for name, group, _, _ in tables:
        a, s = arrays.get(name), segments[name]
        if a is None:
            if group not in new:
                new[group] = 0
            continue
        lo, old, n = start[group], count[group], new[group]
        if n < old or (n > old and lo + old != s.end):
            return None
        if isinstance(a, Hole) != s.in_hole(lo, lo + old) and old:
            return None  # a bank's vectors move between the table and its own file: appended whole
        if not isinstance(a, Hole) and len(s.shape) and a.ndim > 1 and a.shape[1] > s.shape[0]:
            return None
    if any(new.get(g, 0) != c and not any(arrays.get(nm) is not None for nm, gg, _, _ in tables if gg == g)
           for g, c in count.items()):
        return None  # a group the old bank had rows in and the new one has no table for
    for name, group, _, _ in tables:
        a, s = arrays.get(name), segments[name]
        if a is None:
            continue
        lo, old, n = start[group], count[group], new[group]
        if isinstance(a, Hole):  # rows the table reserves, never written (``bank_tables.Hole``)
            if lo + n > s.buf.shape[0]:
                s._regrow(max(2 * s.buf.shape[0], lo + n), s.shape)
            s.add_hole(lo + old, lo + n)
            s.end = max(s.end, lo + n)
            continue
        k = min(same.get(name, 0), old)
        t = _rows(a[k:], s)  # rows k.. of the bank
        if old > k:
            m = old - k
            diff = (s.buf[lo + k:lo + old] != t[:m]).reshape(m, -1).any(1).nonzero().flatten()
            if len(diff):
                s.buf[lo + k + diff] = t[diff]
        if n > old:
            if lo + n > s.buf.shape[0]:
                s._regrow(max(2 * s.buf.shape[0], lo + n), s.shape)
            s.buf[lo + old:lo + n] = t[old - k:]
            s.end = lo + n
    return new
