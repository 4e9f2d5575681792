"""TrawMem over layers (issue 21.4): with facts and profiles as units, a fact supports its source
turns in K (J sees the redundancy), the knapsack pays each unit's rendered tokens, and every
engine path picks exactly what the reference picks."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.objective import Objective, support_floor
from trawmem_gpu.select.params import QueryParams
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.store.view import unit_view
from trawmem_gpu.select.workspace import assemble, token_costs

from layered_banks import layered_bank
from query_mix import MIX, VARIANTS

D = 16


@pytest.fixture(scope="module", params=[("turns", "facts"), ("turns", "facts", "profiles")],
                ids=["facts", "facts-profiles"])
def views(request):
    raw = [layered_bank("a", (3, 1, 5, 2, 7, 4), 1, n_facts=9), layered_bank("b", (4, 4, 4), 2, n_facts=5),
           layered_bank("c", (2, 6, 3, 3, 1, 5, 2), 3, n_facts=12)]
    return [unit_view(b, request.param) for b in raw]


@pytest.fixture(scope="module")
def vqueries(views):
    rng = np.random.default_rng(11)
    ids, qs, zs = [], [], []
    for b in views:
        layer = [i for i, t in enumerate(b.turns) if getattr(t, "layer", "turns") != "turns"]
        turns = [i for i, t in enumerate(b.turns) if getattr(t, "layer", "turns") == "turns"]
        for i in range(6):
            u = int(rng.choice(layer if i % 2 else turns))  # near a fact or profile / a turn
            z = b.unit_vecs[u] + 0.3 * rng.normal(size=D)
            ids.append(b.bank_id)
            qs.append(f"When did Ana {i} cat paint?")
            zs.append(z / np.linalg.norm(z))
    return ids, qs, np.array(zs, dtype=np.float32)


def _reference(banks, cfg, ids, qs, Z, params):
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    return [select_reference(ctx[b], q, z, cfg, p).units for b, q, z, p in zip(ids, qs, Z, params)]


NO_TABLES = ({"backend": "compiled", "table_max_units": 0}, {"backend": "tensor", "table_max_units": 0})
"""Banks without per-bank tables: K and the support links' floor formed per query (``engine/pool.py``)."""


@pytest.mark.parametrize("variant", VARIANTS + NO_TABLES, ids=lambda v: "-".join(map(str, v.values())))
def test_engines_pick_what_the_reference_picks_with_facts(views, vqueries, variant):
    ids, qs, Z = vqueries
    params = [MIX[i % len(MIX)] for i in range(len(ids))]
    for cfg in (SelectConfig(), SelectConfig(fact_support=1.0, knapsack="ratio"), SelectConfig(w_aff=0.0, fact_support=1.0)):
        ref = _reference(views, cfg, ids, qs, Z, params)
        got = SelectionEngine(views, cfg, device="cpu", **variant).select_units(ids, qs, Z, params=params)
        bad = [(i, g, r) for i, (g, r) in enumerate(zip(got, ref)) if g != r]
        assert not bad, f"{len(bad)}/{len(ref)} differ, first: {bad[:2]}"
    bank_of = {b.bank_id: b for b in views}
    assert any(getattr(bank_of[b].turns[u], "layer", "turns") != "turns" for b, r in zip(ids, ref) for u in r), \
        "no layer unit was ever picked: a vacuous test"


def test_a_fact_supports_its_source_turns(views):
    v = views[0]
    cfg = SelectConfig(fact_support=0.75)
    idx = v.index_of()
    F = support_floor(v, cfg)
    f = next(t for t in v.turns if getattr(t, "layer", "") == "facts")
    fi, ti = idx[f.turn_id], idx[f.cites[0]]
    assert F[fi, ti] == 0.75 and F[ti, fi] == 1.0
    eng = SelectionEngine(views, cfg, device="cpu")
    K = eng.candidate_kernel(v.bank_id, np.array([fi, ti]))
    assert K[0, 1] >= 0.75 and K[1, 0] == 1.0
    # J sees the redundancy: once the source turn is in S, the fact adds no information coverage
    obj = Objective(np.array([0.5, 0.5]), K, np.zeros((2, 1)), np.zeros(1), np.zeros(2), np.array([0, 1]),
                    weights=(1.0, 0.0, 0.0, 0.0))
    assert obj.gain(0) > 0
    obj.add(1)
    assert obj.gain(0) == 0.0
    # the plain bank has no links: today's K
    assert support_floor(layered_bank(), cfg) is None


