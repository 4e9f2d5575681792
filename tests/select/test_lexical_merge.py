"""``lexical_merge`` (the BM25 reading past ``EXACT_POSTINGS`` with ``lexical_shortlist.MERGED``)
against its plain references: ``lexical_dense.accumulate`` and the float32 sums of every posting
in column order (scores), ``lexical_dense.rank_table`` (the same keys), ``lexical_dense.top_units``
and ``np.lexsort`` (the top), a unit-to-score dictionary (``scores_in``). Random postings at odd
sizes and block sizes, zero postings, empty columns and inputs, ties and wide score ranges."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.engine import lexical_dense as ld, lexical_merge as lm


def _postings(rng, n: int, cols: int, per: int, kind: str):
    """``(idx int32, data float32, lo, hi)``: ``cols`` columns of up to ``per`` distinct ascending
    units below ``n`` each (an empty one among them when ``cols > 2``), some weights 0."""
    idx, data, lo, hi = [], [], [], []
    at = 0
    for c in range(cols):
        k = 0 if (cols > 2 and c == 1) else int(rng.integers(0, min(per, n) + 1))
        u = np.sort(rng.choice(n, k, replace=False)).astype(np.int32)
        if kind == "ties":
            w = rng.integers(0, 4, k).astype(np.float32) * np.float32(0.75)  # 0 included: touches nothing
        elif kind == "wide":
            w = (np.float32(10.0) ** rng.uniform(-3, 3, k)).astype(np.float32)
        else:
            w = rng.uniform(0.1, 9.0, k).astype(np.float32)
        idx.append(u), data.append(w), lo.append(at), hi.append(at + k)
        at += k
    cat = (lambda xs, t: np.concatenate(xs).astype(t) if xs else np.zeros(0, t))
    return cat(idx, np.int32), cat(data, np.float32), np.int64(lo), np.int64(hi)


def _plain(idx, data, lo, hi, n):
    """Every unit's float32 sum of its postings, column after column (``np.add.at`` adds in order)."""
    acc = np.zeros(n, np.float32)
    for a, b in zip(lo.tolist(), hi.tolist()):
        np.add.at(acc, idx[a:b].astype(np.int64), data[a:b])
    touched = np.zeros(n, bool)
    for a, b in zip(lo.tolist(), hi.tolist()):
        touched[idx[a:b][data[a:b] != 0]] = True
    u = np.flatnonzero(touched)
    return u, acc[u]


CASES = [(n, cols, per, kind) for n in (1, 63, 64, 65, 1000, 70001) for cols in (1, 3, 6)
         for per, kind in ((7, "ties"), (500, "ties"), (500, "wide"), (3000, "fine"))]


@pytest.mark.parametrize("block", [64, 128, 1 << 16])
def test_blocked_scores_are_the_column_order_sums_ascending(block):
    rng = np.random.default_rng(block)
    acc, bits = np.zeros(block, np.float32), np.zeros(block // 64, np.int64)
    for n, cols, per, kind in CASES:
        idx, data, lo, hi = _postings(rng, n, cols, per, kind)
        u, s = lm.blocked_scores(idx, data, lo, hi, n, block, acc, bits)
        pu, ps = _plain(idx, data, lo, hi, n)
        np.testing.assert_array_equal(u, pu)
        np.testing.assert_array_equal(s, ps)  # bit for bit
        du, ds = ld.accumulate(idx, data, lo, hi, np.zeros(n, np.float32))
        o = np.argsort(du)
        np.testing.assert_array_equal(u, du[o])
        np.testing.assert_array_equal(s, ds[o])
        assert not acc.any() and not bits.any()  # left zero for the next query
    u, s = lm.blocked_scores(np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.int64),
                             np.zeros(0, np.int64), 10, block, acc, bits)
    assert len(u) == 0 and len(s) == 0


def test_dense_scores_use_a_thread_scratch_left_zero():
    rng = np.random.default_rng(4)
    idx, data, lo, hi = _postings(rng, 300001, 4, 40000, "ties")
    u, s = lm.dense_scores(idx, data, lo, hi, 300001)
    pu, ps = _plain(idx, data, lo, hi, 300001)
    np.testing.assert_array_equal(u, pu)
    np.testing.assert_array_equal(s, ps)
    assert all(not a.any() for a in lm.scratch())


