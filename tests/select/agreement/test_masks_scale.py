"""Unit masks (``select.restrict``) on the paths of large banks (issue 33 beside issue 35's filters).

* **banks without tables** (``EngineConfig.table_max_units``: K and the bridge formed from the
  candidates, ``engine/pool.py``): a masked query picks what the reference picks over its bank
  restricted to the mask, on the compiled backend, the tensor backend and the tensor front with the
  compiled stage, with every bank table-less and with banks with and without tables in one batch;
* **the approximate path** (``EngineConfig.ann_min_units``, ``engine/shortlist.py``): a masked
  query over a shortlist picks passing units only, and as many as the budget allows; when the
  shortlist holds every passing unit its picks are the reference's.
"""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.config import MULTI_THREAD, ROLE_TERMS, SelectConfig
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.params import QueryParams, split_fields
from trawmem_gpu.select.steps.ann import faiss_available

from benchmarks.synthetic_banks import make_banks, make_queries
from engine_banks import banks, queries  # noqa: F401 - fixtures
from mask_cases import masked_reference, unit_masks

NO_TABLES = [dict(table_max_units=0), dict(backend="tensor", table_max_units=0),
             dict(front="tensor", table_max_units=0),
             dict(table_max_units=31), dict(backend="tensor", table_max_units=31)]  # "odd" and "wide" without


@pytest.mark.parametrize("kw", [pytest.param({}, id="default"), pytest.param(dict(affinity="rrf", hops=2), id="rrf"),
                                pytest.param(ROLE_TERMS | MULTI_THREAD | dict(hops=2), id="roles-multi-thread")])
def test_masked_queries_on_banks_without_tables_pick_what_the_reference_picks(banks, queries, kw):  # noqa: F811
    method, query = split_fields(kw)
    cfg, qp = SelectConfig(**method), QueryParams(**query)
    ids, qs, Z = queries
    masks = unit_masks(banks, ids, seed=21 + len(kw))
    ref = masked_reference(banks, cfg, ids, qs, Z, qp, masks)
    assert all(m is None or all(m[u] for u in r) for r, m in zip(ref, masks))
    for v in NO_TABLES:
        eng = SelectionEngine(banks, cfg, device="cpu", **v)
        tab = eng.snapshot.off.tab.tolist()
        assert tab == ([0] * len(banks) if v["table_max_units"] == 0 else [0, 1, 1, 0, 1])
        got = eng.select_units(ids, qs, Z, params=qp, masks=masks)
        bad = [(i, g, r) for i, (g, r) in enumerate(zip(got, ref)) if g != r]
        assert not bad, f"{v}: {len(bad)}/{len(ref)} queries differ from the reference, first: {bad[:2]}"
    unmasked = SelectionEngine(banks, cfg, device="cpu", table_max_units=0).select_units(ids, qs, Z, params=qp)
    assert sum(r != p for r, p in zip(ref, unmasked)) > len(ids) // 3  # the masks change the picks


# ----------------------------------------------------------------------------------------------
# the approximate path
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def large():
    bank = make_banks(1, units=900, thread_len=6.0, d=16, seed=31, prefix="big")[0]
    ids, qs, Z = make_queries([bank], 14, seed=32)
    rng = np.random.default_rng(33)
    n = bank.n_units
    masks = []
    for i in range(len(ids)):
        kind = i % 4
        if kind == 0:  # most units pass: the index searches among them
            masks.append(rng.random(n) < 0.6)
        elif kind == 1:  # few pass (fewer than the shortlist): every one of them is proposed
            m = np.zeros(n, dtype=bool)
            m[rng.choice(n, size=40, replace=False)] = True
            masks.append(m)
        elif kind == 2:  # whole threads
            keep_t = rng.random(bank.n_threads) < 0.3
            masks.append(keep_t[bank.unit_thread])
        else:
            masks.append(None)
    return bank, (ids, qs, Z), masks


needs_faiss = pytest.mark.skipif(not faiss_available(), reason="the approximate path needs faiss")


@needs_faiss
@pytest.mark.parametrize("affinity", ["learned", "rrf"])
def test_a_masked_query_over_a_shortlist_picks_passing_units(large, affinity):
    """Over a shortlist (64 of 900 units) a masked query picks passing units only, as many as exact
    search picks under its mask, mostly the same ones; a mask passing fewer units than the
    shortlist (all of them proposed) picks exactly what exact search picks."""
    bank, (ids, qs, Z), masks = large
    cfg, qp = SelectConfig(affinity=affinity), QueryParams(budget=8)
    eng = SelectionEngine([bank], cfg, device="cpu", ann_min_units=100, ann_shortlist=64, table_max_units=0)
    assert eng.plan.ann_min_units == 100 and eng.plan.front == "compiled"
    got = eng.select_units(ids, qs, Z, params=qp, masks=masks)
    plain = eng.select_units(ids, qs, Z, params=qp)
    exact = SelectionEngine([bank], cfg, device="cpu", ann_min_units=None).select_units(ids, qs, Z, params=qp,
                                                                                        masks=masks)
    overlap = []
    for g, p, e, m in zip(got, plain, exact, masks):
        assert len(g) == len(e) >= 7  # the budget is spent on passing units (7: a neighbourhood of 40 scattered)
        if m is None:
            assert g == p
            continue
        assert all(m[u] for u in g)
        if m.sum() <= 64:
            assert g == e
        overlap.append(len(set(g) & set(e)) / len(e))
    assert np.mean(overlap) >= 0.8, overlap
    assert sum(g != p for g, p, m in zip(got, plain, masks) if m is not None) > len(ids) // 2
    assert ("unit_index", "auto") in eng.snapshot.infos[0].cache  # the approximate index was searched


@needs_faiss
@pytest.mark.parametrize("affinity", ["learned", "rrf"])
def test_a_shortlist_holding_every_passing_unit_picks_what_the_reference_picks(large, affinity):
    """A mask passing at most ``ann_shortlist`` units proposes all of them: the working set holds
    the restricted bank, its ranks and thread graph are the restricted bank's, and the picks are
    the reference's (the shortlist's compaction, mask mapping and growth compute the exact front)."""
    bank, (ids, qs, Z), masks = large
    cfg, qp = SelectConfig(affinity=affinity), QueryParams()
    rows = [i for i, m in enumerate(masks) if m is not None]
    sub = ([ids[i] for i in rows], [qs[i] for i in rows], Z[rows])
    few = [masks[i] for i in rows]
    eng = SelectionEngine([bank], cfg, device="cpu", ann_min_units=100, ann_shortlist=int(max(m.sum() for m in few)))
    assert eng.select_units(*sub, params=qp, masks=few) == masked_reference([bank], cfg, *sub, qp, few)


@needs_faiss
def test_masked_head_seeds_of_a_large_bank_are_exact(large):
    """On a bank past ``ann_min_units`` the tensor front still scores every live head of a masked
    query exactly (its unmasked queries read the bank's approximate head index)."""
    bank, (ids, qs, Z), masks = large
    rows = [i for i, m in enumerate(masks) if m is not None][:6]
    sub = ([ids[i] for i in rows], [qs[i] for i in rows], Z[rows])
    few = [masks[i] for i in rows]
    method, query = split_fields(dict(seed_score="head", affinity="fused", hops=2))
    cfg, qp = SelectConfig(**method), QueryParams(**query)
    eng = SelectionEngine([bank], cfg, device="cpu", backend="tensor", ann_min_units=100, table_max_units=0)
    assert eng.select_units(*sub, params=qp, masks=few) == masked_reference([bank], cfg, *sub, qp, few)
