"""A front round's arguments built by one compiled call per query (``engine/assembly.py``,
``shortlist.ASSEMBLY``) equal the plain ``shortlist.thread_space`` + ``shortlist.compact`` ones,
array by array (dtypes included), in every round of every query (first and grown working sets),
and the candidates and picks are the same."""
from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, shortlist
from trawmem_gpu.select.params import QueryParams

from benchmarks.synthetic_banks import make_banks, make_queries


def _bank(units: int, ties: bool, seed: int):
    """A bank of ``units`` units (d = 24); ``ties``: sign vectors, so cosines tie often."""
    bank = make_banks(1, units=units, thread_len=5.0, d=24, seed=seed, prefix="asm")[0]
    if ties:
        v = np.sign(bank.unit_vecs) + (bank.unit_vecs == 0)
        bank = replace(bank, unit_vecs=(v / np.sqrt(v.shape[1])).astype(bank.unit_vecs.dtype))
    return [bank], make_queries([bank], 20, seed=seed + 1)


def _equal(a, b, where: str) -> None:
    if isinstance(a, (tuple, list)):  # NamedTuples, tuples and lists, item by item
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, where


def _spy(monkeypatch, seen: list):
    """Wrap ``shortlist.front_args``: each round's compiled arguments against the plain ones."""
    plain = shortlist.front_args

    def checked(snap, Z, bidx, shorts, tok, lq, learned, hops, n_seeds):
        mine = list(shorts)
        monkeypatch.setattr(shortlist, "ASSEMBLY", False)
        want = plain(snap, Z, bidx, mine, tok, lq, learned, hops, n_seeds)
        monkeypatch.setattr(shortlist, "ASSEMBLY", True)
        got = plain(snap, Z, bidx, shorts, tok, lq, learned, hops, n_seeds)
        _equal(got, want, "front_args")
        seen.append(sum(len(sh.units) for sh in shorts))
        return got
    monkeypatch.setattr(shortlist, "front_args", checked)


@pytest.mark.parametrize("affinity", ["learned", "rrf"])
@pytest.mark.parametrize("units,ties,hops", [(1999, False, 2), (2501, True, 1), (777, False, 3)])
def test_compiled_round_arguments_equal_the_plain_ones(monkeypatch, affinity, units, ties, hops):
    banks, (ids, qs, Z) = _bank(units, ties, seed=units)
    params = QueryParams(hops=hops)
    eng = SelectionEngine(banks, SelectConfig(affinity=affinity), device="cpu", ann_min_units=1, ann_shortlist=16)
    got = (eng.candidate_sets(ids, qs, Z, params=params), eng.select_units(ids, qs, Z, params=params))
    seen: list = []
    _spy(monkeypatch, seen)
    eng.candidate_sets(ids, qs, Z, params=params)
    for i in range(0, len(ids), 7):  # batches of one (the benchmark's) and of several
        eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1], params=params)
    assert len(seen) > 2  # rounds compared, grown ones among them (more rounds than calls)
    monkeypatch.setattr(shortlist, "ASSEMBLY", False)
    want = (eng.candidate_sets(ids, qs, Z, params=params), eng.select_units(ids, qs, Z, params=params))
    for a, b in zip(got[0], want[0]):
        np.testing.assert_array_equal(a, b)
    assert got[1] == want[1]


def test_a_working_set_of_fewer_threads_than_seeds_takes_the_lowest_threads(monkeypatch):
    """The pad of ``shortlist._space`` (seeds without a score): a tiny shortlist, many seeds."""
    banks, (ids, qs, Z) = _bank(301, True, seed=5)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=2)
    seen: list = []
    _spy(monkeypatch, seen)
    eng.select_units(ids, qs, Z, params=QueryParams(hops=0, n_seeds=40))
    assert seen


def test_the_last_round_does_not_grow_the_set_its_candidates_index(monkeypatch):
    """``shortlist.ROUNDS``: the candidates of the last front round are positions in the working set
    it ran on, so that set is not grown after it (with one round: no growth, every candidate a
    unit of the first working set, in the neighbourhood's threads)."""
    banks, (ids, qs, Z) = _bank(1999, False, seed=1999)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=16)
    first, calls, plain_grown, plain_args = [], [0], shortlist.grown, shortlist.front_args

    def args(snap, Z_, bidx, shorts, *a):
        first.extend(sh.units.copy() for sh in shorts)  # chunk after chunk: query order
        return plain_args(snap, Z_, bidx, shorts, *a)

    def grown(*a):
        calls[0] += 1
        return plain_grown(*a)
    monkeypatch.setattr(shortlist, "front_args", args)
    monkeypatch.setattr(shortlist, "grown", grown)
    eng.candidate_sets(ids, qs, Z, params=QueryParams(hops=2))
    assert calls[0] > 0 and len(first) > len(ids)  # three rounds: sets grew, second rounds ran
    first.clear()
    calls[0] = 0
    monkeypatch.setattr(shortlist, "ROUNDS", 1)
    got = eng.candidate_sets(ids, qs, Z, params=QueryParams(hops=2))
    assert calls[0] == 0 and len(first) == len(ids)  # one round per query
    threads = banks[0].unit_thread
    for q, cand in enumerate(got):
        assert np.isin(cand, first[q]).all()
        assert len(np.unique(threads[cand])) <= len(cand)


