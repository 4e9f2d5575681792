"""``trawmem score`` questions with a ``where`` filter: each question selects among the turns that
pass it (every method), the record says which filter; a bad filter names the line and the path."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.cli import main


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("method", ["trawmem", "hybrid"])
def test_questions_with_a_filter(tmp_path, monkeypatch, capsys, method):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    rows = [{"bank_id": "b", "turn_id": f"t{i}", "speaker": "Ana", "text": f"I went to the pottery class, day {i}.",
             "timestamp": f"2024-03-{i + 1:02d}", "metadata": {"user_id": f"u{i % 2}"}} for i in range(8)]
    assert main(["build", "--quiet", "--input", str(_jsonl(tmp_path / "t.jsonl", rows)), "--out", str(tmp_path / "c")]) == 0
    qs = _jsonl(tmp_path / "q.jsonl", [{"id": "q1", "bank_id": "b", "question": "Where did I go?",
                                        "where": {"user_id": "u1"}},
                                       {"id": "q2", "bank_id": "b", "question": "Where did I go?"}])
    out = tmp_path / f"{method}.jsonl"
    assert main(["score", "--questions", str(qs), "--banks", str(tmp_path / "c"), "--method", method, "--out",
                 str(out), "--quiet", "--budget", "4"]) == 0
    recs = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert recs["q1"]["units"] and set(recs["q1"]["units"]) <= {"t1", "t3", "t5", "t7"}
    assert recs["q1"]["where"] == {"user_id": {"eq": "u1"}} and "where" not in recs["q2"]
    bad = _jsonl(tmp_path / "bad.jsonl", [{"id": "q1", "bank_id": "b", "question": "q", "where": {"x": {"gt": "a"}}}])
    big = _jsonl(tmp_path / "big.jsonl", [{"id": "q1", "bank_id": "b", "question": "q", "where": {"x": 1}},
                                          {"id": "q2", "bank_id": "b", "question": "q", "where": {"and": [{}] * 10**6}}])
    for path, why in ((bad, ":1: where.x.gt: expected a number or an ISO 8601 date"),
                      (big, ":2: where: the filter is over 65536 bytes")):  # the size bound (issue 42)
        capsys.readouterr()
        assert main(["score", "--questions", str(path), "--banks", str(tmp_path / "c"), "--out",
                     str(tmp_path / "o.jsonl"), "--quiet"]) == 2
        assert f"{path}{why}" in capsys.readouterr().err
