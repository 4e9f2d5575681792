"""A small model's facts can all be refused (SmolLM2-135M copies the prompt's template:
``{"text": "<one sentence>", "source_turns": ["<turn id>"]}``). The bank still records that its
facts layer comes from the LLM and why nothing was kept, so ``trawmem info`` shows it, an
``--update`` goes on extracting facts from the new turns, and ``--method trimem`` says why it
has nothing to rank."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data import sample_path
from trawmem_gpu.store import Collection

TEMPLATE_COPY = json.dumps({"facts": [{"text": "<one sentence>", "source_turns": ["<turn id>"], "persons": [],
                                       "date": None}]})


def _template_copier(messages):
    first = messages[0]["content"]
    if first.startswith("You are a memory extraction agent"):
        return TEMPLATE_COPY
    return None


@pytest.fixture
def built(tmp_path, monkeypatch, server, capsys):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    server.responders.append(_template_copier)
    out = tmp_path / "banks"
    assert main(["build", "--input", str(sample_path()), "--out", str(out), "--facts", "llm", "--profiles", "llm",
                 "--llm", server.base_url, "--quiet"]) == 0
    capsys.readouterr()
    return out


def _extractions(server) -> int:
    return sum(b["messages"][0]["content"].startswith("You are a memory extraction agent") for b in server.bodies)


def test_a_facts_layer_with_every_fact_refused_is_recorded(built, capsys):
    bank = Collection(built).load("ana-ben")
    assert not bank.facts and bank.layer_sources.get("facts") == "llm"
    assert sum(bank.stats["llm_fallbacks"]["facts"].values()) >= 1
    assert main(["info", str(built)]) == 0
    assert "ana-ben: facts:" in capsys.readouterr().out


def test_an_update_goes_on_extracting_facts(built, server, tmp_path):
    new = tmp_path / "s4.jsonl"
    new.write_text(json.dumps({"bank_id": "ana-ben", "turn_id": "S4:1", "speaker": "Ana", "text":
                               "I booked the train to Lisbon for the October marathon.",
                               "timestamp": "2024-05-02T09:00:00"}) + "\n", encoding="utf-8")
    before = _extractions(server)
    assert main(["build", "--input", str(new), "--out", str(built), "--update", "--llm", server.base_url,
                 "--quiet"]) == 0
    assert _extractions(server) > before
    bank = Collection(built).load("ana-ben")
    assert bank.layer_sources.get("facts") == "llm" and sum(bank.stats["llm_fallbacks"]["facts"].values()) >= 2


def test_trimem_on_a_bank_whose_facts_were_all_refused_says_why(built, capsys):
    assert main(["query", "--bank", str(built), "--question", "Which race did Ana sign up for?", "--method",
                 "trimem", "--json"]) == 2
    err = capsys.readouterr().err
    assert "no facts" in err and "refused" in err and "Traceback" not in err