def packed(nbr: np.ndarray) -> bool:
    """Every row's neighbours come first, then -1 (what ``assembly.packed_length`` reads)."""
    have = nbr >= 0
    return bool((have == np.cumprod(have, axis=1).astype(bool)).all())


def test_packed_length_counts_a_rows_neighbours():
    """``assembly.packed_length`` against a plain count on packed rows: empty, full, one column."""
    from trawmem_gpu.select.engine import assembly

    rng = np.random.default_rng(3)
    for rows, width in ((1, 1), (7, 1), (50, 9), (333, 75)):
        deg = rng.integers(0, width + 1, rows)
        nbr = np.where(np.arange(width)[None, :] < deg[:, None], rng.integers(0, 100, (rows, width)), -1).astype(np.int32)
        assert packed(nbr)
        assert [assembly.packed_length(nbr, r) for r in range(rows)] == deg.tolist()


def test_a_built_banks_thread_rows_are_packed():
    banks = make_banks(3, units=401, thread_len=5.0, d=24, seed=4, prefix="pack")
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    nbr = eng.snapshot.np["nbr"]
    assert packed(nbr) and (nbr >= 0).any() and (nbr < 0).any()


def test_padded_stacks_rows_to_the_widest():
    from trawmem_gpu.select.engine import assembly

    a, b = np.arange(6, dtype=np.int32).reshape(3, 2), np.arange(4, dtype=np.int32).reshape(1, 4)
    got = assembly.padded([a, b], -1, np.int32)
    np.testing.assert_array_equal(got, [[0, 1, -1, -1], [2, 3, -1, -1], [4, 5, -1, -1], [0, 1, 2, 3]])
    assert assembly.padded([a], -1, np.int32) is a  # one query: its own array
    assert assembly.padded([a], -1, np.int64).dtype == np.int64
    empty = assembly.padded([], 0, np.float64)
    assert empty.shape == (0, 1) and empty.dtype == np.float64


def test_a_rounds_thread_rows_are_as_wide_as_the_longest_row_it_reads(monkeypatch):
    """The space's neighbour rows keep the columns up to the last neighbour of any thread whose edges
    are read (fewer than ``hops`` from the working set): narrower than the bank's table, which is
    padded to its widest thread, and no neighbour of a read row is cut."""
    banks, (ids, qs, Z) = _bank(2501, False, seed=77)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=16)
    plain, widths = shortlist.front_args, []
    table = eng.snapshot.np["nbr"]

    def args(snap, Z_, bidx, shorts, tok, lq, learned, hops, n_seeds):
        spaces, got = plain(snap, Z_, bidx, shorts, tok, lq, learned, hops, n_seeds)
        for q, sp in enumerate(spaces):
            g0 = int(snap.off.to[bidx[q]])
            rows = table[g0 + sp.ids]
            read = (sp.nbr >= 0).any(axis=1)  # rows with a neighbour in the space (read by the walk)
            need = max([1] + [1 + int(np.flatnonzero(r >= 0).max()) for r in rows[read]])
            assert sp.nbr.shape[1] >= need
            widths.append(sp.nbr.shape[1])
        return spaces, got
    monkeypatch.setattr(shortlist, "front_args", args)
    eng.select_units(ids, qs, Z, params=QueryParams(hops=1))
    assert widths and min(widths) < table.shape[1]


def test_the_threads_scratch_is_left_all_minus_one_and_grows(monkeypatch):
    """``assembly.levels``: the thread's array of a bank's threads is all -1 after every round (so the
    next query's walk starts clean: the rounds above equal the plain ones with it), grows for a
    larger bank, is a fresh one with ``SCRATCH`` off, and is dropped when a call is cut short."""
    from trawmem_gpu.select.engine import assembly

    monkeypatch.setattr(assembly, "_SCRATCH", threading.local())
    banks, (ids, qs, Z) = _bank(1999, False, seed=5)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_shortlist=16)
    eng.select_units(ids[:6], qs[:6], Z[:6])  # one thread: the rounds run on this one
    level = assembly._SCRATCH.level
    assert len(level) >= banks[0].n_threads and (level == -1).all()
    assert assembly.levels(len(level) + 5) is not level and len(assembly._SCRATCH.level) == len(level) + 5
    monkeypatch.setattr(assembly, "SCRATCH", False)
    assert assembly.levels(7) is not assembly._SCRATCH.level and (assembly.levels(7) == -1).all()
    monkeypatch.setattr(assembly, "SCRATCH", True)

    def cut(*a):
        raise RuntimeError("cut short")
    monkeypatch.setattr(assembly, "_assemble", cut)
    with pytest.raises(RuntimeError, match="cut short"):
        eng.select_units(ids[:1], qs[:1], Z[:1])
    assert assembly._SCRATCH.level is None
