"""Planning (``--method trawmem --plan-llm`` with ``--follow-up``, ``--method trimem``,
``Memory(plan_llm=...)``), answers and the judge in ``eval``, and one ``evolve-prompts`` step,
against the real model (tests marked ``real_llm``: opt-in, tests/support/real_llm_fixture.py).
The checks: each path finishes, falls back visibly where the model's output is refused, and
never counts a judge's verdict on a refused answer."""
from __future__ import annotations

import json

import pytest

from real_llm_data import QUESTIONS, jsonl, locomo
from real_llm_fixture import full
from trawmem_gpu.cli import main
from trawmem_gpu.llm.grounding import search_problem

pytestmark = pytest.mark.real_llm


@pytest.fixture
def facts_bank(real_llm_url, real_cache, tmp_path, monkeypatch):
    """The small LoCoMo-layout conversation built with its observations as facts (no LLM)."""
    monkeypatch.setenv("TRAWMEM_CACHE", str(real_cache))
    data = locomo(tmp_path / "l.json")
    out = tmp_path / "banks"
    assert main(["build", "--input", str(data), "--out", str(out), "--facts", "locomo", "--quiet"]) == 0
    return data, out


def _query(capsys, *args) -> dict:
    assert main(["query", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_planning_of_trawmem_and_trimem(real_llm_url, facts_bank, capsys):
    _, banks = facts_bank
    q = QUESTIONS[0][0]
    got = _query(capsys, "--bank", str(banks), "--question", q, "--method", "trawmem", "--plan-llm", real_llm_url,
                 "--follow-up")
    plan = got["plan"]
    assert plan["queries"][0] == q and all(search_problem(s) is None for s in plan["queries"][1:])
    assert plan["planned"] == (not plan["fallback"]) and len(plan["fallback"]) == len(plan["fallback_why"])
    assert got["llm"]["totals"]["calls"] >= 2 and got["units"]
    got = _query(capsys, "--bank", str(banks), "--question", q, "--method", "trimem", "--plan-llm", real_llm_url)
    assert got["plan"]["queries"][0] == q and got["llm"]["totals"]["calls"] >= 2


def test_memory_with_a_real_planner(real_llm, facts_bank):
    from trawmem_gpu import Memory

    _, banks = facts_bank
    ws = Memory(banks, plan_llm=real_llm).select("ana-ben", QUESTIONS[1][0])
    assert ws.units and ws.llm["totals"]["calls"] >= 1
    assert all(search_problem(s) is None for s in ws.searches[1:])


def test_answers_and_judge_in_eval(real_llm_url, facts_bank, tmp_path, capsys):
    data, _ = facts_bank
    out = tmp_path / "e.json"
    assert main(["eval", "--data", str(data), "--method", "trawmem", "--token-budget", "800", "--answer-llm",
                 real_llm_url, "--judge-llm", real_llm_url, "--output", str(out), "--allow-failures", "4"]) == 0
    res = json.loads(out.read_text())
    recs = res["records"]
    assert len(recs) == len(QUESTIONS) and "LLM work:" in capsys.readouterr().out
    for r in recs:
        if r["answer_refused"]:  # a refused answer is scored wrong and its judge never asked
            assert r["prediction"] == "" and r["judge"] == 0 and "not judged" in r["judge_error"]
    assert res["llm"]["counts"]["answer_refused"] == sum(bool(r["answer_refused"]) for r in recs)
    assert res["llm_work"]["totals"]["calls"] >= len(recs)


@pytest.mark.slow
def test_one_step_of_prompt_evolution(real_llm_url, real_cache, tmp_path, monkeypatch, capsys):
    if not full():
        pytest.skip("a long-reply path: set TRAWMEM_REAL_LLM=full")
    monkeypatch.setenv("TRAWMEM_CACHE", str(real_cache))
    data = locomo(tmp_path / "l.json")
    out = tmp_path / "evolve"
    assert main(["evolve-prompts", "--data", str(data), "--llm", real_llm_url, "--steps", "1", "--out",
                 str(out)]) == 0
    state = json.loads((out / "state.json").read_text())
    assert state["done"] and state["versions"] and (out / "best_prompts.json").exists()
