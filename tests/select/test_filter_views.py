"""A filter over a unit view (facts and profile sections as units beside the turns), over the
baselines and over TriMem's retrieval: a derived unit passes when every turn behind it passes,
the rankings are over the passing units (the budget spent on them), and nothing shown fails."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from trawmem_gpu.select.baselines import BASELINES, baseline_units, ranking
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.params import QueryParams
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.restrict import unit_mask
from trawmem_gpu.store.view import unit_view
from layered_banks import layered_bank

WHERE = {"user_id": "u1"}


@pytest.fixture(scope="module")
def tagged():
    b = layered_bank("v", lens=(4, 3, 5, 4), seed=3, n_facts=8)
    rng = np.random.default_rng(4)
    return replace(b, turns=[replace(t, metadata={"user_id": "u1" if rng.random() < 0.6 else "u2"}) for t in b.turns])


def _queries(bank, n=6, seed=5):
    rng = np.random.default_rng(seed)
    Z = bank.unit_vecs[rng.integers(bank.n_units, size=n)] + 0.3 * rng.normal(size=(n, bank.unit_vecs.shape[1]))
    return [f"What did Ana say about {w}?" for w in rng.choice(["cats", "the port", "sailing"], n)], \
        (Z / np.linalg.norm(Z, axis=1, keepdims=True)).astype(np.float32)


def test_a_derived_unit_passes_when_every_turn_behind_it_passes(tagged):
    view = unit_view(tagged, ("turns", "facts", "profiles"))
    keep = unit_mask(view, WHERE)
    ok = {t.turn_id for t in tagged.turns if t.metadata["user_id"] == "u1"}
    for u, k in zip(view.turns, keep):
        layer = getattr(u, "layer", "turns")
        if layer == "turns":
            assert k == (u.turn_id in ok)
        else:
            assert k == all(c in ok for c in u.cited_turns), u.turn_id
    assert keep.any() and not keep.all()
    layered = [getattr(u, "layer", "turns") != "turns" for u in view.turns]
    assert any(k for k, x in zip(keep, layered) if x) and not all(k for k, x in zip(keep, layered) if x)


def test_the_engine_over_a_view_under_a_filter(tagged):
    view = unit_view(tagged, ("turns", "facts", "profiles"))
    qs, Z = _queries(tagged)
    cfg, qp = SelectConfig(), QueryParams(budget=6, hops=2)
    eng = SelectionEngine([view], cfg, device="cpu")
    got = eng.select_units(["v"] * len(qs), qs, Z, params=qp, where=WHERE)
    keep = unit_mask(view, WHERE)
    ctx = BankContext.of(view)
    assert got == [select_reference(ctx, q, z, cfg, qp, keep=keep).units for q, z in zip(qs, Z)]
    assert all(p and all(keep[u] for u in p) for p in got)


@pytest.mark.parametrize("method", BASELINES)
def test_baselines_rank_the_passing_units(tagged, method):
    ctx = BankContext.of(tagged)
    keep = unit_mask(tagged, WHERE)
    qs, Z = _queries(tagged, 3)
    for q, z in zip(qs, Z):
        got = baseline_units(method, ctx, q, z, None, QueryParams(budget=5), keep=keep)
        assert got and all(keep[u] for u in got)
        if method in ("cosine", "bm25", "full"):  # ranks of their own: the filtered ranking, from the top
            want = [int(u) for u in ranking(method, ctx, q, z) if keep[u]]
            assert got == (want if method == "full" else want[:5])
        t = baseline_units(method, ctx, q, z, None, QueryParams(token_budget=60), keep=keep)
        assert t and all(keep[u] for u in t)


def test_trimem_ranks_and_shows_passing_units_only(tagged):
    from trawmem_gpu.select.trimem.method import TriMemRanker
    from trawmem_gpu.select.trimem.plan import plain_plan

    r = TriMemRanker.of(tagged)
    keep = unit_mask(r.view, WHERE)
    qs, Z = _queries(tagged, 3)
    facts = {i for i, u in enumerate(r.view.turns) if getattr(u, "layer", "turns") == "facts"}
    for q, z in zip(qs, Z):
        got = r.units(plain_plan(q), z[None, :], QueryParams(budget=64), keep=keep)
        assert got and all(keep[u] for u in got)
        assert {u for u in got if u in facts} == {u for u in facts if keep[u]}  # every passing fact, no other
        free = r.units(plain_plan(q), z[None, :], QueryParams(budget=64))
        assert {u for u in free if u in facts} == facts
