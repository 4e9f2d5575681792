"""Every value an LLM returns is checked as user input is: a fact's date within a sane range (an
absurd one falls back to the session date and is counted, never an error), persons and the other
names as strings, and the planner's searches within a question's bounds."""
from __future__ import annotations

import json
from datetime import date

import numpy as np
import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data.types import MAX_QUESTION_CHARS
from trawmem_gpu.errors import ConfigError
from trawmem_gpu.llm import FakeBackend
from trawmem_gpu.store import Collection
from trawmem_gpu.ingest.layers.trimem_extract import extract_facts
from trawmem_gpu.ingest.layers.trimem_values import DATE_YEARS, normalize_date
from trawmem_gpu.select.trimem.plan import QueryPlan, check_plans, parse_key_info, parse_queries, plan_queries
from trimem_fake import respond, write_locomo

S1 = [("Ana", "I adopted a beagle called Rex."), ("Ben", "Ben likes pottery a lot.")]
LONG = "kayak " * (50_000 // 6)


@pytest.mark.parametrize("value", ["1000000 days ago", "10000000000 years later", "99999999999999999999",
                                   "Jan 99999999999", "0001-01-01", "3000 years ago", "9999-12-31", "9" * 500])
def test_an_absurd_date_is_unreadable_not_an_error(value):
    assert normalize_date(value, date(2031, 5, 2)) is None


def test_sane_dates_still_read():
    a = date(2031, 5, 2)
    assert normalize_date("yesterday", a) == "2031-05-01" and normalize_date("2031-05", a) == "2031-05"
    assert normalize_date("two weeks ago", a) == "2031-04-18"
    assert normalize_date(f"{DATE_YEARS[0]}", a) == str(DATE_YEARS[0])


def _hostile_extraction(messages):
    """Extraction replies citing each turn, dated a million days back, with numbers as persons."""
    first = next(m["content"] for m in messages if m["role"] == "user")
    if not first.startswith("You are a memory extraction agent"):
        return None
    block = first.split("Turns:\n", 1)[1].split("\n\nReply", 1)[0]
    lines = [(ln[1:ln.index("]")], ln.split(": ", 1)[1]) for ln in block.splitlines() if ln.startswith("[")]
    return json.dumps({"facts": [{"text": text, "source_turns": [i], "date": "1000000 days ago",
                                  "persons": [5, 1e308], "locations": [{"x": 1}, "Lisbon"],
                                  "keywords": ["k" * 5000, "pottery"]} for i, text in lines]})


def test_build_facts_llm_survives_absurd_values_and_a_rerun_too(tmp_path, monkeypatch, server, capsys):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    server.responders += [_hostile_extraction, respond]
    data = write_locomo(tmp_path / "d.json", [S1], [])
    for out in ("coll", "coll-again"):  # the second build is answered from the cache
        assert main(["build", "--input", str(data), "--out", str(tmp_path / out), "--facts", "llm",
                     "--llm", server.base_url, "--quiet"]) == 0, capsys.readouterr().err
        out_text = capsys.readouterr().out
        assert "bad dates 2" in out_text and "bad values 8" in out_text
        bank = Collection(tmp_path / out).load("conv-x")
        assert [f.date for f in bank.facts] == ["2031-05-02", "2031-05-02"]  # the session's date
        assert [f.persons for f in bank.facts] == [("Ana",), ("Ben",)]  # the speakers, not "5", "1e+308"
        assert all(f.locations == ("Lisbon",) and f.keywords == ("pottery",) for f in bank.facts)
    assert server.requests == 1  # the rerun sent nothing


def test_extraction_refuses_non_string_persons():
    from trawmem_gpu.data.types import Turn

    turns = [Turn("D1:1", "Ana", "I adopted a beagle.", 1, "2031-05-02", None)]
    reply = json.dumps({"facts": [{"text": "Ana adopted a beagle.", "source_turns": ["D1:1"],
                                   "persons": [5, 1e308, True, None, "Ana"], "date": "2031-05-01"}]})
    facts, st = extract_facts(turns, FakeBackend(lambda conv: reply))
    assert facts[0].persons == ("Ana",) and st.bad_values == 4 and facts[0].date == "2031-05-01"


def test_planner_searches_longer_than_a_question_are_left_out():
    q = "Where did Ana travel?"
    assert parse_queries(json.dumps({"queries": [LONG, "Ana travel", 7]}), q) == (q, "Ana travel")
    over = "x" * (MAX_QUESTION_CHARS + 1)
    info = parse_key_info(json.dumps({"persons": [5, 1e308, "Ana"], "keywords": [over, "travel"],
                                      "time_expression": over, "location": [over]}))
    assert info["persons"] == ("Ana",) and info["keywords"] == ("travel",) and info["time"] is None
    assert info["location"] is None
    plans = plan_queries([q], FakeBackend(lambda conv: json.dumps({"queries": [LONG]})), key_info=False)
    assert plans[0].queries == (q,) and max(len(s) for s in plans[0].queries) <= MAX_QUESTION_CHARS


def test_given_plans_with_an_overlong_search_are_refused():
    from trawmem_gpu.select.trimem.method import trimem_select

    q = "Where did Ana travel?"
    bad = QueryPlan(question=q, queries=(q, LONG))
    with pytest.raises(ConfigError, match=r"`plans`\[0\]: search 1 is 49998 characters; .* at most 4000"):
        check_plans([bad], [q])
    with pytest.raises(ConfigError, match=r"search 1 is blank"):
        check_plans([QueryPlan(question=q, queries=(q, "  "))], [q])
    with pytest.raises(ConfigError, match="search 1"):
        trimem_select(None, [("b", q)], np.zeros((1, 4), np.float32), encode=lambda xs: None, plans=[bad])
    assert check_plans([QueryPlan(question=q, queries=(q, "Ana travel"))], [q])[0].queries[1] == "Ana travel"
