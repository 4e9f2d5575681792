"""Failed answers are counted, end with exit 1, and are retried on the next run."""
from __future__ import annotations

import json
from pathlib import Path

from trawmem_gpu.score import read_records

from history_files import _build, _history, _questions, _score, cache, TOPICS  # noqa: F401 - cache: an autouse fixture


def test_failed_answers_count_exit_1_and_are_retried(tmp_path, capsys, server):
    banks = tmp_path / "banks"
    assert _build(_history(tmp_path / "h.jsonl", banks=("b1", "b2", "b3")), banks) == 0
    qs = _questions(tmp_path / "q.jsonl", [{"id": f"q{i}", "bank_id": f"b{1 + i % 3}",
                                            "question": f"What about {TOPICS[i]}?"} for i in range(6)])
    out = tmp_path / "o.jsonl"
    server.fail_first, server.fail_status = 2, 400  # two requests fail, not retried by the client
    assert _score(banks, qs, out, "--answer-llm", server.base_url) == 1
    recs = read_records(out)
    assert len(recs) == 6 and sum(r["answer"] is None for r in recs) == 2
    assert json.loads(Path(str(out) + ".summary.json").read_text())["answer_errors"] == 2
    assert "2 LLM requests failed" in capsys.readouterr().err
    sent = server.requests
    assert _score(banks, qs, out, "--answer-llm", server.base_url) == 0  # the rerun retries exactly those two
    assert server.requests == sent + 2
    recs = read_records(out)
    assert len(recs) == 6 and all(r["answer"] is not None for r in recs)
    assert len({r["id"] for r in recs}) == 6
    server.fail_first = 1
    assert _score(banks, qs, tmp_path / "p.jsonl", "--answer-llm", server.base_url, "--allow-failures", "1") == 0
