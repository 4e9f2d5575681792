"""A chunk over shortlists writes its neighbourhood positions (``Candidates.tpos``, ``[Qc, J]``)
into an array its thread keeps all -1 between chunks (``compiled.TPOS_KEPT``): the same picks and
candidates as a new array per chunk, the array all -1 again after every chunk (a select and a
candidates call, one query and several), and dropped when a chunk is cut short."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, compiled

from test_assembly import _bank


def test_kept_positions_pick_the_same_and_are_all_minus_one_after(monkeypatch):
    banks, (ids, qs, Z) = _bank(1999, False, seed=11)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=16)
    got, cands = [], []
    for i in range(0, len(ids), 3):  # chunks of one and of several queries
        got.append(eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1]))
        cands.append(eng.candidate_sets(ids[i:i + 3], qs[i:i + 3], Z[i:i + 3]))
        free = compiled._TPOS.free
        assert free is not None and (free == -1).all()
    again = eng.select_units(ids[:1], qs[:1], Z[:1])
    free = compiled._TPOS.free  # a chunk of another shape: a new array, kept
    eng.select_units(ids[1:2], qs[1:2], Z[1:2])
    assert compiled._TPOS.free is free  # the same array, lent and given back
    monkeypatch.setattr(compiled, "TPOS_KEPT", False)
    assert again == eng.select_units(ids[:1], qs[:1], Z[:1])
    for k, i in enumerate(range(0, len(ids), 3)):
        assert got[k] == eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
        want = eng.candidate_sets(ids[i:i + 3], qs[i:i + 3], Z[i:i + 3])
        assert all(np.array_equal(a, b) for a, b in zip(cands[k], want))


def test_a_chunk_cut_short_drops_the_kept_positions(monkeypatch):
    banks, (ids, qs, Z) = _bank(777, False, seed=12)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=16)
    eng.select_units(ids[:1], qs[:1], Z[:1])
    held = compiled._TPOS.free
    assert held is not None

    def boom(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(compiled, "run_stage", boom)
    with pytest.raises(KeyboardInterrupt):
        eng.select_units(ids[:1], qs[:1], Z[:1])
    assert compiled._TPOS.free is None  # its neighbourhood entries were set: not kept
    monkeypatch.undo()
    eng.select_units(ids[:1], qs[:1], Z[:1])
    assert compiled._TPOS.free is not held and (compiled._TPOS.free == -1).all()
