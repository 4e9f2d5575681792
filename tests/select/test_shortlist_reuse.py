"""A grown working set keeps the ranks its first front round computed (``shortlist.grown``,
``shortlist.REUSE``): the ranks it holds equal those :func:`shortlist.given_ranks` computes over the
grown set from nothing, and the candidates and picks equal those of ranking every round again."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, shortlist, working_set
from trawmem_gpu.select.params import QueryParams

from benchmarks.synthetic_banks import make_banks, make_queries


def _bank(units: int, ties: bool, seed: int):
    """A bank of ``units`` units (d = 24); ``ties``: sign vectors, so cosines tie often."""
    bank = make_banks(1, units=units, thread_len=5.0, d=24, seed=seed, prefix="reuse")[0]
    if ties:
        v = np.sign(bank.unit_vecs) + (bank.unit_vecs == 0)
        bank = replace(bank, unit_vecs=(v / np.sqrt(v.shape[1])).astype(bank.unit_vecs.dtype))
    return [bank], make_queries([bank], 24, seed=seed + 1)


def _spy(monkeypatch):
    """Wrap ``shortlist.grown``: each grown set's held ranks must equal a fresh ranking; returns
    the counts ``[grown sets, grown sets holding ranks]``."""
    seen = [0, 0]
    plain = shortlist.grown

    def checked(snap, short, bank, more, z):
        out = plain(snap, short, bank, more, z)
        seen[0] += 1
        if out.ranks is not None:
            seen[1] += 1
            want = shortlist.given_ranks(out, out.cos, int(snap.off.nu[bank]))
            for a, b in zip(out.ranks, want):
                np.testing.assert_array_equal(a, b)
        return out
    monkeypatch.setattr(shortlist, "grown", checked)
    return seen


@pytest.mark.parametrize("affinity", ["learned", "rrf"])
@pytest.mark.parametrize("units,ties", [(1999, False), (2501, True)])
def test_a_grown_working_set_keeps_its_ranks_and_picks_as_ranking_again(monkeypatch, affinity, units, ties):
    banks, (ids, qs, Z) = _bank(units, ties, seed=units)
    params = QueryParams(hops=2)
    eng = SelectionEngine(banks, SelectConfig(affinity=affinity), device="cpu", ann_min_units=1, ann_shortlist=16)
    seen = _spy(monkeypatch)
    got = (eng.candidate_sets(ids, qs, Z, params=params), eng.select_units(ids, qs, Z, params=params))
    n = seen[0]
    assert n > 0 and seen[1] == n  # sets grew, and every one kept its ranks
    monkeypatch.setattr(shortlist, "REUSE", False)
    want = (eng.candidate_sets(ids, qs, Z, params=params), eng.select_units(ids, qs, Z, params=params))
    assert seen[0] > n and seen[1] == n  # the plain rounds grew sets holding no ranks (ranked again)
    for a, b in zip(got[0], want[0]):
        np.testing.assert_array_equal(a, b)
    assert got[1] == want[1]


def test_growing_by_nothing_keeps_the_set_and_its_ranks(monkeypatch):
    banks, (ids, qs, Z) = _bank(301, True, seed=5)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=8)
    snap = eng.snapshot
    sh = shortlist.working_sets(snap, eng.plan, np.asarray(Z, dtype=np.float64), np.zeros(len(ids), np.int64),
                                (np.zeros(len(ids) + 1, np.int64), np.zeros(0, np.int64)), False)[0]
    sh = shortlist.ranked(sh, int(snap.off.nu[0]))
    same = shortlist.grown(snap, sh, 0, np.zeros(0, np.int64), np.asarray(Z[0], dtype=np.float64))
    np.testing.assert_array_equal(same.units, sh.units)
    for a, b in zip(same.ranks, sh.ranks):
        np.testing.assert_array_equal(a, b)
    masked = shortlist.grown(snap, sh._replace(head=np.zeros((2, 0))), 0, np.arange(3), np.asarray(Z[0], np.float64))
    assert masked.ranks is None  # ranks among W (a masked query's): ranked again


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("J,max_len", [(1, 1), (6, 3), (300, 9)])
def test_the_missing_units_are_the_missing_threads_units_less_the_working_set(monkeypatch, J, max_len, compiled):
    """``missing_units`` (by ``absent``'s merge) equals ``threads_units(missing_threads(...))`` less
    ``W`` (``np.setdiff1d``), with repeated and unordered neighbourhood threads, empty ones and a
    ``W`` holding every unit or none; ``absent`` is ``np.setdiff1d`` of sorted unique arrays."""
    monkeypatch.setattr(working_set, "COMPILED", compiled)
    rng = np.random.default_rng(J + max_len)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(1, max_len + 1, size=J))]).astype(np.int64)
    n = int(offsets[-1])
    for share in (0.0, 0.3, 0.9, 1.0):
        W = np.flatnonzero(rng.random(n) < share).astype(np.int64)
        for k in (0, 1, 5, 2 * J):
            hthread = rng.integers(0, J, size=k).astype(np.int64)
            miss = working_set.missing_threads(offsets, W, hthread)
            want = np.setdiff1d(working_set.threads_units(offsets, miss), W, assume_unique=True) if len(miss) \
                else np.zeros(0, np.int64)
            got = working_set.missing_units(offsets, W, hthread)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, want)
            more = np.unique(rng.integers(0, n, size=k)).astype(np.int64)
            got = working_set.absent(more, W)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, np.setdiff1d(more, W, assume_unique=True))
