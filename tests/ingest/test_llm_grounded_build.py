"""A build stores an LLM output only when it passes its checks: heads and boundaries that a small
model writes badly fall back and are recorded in the bank (``trawmem info`` lists why), facts
that their cited turns do not support are dropped, a window too long for the model is halved,
every build prints its LLM work, and ``--strict-llm`` turns a fallback into an error."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data import sample_path
from trawmem_gpu.data.types import Turn
from trawmem_gpu.ingest.layers.trimem_extract import extract_facts
from trawmem_gpu.ingest.layers.trimem_profiles import build_profiles
from trawmem_gpu.store import Collection
from trimem_fake import respond


def _small_model(messages):
    """Boundaries copied from the prompt's example, a head copied from its template, a name."""
    first = messages[0]["content"]
    if '"boundaries"' in first:
        return json.dumps({"boundaries": [0, 1, 2, 3]})
    if '{"head"' in first:
        if "half marathon" in first:
            return json.dumps({"head": "Ana signed up for the spring half marathon</one sentence>"})
        if "Pixel" in first:
            return json.dumps({"head": "Ben"})
    return None


@pytest.fixture
def built(tmp_path, monkeypatch, server, capsys):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    server.responders.append(_small_model)
    out = tmp_path / "banks"
    assert main(["build", "--input", str(sample_path()), "--out", str(out), "--segmentation", "llm", "--heads", "llm",
                 "--llm", server.base_url, "--quiet"]) == 0
    return out, capsys.readouterr().out


def test_degenerate_boundaries_and_ungrounded_heads_fall_back_and_the_bank_says_why(built, capsys):
    out, printed = built
    bank = Collection(out).load("ana-ben")
    fb = bank.stats["llm_fallbacks"]
    assert fb["segment"] == {"refused: degenerate: 3 of its 4 threads are single turns": 3}
    assert sum(fb["head"].values()) == bank.head_kind.count("extractive") >= 2
    assert any("markup" in w for w in fb["head"]) and any("words" in w for w in fb["head"])
    assert not any("</" in h for h in bank.heads) and "Ben" not in bank.heads
    assert "LLM: 3 of 3 sessions fell back" in printed and "LLM work:" in printed and "refused" in printed
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "LLM fallbacks:" in info and "ana-ben: segment: 3 x refused: degenerate" in info
    assert main(["info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["llm_fallbacks"]["by_step"]["segment"] == 3


def test_strict_llm_makes_a_fallback_an_error(tmp_path, monkeypatch, server, capsys):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    server.responders.append(_small_model)
    out = tmp_path / "banks"
    assert main(["build", "--input", str(sample_path()), "--out", str(out), "--heads", "llm", "--llm",
                 server.base_url, "--quiet", "--strict-llm"]) == 2
    err = capsys.readouterr().err
    assert "--strict-llm:" in err and "would fall back" in err and "Traceback" not in err
    assert not (out / "banks").exists() or not Collection(out).bank_ids


def _turns(texts, session=1):
    from datetime import datetime

    day = datetime(2031, 5, 2 + session)
    return [Turn(f"D{session}:{i}", ("Ana", "Ben")[i % 2], t, session, f"{day:%d %B %Y}", day)
            for i, t in enumerate(texts)]


def test_facts_their_turns_do_not_support_are_refused(llm, server):
    def invent(messages):
        first = messages[0]["content"]
        if not first.startswith("You are a memory extraction agent"):
            return None
        ids = [ln[1:ln.index("]")] for ln in first.split("Turns:\n", 1)[1].splitlines() if ln.startswith("[")]
        return json.dumps({"facts": [{"text": "Ana adopted a beagle called Rex.", "source_turns": [ids[0]],
                                      "persons": ["Ana"], "date": None},
                                     {"text": "Ana likes green tea very much.", "source_turns": [ids[0]],
                                      "persons": ["Ana"], "date": None}]})

    server.responders.insert(0, invent)
    facts, st = extract_facts(_turns(["I like green tea a lot", "Me too"]), llm)
    assert [f.text for f in facts] == ["Ana likes green tea very much."]
    assert st.refused == 1 and "not supported by its cited turns" in next(iter(st.refusals))
    u = llm.usage.summary()["trimem-fact"]
    assert u["fallbacks"] == 1 and (u["checked"], u["refused"]) == (2, 1)  # facts, not replies: one reply held both
    t = llm.usage.totals()  # the extraction reply (1) and its facts (2) checked, one fact refused
    assert (t["checked"], t["refused_share"]) == (3, 0.3333)


def test_a_window_too_long_for_the_model_is_halved(llm, server):
    from trawmem_gpu.ingest.layers.prompts import EXTRACT
    from trawmem_gpu.ingest.layers.trimem_extract import render_window

    turns = _turns([f"Ana went hiking on trail number {i} near the lake" for i in range(16)])
    words = [len(EXTRACT.messages(window=render_window(turns[:n]))[0]["content"].split()) for n in (16, 10)]
    server.context_words = (words[0] + words[1]) // 2  # the 16-turn window overflows; halves (with overlap) fit
    facts, st = extract_facts(turns, llm, window=16, overlap=2)
    assert st.halved == 1 and st.failed == 0 and len(facts) == 16
    assert llm.context_tokens == server.context_words  # learned from the overflow


def test_profile_lines_with_markup_are_dropped(llm, server):
    def marked(messages):
        first = messages[0]["content"]
        if not first.startswith("You build the profile of "):
            return None
        fid = first.split("Facts:\n", 1)[1].split("]", 1)[0].lstrip("[")
        return json.dumps({"identity": [{"text": "<one sentence>", "fact_ids": [fid]},
                                        {"text": "A person who likes tea", "fact_ids": [fid]}]})

    server.responders.insert(0, marked)
    facts, _ = extract_facts(_turns(["Ana likes tea", "Ben likes chess", "Ana likes hiking", "Ben likes jazz"]), llm)
    secs, st = build_profiles(facts, llm)
    assert st.lines_refused >= 2 and all("<" not in ln.text for s in secs for ln in s.lines)
    assert {s.person for s in secs} == {"Ana", "Ben"}
