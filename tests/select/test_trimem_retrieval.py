"""TriMem's layers on a real bank and ``--method trimem`` (issue 21.2-21.3), against the local
protocol server answering through ``trimem_fake.respond``."""
from __future__ import annotations

import re

import numpy as np
import pytest

from trawmem_gpu.ingest import build_banks
from trawmem_gpu.data import load_conversations, sample_path
from trawmem_gpu.encode import get_encoder
from trawmem_gpu.select.params import QueryParams
from trawmem_gpu.ingest.layers.profiles import attach_profiles
from trawmem_gpu.ingest.layers.trimem_extract import extract_facts
from trawmem_gpu.select.trimem.method import TriMemRankers, trimem_select
from trawmem_gpu.select.trimem.plan import QueryPlan, plain_plan
from trawmem_gpu.select.workspace import assemble


@pytest.fixture(scope="module")
def enc():
    return get_encoder()


@pytest.fixture(scope="module")
def sample_bank(enc):
    banks, _ = build_banks(load_conversations(sample_path())[:1], encoder=enc, progress=False)
    return banks[0]


def with_facts(bank, llm, enc, new_from=0):
    """``bank`` with TriMem's facts of its turns from ``new_from`` on, encoded (as the build does)."""
    from dataclasses import replace

    from trawmem_gpu.ingest.layers.facts import with_facts as append_facts

    new, st = extract_facts(bank.turns, llm, new_from=new_from, existing=bank.facts)
    out = append_facts(bank, new, enc, "llm")
    return replace(out, stats={**out.stats, "facts_llm": st.to_dict()})


@pytest.fixture
def layered(sample_bank, llm, enc):
    bank, _ = attach_profiles(with_facts(sample_bank, llm, enc), llm, enc)
    return bank


def test_layers_attach_with_vectors_and_counts(layered, sample_bank):
    assert len(layered.facts) == sample_bank.n_units  # the fake states one fact per turn
    assert layered.fact_vecs.shape == (len(layered.facts), sample_bank.unit_vecs.shape[1])
    assert np.allclose(np.linalg.norm(layered.fact_vecs, axis=1), 1.0, atol=1e-4)
    assert {p.person for p in layered.profiles} == {"Ana", "Ben"}
    assert layered.stats["facts_llm"]["windows"] >= 1 and layered.stats["profiles_llm"]["created"] == 2


def _select(layered, enc, questions, params=None, llm=None):
    rankers = TriMemRankers({layered.bank_id: layered})
    Z = enc.encode(questions, is_query=True)
    picks = trimem_select(rankers, [(layered.bank_id, q) for q in questions], Z, params,
                          encode=lambda xs: enc.encode(xs, is_query=True), llm=llm)
    return rankers, picks


def test_workspace_shows_facts_their_turns_and_profiles_with_ids(layered, enc):
    q = "Where did Clara move for her job?"
    _, (pick,) = _select(layered, enc, [q], QueryParams(budget=4096))
    ws = assemble(pick.view, q, pick.units, "none")
    ids = ws.unit_ids
    facts = [i for i in ids if i.startswith("F:")]
    turns = {t.turn_id for t in layered.turns}
    assert len(facts) == 25  # K
    by_id = {f.fact_id: f for f in layered.facts}
    # every shown fact's source turns are shown too, and the profile of a person involved
    assert all(set(by_id[f].source_turns) <= set(ids) for f in facts)
    assert any(i in turns for i in ids) and any(i.startswith("P:") for i in ids)
    text = ws.render()
    assert re.search(r"^\[F:\d+:\d+ from S\d+:\d+", text, re.M) and "[P:" in text
    assert "S1:8" in ids  # Clara's move is found by the plain question
    _, (capped,) = _select(layered, enc, [q], QueryParams(budget=5))
    assert capped.units == pick.units[:5]  # B caps the units, in priority order


def test_token_budget_is_kept(layered, enc):
    q = "Where did Clara move for her job?"
    for T in (60, 200, 500):
        _, (pick,) = _select(layered, enc, [q], QueryParams(budget=None, token_budget=T))
        ws = assemble(pick.view, q, pick.units, "none")
        assert 0 < ws.n_tokens <= T
    _, (small,) = _select(layered, enc, [q], QueryParams(budget=None, token_budget=60))
    _, (big,) = _select(layered, enc, [q], QueryParams(budget=None, token_budget=500))
    assert len(small.units) < len(big.units)


