"""``score`` checks content, not ids: a resume compares the question, the bank and the config; stale
banks are refused by ``score`` and ``sweep``; the output lock is the real file's."""
from __future__ import annotations

import json

from trawmem_gpu.cli import main
from trawmem_gpu.score import read_records, ResumableJsonl

from locomo_files import write_data
from history_files import _build, _history, _questions, _score, cache, QS  # noqa: F401 - cache: an autouse fixture


def test_resume_compares_question_bank_and_config(tmp_path, capsys):
    B3 = ("--budget", "3")  # fewer than the bank's 8 units: the workspace depends on the question
    hist = _history(tmp_path / "h.jsonl")
    banks = tmp_path / "banks"
    assert _build(hist, banks) == 0
    out = tmp_path / "o.jsonl"
    assert _score(banks, _questions(tmp_path / "q.jsonl", QS), out, *B3) == 0
    first = {r["id"]: r for r in read_records(out)}
    capsys.readouterr()
    # the question's text changed: refused, naming the id and the difference
    edited = _questions(tmp_path / "q2.jsonl", [{**QS[0], "question": "What about the chess club?"}, QS[1]])
    assert _score(banks, edited, out, *B3) == 2
    err = capsys.readouterr().err
    assert "'q1'" in err and "question" in err and "--rescore-changed" in err
    assert {r["id"]: r for r in read_records(out)} == first  # nothing written
    assert _score(banks, edited, out, *B3, "--rescore-changed") == 0
    now = {r["id"]: r for r in read_records(out)}
    assert len(read_records(out)) == 2 and now["q2"] == first["q2"]
    assert now["q1"]["question"] == "What about the chess club?" and now["q1"]["workspace"] != first["q1"]["workspace"]
    capsys.readouterr()
    # the bank changed (rebuilt from other turns): refused, then rescored from the new bank
    assert _build(_history(tmp_path / "h2.jsonl", banks=("b1",), n=6, extra=" again"), banks) == 0
    capsys.readouterr()
    assert _score(banks, edited, out, *B3) == 2
    err = capsys.readouterr().err
    assert "'q1'" in err and "bank 'b1' changed" in err
    assert _score(banks, edited, out, *B3, "--rescore-changed") == 0
    assert "again" in {r["id"]: r for r in read_records(out)}["q1"]["workspace"]
    # the method config changed under the same sidecar: refused too (the record's own config)
    assert _score(banks, edited, out, "--budget", "4") == 2
    assert "another configuration" in capsys.readouterr().err


def test_stale_banks_refused_by_score_and_sweep(tmp_path, capsys):
    data = write_data(tmp_path / "tiny.json")
    banks = tmp_path / "banks"
    assert _build(data, banks) == 0
    samples = json.loads(data.read_text())
    samples[0]["conversation"]["session_1"][0]["text"] = "An edited first message about ferries"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(samples))
    capsys.readouterr()
    out = tmp_path / "o.jsonl"
    assert main(["score", "--data", str(edited), "--banks", str(banks), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "built from other turns" in err and "first differing turn 'D1:1'" in err
    assert not out.exists() or not read_records(out)
    assert main(["sweep", "--data", str(edited), "--banks", str(banks), "--output", str(tmp_path / "s.json"),
                 "--quiet"]) == 2
    assert "built from other turns" in capsys.readouterr().err and not (tmp_path / "s.json").exists()
    # the data the banks were built from is scored, with its own text in the workspaces
    assert main(["score", "--data", str(data), "--banks", str(banks), "--out", str(out), "--quiet"]) == 0
    assert read_records(out) and "ferries" not in "".join(r["workspace"] for r in read_records(out))


def test_output_lock_follows_symlinks(tmp_path, capsys):
    banks = tmp_path / "banks"
    assert _build(_history(tmp_path / "h.jsonl"), banks) == 0
    real = tmp_path / "real.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    qs = _questions(tmp_path / "q.jsonl", QS)
    with ResumableJsonl(real, meta={"other": "job"}):
        assert _score(banks, qs, link) == 2
        assert "another process is writing" in capsys.readouterr().err
    assert real.read_bytes() == b""
    assert _score(banks, qs, link) == 0 and len(read_records(real)) == 2
