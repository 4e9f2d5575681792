"""The GEMM's unit rows cast once per snapshot (``engine.compiled.rows_as``, issue 46 item 3,
seventh pass): the kept casts are the per-call casts, a snapshot's cast is reused, the byte bound
holds, a new snapshot starts empty, and the picks are the same with and without kept casts."""
from __future__ import annotations

import numpy as np

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, compiled

from engine_banks import banks, make_bank, queries  # noqa: F401 - fixtures


def _many(queries, k=10):
    ids, qs, Z = queries
    return ids * k, [q + " " * i for i in range(k) for q in qs], np.concatenate([Z] * k)  # banks of 8+ queries: GEMMs


def test_kept_casts_are_the_casts_and_picks_do_not_change(banks, queries, monkeypatch):
    ids, qs, Z = _many(queries)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1)
    a = eng.select_units(ids, qs, Z)
    snap = eng._store.snapshot
    kept = snap.lazy("rows_as", dict)
    assert len(kept) > 1 and kept["bytes"] == sum(v.nbytes for k, v in kept.items() if k != "bytes")
    for (b, dt), rows in ((k, v) for k, v in kept.items() if k != "bytes"):
        vecs, base = compiled.unit_block(snap, b)
        want = np.asarray(vecs[base:base + snap.off.nu[b]], dtype=np.dtype(dt))
        assert rows.dtype == want.dtype and rows.tobytes() == want.tobytes()
        assert compiled.rows_as(snap, b, vecs[base:base + snap.off.nu[b]], np.dtype(dt)) is rows  # reused
    assert eng.select_units(ids, qs, Z) == a
    monkeypatch.setattr(compiled, "ROWS_KEPT_BYTES", 0)
    eng2 = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1)
    assert eng2.select_units(ids, qs, Z) == a
    assert eng2._store.snapshot.lazy("rows_as", dict) == {"bytes": 0}  # nothing kept past the bound
    eng.replace_bank(make_bank("extra", [2, 3], seed=9))
    assert eng._store.snapshot is not snap and "rows_as" not in eng._store.snapshot._lazy
    assert eng.select_units(ids, qs, Z) == a
