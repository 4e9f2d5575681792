"""One bank's size: the engine's memory stays linear in it (issue 33).

A bank past ``EngineConfig.table_max_units`` gets no ``K [N, N]`` / bridge ``[N, J]`` tables: its
queries form K and the bridge from their candidates' vectors (``engine/pool.py``), and pick what
the reference picks (the agreement suites run those paths too: ``table_max_units`` variants). Here:
the sparse support links equal the dense floor, a large bank holds no quadratic table (at build,
after an append that grows it past the cap), and the per-bank lookup tables are flat.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.objective import support_floor, support_links
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.store.view import unit_view

from benchmarks.synthetic_banks import make_banks, make_queries
from layered_banks import layered_bank


@pytest.mark.parametrize("fs", [0.0, 0.5, 1.0])
def test_support_links_are_the_dense_floor(fs):
    view = unit_view(layered_bank("b0", lens=(5, 4, 6, 3), seed=3, n_facts=9), ("turns", "facts", "profiles"))
    cfg = SelectConfig(fact_support=fs)
    F, links = support_floor(view, cfg), support_links(view, cfg)
    assert F is not None and links is not None
    np.testing.assert_array_equal(links.linked(), (F.max(axis=1) > 0).astype(float))
    rng = np.random.default_rng(0)
    for k in (1, 3, 8, view.n_units):
        cand = np.sort(rng.choice(view.n_units, size=k, replace=False))
        got, want = links.between(cand), F[np.ix_(cand, cand)]
        np.testing.assert_array_equal(np.zeros_like(want) if got is None else got, want)
    assert support_links(make_banks(1, units=20, d=8)[0], cfg) is None


def _engine_and_reference(banks, cap, cfg=SelectConfig(), **kw):
    eng = SelectionEngine(banks, cfg, device="cpu", table_max_units=cap, **kw)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    return eng, lambda ids, qs, Z: [select_reference(ctx[b], q, z, cfg).units for b, q, z in zip(ids, qs, Z)]


def test_a_bank_past_the_cap_holds_no_quadratic_table():
    small, big = make_banks(1, units=40, d=16, seed=1, prefix="s")[0], make_banks(1, units=300, d=16, seed=2)[0]
    eng, ref = _engine_and_reference([small, big], cap=100)
    snap = eng.snapshot
    assert snap.off.tab.tolist() == [1, 0]
    assert snap.rows["ktab"] == small.n_units ** 2 and snap.rows["btab"] == small.n_units * small.n_threads
    assert eng.table_nbytes() >= snap.rows["ktab"] * 8
    ids, qs, Z = make_queries([small, big], 24, seed=4)
    assert eng.select_units(ids, qs, Z) == ref(ids, qs, Z)
    full = SelectionEngine([small, big], SelectConfig(), device="cpu", table_max_units=10 ** 6)
    for b in (small.bank_id, big.bank_id):  # the K a query reads: the table's values, formed per query
        cand = np.arange(0, 30)
        np.testing.assert_allclose(eng.candidate_kernel(b, cand), full.candidate_kernel(b, cand), atol=1e-12)


def test_engine_bytes_per_unit_do_not_grow_with_the_bank():
    """Past the cap a bank costs what its vectors and per-unit rows cost, whatever its size."""
    per_unit = []
    for n in (400, 1600):
        bank = make_banks(1, units=n, d=16, seed=n)[0]
        per_unit.append(SelectionEngine([bank], SelectConfig(), device="cpu", table_max_units=100).nbytes() / n)
    assert per_unit[1] <= 1.25 * per_unit[0], per_unit
    with_tables = SelectionEngine([make_banks(1, units=1600, d=16, seed=1600)[0]], SelectConfig(), device="cpu",
                                  table_max_units=10 ** 6).nbytes() / 1600
    assert with_tables > 10 * per_unit[1]  # the N^2 table it replaces (a vacuous test otherwise)


def test_an_append_past_the_cap_drops_the_banks_tables():
    bank = make_banks(1, units=60, d=16, seed=7)[0]
    eng, _ = _engine_and_reference([bank], cap=100)
    assert eng.snapshot.off.tab.tolist() == [1]
    grown = replace(make_banks(1, units=240, d=16, seed=8)[0], bank_id=bank.bank_id)
    eng.replace_bank(grown)
    snap = eng.snapshot
    assert snap.off.tab.tolist() == [0] and int(snap.off.koff[0]) == snap.rows["ktab"]  # no new K rows
    _, ref = _engine_and_reference([grown], cap=100)
    ids, qs, Z = make_queries([grown], 16, seed=9)
    assert eng.select_units(ids, qs, Z) == ref(ids, qs, Z)


def test_unit_cap_reads_each_banks_own_threads():
    banks = make_banks(3, units=50, thread_len=4.0, d=8, seed=3)
    banks += make_banks(1, units=400, thread_len=9.0, d=8, seed=4, prefix="big")
    snap = SelectionEngine(banks, SelectConfig(), device="cpu").snapshot
    for b, bank in enumerate(banks):
        lens = np.sort(np.diff(bank.thread_offsets))[::-1]
        for h in (0, 1, 3, bank.n_threads, bank.n_threads + 5):
            assert snap.unit_cap(np.array([b]), np.array([h]))[0] == lens[:h].sum()


# ----------------------------------------------------------------------------------------------
# large banks: the approximate search (EngineConfig.ann_min_units, engine/shortlist.py)
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clustered():
    bank = make_banks(1, units=3000, thread_len=6.0, d=32, seed=11, prefix="big")[0]
    return [bank], make_queries([bank], 30, seed=12)


@pytest.mark.parametrize("impact", [False, True])
@pytest.mark.parametrize("affinity", ["learned", "rrf"])
def test_a_shortlist_holding_the_whole_bank_picks_what_exact_search_picks(clustered, affinity, impact, monkeypatch):
    """With every unit proposed, the working set is the bank and the ranks are the bank's: the
    shortlist's front (compaction, given ranks, growth) computes what the exact front computes;
    with ``impact`` the BM25 side reads impact-ordered postings (``lexical_shortlist``), each
    column whole at this shortlist, so its scores and ranks are exact too."""
    from trawmem_gpu.select.engine import lexical_shortlist
    if impact:
        monkeypatch.setattr(lexical_shortlist, "EXACT_POSTINGS", 0)
    banks, (ids, qs, Z) = clustered
    cfg = SelectConfig(affinity=affinity)
    exact = SelectionEngine(banks, cfg, device="cpu", sim="dots", ann_min_units=None)
    whole = SelectionEngine(banks, cfg, device="cpu", ann_min_units=1, ann_shortlist=banks[0].n_units)
    for a, b in zip(whole.candidate_sets(ids, qs, Z), exact.candidate_sets(ids, qs, Z)):
        np.testing.assert_array_equal(a, b)
    assert whole.select_units(ids, qs, Z) == exact.select_units(ids, qs, Z)


@pytest.mark.parametrize("impact", [False, True])
def test_approximate_search_keeps_the_candidate_pool(clustered, impact, monkeypatch):
    """A shortlist of 1/12 of the bank still finds nearly every exact candidate (the recall the
    default settings are held to on large banks is measured in benchmarks/results/ann_recall.json),
    with BM25 read exactly or from impact-ordered postings (``impact``)."""
    from trawmem_gpu.select.engine import lexical_shortlist
    if impact:
        monkeypatch.setattr(lexical_shortlist, "EXACT_POSTINGS", 0)
    banks, (ids, qs, Z) = clustered
    exact = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=None)
    approx = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1000, ann_shortlist=256)
    assert approx.plan.ann_min_units == 1000 and exact.plan.ann_min_units is None
    got, want = approx.candidate_sets(ids, qs, Z), exact.candidate_sets(ids, qs, Z)
    recall = np.mean([len(np.intersect1d(a, b)) / len(b) for a, b in zip(got, want)])
    assert recall >= 0.95, recall
    picks = approx.select_units(ids, qs, Z)
    assert all(set(p) <= set(c.tolist()) for p, c in zip(picks, got))  # picks come from the pool found
    small = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=10 ** 6)  # below the threshold
    assert small.select_units(ids, qs, Z) == exact.select_units(ids, qs, Z)


def test_head_seeds_of_a_large_bank_come_from_its_approximate_index(clustered):
    banks, (ids, qs, Z) = clustered
    cfg = SelectConfig.paper()
    exact = SelectionEngine(banks, cfg, device="cpu", ann_min_units=None).select_units(ids, qs, Z)
    eng = SelectionEngine(banks, cfg, device="cpu", ann_min_units=1000)
    got = eng.select_units(ids, qs, Z)
    assert ("head_index", "auto") in eng.snapshot.infos[0].cache  # the approximate index was used
    assert np.mean([a == b for a, b in zip(got, exact)]) >= 0.9


def _every_thread(snap, bank, units, hops, n_seeds):
    """shortlist.thread_space over the bank's every thread (the front loop as it ran before)."""
    from trawmem_gpu.select.engine import shortlist
    J = int(snap.off.nt[bank])
    g0 = int(snap.off.to[bank])
    return shortlist.ThreadSpace(np.arange(J), snap.np["nbr"][g0:g0 + J].copy(), snap.np["nbw"][g0:g0 + J])


