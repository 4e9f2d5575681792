"""``python -m benchmarks run agent-loop`` on a tiny slice of the bundled sample: the real
LangChain agent loop with a fake chat model, its JSON's fields, no workspace without memory, and
the two memory arms within the token budget."""
import json

import pytest

pytest.importorskip("langchain")

from benchmarks import bench_agent_loop  # noqa: E402


def test_a_tiny_run_writes_the_fields_and_keeps_each_arm_to_its_budget(tmp_path):
    budget = 60
    assert bench_agent_loop.main(["--budgets", str(budget), "--questions", "2", "--n-boot", "50",
                                  "--out-dir", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "agent_loop.json").read_text())
    assert (tmp_path / "agent_loop.png").stat().st_size > 0
    assert rec["questions"] == 2 and rec["arms"] == ["trawmem", "none", "hybrid"] and "machine" in rec
    (entry,) = rec["budgets"]
    assert entry["budget"] == budget
    calls = entry["per_call"]
    assert {c["arm"] for c in calls} == {"trawmem", "none", "hybrid"}
    for arm in ("trawmem", "none", "hybrid"):
        mine = [c for c in calls if c["arm"] == arm]
        assert len(mine) == 2 == entry["arms"][arm]["calls"]  # one model call per question, no tools
        for field in ("workspace_tokens_median", "workspace_tokens_mean", "evidence_recall_mean",
                      "added_ms_p50", "added_ms_p99"):
            assert field in entry["arms"][arm]
    none = [c for c in calls if c["arm"] == "none"]
    assert all(c["workspace_tokens"] == 0 and c["evidence_recall"] == 0 for c in none)
    for arm in ("trawmem", "hybrid"):
        mine = [c for c in calls if c["arm"] == arm]
        assert all(0 < c["workspace_tokens"] <= budget for c in mine), arm
    p = entry["paired"]
    assert p["questions"] == 2 and len(p["ci95"]) == 2 and p["ci95"][0] <= p["trawmem_minus_hybrid"] <= p["ci95"][1]


def test_recall_counts_only_gold_lines_that_reached_the_model():
    from trawmem_gpu.integrations.langchain import WORKSPACE_HEADER

    system = f"You help.\n\n{WORKSPACE_HEADER}\n[S1:6] (2 March 2024) Ben: my sister Clara\n[S1:10] Ana: hi\n"
    block = bench_agent_loop.block_of(system)
    assert block.startswith("[S1:6]") and "You help" not in block
    assert bench_agent_loop.recall_in(block, ("S1:6", "S1:1")) == 0.5  # [S1:1] is not [S1:10]
    assert bench_agent_loop.block_of("You help.") == ""