def _scored(rng, n: int, kind: str, spread: int = 1):
    units = np.sort(rng.choice(40000, n, replace=False)).astype(np.int64) * spread
    scores = {"ties": lambda: rng.integers(1, 6, n) * 0.5, "wide": lambda: 10.0 ** rng.uniform(-3, 3, n),
              "fine": lambda: rng.uniform(0.5, 40.0, n)}[kind]().astype(np.float32)
    return units, scores


@pytest.mark.parametrize("kind", ["ties", "wide", "fine"])
def test_score_table_is_rank_tables_keys(kind):
    """The same ``(keys, units, runs)`` as ``lexical_dense.rank_table``: counted (few distinct
    scores), past ``FEW_SCORES`` distinct (the radix sort), units not ascending (the radix sort), and
    empty or one unit."""
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 7, 401, 5000, 30001):
        for spread in (1, 997):
            units, scores = _scored(rng, n, kind, spread)
            for u in (units, rng.permutation(units)):
                got = lm.score_table(u, scores, ld.radix_scratch(n))
                want = ld.rank_table(u, scores, ld.radix_scratch(n))
                for g, w in zip(got, want):
                    np.testing.assert_array_equal(g, w)
    assert lm._counted_keys(np.float32([1.0, 2.0]), np.empty(2, np.int64))
    many = (np.arange(1, lm.FEW_SCORES + 2) * 0.25).astype(np.float32)
    assert not lm._counted_keys(many, np.empty(len(many), np.int64))  # past FEW_SCORES: not counted


@pytest.mark.parametrize("kind", ["ties", "wide", "fine"])
def test_table_top_is_the_heaps_and_lexsorts_top(kind):
    rng = np.random.default_rng(9)
    for n in (0, 1, 5, 128, 129, 4001):
        units, scores = _scored(rng, n, kind)
        keys, tu, _runs = lm.score_table(units, scores, ld.radix_scratch(n))
        for M in (1, 7, 128, n + 3):
            got = lm.table_top(keys, tu, M)
            np.testing.assert_array_equal(got, ld.top_units(units, scores, M))
            np.testing.assert_array_equal(got, units[np.lexsort((units, -scores))][:M])


@pytest.mark.parametrize("kind", ["ties", "wide", "fine"])
def test_score_ranks_are_the_tables_ranks_and_top(kind):
    """``score_ranks``: every touched unit's rank as ``lexical_dense.table_ranks`` reads it from the
    rank table and as the plain definition counts it (``1 + #{higher score} + #{same score, lower
    unit}``), its top ``table_top``'s and ``np.lexsort``'s; None past ``FEW_SCORES`` distinct scores."""
    rng = np.random.default_rng(13)
    for n in (0, 1, 2, 7, 129, 4001, 30001):
        for spread in (1, 997):
            units, scores = _scored(rng, n, kind, spread)
            for M in (1, 7, 128, n + 3):
                got = lm.score_ranks(units, scores, M)
                table = lm.score_table(units, scores, ld.radix_scratch(n))
                if got is None:
                    assert len(np.unique(scores)) > lm.FEW_SCORES
                    continue
                rank, top = got
                assert rank.dtype == np.float64 and len(rank) == n
                if n:
                    np.testing.assert_array_equal(rank, ld.table_ranks(*table, units, scores))
                order = np.lexsort((units, -scores))
                plain = np.empty(n)
                plain[order] = np.arange(1, n + 1)
                np.testing.assert_array_equal(rank, plain)
                np.testing.assert_array_equal(units[top], lm.table_top(table[0], table[1], M))
                np.testing.assert_array_equal(units[top], units[order][:M])
    many = (np.arange(1, lm.FEW_SCORES + 2) * 0.25).astype(np.float32)
    assert lm.score_ranks(np.arange(len(many)), many, 4) is None


def test_scores_in_reads_each_units_score_or_zero():
    rng = np.random.default_rng(11)
    for n in (0, 1, 9, 3000):
        units, scores = _scored(rng, n, "fine")
        ask = rng.integers(0, 41000, 500).astype(np.int64)
        ask[:min(n, 50)] = units[:50]
        want = dict(zip(units.tolist(), scores.tolist()))
        for wu in (ask, np.sort(ask), np.unique(ask), np.unique(ask)[::-1].copy(), np.union1d(ask, units)):
            got = lm.scores_in(units, scores, wu)  # any order; an ascending working set gallops
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, np.float32([want.get(a, 0.0) for a in wu.tolist()]))
    assert len(lm.scores_in(np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64))) == 0
