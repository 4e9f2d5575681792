"""TriMem (issue 21): extraction, profiles, planning and retrieval against the local
OpenAI-protocol server, which answers TriMem's prompts through ``trimem_fake.respond``."""
from __future__ import annotations

from datetime import datetime

import pytest

from trawmem_gpu.data.types import Turn
from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend
from trawmem_gpu.ingest.layers.trimem_extract import extract_facts, windows
from trawmem_gpu.ingest.layers.trimem_values import normalize_date
from trawmem_gpu.select.trimem.plan import plain_plan, plan_queries
from trawmem_gpu.ingest.layers.trimem_profiles import build_profiles
from trawmem_gpu.ingest.layers.prompts import EXTRACT, PromptSet, check_template, load_prompt_set, save_prompt_set
from trawmem_gpu.errors import InputError


def _turns(texts, session=1, start=0):
    day = datetime(2031, 5, 2 + session)
    return [Turn(f"D{session}:{start + i}", ("Ana", "Ben")[i % 2], t, session, f"{day:%d %B %Y}", day)
            for i, t in enumerate(texts)]


def test_windows_overlap_and_cover_new_turns_only():
    assert windows(100, 40, 10) == [(0, 40), (30, 70), (60, 100)]
    assert windows(35, 40, 10) == [(0, 35)]
    assert windows(100, 40, 10, start=90) == [(80, 100)]  # an update: context from 10 old turns
    assert windows(10, 40, 10, start=10) == []


def test_dates_are_normalized_resolved_or_refused():
    from datetime import date

    assert normalize_date("2031-05") == "2031-05"
    assert normalize_date("7 May 2031") == "2031-05-07"
    assert normalize_date("last Friday") is None and normalize_date(None) is None  # no session date
    wed = date(2031, 5, 7)  # a Wednesday
    got = {e: normalize_date(e, wed) for e in ("last Friday", "next Friday", "yesterday", "two weeks ago",
                                               "last month", "next year", "last week", "3 days ago", "soon")}
    assert got == {"last Friday": "2031-05-02", "next Friday": "2031-05-09", "yesterday": "2031-05-06",
                   "two weeks ago": "2031-04-23", "last month": "2031-04", "next year": "2032",
                   "last week": "2031-04-28", "3 days ago": "2031-05-04", "soon": None}
    assert normalize_date("last Wednesday", wed) == "2031-04-30"  # not the session's own day


def test_an_iso_date_that_names_no_day_is_unreadable():
    from datetime import date

    assert [normalize_date(s) for s in ("2031-02-30", "2031-13", "2031-00-10", "0000")] == [None] * 4
    assert normalize_date("2031-13", date(2031, 5, 7)) is None
    assert [normalize_date(s) for s in ("2031-02-28", "2031-12", "2031")] == ["2031-02-28", "2031-12", "2031"]


def test_extraction_counts_and_retries_malformed_unknown_and_empty_windows(llm, server):
    turns = _turns([f"plain turn {i}" for i in range(12)])
    turns[1] = Turn(turns[1].turn_id, "Ben", "MALFORMED_ONCE here", 1, turns[1].timestamp, turns[1].time)
    turns[6] = Turn(turns[6].turn_id, "Ana", "BOGUS_ID there", 1, turns[6].timestamp, turns[6].time)
    turns[10] = Turn(turns[10].turn_id, "Ana", "EMPTY_ONCE now", 1, turns[10].timestamp, turns[10].time)
    turns[11] = Turn(turns[11].turn_id, "Ben", "LAST_FRIDAY I ran", 1, turns[11].timestamp, turns[11].time)
    facts, st = extract_facts(turns, llm, window=4, overlap=1)
    assert st.windows == 4  # (0,4) (3,7) (6,10) (9,12)
    assert (st.malformed, st.unknown_ids, st.empty) == (1, 2, 1)  # turn 6 sits in two windows
    assert st.retried == 4 and st.failed == 0 and st.requests == 8
    ids = {t.turn_id for t in turns}
    assert all(set(f.source_turns) <= ids and f.source_turns for f in facts)
    assert "ZZ:99" not in {s for f in facts for s in f.source_turns}
    # one fact per turn: overlapping windows' duplicates merged, none lost
    assert len(facts) == 12 and st.duplicates == 3
    assert {f.source_turns[0] for f in facts} == ids
    assert len({f.fact_id for f in facts}) == 12 and all(f.fact_id.startswith("F:1:") for f in facts)
    assert all(f.date and f.date.startswith("2031-05-") for f in facts)
    assert facts[-1].date == "2031-05-02"  # "last Friday" from the session of Saturday 3 May 2031
    assert facts[0].persons == ("Ana",) and facts[0].text == "Ana said: plain turn 0"


