"""``trawmem score``: the exactly-once JSONL writer, the job over a collection (batched engine by
default, reference and baselines), resume after a kill, questions JSONL errors, answers through
the LLM layer, and the CLI on a LongMemEval-format file. Tiny hand-made banks (MiniLM)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lme_synthetic import instances, write
from trawmem_gpu.cli import main
from trawmem_gpu.errors import InputError
from trawmem_gpu.score import ResumableJsonl, ScoreItem, ScoreSpec, read_questions, read_records, run_score
from trawmem_gpu.score.job import plan_batches
from trawmem_gpu.score.writer import summarize_output

ROOT = Path(__file__).resolve().parents[2]
N_Q = 8


@pytest.fixture(scope="module")
def lme(tmp_path_factory):
    """A LongMemEval-format file and its collection, built through the job's own path."""
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.data.longmemeval import load_longmemeval
    from trawmem_gpu.ingest.cache import build_identity, ensure_collection
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.score.items import items_from_conversations

    d = tmp_path_factory.mktemp("lme")
    path = write(d / "lme.json", instances(N_Q, seed=5))
    convs = load_longmemeval(path)
    ident = build_identity(file_sha256(path), BuildConfig(), "user")
    st = ensure_collection(convs, d / "banks", ident, BuildConfig(), progress=False, chunk_units=40)
    assert st["banks_built"] == N_Q and st["units_per_s"] > 0
    # a second call builds nothing; another config on the same directory is refused
    assert ensure_collection(convs, d / "banks", ident, BuildConfig(), progress=False)["banks_reused"] == N_Q
    from trawmem_gpu.errors import BankError

    with pytest.raises(BankError, match="another config"):
        ensure_collection(convs, d / "banks", ident | {"units": "all"}, BuildConfig(), progress=False)
    return {"path": path, "banks": d / "banks", "items": items_from_conversations(convs), "dir": d}


def test_the_bank_cache_builds_through_a_given_builder(lme, tmp_path):
    """``build_chunks`` (how ``score --ray`` builds on Ray actors) gets every missing chunk and its
    banks land in the collection like a local build's."""
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.ingest.cache import build_identity, ensure_collection
    from trawmem_gpu.data.longmemeval import load_longmemeval
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.store import Collection

    convs = load_longmemeval(lme["path"])
    seen = []

    def build(chunks, cfg):
        for ch in chunks:
            seen.append(len(ch))
            yield build_banks(ch, cfg, progress=False)

    build.runner = "test"
    ident = build_identity(file_sha256(lme["path"]), BuildConfig(), "user")
    st = ensure_collection(convs, tmp_path / "b", ident, BuildConfig(), progress=False, chunk_units=40,
                           build_chunks=build)
    assert sum(seen) == len(convs) and len(seen) > 1 and st["runner"] == "test"
    local = Collection(lme["banks"])
    for c in convs:
        assert Collection(tmp_path / "b").load(c.bank_id).heads == local.load(c.bank_id).heads


# ---------------------------------------------------------------------------------------------
# writer
# ---------------------------------------------------------------------------------------------
def test_writer_drops_a_torn_line_and_resumes(tmp_path):
    p = tmp_path / "o.jsonl"
    with ResumableJsonl(p, meta={"a": 1}) as w:
        w.write_many([{"id": "x", "v": 1}, {"id": "y", "v": 2}])
        assert "x" in w and len(w) == 2
        with pytest.raises(ValueError, match="already written"):
            w.write_many([{"id": "x"}])
    with open(p, "ab") as f:  # what a power cut mid-write can leave
        f.write(b'{"id": "z", "v"')
    with ResumableJsonl(p, meta={"a": 1}) as w:
        assert w.torn_bytes == len(b'{"id": "z", "v"') and w.ids == {"x", "y"}
        w.write_many([{"id": "z", "v": 3}])
    assert [r["id"] for r in read_records(p)] == ["x", "y", "z"]
    assert p.read_bytes().endswith(b"\n")


def test_writer_refuses_corruption_duplicates_other_jobs_and_a_second_writer(tmp_path):
    p = tmp_path / "o.jsonl"
    p.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(InputError, match=r"o.jsonl:2: corrupt record"):
        ResumableJsonl(p)
    p.write_text('{"id": "a"}\n{"id": "a"}\n')
    with pytest.raises(InputError, match="duplicate id 'a'"):
        ResumableJsonl(p)
    p.write_text("")
    with ResumableJsonl(p, meta={"budget": 16}) as w:
        w.write_many([{"id": "a"}])
    with pytest.raises(InputError, match="another configuration.*budget"):
        ResumableJsonl(p, meta={"budget": 8})
    with ResumableJsonl(p, meta={"budget": 8}, overwrite=True) as w:
        assert len(w) == 0
        with pytest.raises(InputError, match="another process is writing"):
            ResumableJsonl(p, meta={"budget": 8})


