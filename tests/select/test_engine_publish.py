"""A grown bank published over its own rows (``select/engine/publish.py``) holds exactly the tables
of a fresh engine over the same banks, row for row in every group (units, threads, K and bridge
tables, BM25), and picks what it picks; the in-place write is skipped (the bank appended whole, as
before) while a select reads the store, for a bank that shrinks (a forget) and for one that would
grow where another bank's rows follow."""
from __future__ import annotations

import numpy as np
import pytest

from engine_banks import VOCAB, _unit, make_bank, queries_of
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.engine.tables import TABLES
from trawmem_gpu.select.params import QueryParams
from trawmem_gpu.store.graph import ADJACENT, SEMANTIC

BACKENDS = [pytest.param({}, id="default"), pytest.param(dict(backend="tensor"), id="tensor"),
            pytest.param(dict(table_max_units=0), id="no-tables")]
MAX_N = 56


def _pool(seed: int):
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(VOCAB, size=int(rng.integers(3, 8)))) + (" last week" if i % 5 == 0 else "")
             for i in range(MAX_N)]
    return _unit(rng, MAX_N), texts, rng


def _grown(bank_id: str, lens: list[int], pool, semantic: dict) -> object:
    E, texts, _ = pool
    n = sum(lens)
    pairs = {(j, j + 1): (1.0, ADJACENT) for j in range(len(lens) - 1)}
    for (a, b), w in semantic.items():
        if b < len(lens):
            pairs.setdefault((a, b), (w, SEMANTIC))
    return make_bank(bank_id, lens, seed=0, unit_vecs=E[:n], texts=texts[:n], pairs=pairs)


def _rows(eng, bank_id: str) -> dict:
    """Every table's rows of ``bank_id`` (all groups, from the store's entry)."""
    st = eng._store
    e = st._entries[bank_id]
    snap = eng.snapshot
    return {name: snap.t[name][e.start[g]:e.start[g] + e.count[g]].cpu().numpy().copy()
            for name, g, _, _ in TABLES if st._segments[name].end > 0 or e.count[g] == 0}


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _grow(rng, lens: list[int], semantic: dict) -> str:
    """One random append: extend the last thread, start a new one, join an earlier thread, or link
    the last thread to an earlier one by a semantic edge."""
    kind = ["extend", "new", "join", "edge"][int(rng.integers(4))]
    if kind == "extend":
        lens[-1] += int(rng.integers(1, 3))
    elif kind == "new":
        lens.append(int(rng.integers(1, 4)))
    elif kind == "join" and len(lens) > 1:
        lens[int(rng.integers(len(lens) - 1))] += 1
    elif len(lens) > 2:
        semantic[(int(rng.integers(len(lens) - 1)), len(lens) - 1)] = float(rng.uniform(0.3, 1.0))
    return kind


@pytest.mark.parametrize("kw", BACKENDS)
def test_random_appends_publish_the_tables_of_a_fresh_engine(kw):
    cfg, qp = SelectConfig(), [QueryParams(budget=4), QueryParams(budget=None, token_budget=60)]
    pool = _pool(1)
    rng = pool[2]
    a = make_bank("a", [3, 4, 2], seed=5)
    lens, semantic = [3, 2], {}
    b = _grown("b", lens, pool, semantic)
    eng = SelectionEngine([a, b], cfg, device="cpu", **kw)
    in_place = 0
    while sum(lens) < MAX_N - 4:
        _grow(rng, lens, semantic)
        b = _grown("b", lens, pool, semantic)
        before = eng.snapshot.rows["unit_vecs"]
        eng.replace_bank(b)
        in_place += eng.snapshot.rows["unit_vecs"] < before + b.n_units  # not appended whole
        fresh = SelectionEngine([a, b], cfg, device="cpu", **kw)
        _same(_rows(eng, "b"), _rows(fresh, "b"))
        _same(_rows(eng, "a"), _rows(fresh, "a"))
        ids, qs, Z = queries_of([a, b], seed=int(rng.integers(100)), per_bank=3)
        for p in qp:
            assert eng.select_units(ids, qs, Z, params=p) == fresh.select_units(ids, qs, Z, params=p)
    assert in_place >= 4


def test_a_select_in_flight_keeps_its_rows_and_the_bank_is_appended_whole():
    cfg = SelectConfig()
    pool = _pool(2)
    lens, semantic = [3, 2, 4], {}
    b = _grown("b", lens, pool, semantic)
    eng = SelectionEngine([make_bank("a", [3, 4], seed=6), b], cfg, device="cpu")
    with eng._store.reading() as snap:
        rows = {k: v.clone() for k, v in snap.t.items()}
        lens[-1] += 2
        b2 = _grown("b", lens, pool, semantic)
        eng.replace_bank(b2)
        for k, v in rows.items():  # nothing the reader's snapshot holds was written
            n = snap.rows[k]
            np.testing.assert_array_equal(snap.t[k][:n].numpy(), v[:n].numpy(), err_msg=k)
    assert eng.snapshot.rows["unit_vecs"] == snap.rows["unit_vecs"] + b2.n_units  # appended whole
    lens[-1] += 1  # no reader: in place again
    b3 = _grown("b", lens, pool, semantic)
    before = eng.snapshot.rows["unit_vecs"]
    eng.replace_bank(b3)
    assert eng.snapshot.rows["unit_vecs"] == before + 1
    _same(_rows(eng, "b"), _rows(SelectionEngine([make_bank("a", [3, 4], seed=6), b3], cfg, device="cpu"), "b"))


def _start(eng, bank_id: str) -> int:
    return eng._store._entries[bank_id].start["unit"]


def test_a_shrunk_bank_and_a_bank_followed_by_another_are_appended_whole():
    cfg, qp = SelectConfig(), QueryParams(budget=4)
    pool = _pool(3)
    lens, semantic = [3, 2, 4], {(0, 2): 0.6}
    a, b = _grown("a", lens, pool, semantic), make_bank("b", [2, 5], seed=7)
    eng = SelectionEngine([a, b], cfg, device="cpu")
    lens[-1] += 1  # "a" grows, and "b"'s rows follow it: appended whole
    a2 = _grown("a", lens, pool, semantic)
    eng.replace_bank(a2)
    assert _start(eng, "a") > _start(eng, "b")
    lens[-1] -= 2  # a forget: appended whole (its old rows go in the purge)
    a3 = _grown("a", lens, pool, semantic)
    snap = eng.snapshot
    old = {k: v.clone() for k, v in snap.t.items()}
    eng.replace_bank(a3)
    for k, v in old.items():  # no row of the bank before the forget was written over
        n = snap.rows[k]
        np.testing.assert_array_equal(snap.t[k][:n].numpy(), v[:n].numpy(), err_msg=k)
    eng.purge()
    for extra in (2, 1):  # appends after the forget: "a" comes first after the purge (appended whole), then in place
        lens.append(extra)
        a4 = _grown("a", lens, pool, semantic)
        before, at = eng.snapshot.rows["unit_vecs"], _start(eng, "a")
        eng.replace_bank(a4)
    assert eng.snapshot.rows["unit_vecs"] == before + 1 and _start(eng, "a") == at
    fresh = SelectionEngine([a4, b], cfg, device="cpu")
    for bid in ("a", "b"):
        _same(_rows(eng, bid), _rows(fresh, bid))
    ids, qs, Z = queries_of([a4, b], seed=4, per_bank=3)
    assert eng.select_units(ids, qs, Z, params=qp) == fresh.select_units(ids, qs, Z, params=qp)