def test_extraction_stays_malformed_without_inventing_facts(server):
    server.responders.append(lambda m: "never json")
    b = OpenAIHTTPBackend(server.base_url, model="test-model-a", max_retries=0)
    facts, st = extract_facts(_turns(["a", "b"]), b)
    b.close()
    assert facts == [] and (st.malformed, st.retried, st.failed) == (1, 1, 1)


def test_update_extracts_for_new_turns_only(llm, server):
    old_turns = _turns([f"old turn {i}" for i in range(6)])
    old, _ = extract_facts(old_turns, llm, window=4, overlap=1)
    turns = old_turns + _turns(["new one", "new two"], session=2)
    server.reset_counts()
    new, st = extract_facts(turns, llm, window=4, overlap=1, new_from=6, existing=old)
    assert st.windows == 1 and server.requests == 1  # one window: 1 old turn of context + 2 new
    assert [f.source_turns for f in new] == [("D2:0",), ("D2:1",)]
    assert [f.fact_id for f in new] == ["F:2:0", "F:2:1"]
    assert not {f.fact_id for f in new} & {f.fact_id for f in old}


def _facts(llm, texts):
    facts, _ = extract_facts(_turns(texts), llm)
    return facts


def test_profile_update_touches_one_section_only(llm, server):
    texts = ["Ana likes tea", "Ben likes chess", "Ana likes hiking", "Ben works at a port", "Ana said hello",
             "Ben said bye"]
    facts = _facts(llm, texts)
    secs, st = build_profiles(facts, llm)
    assert st.created == 2 and st.failed == 0
    by = {(s.person, s.section): s for s in secs}
    assert set(by) == {("Ana", "identity"), ("Ana", "interests"), ("Ben", "identity"), ("Ben", "interests"),
                       ("Ben", "career")}
    fids = {f.fact_id for f in facts}
    assert all(ln.fact_ids and set(ln.fact_ids) <= fids for s in secs for ln in s.lines)
    # Ben gets a new career fact; Ana gets nothing new
    turns2 = _turns(texts) + _turns(["", "Ben works nights now"], session=2)
    new, _ = extract_facts(turns2, llm, new_from=len(texts), existing=facts)
    new = [f for f in new if f.persons == ("Ben",)]
    server.reset_counts()
    secs2, st2 = build_profiles(facts + new, llm, existing=secs, new_fact_ids=[f.fact_id for f in new])
    assert server.requests == 1  # Ana is not asked
    assert (st2.updated, st2.unchanged, st2.sections_changed) == (1, 1, 1)
    by2 = {(s.person, s.section): s for s in secs2}
    assert set(by2) == set(by)
    changed = [k for k in by if by2[k] is not by[k]]
    assert changed == [("Ben", "career")]
    assert by2[("Ben", "career")].lines[0].fact_ids == tuple(f.fact_id for f in new)


def test_planning_and_its_fallback_to_the_plain_question(llm):
    plans = plan_queries(["When did Ana meet Ben at the harbour?", "What did Ana say PLAN_FAIL?"], llm)
    ok, failed = plans
    assert ok.planned and ok.queries[0] == "When did Ana meet Ben at the harbour?" and len(ok.queries) == 2
    assert ok.persons == ("Ana", "Ben")
    assert not failed.planned and failed.queries == ("What did Ana say PLAN_FAIL?",)
    assert set(failed.fallback) == {"key_info", "target_query"} and failed.persons == ()
    assert plan_queries(["Q?"], None) == [plain_plan("Q?")]


def test_planning_falls_back_when_the_server_is_down(server):
    server.fail_first = 100
    b = OpenAIHTTPBackend(server.base_url, model="test-model-a", max_retries=0)
    (p,) = plan_queries(["Where is Ana?"], b)
    b.close()
    assert p.queries == ("Where is Ana?",) and set(p.fallback) == {"key_info", "target_query"}


def test_prompt_sets_round_trip_and_refuse_lost_placeholders(tmp_path):
    ps = PromptSet().with_template("extract", EXTRACT.template + "\nBe exact.", "e1")
    save_prompt_set(ps, tmp_path / "p.json")
    back = load_prompt_set(tmp_path / "p.json")
    assert back.extract.template.endswith("Be exact.") and back.extract.version == "e1" and back.sha == ps.sha
    with pytest.raises(InputError, match=r"placeholders \['\$window'\]"):
        check_template(EXTRACT, "no window here")
    with pytest.raises(InputError, match="not a TriMem prompt set"):
        (tmp_path / "bad.json").write_text("{}")
        load_prompt_set(tmp_path / "bad.json")
