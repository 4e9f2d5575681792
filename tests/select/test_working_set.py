"""``engine/working_set.py``: the compiled proposals' order and ``W``'s assembly equal their plain
NumPy forms (values and dtypes; random, odd sizes, empty, ties, far-from-sorted input), and
``shortlist.working_sets`` with them gives the same shortlists, candidates and picks as without."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, shortlist, working_set
from trawmem_gpu.select.params import QueryParams

from benchmarks.synthetic_banks import make_banks, make_queries


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def _check_order(c, i, M):
    near, head = working_set.head_order(c, i, M)
    want_near, want_head = working_set.head_order_plain(c, i, M)
    _same(near, want_near)
    _same(head, want_head)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 129, 1024, 1031])
def test_the_proposals_order_is_lexsorts(n):
    rng = np.random.default_rng(n)
    i = rng.permutation(5 * n + 3)[:n].astype(np.int64)
    c = rng.standard_normal(n)
    by_f32 = np.argsort(-c.astype(np.float32), kind="stable")  # as an index returns them
    for cc, ii in ((c, i), (c[by_f32], i[by_f32]), (c[::-1].copy(), i[::-1].copy())):
        for M in (0, 1, 16, n + 5):
            _check_order(cc, ii, M)


@pytest.mark.parametrize("n", [2, 5, 64, 1024])
def test_tied_cosines_order_by_unit(n):
    rng = np.random.default_rng(7)
    c = rng.choice([0.5, 0.25, -0.125], size=n)  # few values: long runs of ties in any order
    i = rng.permutation(3 * n)[:n].astype(np.int64)
    _check_order(c, i, 4)
    c = np.zeros(n)
    _check_order(c, i, n)  # all tied: by unit alone
    near, _ = working_set.head_order(c, i, n)
    assert np.all(np.diff(near) > 0)


def test_the_order_of_a_far_from_sorted_input_takes_the_merge_sort():
    rng = np.random.default_rng(3)
    n = 2000
    c = np.sort(rng.standard_normal(n))  # ascending: the insertion sort would move every unit
    i = rng.permutation(n).astype(np.int64)
    _check_order(c, i, 128)


def test_non_finite_cosines_take_the_plain_order_and_lengths_must_agree():
    c = np.array([0.1, np.nan, 0.3, -np.inf])
    i = np.array([3, 1, 2, 0], dtype=np.int64)
    _check_order(c, i, 2)
    with pytest.raises(ValueError, match="differ in length"):
        working_set.head_order(c, i[:3], 2)


def _threads(rng, J, max_len):
    offsets = np.concatenate([[0], np.cumsum(rng.integers(1, max_len + 1, size=J))]).astype(np.int64)
    return offsets, int(offsets[-1])


def _rel(rng, n, p_none):
    """``[n + 5, 3]`` int32 rows (the bank at offset 5): column 1 / 2 a unit or -1."""
    rel = rng.integers(0, n, size=(n + 5, 3)).astype(np.int32)
    rel[rng.random(rel.shape) < p_none] = -1
    return rel


@pytest.mark.parametrize("J,max_len,picked", [(1, 1, 1), (5, 3, 0), (17, 9, 40), (400, 12, 130), (3000, 8, 256)])
@pytest.mark.parametrize("p_none", [0.0, 0.3, 1.0])
def test_the_assembled_working_set_is_threads_units_and_union1d(J, max_len, picked, p_none):
    rng = np.random.default_rng(J * 7 + picked)
    offsets, n = _threads(rng, J, max_len)
    rel = _rel(rng, n, p_none)
    for threads in (rng.integers(0, J, size=picked), rng.integers(0, J, size=picked).astype(np.int32)):
        for context in (False, True):
            got = working_set.assemble(offsets, threads, rel, 5, context)
            _same(got, working_set.assemble_plain(offsets, threads, rel, 5, context))
            assert np.all(np.diff(got) > 0)


def test_neighbours_inside_the_threads_add_nothing():
    offsets = np.array([0, 3, 5, 9], dtype=np.int64)
    rel = np.full((9, 3), -1, np.int32)
    rel[0, 2], rel[1, 1], rel[3, 1], rel[4, 2] = 1, 0, 2, 8  # 0 <-> 1 inside thread 0; 3 -> 2, 4 -> 8 outside
    got = working_set.assemble(offsets, np.array([1, 0, 1]), rel, 0, True)
    _same(got, np.array([0, 1, 2, 3, 4, 8], dtype=np.int64))
    _same(got, working_set.assemble_plain(offsets, np.array([1, 0, 1]), rel, 0, True))


def _spied(monkeypatch) -> list:
    """Every ``shortlist.working_sets`` result from now on, in call order."""
    calls = []
    plain = shortlist.working_sets

    def spy(*a, **k):
        got = plain(*a, **k)
        calls.append(got)
        return got

    monkeypatch.setattr(shortlist, "working_sets", spy)
    return calls


@pytest.mark.parametrize("affinity", ["learned", "rrf"])
def test_working_sets_candidates_and_picks_are_the_plain_forms(monkeypatch, affinity):
    banks = make_banks(1, units=2003, thread_len=5.0, d=24, seed=11, prefix="ws")
    ids, qs, Z = make_queries(banks, 16, seed=12)
    eng = SelectionEngine(banks, SelectConfig(affinity=affinity), device="cpu", ann_min_units=1, ann_shortlist=16)
    params = QueryParams(hops=2)
    calls = _spied(monkeypatch)
    got = (eng.candidate_sets(ids, qs, Z, params=params), eng.select_units(ids, qs, Z, params=params))
    monkeypatch.setattr(working_set, "COMPILED", False)
    want = (eng.candidate_sets(ids, qs, Z, params=params), eng.select_units(ids, qs, Z, params=params))
    assert len(calls) == 4
    for a, b in zip(calls[0] + calls[1], calls[2] + calls[3]):
        for k in ("units", "head", "sample", "cos", "bm"):
            _same(getattr(a, k), getattr(b, k))
        assert a.edge == b.edge
    for a, b in zip(got[0], want[0]):
        np.testing.assert_array_equal(a, b)
    assert got[1] == want[1]


@pytest.mark.parametrize("n", [1, 2, 3, 9, 40])
def test_the_galloping_search_finds_exactly_the_members(n):
    rng = np.random.default_rng(n)
    W = np.sort(rng.choice(4 * n + 2, size=n, replace=False)).astype(np.int64)
    for a in range(n):
        for v in range(-1, 4 * n + 4):
            assert working_set._holds(W, a, np.int64(v)) == (v in W), (W, a, v)


@pytest.mark.parametrize("n", [0, 1, 5, 1024])
def test_each_proposal_is_found_at_its_placed_column(n):
    rng = np.random.default_rng(40 + n)
    i = rng.permutation(3 * n + 1)[:n].astype(np.int64)
    c = rng.integers(0, 4, n) / 4.0  # ties: placed by unit
    for order in (working_set.head_order, working_set.head_order_plain):
        near, head, at = order(c, i, 8, placed=True)
        _same(near, order(c, i, 8)[0])
        assert at.dtype == np.int64 and sorted(at.tolist()) == list(range(n))
        np.testing.assert_array_equal(head[0, at], c)
        np.testing.assert_array_equal(head[1, at], i.astype(np.float64))


@pytest.mark.parametrize("affinity", ["learned", "rrf"])
def test_proposals_read_in_unit_order_give_the_same_shortlists(monkeypatch, affinity):
    """``shortlist.SORTED_GATHER``: the proposals' rows read in unit order give the same cosines bit
    for bit (each row's own sum), so the same shortlists, their held order by unit, candidates and picks."""
    banks = make_banks(1, units=1501, thread_len=4.0, d=24, seed=13, prefix="sg")
    ids, qs, Z = make_queries(banks, 12, seed=14)
    eng = SelectionEngine(banks, SelectConfig(affinity=affinity), device="cpu", ann_min_units=1, ann_shortlist=16)
    calls = _spied(monkeypatch)
    got = (eng.candidate_sets(ids, qs, Z), eng.select_units(ids, qs, Z))
    monkeypatch.setattr(shortlist, "SORTED_GATHER", False)
    want = (eng.candidate_sets(ids, qs, Z), eng.select_units(ids, qs, Z))
    for a, b in zip(calls[0] + calls[1], calls[2] + calls[3]):
        for k in ("units", "head", "cos", "bm", "by_unit"):
            _same(getattr(a, k), getattr(b, k))
        _same(a.by_unit, np.argsort(a.head[1].astype(np.int64), kind="stable"))
    for a, b in zip(got[0], want[0]):
        np.testing.assert_array_equal(a, b)
    assert got[1] == want[1]