# ---------------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------------
def _ids_units(path):
    return {r["id"]: r["units"] for r in read_records(path)}


def test_batched_default_matches_reference_and_records_are_complete(lme, tmp_path):
    items = lme["items"]
    s1 = run_score(items, lme["banks"], ScoreSpec(), tmp_path / "b.jsonl", progress=False, batch_size=3)
    s2 = run_score(items, lme["banks"], ScoreSpec(engine="reference"), tmp_path / "r.jsonl", progress=False)
    assert s1["scored_now"] == s2["scored_now"] == N_Q and s1["questions_per_s"] > 0
    assert _ids_units(tmp_path / "b.jsonl") == _ids_units(tmp_path / "r.jsonl")
    rec = read_records(tmp_path / "b.jsonl")[0]
    assert rec["config"]["method"] == "trawmem" and rec["config"]["engine"] == "batched"
    assert rec["config"]["budget"] == 16 and rec["tokens"] > 0 and rec["tokenizer"].endswith("cl100k_base")
    assert all(u in rec["workspace"] for u in rec["units"]) and rec["date"].startswith("2023-")
    assert rec["eval"]["official"]["turn"]["recall_any@10"] in (0.0, 1.0)
    m = summarize_output(tmp_path / "b.jsonl")
    assert m["skipped_abstention"] == sum(1 for it in items if "_abs" in it.id)
    assert m["n_scored"] == N_Q - m["skipped_abstention"]
    # the planted gold turns are easy: TrawMem finds them
    assert m["macro"]["evidence_recall"] >= 0.75
    meta = json.loads((tmp_path / "b.jsonl.meta.json").read_text())
    assert meta["spec"]["select"]["budget"] == 16


@pytest.mark.parametrize("method", ["cosine", "bm25", "hybrid", "full"])
def test_baselines_rank_order_and_budget(lme, tmp_path, method):
    spec = ScoreSpec(method=method, select={**ScoreSpec().select, "budget": 4})
    run_score(lme["items"], lme["banks"], spec, tmp_path / "o.jsonl", progress=False)
    recs = read_records(tmp_path / "o.jsonl")
    assert len(recs) == N_Q
    for r in recs:
        assert (len(r["units"]) == 4) if method != "full" else len(r["units"]) > 4
        assert r["config"]["engine"] is None and "##" not in r["workspace"]  # baselines: no heads


@pytest.mark.parametrize("method", ["trawmem", "hybrid", "full"])
def test_token_budget_through_the_job(lme, tmp_path, method):
    """``--token-budget`` travels in the spec's selection config: every workspace holds at most T
    tokens (the record's own count), TrawMem batched = reference, and the records say T."""
    spec = ScoreSpec(method=method, select={**ScoreSpec().select, "token_budget": 80, "budget": None})
    run_score(lme["items"], lme["banks"], spec, tmp_path / "b.jsonl", progress=False)
    recs = read_records(tmp_path / "b.jsonl")
    assert len(recs) == N_Q and all(0 < r["tokens"] <= 80 and r["units"] for r in recs)
    assert all(r["config"]["token_budget"] == 80 and r["config"]["budget"] is None for r in recs)
    if method == "trawmem":
        ref = ScoreSpec(method=method, select=spec.select, engine="reference")
        run_score(lme["items"], lme["banks"], ref, tmp_path / "r.jsonl", progress=False)
        assert _ids_units(tmp_path / "b.jsonl") == _ids_units(tmp_path / "r.jsonl")


def test_resume_skips_written_ids(lme, tmp_path):
    out = tmp_path / "o.jsonl"
    items = lme["items"]
    run_score(items[:3], lme["banks"], ScoreSpec(), out, progress=False)
    before = out.read_bytes()
    s = run_score(items, lme["banks"], ScoreSpec(), out, progress=False)
    assert s["skipped_already_written"] == 3 and s["scored_now"] == N_Q - 3
    assert out.read_bytes().startswith(before)
    ids = [r["id"] for r in read_records(out)]
    assert sorted(ids) == sorted(it.id for it in items)
    with pytest.raises(InputError, match="another configuration"):
        run_score(items, lme["banks"], ScoreSpec(method="cosine"), out, progress=False)


