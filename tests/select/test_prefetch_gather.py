"""Gathers of scattered rows that ask for the rows ahead (``_jit.prefetch_row``: a hint, no value
changes): ``shortlist._gather_dots`` at every distance ahead, and the stage's candidate rows
(``pool.candidate_rows``, :data:`pool.GATHER`) against ``tables.unit_rows``, for a bank's own
(mapped) vectors and the table's rows, with the same picks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trawmem_gpu.select._jit import HAS_NUMBA, prefetch_row
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, pool, shortlist

from benchmarks.synthetic_banks import make_banks, make_queries


@pytest.mark.parametrize("ahead", [0, 1, 7, 32, 5000])
def test_gathered_dots_do_not_depend_on_the_rows_asked_for_ahead(ahead):
    rng = np.random.default_rng(ahead)
    V = rng.standard_normal((3001, 37)).astype(np.float32)
    Z = rng.standard_normal((3, 37))
    for n in (0, 1, 33, 900):
        rows, qrow = rng.integers(0, len(V), n), rng.integers(0, 3, n)
        got = np.empty(n)
        shortlist._gather_dots(V, rows, qrow, Z, got, ahead)
        want = np.einsum("ij,ij->i", V[rows].astype(np.float64), Z[qrow])
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        plain = np.empty(n)
        shortlist._gather_dots(V, rows, qrow, Z, plain, 0)
        assert np.array_equal(got, plain)  # the same sums, bit for bit


@pytest.mark.skipif(not HAS_NUMBA, reason="a compiled hint")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64])
def test_a_prefetched_row_changes_nothing(dtype):
    from trawmem_gpu.select._jit import njit

    @njit()
    def ask(a, i):
        prefetch_row(a, i)
        prefetch_row(a[:, 1:], i)  # a strided view
        return a[i].sum()

    a = np.arange(4 * 70).reshape(4, 70).astype(dtype)
    before = a.copy()
    ask(a, 3)
    assert np.array_equal(a, before)


@pytest.fixture(scope="module")
def engines():
    banks = make_banks(1, units=1203, thread_len=7.0, d=24, seed=32, prefix="big") + \
        make_banks(2, units=257, thread_len=5.0, d=24, seed=31, prefix="odd")
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1000, ann_shortlist=32, table_max_units=0)
    return banks, eng


def test_candidate_rows_are_the_tables_rows_in_float64(engines, monkeypatch):
    banks, eng = engines
    snap = eng.snapshot
    assert snap.mapped.tolist() == [True, False, False]  # a bank's own vectors and the table's rows
    rng = np.random.default_rng(3)
    bidx = np.array([0, 1, 2, 0])
    n = np.array([5, 0, 17, 40])
    cand = np.stack([np.sort(rng.choice(int(snap.off.nu[b]), 40, replace=False)) for b in bidx])
    got = pool.candidate_rows(snap, bidx, cand, n)
    monkeypatch.setattr(pool, "GATHER", False)
    want = pool.candidate_rows(snap, bidx, cand, n)
    assert got.dtype == want.dtype == torch.float64 and got.shape == want.shape == (4, 40, 24)
    for q in range(len(bidx)):
        assert torch.equal(got[q, :n[q]], want[q, :n[q]])
        assert not got[q, n[q]:].any()  # padding: never read
    own = torch.as_tensor(banks[0].unit_vecs[cand[3, :40]], dtype=torch.float64)
    assert torch.equal(got[3], own)


def test_the_stage_picks_the_same_with_either_gather(engines, monkeypatch):
    banks, eng = engines
    ids, qs, Z = make_queries(banks, 24, seed=5)
    got = eng.select_units(ids, qs, Z)
    monkeypatch.setattr(pool, "GATHER", False)
    assert eng.select_units(ids, qs, Z) == got and sum(map(len, got)) > 0
