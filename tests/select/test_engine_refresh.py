"""Per-bank refresh of a serving engine (``replace_bank`` / ``remove_bank``) and per-query dates.

* a replaced or added bank selects exactly as a fresh engine (and the reference) on the new bank,
  the other banks as before; removed banks are unknown; rows of old banks are reclaimed;
* under concurrent refreshes, every ``select_units`` call sees one consistent set of banks: all
  of its queries on a bank get the old bank's picks or all the new bank's, never a mix;
* ``dates`` / ``now`` are checked and reach the objective the same way in the engine and the
  reference.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import numpy as np
import pytest

from engine_banks import make_bank, queries_of, reference
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.params import QueryParams
from trawmem_gpu.select.reference import select_reference

BACKENDS = [pytest.param({}, id="default"), pytest.param(dict(backend="tensor"), id="tensor")]


def _banks(seed=0):
    return [make_bank("a", [3, 4, 2, 5, 1], seed=seed + 1, n_semantic=3),
            make_bank("b", [2, 6, 3], seed=seed + 2),
            make_bank("c", [4, 4, 4, 4], seed=seed + 3, n_semantic=2)]


@pytest.mark.parametrize("kw", BACKENDS)
def test_replace_add_and_remove_banks(kw):
    cfg, qp = SelectConfig(), QueryParams(budget=5)
    a, b, c = _banks()
    eng = SelectionEngine([a, b, c], cfg, device="cpu", **kw)
    ids, qs, Z = queries_of([a, b, c])
    before = eng.select_units(ids, qs, Z, params=qp)
    b2 = make_bank("b", [3, 3, 3, 3, 1], seed=40, n_semantic=4)  # same id, other content and size
    d = make_bank("d", [5, 2, 2], seed=41)
    eng.replace_bank(b2)
    eng.replace_bank(d)  # a new id: added
    assert eng.bank_ids == ["a", "b", "c", "d"]
    ids2, qs2, Z2 = queries_of([a, b2, c, d], seed=5)
    fresh = SelectionEngine([a, b2, c, d], cfg, device="cpu", **kw).select_units(ids2, qs2, Z2, params=qp)
    assert eng.select_units(ids2, qs2, Z2, params=qp) == fresh == reference([a, b2, c, d], cfg, ids2, qs2, Z2, qp)
    keep = [i for i, x in enumerate(ids) if x != "b"]  # the untouched banks select as before
    assert eng.select_units([ids[i] for i in keep], [qs[i] for i in keep], Z[keep], params=qp) == \
        [before[i] for i in keep]
    eng.remove_bank("a")
    assert eng.bank_ids == ["b", "c", "d"]
    with pytest.raises(KeyError, match="unknown bank id 'a'"):
        eng.select_units(["a"], ["q"], Z[:1], params=qp)
    with pytest.raises(KeyError, match="unknown bank id 'zz'"):
        eng.remove_bank("zz")
    rest = [i for i, x in enumerate(ids2) if x != "a"]
    assert eng.select_units([ids2[i] for i in rest], [qs2[i] for i in rest], Z2[rest], params=qp) == \
        [fresh[i] for i in rest]
    for x in ("b", "c"):
        eng.remove_bank(x)
    with pytest.raises(ValueError, match="at least one bank"):
        eng.remove_bank("d")
    with pytest.raises(ValueError, match="has 8-dimensional vectors, the engine 16"):
        eng.replace_bank(make_bank("e", [2, 2], seed=9, unit_vecs=np.eye(4, 8, dtype=np.float32)))


@pytest.mark.parametrize("kw", BACKENDS)
def test_prepared_tables_publish_the_same_bank(kw):
    """``prepare_bank`` on another thread, then ``replace_bank(bank, prepared)``: the same picks
    as a plain ``replace_bank``; tables prepared for another bank object are refused."""
    cfg, qp = SelectConfig(), QueryParams(budget=5)
    a, b, c = _banks()
    plain = SelectionEngine([a, b, c], cfg, device="cpu", **kw)
    eng = SelectionEngine([a, b, c], cfg, device="cpu", **kw)
    b2 = make_bank("b", [3, 3, 3, 3, 1], seed=40, n_semantic=4)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("p", eng.prepare_bank(b2)))
    t.start()
    t.join()
    ids, qs, Z = queries_of([a, b, c])
    assert eng.select_units(ids, qs, Z, params=qp) == plain.select_units(ids, qs, Z, params=qp)  # nothing published yet
    eng.replace_bank(b2, out["p"])
    plain.replace_bank(b2)
    ids2, qs2, Z2 = queries_of([a, b2, c], seed=5)
    assert eng.select_units(ids2, qs2, Z2, params=qp) == plain.select_units(ids2, qs2, Z2, params=qp)
    b3 = make_bank("b", [3, 3, 3, 3, 1], seed=40, n_semantic=4)  # equal content, another object
    with pytest.raises(ValueError, match="another bank object"):
        eng.replace_bank(b3, out["p"])


def test_refresh_reclaims_rows_and_widens_neighbour_lists():
    """Replacing a bank many times triggers compactions (old rows are not kept forever); a bank
    with more graph neighbours than any before widens the neighbour lists."""
    cfg, qp = SelectConfig(), QueryParams(budget=4)
    a, b, _ = _banks(seed=10)
    eng = SelectionEngine([a, b], cfg, device="cpu")
    D0 = eng.snapshot.t["nbr"].shape[1]
    rows = []
    for i in range(12):
        eng.replace_bank(make_bank("b", [2, 6, 3], seed=50 + i))
        rows.append(eng.snapshot.rows["unit_vecs"])
    assert max(rows) < a.n_units + 4 * b.n_units, rows  # compacted, not 13 copies of b
    pairs = {(0, k): (0.5 + 0.01 * k, 1) for k in range(1, 12)}  # a hub thread with 11 neighbours
    hub = make_bank("hub", [1] * 12, seed=60, pairs=pairs)
    eng.replace_bank(hub)
    assert eng.snapshot.t["nbr"].shape[1] >= 11 > D0
    ids, qs, Z = queries_of([a, hub])
    assert eng.select_units(ids, qs, Z, params=qp) == reference([a, hub], cfg, ids, qs, Z, qp)


@pytest.mark.parametrize("kw", BACKENDS)
def test_concurrent_readers_see_one_bank_version(kw):
    """Reader threads select on every bank while a writer swaps bank "b" between two versions:
    each call's queries on "b" all carry the picks of one version, and "a" is never disturbed."""
    cfg, qp = SelectConfig(), QueryParams(budget=4)
    a, b1, c = _banks(seed=20)
    b2 = make_bank("b", [4, 1, 4, 2], seed=70)
    ids, qs, Z = queries_of([a, b1, c], per_bank=5, seed=8)
    want = {v: SelectionEngine([a, bv, c], cfg, device="cpu", **kw).select_units(ids, qs, Z, params=qp)
            for v, bv in (("1", b1), ("2", b2))}
    on_b = [i for i, x in enumerate(ids) if x == "b"]
    assert [want["1"][i] for i in on_b] != [want["2"][i] for i in on_b]  # the versions pick differently
    eng = SelectionEngine([a, b1, c], cfg, device="cpu", threads=2, **kw)
    stop = threading.Event()
    errors, seen, calls = [], [], [0]

    def reader():
        while not stop.is_set():
            try:
                got = eng.select_units(ids, qs, Z, params=qp)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
                return
            versions = [v for v in ("1", "2") if [got[i] for i in on_b] == [want[v][i] for i in on_b]]
            if len(versions) != 1:
                errors.append(f"a mix of versions: {[got[i] for i in on_b]}")
                return
            seen.append(versions[0])
            calls[0] += 1
            if any(got[i] != want["1"][i] for i in range(len(ids)) if ids[i] != "b"):
                errors.append("another bank changed")
                return

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    i = 0
    while (calls[0] < 24 or i < 8) and not errors and time.monotonic() < deadline:
        version = "2" if i % 2 == 0 else "1"
        n0 = len(seen)
        eng.replace_bank(b2 if version == "2" else b1)
        i += 1
        # hold the version until a reader has selected on it (a loaded machine may otherwise swap
        # back before any call starts on it, and the test would prove nothing about that version)
        hold = time.monotonic() + 10
        while version not in seen[n0:] and not errors and time.monotonic() < hold:
            time.sleep(0.002)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert set(seen) == {"1", "2"}, f"{len(seen)} calls saw {set(seen)} over {i} refreshes"