@pytest.mark.parametrize("affinity", ["learned", "rrf"])
@pytest.mark.parametrize("hops", [0, 1, 2, 3])
def test_a_shortlists_thread_space_propagates_as_the_whole_thread_graph(clustered, monkeypatch, affinity, hops):
    """The front loop over a working set reads only the threads within ``hops`` of it (its
    ``ThreadSpace``): the neighbourhood, the candidates and the picks equal those of the same loop
    over every thread of the bank, with a shortlist small enough that the space is a sliver of it."""
    from trawmem_gpu.select.engine import shortlist
    from trawmem_gpu.select.params import QueryParams
    banks, (ids, qs, Z) = clustered
    cfg, params = SelectConfig(affinity=affinity), QueryParams(hops=hops)
    eng = SelectionEngine(banks, cfg, device="cpu", ann_min_units=1, ann_shortlist=16)
    sizes = [len(shortlist.thread_space(eng.snapshot, 0, w.units, hops, 8).ids) for w in shortlist.working_sets(
        eng.snapshot, eng.plan, np.asarray(Z, dtype=np.float64), np.zeros(len(ids), np.int64),
        (np.zeros(len(ids) + 1, np.int64), np.zeros(0, np.int64)), False)]
    if hops <= 2:  # at 3 hops the space of this 500-thread bank is all of it
        assert max(sizes) < int(eng.snapshot.off.nt[0])  # the space is not the whole graph
    got = (eng.candidate_sets(ids, qs, Z, params=params), eng.select_units(ids, qs, Z, params=params))
    monkeypatch.setattr(shortlist, "thread_space", _every_thread)
    want = (eng.candidate_sets(ids, qs, Z, params=params), eng.select_units(ids, qs, Z, params=params))
    for a, b in zip(got[0], want[0]):
        np.testing.assert_array_equal(a, b)
    assert got[1] == want[1]


