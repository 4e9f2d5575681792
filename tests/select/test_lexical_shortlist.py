"""BM25 of a large bank's shortlist (``select/engine/lexical_shortlist.py``) against the exact
scores of every posting (``lexical_shortlist.bm25_sparse``): the working set's scores are the same
float32 values, every unit above the threshold bound is found with its exact rank, and the
ranks below it are never better than a found unit's."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, lexical_shortlist as lx

from benchmarks.synthetic_banks import make_banks, make_queries


@pytest.fixture(scope="module")
def bank():
    banks = make_banks(2, units=1500, thread_len=6.0, d=16, seed=21, prefix="lx")
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=None)
    _ids, qs, _ = make_queries(banks, 24, seed=22)
    return eng.snapshot, qs


def _cols(snap, bank: int, question: str) -> np.ndarray:
    from trawmem_gpu.select.steps import candidates as step3
    bm = snap.bm25
    ptr, ids, _slow = step3.bm25_columns([bank], [question], bm.vocabs, bm.plain, bm.store.col0)
    return np.asarray(ids[ptr[0]:ptr[1]], dtype=np.int64)


def _exact(snap, bank, cols):
    u, s = lx.bm25_sparse(snap, bank, cols)
    order = np.lexsort((u, -s))
    rank = np.empty(len(u))
    rank[order] = np.arange(1, len(u) + 1)
    return u, s, rank


def _queries(snap, qs):
    out = []
    for i, q in enumerate(qs):
        bank = i % 2
        common = [w for w in list(snap.bm25.vocabs[bank])[:40] if isinstance(w, str)][i % 7::7][:2]
        cols = _cols(snap, bank, " ".join([q, *common]))
        if len(cols):
            out.append((bank, cols))
    return out


def test_scores_at_are_the_exact_float32_sums(bank):
    snap, qs = bank
    for b, cols in _queries(snap, qs):
        u, s, _ = _exact(snap, b, cols)
        everyone = np.arange(int(snap.off.nu[b]))
        got = lx.scores_at(snap, b, cols, everyone)
        want = np.zeros(len(everyone), np.float32)
        want[u] = s
        np.testing.assert_array_equal(got, want)  # bit for bit: token order, float32


def test_impact_order_sorts_each_column_by_score_then_unit(bank):
    snap, _qs = bank
    st = snap.bm25.store
    for b in range(2):
        order, start = lx.impact_order(snap, b)
        c0, V = int(st.col0[b]), len(snap.bm25.vocabs[b])
        lo, hi = lx.columns(snap, b, np.arange(c0, c0 + V - 1))
        for a, e in zip(lo.tolist(), hi.tolist()):
            pos = order[a - start:e - start]
            assert sorted(pos.tolist()) == list(range(a, e))  # a column's own postings
            key = list(zip((-st.data[pos]).tolist(), st.idx[pos].tolist()))
            assert key == sorted(key)


@pytest.mark.parametrize("M", [1, 16, 48])
def test_units_above_the_bound_are_found_with_their_exact_ranks(bank, monkeypatch, M):
    snap, qs = bank
    monkeypatch.setattr(lx, "EXACT_POSTINGS", 0)  # always the impact-ordered path
    monkeypatch.setattr(lx, "DENSE", False)
    sample = np.arange(0, 1500, 7)
    bounded = 0
    for b, cols in _queries(snap, qs):
        u, s, rank = _exact(snap, b, cols)
        lex = lx.lexical(snap, b, cols, M, sample)
        assert lex.bound >= 0
        above = s > lex.bound
        bounded += int(above.sum())
        assert set(u[above].tolist()) <= set(lex.units.tolist())  # the threshold algorithm's guarantee
        got = lx.ranks_of(lex, u, s)
        np.testing.assert_array_equal(got[above], rank[above])
        # a unit at or below the bound ranks after every found unit scoring more than it
        for j in np.flatnonzero(~above):
            assert got[j] >= 1 + np.sum(lex.scores > s[j])
        # the proposals: the best found, best first by the exact order among the found
        assert len(lex.top) == min(M, len(lex.units))
        assert np.all(lx.scores_at(snap, b, cols, lex.top) >= np.sort(lex.scores)[::-1][len(lex.top) - 1])
    assert bounded > 0 or M == 1  # one posting per column: the bound is every column's best, rarely passed


READINGS = {"counted": (True, True), "table": (True, False), "accumulated": (False, False)}
"""``(MERGED, COUNTED_RANKS)`` of each compiled reading: every touched unit's rank kept
(``lexical_merge.score_ranks``), the rank table (``score_table``), ``lexical_dense`` alone."""


@pytest.mark.parametrize("reading", list(READINGS))
def test_few_postings_are_read_exactly(bank, monkeypatch, reading):
    """A query of few postings: read by ``bm25_sparse`` (``MERGED`` off, past ``EXACT_POSTINGS``
    otherwise) or by the compiled reading (``MERGED``, past ``MERGED_POSTINGS`` = 0, its ranks kept
    per unit or in a table): the same units, ranks and top either way."""
    merged, per_unit = READINGS[reading]
    monkeypatch.setattr(lx, "MERGED", merged)
    monkeypatch.setattr(lx, "COUNTED_RANKS", per_unit)
    snap, qs = bank
    for b, cols in _queries(snap, qs)[:5]:
        u, s, rank = _exact(snap, b, cols)
        lex = lx.lexical(snap, b, cols, 8, np.arange(10))
        assert lex.bound == -1.0 and lex.counted == (merged and not per_unit)
        np.testing.assert_array_equal(lex.units, u)
        np.testing.assert_array_equal(lx.ranks_of(lex, u, s), rank)
        for M in (0, 1, 7, len(u) + 3):  # the top: the M best by (score descending, unit ascending)
            np.testing.assert_array_equal(lx.lexical(snap, b, cols, M, np.arange(10)).top, u[np.argsort(rank)][:M])
        everyone = np.arange(int(snap.off.nu[b]))
        want = lx.scores_at(snap, b, cols, everyone)
        keep = everyone % 3 > 0
        masked = lx.lexical(snap, b, cols, 8, np.arange(10), keep)
        assert lex.ascending and not masked.ascending  # a filter's units are not every unit of positive score
        for one in (lex, masked, None):
            np.testing.assert_array_equal(lx.scores_of(one, snap, b, cols, everyone), want)


@pytest.mark.parametrize("reading", list(READINGS))
def test_dense_reading_is_the_exact_top_scores_and_ranks(bank, monkeypatch, reading):
    """The compiled pass over every posting (``lexical_merge`` with ``MERGED``, else
    ``lexical_dense``) against the plain reference: the same float32 scores, the exact ``M`` best in
    order, every unit's exact rank (ties included) and, read from the ascending units
    (``scores_of``), every unit's score as ``scores_at``'s."""
    snap, qs = bank
    monkeypatch.setattr(lx, "EXACT_POSTINGS", 0)
    monkeypatch.setattr(lx, "DENSE", True)
    merged, per_unit = READINGS[reading]
    monkeypatch.setattr(lx, "MERGED", merged)
    monkeypatch.setattr(lx, "COUNTED_RANKS", per_unit)
    checked = 0
    for b, cols in _queries(snap, qs):
        u, s, rank = _exact(snap, b, cols)
        for M in (1, 7, 64, len(u) + 3):
            lex = lx.lexical(snap, b, cols, M, np.arange(10))
            assert lex.counted == (not per_unit) and lex.bound == -1.0
            by_unit = np.argsort(lex.units)
            np.testing.assert_array_equal(lex.units[by_unit], u)
            np.testing.assert_array_equal(lex.scores[by_unit], s)
            np.testing.assert_array_equal(lex.top, u[np.argsort(rank)][:M])
        everyone = np.arange(int(snap.off.nu[b]))
        scores = lx.scores_at(snap, b, cols, everyone)
        assert lex.ascending == merged
        np.testing.assert_array_equal(lx.scores_of(lex, snap, b, cols, everyone[::-1]), scores[::-1])  # bit for bit
        want = np.zeros(len(everyone))
        want[u] = np.where(s > 0, rank, 0)
        np.testing.assert_array_equal(lx.ranks_of(lex, everyone[::-1], scores[::-1]), want[::-1])
        checked += int((s[:, None] == s[None, :]).sum() > len(s))  # ties among them
    assert checked > 0


def test_counted_ranks_break_ties_by_unit_and_take_empty_input():
    from trawmem_gpu.select.engine import lexical_dense as ld
    rng = np.random.default_rng(3)
    wide = np.float32(10.0) ** rng.uniform(-3, 3, 50).astype(np.float32)  # buckets of many bit widths
    for n, spread in [(k, w) for k in (0, 1, 2, 5, 33, 400) for w in (False, True)]:
        units = rng.permutation(1000)[:n].astype(np.int64)
        scores = (rng.choice(wide, n) if spread else rng.integers(1, 6, n)).astype(np.float32)  # many ties
        order = np.lexsort((units, -scores))
        rank = np.empty(n)
        rank[order] = np.arange(1, n + 1)
        pick = rng.permutation(n)[: max(0, n // 2)]
        np.testing.assert_array_equal(ld.counted_ranks(units, scores, units[pick], scores[pick]), rank[pick])
        for M in (0, 1, 3, n + 1):
            np.testing.assert_array_equal(ld.top_units(units, scores, M), units[order][:M])
    acc = ld.scratch(10)
    u, s = ld.accumulate(np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64), acc)
    assert len(u) == 0 and len(s) == 0 and not acc.any()


@pytest.mark.parametrize("table", [True, False])
def test_counted_ranks_read_again_from_the_memo_are_the_same(bank, monkeypatch, table):
    """A working set grown between fronts: the units ranked before are read from the query's memo
    (or its rank table), the others counted; both as the exact ranks."""
    snap, qs = bank
    monkeypatch.setattr(lx, "EXACT_POSTINGS", 0)
    monkeypatch.setattr(lx, "RANK_TABLE", table)
    monkeypatch.setattr(lx, "COUNTED_RANKS", False)  # the memo's readings (the ranks kept per unit: above)
    for b, cols in _queries(snap, qs)[:6]:
        u, s, rank = _exact(snap, b, cols)
        lex = lx.lexical(snap, b, cols, 8, np.arange(10))
        n = int(snap.off.nu[b])
        scores = lx.scores_at(snap, b, cols, np.arange(n))
        want = np.zeros(n)
        want[u] = np.where(s > 0, rank, 0)
        for part in (np.arange(0, n, 3), np.arange(0, n, 2), np.arange(n)):  # growing, overlapping
            np.testing.assert_array_equal(lx.ranks_of(lex, part, scores[part]), want[part])
        if table:  # one table, built on the first call: every unit of positive score in it
            assert len(lex.memo) == 1 and len(lex.memo[0][0]) == int((scores > 0).sum())
        else:
            assert len(lex.memo[0][0]) == int((scores > 0).sum())


def _ranks_by_lexsort(units, scores, wu, ws):
    """The plain reference: ``1 +`` the units of ``(units, scores)`` ordering before ``(wu, ws)``
    (score descending, then unit ascending)."""
    return np.array([1.0 + np.sum((scores > s) | ((scores == s) & (units < u))) for u, s in zip(wu, ws)])


def test_rank_table_ranks_as_lexsort_with_ties_wide_scores_and_empty_input():
    """``lexical_dense.rank_table`` + ``table_ranks`` against the plain count: random, odd sizes,
    many ties, scores spread over many float32 exponents, units of one to three radix digits,
    units outside the table (above, below and between its scores), the table read twice, and an
    empty table."""
    from trawmem_gpu.select.engine import lexical_dense as ld
    rng = np.random.default_rng(5)
    wide = np.float32(10.0) ** rng.uniform(-3, 3, 50).astype(np.float32)
    for n, kind in [(k, w) for k in (0, 1, 2, 7, 33, 401, 5000) for w in ("ties", "wide", "fine")]:
        spread = 997 if kind == "fine" else 1  # units past 2^22: three radix passes, not two
        units = (rng.permutation(20000)[:n] * spread).astype(np.int64)
        scores = {"ties": lambda: rng.integers(1, 6, n), "wide": lambda: rng.choice(wide, n),
                  "fine": lambda: rng.uniform(0.5, 40.0, n)}[kind]().astype(np.float32)
        table = ld.rank_table(units, scores, ld.radix_scratch(len(units)))
        assert len(table[0]) == n and np.all(np.diff(table[0]) > 0) and table[2][-1] == n
        order = np.lexsort((units, -scores))
        rank = np.empty(n)
        rank[order] = np.arange(1, n + 1)
        for _round in range(2):  # a later front round reads the same table
            pick = rng.permutation(n)[: n // 2]
            got = ld.table_ranks(*table, units[pick], scores[pick])
            np.testing.assert_array_equal(got, rank[pick])
        others = rng.integers(20000, 30000, 40).astype(np.int64) * spread
        pool = np.concatenate([scores, wide, np.float32([1e-6, 1e6, 3.0])]).astype(np.float32)
        os_ = rng.choice(pool, 40).astype(np.float32)
        np.testing.assert_array_equal(ld.table_ranks(*table, others, os_), _ranks_by_lexsort(units, scores, others, os_))
    empty = ld.rank_table(np.zeros(0, np.int64), np.zeros(0, np.float32), ld.radix_scratch(0))
    assert len(ld.table_ranks(*empty, np.zeros(0, np.int64), np.zeros(0, np.float32))) == 0
    np.testing.assert_array_equal(ld.table_ranks(*empty, np.int64([3]), np.float32([2.0])), [1.0])


def test_a_bank_past_the_rank_keys_width_is_refused(monkeypatch):
    from trawmem_gpu.select.engine import lexical_dense as ld
    lex = lx.Lexical(np.zeros(0, np.int64), np.int64([1]), np.float32([1.0]), np.zeros(0), -1.0,
                     np.zeros(0, np.float32), ld.KEY_UNITS + 1, True, [])
    with pytest.raises(ValueError, match="rank keys"):
        lx.ranks_of(lex, np.int64([1]), np.float32([1.0]))


def test_the_exact_readings_radix_order_is_lexsorts_with_ties_wide_scores_and_fallbacks(monkeypatch):
    """``_ranked``'s radix order (``RADIX_ORDER``) against the plain ``np.lexsort((u, -s))``:
    random, odd sizes, many ties, scores over six decades, units past 2^22, an empty and a
    one-unit input; and inputs the radix sort may not take (a zero or negative score, NaN,
    units not ascending, float64 scores), which fall back to the plain order."""
    rng = np.random.default_rng(11)
    wide = np.float32(10.0) ** rng.uniform(-3, 3, 50).astype(np.float32)
    cases = []
    for n in (0, 1, 2, 7, 33, 401, 5000):
        units = np.sort(rng.permutation(20000)[:n]).astype(np.int64) * 997
        for scores in (rng.integers(1, 6, n), rng.choice(wide, n), rng.uniform(0.5, 40.0, n)):
            cases.append((units, np.asarray(scores, np.float32)))
    u = np.arange(9, dtype=np.int64)
    s = rng.integers(1, 4, 9).astype(np.float32)
    bad = [(u, np.where(u == 4, 0, s).astype(np.float32)), (u, np.where(u == 4, -1, s).astype(np.float32)),
           (u, np.where(u == 4, np.nan, s).astype(np.float32)), (u[::-1].copy(), s), (u, s.astype(np.float64))]
    assert not any(lx._radix_sortable(a, b) for a, b in bad)
    assert lx._radix_sortable(u, s)
    for units, scores in cases + bad:
        monkeypatch.setattr(lx, "RADIX_ORDER", True)
        rank, order = lx._ranked(units, scores)
        monkeypatch.setattr(lx, "RADIX_ORDER", False)
        rank0, order0 = lx._ranked(units, scores)
        np.testing.assert_array_equal(order, order0)
        np.testing.assert_array_equal(rank, rank0)
        if len(units) and not np.isnan(scores).any():
            assert np.all(np.diff(scores[order]) <= 0)  # best first


def test_the_exact_reading_is_the_same_with_the_radix_order(bank, monkeypatch):
    """Every query of the fixture's banks read exactly (few postings) gives the same proposals,
    units, scores and ranks with ``RADIX_ORDER`` on and off."""
    monkeypatch.setattr(lx, "MERGED", False)  # else every query takes the compiled reading
    snap, qs = bank
    for b, cols in _queries(snap, qs):
        got = []
        for radix in (True, False):
            monkeypatch.setattr(lx, "RADIX_ORDER", radix)
            got.append(lx.lexical(snap, b, cols, 16, np.arange(10), None))
        a, e = got
        assert a.bound == e.bound == -1.0
        for x, y in zip((a.top, a.units, a.scores, a.rank), (e.top, e.units, e.scores, e.rank)):
            np.testing.assert_array_equal(x, y)