def test_dates_are_checked_and_reach_the_objective_alike():
    cfg, qp = SelectConfig(), QueryParams(budget=5)
    banks = _banks(seed=30)
    ids, qs, Z = queries_of(banks)
    eng = SelectionEngine(banks, cfg, device="cpu")
    dates = [datetime(2023, 5, 1 + i % 20, tzinfo=timezone.utc) if i % 3 else None for i in range(len(ids))]
    got = eng.select_units(ids, qs, Z, dates=dates, params=qp)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    ref = [select_reference(ctx[b], q, z, cfg, qp, now=d).units for b, q, z, d in zip(ids, qs, Z, dates)]
    assert got == ref
    with pytest.raises(ValueError, match=r"dates\[1\] must be a datetime or None \(got str\)"):
        eng.select_units(ids[:2], qs[:2], Z[:2], dates=[None, "2023-05-01"], params=qp)
    with pytest.raises(ValueError, match="2 queries but 1 dates"):
        eng.select_units(ids[:2], qs[:2], Z[:2], dates=[None], params=qp)
    with pytest.raises(TypeError, match="a date must be a datetime"):
        select_reference(ctx["a"], qs[0], Z[0], cfg, qp, now="yesterday")


def _dated(bank, start: datetime, days_per_thread: float):
    """``bank`` with dated units: thread j dated ``start + j * days_per_thread`` (one session each)."""
    from dataclasses import replace
    from datetime import timedelta

    ut = bank.unit_thread
    bank.turns = [replace(t, time=start + timedelta(days=days_per_thread * int(ut[i])))
                  for i, t in enumerate(bank.turns)]
    return bank