def test_the_approximate_threshold_follows_the_vectors_width(clustered):
    """``ann_min_units="auto"`` (the default) resolves by the banks' width from the measured cost
    fits: a wider vector makes exact search dearer, so approximate search starts at fewer units."""
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.select.config import EngineConfig
    from trawmem_gpu.select.engine.plan import ann_threshold
    banks, _q = clustered
    assert EngineConfig().ann_min_units == "auto"
    assert ann_threshold(384) < ann_threshold(64) < ann_threshold(8)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    assert eng.plan.ann_min_units == ann_threshold(banks[0].unit_vecs.shape[1]) > banks[0].n_units
    assert SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=5).plan.ann_min_units == 5
    for bad in ("many", 0, -3):
        with pytest.raises(ConfigError, match="ann_min_units"):
            EngineConfig(ann_min_units=bad)


def test_chunks_over_shortlists_are_bounded_like_exact_ones(clustered, monkeypatch):
    """A chunk over shortlists holds every query's working set and compacted tables at once, so it
    is bounded by ``FRONT_ROWS`` (queries x bank units) as an exact chunk is, not a fixed 64 rows
    (a chunk of 64 held 2.4 GiB on a 10^5-unit bank); how a batch is cut never changes a pick."""
    from trawmem_gpu.select.engine import compiled
    banks, (ids, qs, Z) = clustered
    approx = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1000, ann_shortlist=256, threads=1)
    want = [approx.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])[0] for i in range(len(ids))]
    seen = []
    real = compiled._chunk
    monkeypatch.setattr(compiled, "_chunk", lambda snap, plan, cfg, batch, Zn, rows, *a: (seen.append(len(rows)),
                        real(snap, plan, cfg, batch, Zn, rows, *a))[1])
    monkeypatch.setattr(compiled, "FRONT_ROWS", 7 * banks[0].n_units)  # 7 queries of this bank a chunk
    assert approx.select_units(ids, qs, Z) == want
    assert seen and max(seen) == 7 and sum(seen) == len(ids), seen
    seen.clear()
    monkeypatch.setattr(compiled, "FRONT_ROWS", 1)  # never fewer than one query
    assert approx.select_units(ids, qs, Z) == want
    assert seen == [1] * len(ids)