def test_knapsack_pays_rendered_fact_lines(views):
    v = views[0]
    c = token_costs(v)
    idx = v.index_of()
    f = next(t for t in v.turns if getattr(t, "layer", "") == "facts")
    u = idx[f.turn_id]
    ws = assemble(v, "", [u])
    assert " from " in ws.render() and ws.render().count("[F:") == 1
    assert ws.n_tokens <= c.unit[u] + c.heading[c.runs(np.array([v.unit_thread[u]]))[0]]
    p = QueryParams(budget=None, token_budget=90)
    for b in views:
        ctx = BankContext.of(b)
        z = b.unit_vecs[-1]
        sel = select_reference(ctx, "What does Ana like?", z, SelectConfig(), p)
        assert assemble(b, "", sel.units).n_tokens <= 90


def test_served_engine_selects_from_the_views():
    """``serve --units``: the service's engine selects from each stored bank's unit view, and an
    append's refresh makes the new bank's view."""
    from dataclasses import replace

    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.memory.engines import ServedEngine

    a, b = layered_bank("a", (3, 4), 1), layered_bank("b", (2, 5), 2)
    es = ServedEngine({"a": a}, SelectConfig(), units=ServeConfig(units="turns,facts").units)
    assert es.banks["a"] is a and es.bank("a").units == ("turns", "facts")
    assert es.bank("a").n_units == a.n_units + len(a.facts)
    prep = es.prepare(b)
    es.refresh(b, prep)
    assert es.bank("b") is prep[3] and es.engine.snapshot.bank_index("b") == 1
    z = es.bank("b").unit_vecs[-1]
    (picks,) = es.engine.select_units(["b"], ["What does Ana like?"], z[None, :])
    ref = select_reference(BankContext.of(es.bank("b")), "What does Ana like?", z, SelectConfig()).units
    assert picks == ref
    es.refresh(replace(b))  # a new bank object without prepared tables: its view is built here
    assert es.bank("b").units == ("turns", "facts")
    with pytest.raises(Exception, match="unknown layer"):
        ServeConfig(units="turns,gists")


def test_turn_context_is_the_banks_and_a_fact_has_its_source_turns():
    """The ``learned`` affinity's session context in a view: a turn's neighbours are its bank
    neighbours (the layer units do not come between), a fact's are its source turn's."""
    from trawmem_gpu.select.steps.relevance import relevance_static

    b = layered_bank("c", (2, 6, 3, 3, 1, 5, 2), 3, n_facts=12)
    v = unit_view(b, ("turns", "facts"))
    sb, sv = relevance_static(b), relevance_static(v)
    vid = v.index_of()
    ids = lambda bank, k: None if k < 0 else bank.turns[k].turn_id  # noqa: E731
    for i, t in enumerate(b.turns):
        j = vid[t.turn_id]
        assert (ids(v, sv.prev[j]), ids(v, sv.next[j])) == (ids(b, sb.prev[i]), ids(b, sb.next[i]))
    for f in b.facts:
        j, src = vid[f.fact_id], b.index_of()[f.source_turns[0]]
        assert (ids(v, sv.prev[j]), ids(v, sv.next[j])) == (ids(b, sb.prev[src]), ids(b, sb.next[src]))


@pytest.mark.slow
def test_engines_agree_on_dev_banks_with_locomo_facts(dev_path):
    """Real turns and facts (LoCoMo dev, 2 banks with their observations, 15 questions each): the
    reference and the engine paths pick identical sets at T = 400 and B = 16, and every workspace
    fits T."""
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.retrieval import banks_for, layered_banks

    convs, banks, _ = banks_for(dev_path, BuildConfig(), progress=False)
    convs, banks = convs[:2], banks[:2]
    enc = get_encoder()
    views = layered_banks(banks, dev_path, ("turns", "facts"), "locomo", enc)
    items = [(c.bank_id, q.question) for c in convs for q in
             [q for q in c.questions if q.category in (1, 2, 3, 4) and q.evidence][:15]]
    Z = enc.encode([q for _, q in items], is_query=True)
    ids, qs = [b for b, _ in items], [q for _, q in items]
    for qp in (QueryParams(token_budget=400, budget=None), QueryParams(budget=16)):
        ref = _reference(views, SelectConfig(), ids, qs, Z, [qp] * len(ids))
        for variant in VARIANTS[:3] + NO_TABLES[:1]:  # the last: no per-bank tables, K per query
            got = SelectionEngine(views, SelectConfig(), device="cpu", **variant).select_units(ids, qs, Z, params=qp)
            assert got == ref, variant
        bank = {b.bank_id: b for b in views}
        n_facts = sum(getattr(bank[b].turns[u], "layer", "") == "facts" for b, r in zip(ids, ref) for u in r)
        assert n_facts > 0
        if qp.token_budget:
            assert max(assemble(bank[b], q, r).n_tokens for b, q, r in zip(ids, qs, ref)) <= 400