def test_plan_batches_never_split_a_bank():
    items = [ScoreItem(f"q{i}", f"b{i % 3}", "q") for i in range(10)]
    batches = plan_batches(items, 4)
    seen = set()
    for b in batches:
        banks = {it.bank_id for it in b}
        assert not banks & seen
        seen |= banks
    assert sum(len(b) for b in batches) == 10


def test_questions_jsonl_and_its_errors(lme, tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": 1, "bank_id": "q000", "question": "What did I spend?", "date": "2031/05/13 (Tue) 04:17"}\n\n'
                 '{"id": "2", "bank_id": "q001", "question": "Where did I go?"}\n')
    items = read_questions(q)
    assert [it.id for it in items] == ["1", "2"] and items[0].date == "2031-05-13T04:17:00" and items[1].date is None
    out = tmp_path / "o.jsonl"
    run_score(items, lme["banks"], ScoreSpec(), out, progress=False)
    assert {r["id"] for r in read_records(out)} == {"1", "2"} and "eval" not in read_records(out)[0]
    for text, msg in [('{"id": 1, "bank_id": "a"}', "missing field 'question'"),
                      ('{"id": 1, "bank_id": "a", "question": " "}', "'question' is empty"),
                      ('{"id": 1, "bank_id": "a", "question": "' + "x" * 5000 + '"}', "limit is 4000"),
                      ('{"id": 1, "bank_id": "a", "question": "q", "date": "soon"}', "field 'date'"),
                      ('{"id": 1, "bank_id": "a", "question": "q"}\n{"id": 1, "bank_id": "a", "question": "q"}',
                       "duplicate id"),
                      ("[1]", "JSON object"), ("{bad", "bad JSON")]:
        q.write_text(text + "\n")
        with pytest.raises(InputError, match=msg):
            read_questions(q)
    q.write_text('{"id": 1, "bank_id": "nope", "question": "q"}\n')
    with pytest.raises(InputError, match="does not hold: 'nope'"):
        run_score(read_questions(q), lme["banks"], ScoreSpec(), tmp_path / "x.jsonl", progress=False)


