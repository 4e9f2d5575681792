"""Segmentation and heads, facts and profiles (with ``build --update``) against the real model
(tests marked ``real_llm``: opt-in, tests/support/real_llm_fixture.py). A 135M model writes poor
JSON and ungrounded text: what matters here is that nothing it writes is stored unchecked, that
every fallback is recorded with its reason, and that the work finishes and is accounted for."""
from __future__ import annotations

import pytest

from real_llm_data import jsonl
from real_llm_fixture import full
from trawmem_gpu.cli import main
from trawmem_gpu.ingest.layers.trimem_extract import cited_texts
from trawmem_gpu.llm.grounding import fact_problem, head_problem
from trawmem_gpu.llm.prompts import HEAD
from trawmem_gpu.store import Collection

pytestmark = pytest.mark.real_llm


def test_segmentation_and_heads_store_only_grounded_output(real_llm_url, real_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRAWMEM_CACHE", str(real_cache))
    out = tmp_path / "banks"
    assert main(["build", "--input", str(jsonl(tmp_path / "h.jsonl")), "--out", str(out), "--segmentation", "llm",
                 "--heads", "llm", "--llm", real_llm_url, "--quiet"]) == 0
    printed = capsys.readouterr().out
    bank = Collection(out).load("ana-ben")
    for k, (head, kind) in enumerate(zip(bank.heads, bank.head_kind)):
        if kind == "llm":  # a head the model wrote passed its checks (the lexical ones, again here)
            texts = [t.embed_text() for t in bank.turns[bank.thread_offsets[k]:bank.thread_offsets[k + 1]]]
            assert head_problem(head, texts, HEAD.template) is None, head
    fb = bank.stats.get("llm_fallbacks", {})
    assert sum(fb.get("head", {}).values()) == bank.head_kind.count("extractive")
    assert sum(fb.get("segment", {}).values()) == bank.stats["llm_segment_fallbacks"]
    assert "LLM work:" in printed and "0 sent" not in printed


@pytest.mark.slow
def test_facts_and_profiles_finish_grounded_and_update(real_llm_url, real_cache, tmp_path, monkeypatch, capsys):
    if not full():
        pytest.skip("a long-reply path: set TRAWMEM_REAL_LLM=full")
    monkeypatch.setenv("TRAWMEM_CACHE", str(real_cache))
    out = tmp_path / "banks"
    first = jsonl(tmp_path / "a.jsonl", sessions=1)
    assert main(["build", "--input", str(first), "--out", str(out), "--facts", "llm", "--profiles", "llm", "--llm",
                 real_llm_url, "--quiet"]) == 0
    both = jsonl(tmp_path / "b.jsonl", sessions=2)
    assert main(["build", "--input", str(both), "--out", str(out), "--update", "--llm", real_llm_url,
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    bank = Collection(out).load("ana-ben")
    by_id = {t.turn_id: t for t in bank.turns}
    for f in bank.facts:  # every stored fact cites turns of the bank that support it
        assert f.source_turns and set(f.source_turns) <= set(by_id)
        assert fact_problem(f.text, cited_texts([by_id[t] for t in f.source_turns])) is None, f.text
    facts_of = {}
    for f in bank.facts:
        for p in f.persons:
            facts_of.setdefault(p.casefold(), set()).add(f.fact_id)
    for s in bank.profiles:  # every profile line cites facts of its person
        assert all(ln.fact_ids and set(ln.fact_ids) <= facts_of.get(s.person.casefold(), set()) for ln in s.lines)
    assert "LLM work:" in printed and "updated ana-ben" in printed
