"""What memory costs in LLM work, as every front reports it: ``Memory.add`` to a bank built with
LLM heads, ``Memory.select`` with a planner, and the server, whose ``/metrics`` counts the work of
its ``--llm`` on appends."""
from __future__ import annotations

import json

import httpx
import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data import sample_path
from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend


def _new_turns():
    return [{"turn_id": "N:1", "speaker": "Ana", "text": "I booked the train to Lisbon for the October marathon.",
             "timestamp": "2024-05-02T10:00:00", "session": 4},
            {"turn_id": "N:2", "speaker": "Ben", "text": "Great, I will come and cheer for you at the finish line.",
             "timestamp": "2024-05-02T10:01:00", "session": 4}]


@pytest.fixture
def llm_bank(tmp_path, monkeypatch, server):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = tmp_path / "coll"
    assert main(["build", "--input", str(sample_path()), "--out", str(coll), "--heads", "llm", "--llm",
                 server.base_url, "--quiet"]) == 0
    return coll


def test_add_and_select_report_their_llm_work(llm_bank, server):
    from trawmem_gpu import Memory

    be = OpenAIHTTPBackend(server.base_url, model="test-model-a", progress=False)
    server.responders.append(lambda m: json.dumps({"queries": [m[0]["content"].split("Question: ", 1)[1]
                                                               .split("\n", 1)[0], "Ana's marathon training plan"]})
                             if m[0]["content"].startswith("Plan searches") else None)
    mem = Memory(llm_bank, llm=be, plan_llm=be)
    res = mem.add("ana-ben", _new_turns())
    t = res["llm"]["totals"]
    assert res["appended"] == 2 and t["calls"] >= 1 and t["replies"] >= 1 and "head" in res["llm"]["stages"]
    ws = mem.select("ana-ben", "How did Ana train for the marathon?")
    assert ws.llm["totals"]["calls"] == 1 and "trimem-target-query" in ws.llm["stages"]
    assert ws.searches[1] == "Ana's marathon training plan" and ws.to_dict()["llm"] == ws.llm
    assert Memory(llm_bank).select("ana-ben", "How did Ana train?").llm is None


def test_the_server_counts_the_llm_work_of_its_appends_in_metrics(llm_bank, server):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from serve_util import running

    from trawmem_gpu.serve.config import ServeConfig

    cfg = ServeConfig(collection=str(llm_bank), port=0, llm=server.base_url + "@test-model-a", warmup=False)
    with running(cfg) as (url, _, _):
        r = httpx.post(f"{url}/v1/banks/ana-ben/turns", json={"turns": _new_turns()}, timeout=120)
        assert r.status_code == 200, r.text
        text = httpx.get(url + "/metrics").text
    calls = [ln for ln in text.splitlines() if ln.startswith('trawmem_llm_calls_total{stage="head"}')]
    assert calls and float(calls[0].split()[-1]) >= 1
    assert 'trawmem_llm_fallbacks_total{stage="head"}' in text and "trawmem_llm_seconds_total" in text