@pytest.mark.parametrize("kw", BACKENDS)
def test_recency_bonus_with_query_dates(kw):
    """w_rec > 0 and a query date favour recent units, alike in the engine and the reference; no
    date (or w_rec = 0, the default) changes nothing."""
    from trawmem_gpu.select.objective import ModularInputs, date_seconds
    from trawmem_gpu.select.terms.recency import recency

    t0 = datetime(2023, 1, 1, tzinfo=timezone.utc)
    banks = [_dated(b, t0, 20.0) for b in _banks(seed=40)]
    ids, qs, Z = queries_of(banks, per_bank=6, seed=11)
    now = [datetime(2023, 4, 11) if i % 4 else None for i in range(len(ids))]  # naive = UTC
    qp = QueryParams(budget=5)
    base = SelectionEngine(banks, SelectConfig(), device="cpu", **kw).select_units(ids, qs, Z, params=qp)
    assert SelectionEngine(banks, SelectConfig(), device="cpu", **kw).select_units(ids, qs, Z, dates=now,
                                                                                    params=qp) == base
    cfg = SelectConfig(w_rec=3.0, recency_half_life_days=30.0)
    eng = SelectionEngine(banks, cfg, device="cpu", **kw)
    got = eng.select_units(ids, qs, Z, dates=now, params=qp)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    assert got == [select_reference(ctx[b], q, z, cfg, qp, now=d).units for b, q, z, d in zip(ids, qs, Z, now)]
    assert all(g == b_ for g, b_, d in zip(got, base, now) if d is None)  # undated queries: no bonus
    changed = [i for i, (g, b_) in enumerate(zip(got, base)) if g != b_]
    assert changed and all(now[i] is not None for i in changed)
    ut = {b.bank_id: b.unit_thread for b in banks}  # later threads are more recent
    assert np.mean([ut[ids[i]][got[i]].mean() for i in changed]) > np.mean([ut[ids[i]][base[i]].mean()
                                                                            for i in changed])
    x = ModularInputs(None, np.array([[date_seconds(datetime(2023, 6, 1))], [date_seconds(datetime(2023, 5, 17))],
                                      [date_seconds(datetime(2023, 7, 1))], [np.nan]]), date_seconds(datetime(2023, 6, 1)))
    np.testing.assert_allclose(recency(x, 15.0), [1.0, 0.5, 1.0, 0.0])
    assert recency(ModularInputs(None, x.attrs, np.nan), 15.0).tolist() == [0.0] * 4
