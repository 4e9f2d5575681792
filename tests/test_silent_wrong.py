"""The silent-wrong audit of issue 26: each class of defect run end to end on tiny made-up data,
checking the *result* (dates read, records written, banks kept, answers retried), not only the
exit status. Before the fixes every one of these ended with exit 0 and a wrong or stale answer,
or lost data.

Histories are small synthetic JSONL / LoCoMo-layout / LongMemEval-format files written into
``tmp_path`` (dates in 2031); the embedding and LLM caches are redirected there.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data import detect_format, load_conversations
from trawmem_gpu.errors import BankError, InputError
from trawmem_gpu.score import ResumableJsonl, read_records
from trawmem_gpu.store import Collection

sys.path.insert(0, str(Path(__file__).parent))
from lme_synthetic import instances, write  # noqa: E402
from locomo_files import write_data  # noqa: E402

TOPICS = ["the garden shed", "a trip to the coast", "learning the cello", "a new bicycle", "the bakery downtown",
          "a chess club", "painting the kitchen", "a hiking boot"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _history(path: Path, banks=("b1", "b2"), n: int = 8, date="2031/03/02 10:{m:02d}", extra: str = "") -> Path:
    """A JSONL history, year-first dates (``2031/03/02`` is 2 March in every reading)."""
    recs = [{"bank_id": b, "turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben",
             "text": f"{b} message {i}: we talked about {TOPICS[i % len(TOPICS)]}{extra}",
             "timestamp": date.format(m=i)} for b in banks for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _questions(path: Path, qs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(q) + "\n" for q in qs))
    return path


def _build(hist: Path, out: Path, *extra) -> int:
    return main(["build", "--input", str(hist), "--out", str(out), "--quiet", *extra])


def _score(banks: Path, qs: Path, out: Path, *extra) -> int:
    return main(["score", "--banks", str(banks), "--questions", str(qs), "--out", str(out), "--quiet", *extra])


QS = [{"id": "q1", "bank_id": "b1", "question": "What about the garden shed?"},
      {"id": "q2", "bank_id": "b2", "question": "Tell me about the new bicycle"}]


# 1. --dayfirst never reorders a year-first date --------------------------------------------------
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


# 2. score --questions honours --dayfirst -------------------------------------------------------
def test_questions_dates_honour_dayfirst(tmp_path):
    banks = tmp_path / "banks"
    assert _build(_history(tmp_path / "h.jsonl"), banks) == 0
    qs = _questions(tmp_path / "q.jsonl", [{**QS[0], "date": "01.02.2031"}])
    assert _score(banks, qs, tmp_path / "d.jsonl", "--dayfirst") == 0
    assert _score(banks, qs, tmp_path / "m.jsonl") == 0
    assert read_records(tmp_path / "d.jsonl")[0]["date"] == "2031-02-01T00:00:00"  # was 2 January
    assert read_records(tmp_path / "m.jsonl")[0]["date"] == "2031-01-02T00:00:00"


# 3. resume checks content, not ids -------------------------------------------------------------
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


# 4. stale banks are refused by score and sweep, as by eval --------------------------------------
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


# 5. failed answers are counted, exit 1, and retried ---------------------------------------------
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


# 6. the output lock is the real file's ---------------------------------------------------------
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


# 7. a lost index is refused, never overwritten; repair-index rebuilds it ------------------------
def test_lost_index_is_refused_and_repaired(tmp_path, capsys):
    banks = tmp_path / "banks"
    assert _build(_history(tmp_path / "h.jsonl", banks=("b1", "b2", "b3")), banks) == 0
    (banks / "collection.json").unlink()
    capsys.readouterr()
    assert _build(_history(tmp_path / "h4.jsonl", banks=("b4",)), banks) == 2
    err = capsys.readouterr().err
    assert "collection.json is missing" in err and f"trawmem repair-index {banks}" in err
    assert not (banks / "collection.json").exists() and not (banks / "banks" / "b4").exists()
    assert main(["eval", "--data", str(write_data(tmp_path / "t.json")), "--banks", str(banks),
                 "--output", str(tmp_path / "r.json")]) == 2
    assert "repair-index" in capsys.readouterr().err
    assert main(["repair-index", str(banks)]) == 0
    assert "3 banks" in capsys.readouterr().out
    assert sorted(Collection(banks).bank_ids) == ["b1", "b2", "b3"]
    assert _build(_history(tmp_path / "h4.jsonl", banks=("b4",)), banks) == 0
    coll = Collection(banks)
    assert sorted(coll.bank_ids) == ["b1", "b2", "b3", "b4"] and all(coll.load(b).n_units == 8 for b in coll.bank_ids)


# 8. one id rule for every ingest path ---------------------------------------------------------
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


# 9. one format sniffer ------------------------------------------------------------------------
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


# 10. train-affinity refuses degenerate fits; --affinity-weights refuses their files ------------
def test_degenerate_affinity_weights_refused(tmp_path, capsys):
    from trawmem_gpu.head.relevance import fit_relevance, load_weights, save_weights
    from trawmem_gpu.select.config import RELEVANCE_FEATURES

    for c in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit) as e:
            main(["train-affinity", "--data", "D", "--out", str(tmp_path / "w.json"), "--C", c])
        assert e.value.code == 2 and "argument --C" in capsys.readouterr().err
    assert not (tmp_path / "w.json").exists()
    with pytest.raises(ValueError, match="C must be"):
        fit_relevance([object()], C=0.0)
    n = len(RELEVANCE_FEATURES)
    with pytest.raises(InputError, match="carries no signal"):
        load_weights(save_weights(tmp_path / "z.json", [0.0] * n + [-1.5], {"C": 1.0}))
    with pytest.raises(InputError, match="C = -1"):
        load_weights(save_weights(tmp_path / "n.json", [9e15] * n + [1.0], {"C": -1.0}))
    assert load_weights(save_weights(tmp_path / "ok.json", [0.5] * n + [-1.0], {"C": 1.0}))[0] == 0.5


# 11. numeric options have ranges ----------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["query", "--bank", "B", "--question", "q", "--hops", "1000000000"],
    ["score", "--data", "D", "--out", "o", "--hops", "9"],
    ["eval", "--data", "D", "--output", "o", "--hops", "1000000000"],
    ["sweep", "--data", "D", "--hops", "1,1000000000"],
    ["serve", "--max-hops", "99"],
    ["query", "--bank", "B", "--question", "q", "--budget", "100000000"],
    ["score", "--data", "D", "--out", "o", "--token-budget", "10000000000"],
    ["serve", "--port", "70000"],
    ["serve", "--max-wait-ms", "nan"],
    ["train-head", "--data", "D", "--out", "o", "--lr", "-1"],
    ["train-head", "--data", "D", "--out", "o", "--epochs", "0"],
])
def test_numeric_ranges_at_parse_time(argv, capsys, monkeypatch):
    import trawmem_gpu.encode as enc

    monkeypatch.setattr(enc, "get_encoder", lambda *a, **k: pytest.fail("loaded a model before checking flags"))
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {argv[-2]}" in err and "must be" in err, err