TENSOR_VARIANTS = [v for v in VARIANTS if v["backend"] == "tensor"]  # the fused paths stand aside for w_grp


def test_restatement_groups_join_a_fact_and_its_source_turns(views):
    from trawmem_gpu.select.objective import GROUP, restatement_groups
    from trawmem_gpu.select.terms import unit_attributes

    v = views[0]
    g, idx = restatement_groups(v), v.index_of()
    for t in v.turns:
        if getattr(t, "layer", "") == "facts":
            assert {g[idx[c]] for c in t.cites} == {g[idx[t.turn_id]]} and g[idx[t.turn_id]] >= 0
    linked = set(v.support_src.tolist()) | set(v.support_dst.tolist())
    assert all(g[u] == -1 for u in range(v.n_units) if u not in linked)
    assert all(g[u] <= u for u in linked)  # a group is named by its smallest unit
    assert np.array_equal(unit_attributes(v)[:, GROUP], g)


def test_group_affinity_counts_a_fact_and_its_turn_once():
    alpha = np.array([0.9, 0.6, 0.5])  # unit 0 a turn, unit 1 its fact, unit 2 of no group
    attrs = np.array([[np.nan, 0.0], [np.nan, 0.0], [np.nan, -1.0]])
    cfg = SelectConfig(w_grp=1.0)
    from trawmem_gpu.select.objective import ModularInputs, modular_gain

    m = modular_gain(ModularInputs(alpha, attrs, np.nan), {"w_aff": 1.0, "w_rec": 0.0}, cfg)
    assert m.tolist() == [0.0, 0.0, 0.5]  # grouped units leave the modular sum
    obj = Objective(np.full(3, 1 / 3), np.eye(3), np.zeros((3, 1)), np.zeros(1), m, np.array([0, 1, 2]),
                    weights=(0.0, 0.0, 0.0, 1.0), attrs=attrs, alpha=alpha)
    assert obj.gain(1) == pytest.approx(0.6)
    obj.add(0)
    assert obj.gain(1) == 0.0 and obj.gain(2) == pytest.approx(0.5)  # the fact adds nothing beside its turn
    assert obj.value([0, 1, 2]) == pytest.approx(0.9 + 0.5)


@pytest.mark.parametrize("variant", TENSOR_VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_engines_pick_what_the_reference_picks_with_group_affinity(views, vqueries, variant):
    ids, qs, Z = vqueries
    params = [MIX[i % len(MIX)] for i in range(len(ids))]
    cfg = SelectConfig(w_grp=16.0)
    ref = _reference(views, cfg, ids, qs, Z, params)
    got = SelectionEngine(views, cfg, device="cpu", **variant).select_units(ids, qs, Z, params=params)
    bad = [(i, g, r) for i, (g, r) in enumerate(zip(got, ref)) if g != r]
    assert not bad, f"{len(bad)}/{len(ref)} differ, first: {bad[:2]}"
    assert ref != _reference(views, SelectConfig(), ids, qs, Z, params), "w_grp changed no pick: a vacuous test"


def test_group_affinity_is_inactive_without_support_links():
    from layered_banks import layered_bank

    bank = layered_bank("t", (3, 4, 2, 5), 4, n_facts=0)
    rng = np.random.default_rng(5)
    Z = rng.normal(size=(6, D))
    Z = (Z / np.linalg.norm(Z, axis=1, keepdims=True)).astype(np.float32)
    ids, qs = ["t"] * 6, [f"Where did Ana {i} go?" for i in range(6)]
    params = [QueryParams(token_budget=120)] * 6
    on = _reference([bank], SelectConfig(w_grp=16.0), ids, qs, Z, params)
    assert on == _reference([bank], SelectConfig(), ids, qs, Z, params)
