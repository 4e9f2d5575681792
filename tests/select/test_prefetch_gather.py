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


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
def test_known_dots_are_the_gathered_dots_bit_for_bit(share):
    """``shortlist._known_dots``: a unit whose cosine the proposals hold takes it, the others are
    summed as ``_gather_dots`` sums them: the same bits either way."""
    rng = np.random.default_rng(int(share * 10))
    V = rng.standard_normal((2000, 41)).astype(np.float32)
    Z = rng.standard_normal((1, 41))
    W = np.sort(rng.choice(1900, 700, replace=False))
    ku = np.sort(rng.choice(W, int(share * len(W)), replace=False) if share else np.zeros(0, np.int64))
    ku = np.union1d(ku, [1950, 1999])  # proposals outside W too
    kc = np.empty(len(ku))
    shortlist._gather_dots(V, 7 + ku, np.zeros(len(ku), np.int64), Z, kc, 3)
    want = np.empty(len(W))
    shortlist._gather_dots(V, 7 + W, np.zeros(len(W), np.int64), Z, want, 0)
    for ahead in (0, 5, 32):
        got = np.full(len(W), np.nan)
        shortlist._known_dots(V, 7, W, Z[0], ku.astype(np.int64), kc, got, ahead)
        assert np.array_equal(got, want)


def test_the_working_sets_cosines_are_the_same_with_the_proposals_reused(engines, monkeypatch):
    banks, eng = engines
    ids, qs, Z = make_queries(banks, 12, seed=6)
    got = (eng.select_units(ids, qs, Z), eng.candidate_sets(ids, qs, Z))
    seen = []
    real = shortlist.working_sets

    def both(*a, **k):
        monkeypatch.setattr(shortlist, "REUSE_DOTS", False)
        want = real(*a, **k)
        monkeypatch.setattr(shortlist, "REUSE_DOTS", True)
        out = real(*a, **k)
        for x, y in zip(out, want):
            assert np.array_equal(x.units, y.units) and np.array_equal(x.cos, y.cos)
            seen.append(np.isin(x.units, x.head[1]).sum())
        return out
    monkeypatch.setattr(shortlist, "working_sets", both)
    picks, cands = eng.select_units(ids, qs, Z), eng.candidate_sets(ids, qs, Z)
    assert picks == got[0] and all(np.array_equal(a, b) for a, b in zip(cands, got[1]))
    assert sum(seen) > 0  # some of W's units were proposals