def test_killed_run_leaves_whole_lines_and_rerun_completes(lme, tmp_path):
    """SIGKILL a `trawmem score` process mid-run: only whole lines are left, and a rerun writes
    every missing id exactly once."""
    q = tmp_path / "q.jsonl"
    bank_ids = [it.bank_id for it in lme["items"]]
    n = 160
    with open(q, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"k{i}", "bank_id": bank_ids[i % len(bank_ids)],
                                "question": f"How much did I spend on item {i}?"}) + "\n")
    out = tmp_path / "o.jsonl"
    argv = [sys.executable, "-c", "import sys; from trawmem_gpu.cli import main; sys.exit(main(sys.argv[1:]))",
            "score", "--banks", str(lme["banks"]), "--questions", str(q), "--out", str(out), "--method", "cosine",
            "--batch-size", "4", "--quiet"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    killed_at = None
    for _ in range(3):  # the kill must land mid-run; a slow or fast machine may need another try
        out.unlink(missing_ok=True)
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            if out.exists() and out.stat().st_size > 0:
                p.send_signal(signal.SIGKILL)
                break
            time.sleep(0.005)
        p.wait(timeout=60)
        k = len(read_records(out)) if out.exists() else 0
        if p.returncode == -signal.SIGKILL and 0 < k < n:
            killed_at = k
            break
    assert killed_at is not None, "could not kill the job mid-run"
    data = out.read_bytes()
    whole = data[:data.rfind(b"\n") + 1]  # a kill during a write of several pages may tear its batch
    assert len(read_records(out)) == whole.count(b"\n") == killed_at  # readers see the whole lines only
    rc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0, rc.stderr[-2000:]
    ids = [r["id"] for r in read_records(out)]
    assert len(ids) == len(set(ids)) == n
    after = out.read_bytes()
    assert after.startswith(whole) and after.endswith(b"\n")  # the torn tail cut, the whole lines kept


def test_answers_through_the_llm_layer(lme, tmp_path, server, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    items = lme["items"][:3]
    spec = ScoreSpec(answer_llm=server.base_url)
    run_score(items, lme["banks"], spec, tmp_path / "o.jsonl", progress=False)
    recs = read_records(tmp_path / "o.jsonl")
    assert server.requests == 3 and all("answer" in r and r["answer"] is not None for r in recs)
    # the question date reaches the answer model
    assert any("asked on 2023-" in json.dumps(b) for b in server.bodies)


def test_cli_score_benchmark_file(lme, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    rc = main(["score", "--data", str(lme["path"]), "--banks", str(lme["banks"]), "--out", str(out),
               "--k", "1,5", "--budget", "8", "--quiet"])
    assert rc == 0
    summ = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert summ["build"]["banks_reused"] == N_Q and summ["scored_now"] == N_Q
    assert set(summ["metrics"]["official"]["turn"]) == {f"{m}@{k}" for m in ("recall_any", "recall_all", "ndcg_any")
                                                        for k in (1, 5)}
    text = capsys.readouterr().out
    assert "questions/s" in text and "official turn" in text
    assert main(["score", "--questions", str(out), "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--questions needs --banks" in capsys.readouterr().err
    for bad in (["--k", "0"], ["--k", "a,b"], ["--budget", "0"], ["--ray-workers", "0"]):
        with pytest.raises(SystemExit) as e:
            main(["score", "--data", str(lme["path"]), "--out", str(out), *bad])
        assert e.value.code == 2 and bad[0] in capsys.readouterr().err


def test_max_questions_is_a_stratified_reproducible_sample_that_builds_only_its_banks(lme, tmp_path, capsys):
    from collections import Counter

    banks, out = tmp_path / "banks", tmp_path / "o.jsonl"
    argv = ["score", "--data", str(lme["path"]), "--banks", str(banks), "--out", str(out), "--method", "cosine"]
    assert main(argv + ["--max-questions", "3"]) == 0
    err = capsys.readouterr().err
    assert "--max-questions 3: 3 of 8 questions, stratified by type, seed 0" in err
    assert "0 banks reused, 3 to build" in err
    first = [r["id"] for r in read_records(out)]
    assert len(first) == 3 and len(json.loads((banks / "collection.json").read_text())["banks"]) == 3
    types = Counter(it.qtype for it in lme["items"] if it.id in first)
    assert max(types.values()) == 1  # 3 of 8 questions over several types: one of each type taken
    # a larger sample extends the smaller one: the rerun reuses its banks and its answers
    assert main(argv + ["--max-questions", "5"]) == 0
    err = capsys.readouterr().err
    assert "3 banks reused, 2 to build" in err and f"{out}: 3 answers already in, 2 to score" in err
    ids = [r["id"] for r in read_records(out)]
    assert ids[:3] == first and len(ids) == len(set(ids)) == 5
    # the same N and seed give the same sample; another seed another one
    from trawmem_gpu.score.items import stratified_sample

    assert stratified_sample(lme["items"], 5, 0) == stratified_sample(lme["items"], 5, 0)
    assert [it.id for it in stratified_sample(lme["items"], 5, 0)] != \
        [it.id for it in stratified_sample(lme["items"], 5, 1)] or len(lme["items"]) <= 5
    assert main(argv + ["--max-questions", "8"]) == 0
    assert "5 banks reused, 3 to build" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(argv + ["--max-questions", "0"])
    assert e.value.code == 2 and "--max-questions" in capsys.readouterr().err


def test_stratified_sample_keeps_proportions_within_one():
    from collections import Counter

    from trawmem_gpu.score.items import stratified_sample

    items = [ScoreItem(f"q{i}", f"b{i}", "?", qtype=t) for i, t in enumerate("a" * 50 + "b" * 30 + "c" * 15 + "d" * 5)]
    prev: set = set()
    for n in (1, 4, 10, 37, 99, 100, 150):
        got = stratified_sample(items, n, seed=3)
        assert len(got) == min(n, 100) and [it.id for it in got] == [it.id for it in items if it in got]  # input order
        c = Counter(it.qtype for it in got)
        for t, total in (("a", 50), ("b", 30), ("c", 15), ("d", 5)):
            assert abs(c[t] - total * len(got) / 100) <= 1
        assert prev <= {it.id for it in got}  # nested
        prev = {it.id for it in got}


def test_bank_build_reports_progress_per_encoder_batch(lme):
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.data.longmemeval import load_longmemeval
    from trawmem_gpu.encode import get_encoder

    convs = load_longmemeval(lme["path"])[:3]
    ticks: list[int] = []
    enc = get_encoder("minilm", cache=False)  # these texts are in the cache: every batch is encoded here
    banks, _ = build_banks(convs, BuildConfig(encode_batch_size=4), enc, progress=False, on_units=ticks.append)
    n = sum(b.n_units for b in banks)
    assert sum(ticks) == n and len(ticks) == -(-n // 4)  # moves per batch of 4, not once per chunk
