"""Dates and formats end to end, checking what is read: ``--dayfirst`` never reorders a year-first
date (also in ``score --questions``), LongMemEval ids follow the id rule, and one format sniffer."""
from __future__ import annotations

import json
from datetime import datetime

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data import detect_format, load_conversations
from trawmem_gpu.errors import InputError
from trawmem_gpu.score import read_records
from trawmem_gpu.store import Collection

from lme_synthetic import instances, write
from locomo_files import write_data
from history_files import _build, _history, _questions, _score, cache, QS  # noqa: F401 - cache: an autouse fixture


def test_dayfirst_keeps_year_first_dates(tmp_path, capsys):
    banks = tmp_path / "banks"
    assert _build(_history(tmp_path / "h.jsonl"), banks, "--dayfirst") == 0
    b = Collection(banks).load("b1")
    assert {t.time.date() for t in b.turns} == {datetime(2031, 3, 2).date()}  # was 3 February
    qs = _questions(tmp_path / "q.jsonl", [{**QS[0], "date": "2031/05/10"}])
    assert _score(banks, qs, tmp_path / "o.jsonl", "--dayfirst") == 0
    rec = read_records(tmp_path / "o.jsonl")[0]
    assert rec["date"] == "2031-05-10T00:00:00"  # was 5 October
    assert "March 2031" in rec["workspace"] and "February" not in rec["workspace"]
    # LongMemEval's dates carry a weekday: --dayfirst used to refuse them as "wrong weekday"
    lme = write(tmp_path / "lme.json", instances(2, seed=1))
    plain = load_conversations(lme)
    swapped = load_conversations(lme, dayfirst=True)
    assert [t.time for c in swapped for t in c.turns] == [t.time for c in plain for t in c.turns]
    assert [c.questions[0].date for c in swapped] == [c.questions[0].date for c in plain]


def test_questions_dates_honour_dayfirst(tmp_path):
    banks = tmp_path / "banks"
    assert _build(_history(tmp_path / "h.jsonl"), banks) == 0
    qs = _questions(tmp_path / "q.jsonl", [{**QS[0], "date": "01.02.2031"}])
    assert _score(banks, qs, tmp_path / "d.jsonl", "--dayfirst") == 0
    assert _score(banks, qs, tmp_path / "m.jsonl") == 0
    assert read_records(tmp_path / "d.jsonl")[0]["date"] == "2031-02-01T00:00:00"  # was 2 January
    assert read_records(tmp_path / "m.jsonl")[0]["date"] == "2031-01-02T00:00:00"


def test_longmemeval_ids_follow_the_id_rule(tmp_path, capsys):
    data = instances(2, seed=2)
    data[1]["question_id"] = "a\nb"
    p = write(tmp_path / "lme.json", data)
    with pytest.raises(InputError, match="question_id.*control character"):
        load_conversations(p)
    assert main(["score", "--data", str(p), "--out", str(tmp_path / "o.jsonl"), "--quiet"]) == 2
    assert "control character" in capsys.readouterr().err
    qs = _questions(tmp_path / "q.jsonl", [{"id": "x\ty", "bank_id": "b1", "question": "hi"}])
    from trawmem_gpu.score import read_questions

    with pytest.raises(InputError, match="'id' holds the control character"):
        read_questions(qs)


def test_one_format_sniffer(tmp_path, capsys):
    samples = json.loads(write_data(tmp_path / "t.json").read_text())
    for s in samples:  # qa first, carrying question_id
        s["qa"] = [{**q, "question_id": f"{s['sample_id']}-{i}"} for i, q in enumerate(s["qa"])]
    loc = tmp_path / "qa_first.json"
    loc.write_text(json.dumps([{"qa": s["qa"], "sample_id": s["sample_id"], "conversation": s["conversation"]}
                               for s in samples]))
    assert detect_format(loc) == "locomo"
    convs = load_conversations(loc)
    assert [len(c.questions) for c in convs] == [len(s["qa"]) for s in samples] and all(c.turns for c in convs)
    # LongMemEval text that merely mentions a LongMemEval key inside a string stays LoCoMo
    samples[0]["conversation"]["session_1"][0]["text"] = 'see "haystack_sessions": [] in the file'
    loc.write_text(json.dumps(samples))
    assert detect_format(loc) == "locomo"
    lme = write(tmp_path / "lme.json", instances(3, seed=4))
    assert detect_format(lme) == "longmemeval"
    for argv in (["sweep", "--data", str(lme), "--output", str(tmp_path / "s.json"), "--quiet"],
                 ["eval", "--data", str(lme), "--output", str(tmp_path / "e.json")]):
        assert main(argv) == 2
        assert "is a LongMemEval file" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()
