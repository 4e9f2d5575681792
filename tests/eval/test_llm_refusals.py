"""Answers, judgements and plans from a model that echoes and copies formats: an answer that
repeats the question or copies the workspace's format is refused and never judged, a plan with no
search beyond the question (or searches that are no questions) falls back and is counted, and the
LLM work of every run is reported."""
from __future__ import annotations

import json

from trawmem_gpu.eval.answer import answer_and_judge
from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend
from trawmem_gpu.select.trimem.plan import follow_up_queries, plan_queries

CTX = "## 29 January 2023\n[D1:4] Gina: I opened my online clothing store.\n[D1:5] Jon: Congrats!"


def _echo(messages):
    first = messages[0]["content"]
    if first.startswith("You are answering"):
        q = first.split("Question: ", 1)[1].split("\n", 1)[0]
        if "store" in q:
            return q  # the question repeated
        if "Jon" in q:
            return "## 29 January 2023 [D1:4] Gina: I opened my online clothing store."
        return "29 January 2023"
    if first.startswith("You grade"):
        return json.dumps({"label": "CORRECT"})  # a judge that calls everything correct
    return None


def test_echoed_and_copied_answers_are_refused_and_never_judged(server):
    server.responders.append(_echo)
    be = OpenAIHTTPBackend(server.base_url, model="m", progress=False)
    items = [{"qid": f"q{i}", "question": q, "category": 4, "gold": "29 January 2023", "context": CTX}
             for i, q in enumerate(["When did Gina open her online clothing store?", "What did Jon say?",
                                    "When did it happen?"])]
    run = answer_and_judge(items, be, be)
    recs = {r["qid"]: r for r in run.records}
    assert recs["q0"]["answer_refused"] == "echoes the question" and recs["q0"]["prediction"] == ""
    assert "turn ids" in recs["q1"]["answer_refused"] or "heading" in recs["q1"]["answer_refused"]
    assert recs["q0"]["judge"] == 0 and recs["q0"]["judge_label"] is None and "not judged" in recs["q0"]["judge_error"]
    assert recs["q2"]["judge"] == 1 and recs["q2"]["answer_refused"] is None
    judged = [b for b in server.bodies if "You grade" in b["messages"][0]["content"]]
    assert len(judged) == 1  # only the answer that was not refused
    assert run.counts["answer_refused"] == 2 and run.counts["judge_skipped"] == 2
    assert run.usage["answer"]["refused"] == 2 and run.usage["answer"]["fallbacks"] == 2
    assert be.usage.summary()["answer"]["fallbacks"] == 2
    # refusals are a share of the outputs checked (3 answers and the 1 judge reply), never above 1:
    # counted against the structured replies alone, two refused answers read 2.0
    t = be.usage.totals()
    assert (t["checked"], t["refused"], t["refused_share"]) == (4, 2, 0.5)


def test_plans_without_searches_or_with_dates_for_searches_fall_back_and_are_counted(server):
    def planner(messages):
        first = messages[0]["content"]
        q = first.split("Question: ", 1)[1].split("\n", 1)[0] if "Question: " in first else ""
        if first.startswith("Plan searches"):
            return json.dumps({"queries": [q, "2 March 2024"]} if "Ana" in q else
                              {"queries": [q, "Ben's job at the port"]})
        if first.startswith("A memory of past conversations"):
            return json.dumps({"queries": [], "query1": "2 March 2024"} if "Ana" in q else {"queries": []})
        return None

    server.responders.append(planner)
    be = OpenAIHTTPBackend(server.base_url, model="m", progress=False)
    qs = ["When did Ana run?", "Where does Ben work?"]
    plans = plan_queries(qs, be, key_info=False)
    assert plans[0].fallback == ("target_query",) and "degenerate" in plans[0].fallback_why[0]
    assert plans[0].queries == (qs[0],)  # the question alone
    assert plans[1].planned and plans[1].queries == (qs[1], "Ben's job at the port")
    fus = follow_up_queries(qs, ["ws", "ws"], [p.queries for p in plans], be)
    assert fus == [None, ()]  # the copied format falls back; an honest "nothing missing" does not
    u = be.usage.summary()
    assert u["trimem-target-query"]["fallbacks"] == 1 and u["trawmem-follow-up"]["refused"] == 1
