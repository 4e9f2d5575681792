"""Token budgets (``QueryParams.token_budget``): the engine against the reference, the baselines'
fill, and the check of the real rendering (every method within T on the LoCoMo dev banks).

Random problems and tiny hand-made banks for most of it; the LoCoMo dev banks for the check that
every method's rendered workspace holds at most T tokens on real turns.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine_banks import VOCAB, make_bank
from trawmem_gpu.select.baselines import BASELINES, baseline_units, take_within_tokens
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.params import QueryParams, split_fields
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.workspace import assemble

from token_budget_cases import D, _extractive_bank


# ----------------------------------------------------------------------------------------------
# the engine against the reference; every method within T
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def banks():
    return [make_bank("odd", [3, 1, 5, 2, 7, 4, 1, 6, 3], seed=1, n_semantic=5), make_bank("single", [4], seed=2),
            make_bank("tiny", [1, 2], seed=3), make_bank("wide", [2, 3, 4, 5] * 8, seed=4, n_semantic=20),
            _extractive_bank(seed=6, lens=(4, 2, 6, 3, 5, 1, 2))]


@pytest.fixture(scope="module")
def queries(banks):
    rng = np.random.default_rng(7)
    ids, qs, zs = [], [], []
    for b in banks:
        for i in range(5):
            z = b.unit_vecs[int(rng.integers(b.n_units))] + 0.4 * rng.normal(size=D) if i < 3 else rng.normal(size=D)
            ids.append(b.bank_id)
            qs.append("When did " + " ".join(rng.choice(VOCAB, size=3)) + "?")
            zs.append(z / np.linalg.norm(z))
    return ids, qs, np.array(zs, dtype=np.float32)


ENGINE_VARIANTS = [{}, {"backend": "tensor"}, {"backend": "tensor", "optimizer": "plain"}, {"front": "tensor"}]


@pytest.mark.parametrize("cfg", [
    pytest.param(dict(token_budget=60, budget=None), id="T60"),
    pytest.param(dict(token_budget=150, budget=None), id="T150"),
    pytest.param(dict(token_budget=400, budget=None), id="T400"),
    pytest.param(dict(token_budget=400, budget=5), id="T400-B5"),
    pytest.param(dict(token_budget=150, budget=None, knapsack="gain"), id="T150-gain"),
    pytest.param(dict(token_budget=150, budget=None, knapsack="ratio", hops=2), id="T150-ratio-H2"),
    pytest.param(dict(token_budget=300, budget=None, ablation="no_multi_thread"), id="T300-no-multi-thread"),
    pytest.param(dict(token_budget=300, budget=None, lambda_r=0.5, w_role=1.0, cross_thread=True, w_thr=1.0),
                 id="T300-roles-and-multi-thread"),
    pytest.param(dict(token_budget=200, budget=None, affinity="learned"), id="T200-learned-affinity"),
    pytest.param(dict(token_budget=200, budget=None, headings="gist"), id="T200-gist-headings"),
    pytest.param(dict(token_budget=200, budget=None, headings="none"), id="T200-no-headings"),
])
def test_engine_agrees_with_reference_under_a_token_budget(banks, queries, cfg):
    ids, qs, Z = queries
    method, query = split_fields(cfg)
    c, qp = SelectConfig(**method), QueryParams(**query)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    bank = {b.bank_id: b for b in banks}
    ref = [select_reference(ctx[b], q, z, c, qp).units for b, q, z in zip(ids, qs, Z)]
    assert any(ref) and all(assemble(bank[b], q, p, c.headings).n_tokens <= qp.token_budget
                            for b, q, p in zip(ids, qs, ref))
    if qp.budget is not None:
        assert max(len(p) for p in ref) <= qp.budget
    for v in ENGINE_VARIANTS:
        got = SelectionEngine(banks, c, device="cpu", **v).select_units(ids, qs, Z, params=qp)
        bad = [(i, g, r) for i, (g, r) in enumerate(zip(got, ref)) if g != r]
        assert not bad, f"{v or 'default'}: {len(bad)} queries differ, first {bad[:2]}"


def test_token_costs_survive_replace_bank(banks, queries):
    ids, qs, Z = queries
    cfg, qp = SelectConfig(), QueryParams(token_budget=150, budget=None)
    eng = SelectionEngine(banks, cfg, device="cpu")
    new = _extractive_bank(seed=9, lens=(5, 5, 2))
    new.bank_id = "odd"  # same id, other units: other costs
    for t in range(len(new.turns)):
        new.turns[t] = replace(new.turns[t], turn_id=f"odd:{t}")
    eng.replace_bank(new)
    eng.remove_bank("tiny")
    rows = [i for i, b in enumerate(ids) if b in ("odd", "ext")]
    rid, rq = [ids[i] for i in rows], [qs[i] for i in rows]
    got = eng.select_units(rid, rq, Z[rows], params=qp)
    now = {b.bank_id: b for b in banks if b.bank_id != "odd"} | {"odd": new}
    ref = [select_reference(BankContext.of(now[b]), q, z, cfg, qp).units for b, q, z in zip(rid, rq, Z[rows])]
    assert got == ref and any(p for b, p in zip(rid, got) if b == "odd")


@pytest.mark.parametrize("fill", ["skip", "stop"])
def test_baselines_fill_a_token_budget(banks, queries, fill):
    ids, qs, Z = queries
    bank = {b.bank_id: b for b in banks}
    for T in (40, 120, 300):
        cfg, qp = SelectConfig(), QueryParams(token_budget=T, budget=None, fill=fill)
        for b, q, z in zip(ids, qs, Z):
            ctx = BankContext.of(bank[b])
            costs = ctx.token_costs("none")
            for m in BASELINES:
                units = baseline_units(m, ctx, q, z, cfg, qp)
                assert assemble(bank[b], q, units, "none").n_tokens <= T
                from trawmem_gpu.select.baselines import ranking

                order = [int(u) for u in ranking(m, ctx, q, z)]
                pos = [order.index(u) for u in units]
                assert pos == sorted(pos)  # rank order
                if fill == "stop":
                    assert units == order[:len(units)]  # a prefix of the ranking
                else:  # every unit ranked above the last taken one that was left out did not fit then
                    left = [u for u in order[:pos[-1] if pos else 0] if u not in units]
                    for u in left:
                        before = [x for x in units if order.index(x) < order.index(u)]
                        assert costs.cost(before + [u], bank[b].unit_thread) > T
            # a unit cap on top of T
            capped = baseline_units("cosine", ctx, q, z, cfg, replace(qp, budget=2))
            assert capped == baseline_units("cosine", ctx, q, z, cfg, qp)[:2] or fill == "skip" and len(capped) <= 2


def test_take_within_tokens_skip_and_stop():
    class C:
        unit = np.array([5, 50, 5, 5])
        heading = np.array([0, 0])
    th = np.array([0, 0, 1, 1])
    assert take_within_tokens([0, 1, 2, 3], C, th, 12, "skip") == [0, 2]
    assert take_within_tokens([0, 1, 2, 3], C, th, 15, "skip") == [0, 2, 3]
    assert take_within_tokens([0, 1, 2, 3], C, th, 15, "stop") == [0]
    assert take_within_tokens([0, 1, 2, 3], C, th, 15, "skip", cap=2) == [0, 2]
    C.heading = np.array([0, 6])  # a heading paid with its thread's first unit
    assert take_within_tokens([0, 2, 3], C, th, 20, "skip") == [0, 2]


@pytest.mark.slow
def test_every_method_fits_the_budget_on_dev_banks(dev_path):
    """Real turns (LoCoMo dev, 3 banks, 20 questions each): TrawMem (reference and engine) and every
    baseline (both fills) render within T at T = 400, 800, 1600."""
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.retrieval import banks_for

    convs, banks, _ = banks_for(dev_path, BuildConfig(), progress=False)
    convs, banks = convs[:3], banks[:3]
    items = [(c.bank_id, q.question) for c in convs for q in
             [q for q in c.questions if q.category in (1, 2, 3, 4) and q.evidence][:20]]
    Z = get_encoder().encode([q for _, q in items], is_query=True)
    bank = {b.bank_id: b for b in banks}
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    for T in (400, 800, 1600):
        cfg, qp = SelectConfig(), QueryParams(token_budget=T, budget=None)
        ref = [select_reference(ctx[b], q, z, cfg, qp).units for (b, q), z in zip(items, Z)]
        eng = SelectionEngine(banks, cfg).select_units([b for b, _ in items], [q for _, q in items], Z, params=qp)
        assert eng == ref
        used = [assemble(bank[b], q, p).n_tokens for (b, q), p in zip(items, ref)]
        assert max(used) <= T and np.mean(used) > 0.9 * T  # the budget is used, not wasted
        for m in BASELINES:
            for fill in ("skip", "stop"):
                for (b, q), z in zip(items, Z):
                    p = baseline_units(m, ctx[b], q, z, cfg, replace(qp, fill=fill))
                    assert assemble(bank[b], q, p, "none").n_tokens <= T