def test_planned_searches_are_used_and_failure_falls_back(layered, enc, llm, server):
    qs = ["What did Ana say about the half marathon?", "What did Ana say PLAN_FAIL?"]
    _, (ok, failed) = _select(layered, enc, qs, llm=llm)
    assert ok.plan.planned and len(ok.plan.queries) == 2 and ok.plan.persons == ("Ana",)
    assert failed.plan.queries == (qs[1],) and not failed.plan.planned
    # the failed plan retrieves exactly what no LLM retrieves
    _, (plain,) = _select(layered, enc, [qs[1]])
    assert plain.plan == plain_plan(qs[1]) and failed.units == plain.units


def test_symbolic_person_match_lifts_a_persons_facts(layered, enc):
    rankers = TriMemRankers({layered.bank_id: layered})
    r = rankers[layered.bank_id]
    q = "what happened"
    z = enc.encode([q], is_query=True)
    base = r.units(plain_plan(q), z)
    ben = r.units(QueryPlan(question=q, queries=(q,), persons=("Ben",)), z)
    top = lambda units: [r.view.turns[u].turn_id for u in units if r.view.turns[u].turn_id.startswith("F:")][:10]
    by_id = {f.fact_id: f for f in layered.facts}
    share = lambda ids: sum("Ben" in by_id[i].persons for i in ids)
    assert share(top(ben)) > share(top(base))


def test_update_extracts_new_turns_and_touches_only_their_profiles(layered, llm, enc, server):
    from dataclasses import replace

    from trawmem_gpu.ingest import update_bank
    from trawmem_gpu.data.types import Turn

    last = layered.turns[-1]
    new = [Turn("S9:1", "Ben", "Ben works at the harbour office now.", last.session + 1, "2031-06-01T10:00:00",
                last.time.replace(year=2031, month=6, day=1) if last.time else None)]
    grown, _ = update_bank(layered, new, encoder=enc)
    grown = replace(grown, facts=layered.facts, fact_vecs=layered.fact_vecs, profiles=layered.profiles,
                    profile_vecs=layered.profile_vecs)  # (the facts task's update_bank carries the layers)
    server.reset_counts()
    grown = with_facts(grown, llm, enc, new_from=layered.n_units)
    upd, st = attach_profiles(grown, llm, enc, new_fact_ids=[f.fact_id for f in grown.facts[len(layered.facts):]])
    added = [f for f in upd.facts if f.fact_id not in {g.fact_id for g in layered.facts}]
    assert [f.source_turns for f in added] == [("S9:1",)]
    assert server.requests == 2  # one extraction window, one profile update (Ben); Ana is not asked
    before = {p.unit_id: p for p in layered.profiles}
    changed = [p.unit_id for p in upd.profiles if before.get(p.unit_id) is not p]
    assert changed == ["P:Ben:career"]
    i_old = [p.unit_id for p in layered.profiles].index("P:Ana:identity")
    i_new = [p.unit_id for p in upd.profiles].index("P:Ana:identity")
    assert np.array_equal(upd.profile_vecs[i_new], layered.profile_vecs[i_old])


def test_serving_engine_adapter(layered, enc, sample_bank):
    from trawmem_gpu.select.trimem.method import TriMemEngine

    eng = TriMemEngine([layered])
    q = "Where did Clara move for her job?"
    z = enc.encode([q], is_query=True)
    (units,) = eng.select_units([layered.bank_id], [q], z, params=[QueryParams(budget=None, token_budget=300)])
    _, (pick,) = _select(layered, enc, [q], QueryParams(budget=None, token_budget=300))
    assert units == pick.units and eng.view(layered.bank_id).n_units > layered.n_units
    with pytest.raises(KeyError):
        eng.select_units(["nope"], [q], z)
    smaller = replace_facts(layered, layered.facts[:5])
    eng.replace_bank(smaller, eng.prepare_bank(smaller))
    (units,) = eng.select_units([layered.bank_id], [q], z, params=[QueryParams(budget=4096)])
    shown = [eng.view(layered.bank_id).turns[u].turn_id for u in units]
    assert {i for i in shown if i.startswith("F:")} <= {f.fact_id for f in layered.facts[:5]}


def replace_facts(bank, facts):
    from dataclasses import replace

    return replace(bank, facts=tuple(facts), fact_vecs=bank.fact_vecs[:len(facts)], profiles=(), profile_vecs=None)
