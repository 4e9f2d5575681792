"""LongMemEval: ingestion (official turn ids, gold, units, dates, errors, auto-detection) and the
official retrieval metrics (turn and turn-to-session) against a plain spec of their definitions."""
from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from lme_synthetic import instances, write
from trawmem_gpu.data import load_conversations
from trawmem_gpu.data.longmemeval import QUESTION_TYPES, load_longmemeval, session_of
from trawmem_gpu.errors import InputError
from trawmem_gpu.eval.longmemeval import aggregate_lme, official_metrics, question_record, session_metrics, turn_metrics

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# ingestion
# ---------------------------------------------------------------------------------------------
def test_official_turn_ids_gold_and_units(tmp_path):
    data = instances(3, seed=1)
    p = write(tmp_path / "lme.json", data)
    convs = load_longmemeval(p)
    assert [c.bank_id for c in convs] == [d["question_id"] for d in data]
    for c, d in zip(convs, data):
        q = c.questions[0]
        assert q.qid == d["question_id"] and q.qtype == d["question_type"] and q.date.year == 2023
        assert q.category == QUESTION_TYPES.index(d["question_type"]) + 1
        ids = []
        for si, (sid, sess) in enumerate(zip(d["haystack_session_ids"], d["haystack_sessions"])):
            for ti, t in enumerate(sess):
                if t["role"] == "user":
                    tid = f"{sid}_{ti + 1}"  # 1-based over ALL turns of the session
                    ids.append(tid if ("answer" not in sid or t["has_answer"]) else tid.replace("answer", "noans"))
        assert [t.turn_id for t in c.turns] == ids
        assert all(t.speaker == "user" for t in c.turns)
        gold = {i for i in ids if "answer" in i}
        assert set(q.evidence) == gold and gold
        # the session index and the session's date stay on the units
        t = c.turns[0]
        assert t.session == 1 and t.timestamp == d["haystack_dates"][0] and t.time is not None
        assert all(session_of(t.turn_id).removeprefix("noans").removeprefix("answer") in
                   {s.removeprefix("answer") for s in d["haystack_session_ids"]} for t in c.turns)
    full = load_longmemeval(p, units="all")
    for c, d in zip(full, data):
        assert len(c.turns) == sum(len(s) for s in d["haystack_sessions"])
        assert {t.speaker for t in c.turns} == {"user", "assistant"}
        g = set(c.questions[0].evidence)
        assert g == {t.turn_id for t in c.turns if "answer" in t.turn_id}  # assistant turns never gold
        assert all(t.speaker == "user" for t in c.turns if t.turn_id in g)


def test_auto_detection_gzip_and_repeated_sessions(tmp_path):
    data = instances(2, seed=2)
    d = data[0]  # the same session placed twice in one haystack (the real dev file does this)
    d["haystack_session_ids"].append(d["haystack_session_ids"][0])
    d["haystack_dates"].append(d["haystack_dates"][-1])
    d["haystack_sessions"].append(d["haystack_sessions"][0])
    for gz in (False, True):
        p = write(tmp_path / ("lme.json.gz" if gz else "lme.json"), data, gz=gz)
        convs = load_conversations(p)  # auto: from the content
        ids = [t.turn_id for t in convs[0].turns]
        assert len(ids) == len(set(ids))
        rep = [i for i in ids if "~2" in i]
        assert rep and all(session_of(i) == d["haystack_session_ids"][0] for i in rep)
    # a LoCoMo file is still read as LoCoMo
    assert load_conversations(ROOT / "trawmem_gpu" / "data" / "sample" / "sample_conversation.jsonl")


@pytest.mark.parametrize("mutate, msg", [
    (lambda d: d.pop("question_date"), "missing field 'question_date'"),
    (lambda d: d.update(question_date="someday"), "field 'question_date'"),
    (lambda d: d["haystack_dates"].__setitem__(0, "2031/05/13 (Mon) 04:17"), "wrong weekday"),
    (lambda d: d["haystack_dates"].pop(), "differ in length"),
    (lambda d: d["haystack_sessions"][0][0].update(role="system"), "field 'role'"),
    (lambda d: d["haystack_sessions"][0][0].pop("content"), "missing field 'content'"),
    (lambda d: d["haystack_sessions"][0][0].update(has_answer="yes"), "has_answer"),
    (lambda d: d.update(haystack_sessions=[[] for _ in d["haystack_sessions"]]), "empty haystack"),
    (lambda d: d.update(question="  "), "field 'question' is empty"),
    (lambda d: d.update(haystack_session_ids=7), "must be list"),
])
def test_bad_instances_name_instance_and_field(tmp_path, mutate, msg):
    data = instances(2, seed=3)
    mutate(data[1])
    p = write(tmp_path / "bad.json", data)
    with pytest.raises(InputError, match=msg) as e:
        load_longmemeval(p)
    assert "instance 1" in str(e.value) and str(p) in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(InputError, match="corrupt gzip"):
        load_longmemeval(_torn_gzip(tmp_path))
    (tmp_path / "y.json").write_text('[{"question_id": ')
    with pytest.raises(InputError, match="bad JSON"):
        load_longmemeval(tmp_path / "y.json")
    with pytest.raises(InputError, match="no instances"):
        load_longmemeval(write(tmp_path / "z.json", []))
    data = instances(2)
    data[1]["question_id"] = data[0]["question_id"]
    with pytest.raises(InputError, match="duplicate question_id"):
        load_longmemeval(write(tmp_path / "d.json", data))
    with pytest.raises(InputError, match="`units`"):
        load_longmemeval(write(tmp_path / "u.json", instances(1)), units="assistant")


def _torn_gzip(tmp_path):
    raw = gzip.compress(json.dumps(instances(2)).encode())
    p = tmp_path / "torn.json.gz"
    p.write_bytes(raw[: len(raw) // 2])
    return p


def test_dev_file_matches_the_official_corpus(lme_dev_path):
    raw = json.loads(gzip.decompress(lme_dev_path.read_bytes()))
    convs = load_conversations(lme_dev_path)
    assert len(convs) == len(raw) == 150
    n_user = sum(1 for d in raw for s in d["haystack_sessions"] for t in s if t["role"] == "user")
    assert sum(len(c.turns) for c in convs) == n_user
    for c, d in zip(convs, raw):
        q = c.questions[0]
        assert c.bank_id == d["question_id"] and q.date is not None
        assert all("answer" in g for g in q.evidence)
        # every gold unit is a has_answer user turn of an answer session
        want = {f"{sid}_{i + 1}" for sid, s in zip(d["haystack_session_ids"], d["haystack_sessions"])
                if "answer" in sid for i, t in enumerate(s) if t["role"] == "user" and t.get("has_answer")}
        assert set(q.evidence) == want
    assert sum(1 for c in convs if not c.questions[0].evidence) == 20


# ---------------------------------------------------------------------------------------------
# official metrics: a plain spec of eval_utils.py's definitions, written independently
# ---------------------------------------------------------------------------------------------
def _spec_dcg(rel, k):
    rel = np.asarray(rel, dtype=float)[:k]
    if rel.size == 0:
        return 0.0
    return rel[0] + np.sum(rel[1:] / np.log2(np.arange(2, rel.size + 1)))


def _spec_eval(rank, gold, corpus, k):
    got = {corpus[i] for i in rank[:k]}
    rel = np.array([c in gold for c in corpus], dtype=float)
    ideal = _spec_dcg(np.sort(rel)[::-1], k)
    nd = _spec_dcg(rel[list(rank[:k])], k) / ideal if ideal > 0 else 0.0
    return float(any(g in got for g in gold)), float(all(g in got for g in gold)), nd


def _spec_session(rank, gold, corpus, k):
    strip = lambda x: "_".join(x.split("_")[:-1])  # noqa: E731
    gold = {strip(g) for g in gold}
    corpus = [strip(c) for c in corpus]
    e = k
    while e <= len(corpus) and len({corpus[i] for i in rank[:e]}) < k:
        e += 1
    return _spec_eval(rank, gold, corpus, e)


def test_metrics_by_hand():
    corpus = ["a_1", "a_3", "answer_b_1", "noans_b_3", "c_1", "answer_d_2"]
    gold = ["answer_b_1", "answer_d_2"]
    ranked = ["c_1", "answer_b_1", "a_1"]
    r_any, r_all, nd = turn_metrics(ranked, gold, corpus, 3)
    assert (r_any, r_all) == (1.0, 0.0)
    assert nd == pytest.approx((1 / math.log2(2)) / (1 + 1 / math.log2(2)))
    # sessions: c, answer_b, a are 3 distinct sessions in 3 ranks; gold sessions answer_b, answer_d
    assert session_metrics(ranked, gold, corpus, 3)[:2] == (1.0, 0.0)
    # k above the set: the whole set counts
    assert turn_metrics(ranked, gold, corpus, 50)[1] == 0.0
    assert turn_metrics(["answer_d_2", "answer_b_1"], gold, corpus, 1) == (1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="not in the corpus"):
        turn_metrics(["zz_1"], gold, corpus, 1)


@pytest.mark.parametrize("seed", range(25))
def test_metrics_match_the_spec_on_random_rankings(seed):
    rng = random.Random(seed)
    sessions = [f"{'answer_' if rng.random() < 0.3 else ''}s{j}x_{rng.randint(1, 3)}" for j in range(rng.randint(1, 8))]
    corpus = []
    for s in sessions:
        for t in range(rng.randint(1, 5)):
            tid = f"{s}_{2 * t + 1}"
            corpus.append(tid if rng.random() < 0.5 or "answer" not in s else tid.replace("answer", "noans"))
    gold = [c for c in corpus if "answer" in c]
    if not gold:
        gold = [corpus[0]]
    n = rng.randint(0, len(corpus))
    rank_idx = rng.sample(range(len(corpus)), n)  # a selected set: shorter than the corpus
    ranked = [corpus[i] for i in rank_idx]
    for k in (1, 2, 3, 5, 10, 50):
        assert turn_metrics(ranked, gold, corpus, k) == pytest.approx(_spec_eval(rank_idx, set(gold), corpus, k))
        assert session_metrics(ranked, gold, corpus, k) == pytest.approx(_spec_session(rank_idx, gold, corpus, k))


def test_aggregate_skips_abstention_and_no_gold_and_macro_over_types():
    corpus = ["answer_a_1", "b_1", "c_1"]
    recs = [question_record("q1", "multi-session", ["answer_a_1"], ["answer_a_1"], corpus, 10, (1,)),
            question_record("q2", "multi-session", ["b_1"], ["answer_a_1"], corpus, 20, (1,)),
            question_record("q3", "temporal-reasoning", ["answer_a_1", "b_1"], ["answer_a_1"], corpus, 40, (1,)),
            question_record("q4_abs", "temporal-reasoning", ["b_1"], ["answer_a_1"], corpus, 99, (1,)),
            question_record("q5", "temporal-reasoning", ["b_1"], [], corpus, 99, (1,))]
    agg = aggregate_lme(recs)
    assert agg["n_scored"] == 3 and agg["skipped_abstention"] == 1 and agg["skipped_no_gold"] == 1
    assert agg["per_type"]["multi-session"]["evidence_recall"] == 0.5
    assert agg["macro"]["evidence_recall"] == pytest.approx((0.5 + 1.0) / 2)
    assert agg["macro"]["context_tokens"] == pytest.approx((15 + 40) / 2)
    assert agg["official"]["turn"]["recall_any@1"] == pytest.approx(2 / 3)  # official: mean over questions
    assert official_metrics(["b_1"], ["answer_a_1"], corpus, (1,))["session"]["recall_all@1"] == 0.0


def test_trawmem_eval_points_longmemeval_files_to_trawmem_score(tmp_path, capsys):
    """`trawmem eval` scores LoCoMo categories 1-4; on a LongMemEval file that would silently
    drop two question types and keep abstention questions, so it names the right command."""
    from trawmem_gpu.cli import main

    p = write(tmp_path / "lme.json", instances(2))
    assert main(["eval", "--data", str(p), "--output", str(tmp_path / "o.json")]) == 2
    assert "score it with `trawmem score`" in capsys.readouterr().err


def test_unit_sessions_official_for_longmemeval_ids_and_session_numbers_otherwise(tmp_path):
    from trawmem_gpu.eval.longmemeval import unit_sessions

    data = instances(3, seed=2)
    data[0]["haystack_session_ids"].append(data[0]["haystack_session_ids"][0])  # a repeated session
    data[0]["haystack_dates"].append(data[0]["haystack_dates"][0])
    data[0]["haystack_sessions"].append(data[0]["haystack_sessions"][0])
    for c in load_longmemeval(write(tmp_path / "lme.json", data)):
        ids = [t.turn_id for t in c.turns]
        assert unit_sessions(ids, [t.session for t in c.turns]) == [session_of(i) for i in ids]  # the official rule
    # LoCoMo dia ids: no '_', so the bank's session numbers (D3:5 -> session 3)
    ids, sess = ["D1:1", "D1:2", "D2:1", "D3:5"], [1, 1, 2, 3]
    assert unit_sessions(ids, sess) == ["session 1", "session 1", "session 2", "session 3"]
    # ids whose part before the last '_' spans sessions are not LongMemEval's either
    assert unit_sessions(["t_1", "t_2", "t_3"], [1, 2, 2]) == ["session 1", "session 2", "session 2"]


def test_session_metrics_on_locomo_ids_see_sessions():
    """The defect: with LoCoMo ids every unit fell in one session '' and a wrong session scored 1."""
    from trawmem_gpu.eval.longmemeval import unit_sessions

    corpus, gold = ["D1:1", "D1:2", "D2:1", "D2:2"], ["D2:1"]
    sessions = unit_sessions(corpus, [1, 1, 2, 2])
    assert session_metrics(["D1:2"], gold, corpus, 1)[0] == 1.0  # without sessions: the old, meaningless 1
    assert session_metrics(["D1:2"], gold, corpus, 1, sessions) == (0.0, 0.0, 0.0)
    assert session_metrics(["D2:2"], gold, corpus, 1, sessions)[:2] == (1.0, 1.0)  # the right session, another turn
    rec = question_record("q", "multi-hop", ["D1:2"], gold, corpus, 5, (1,), sessions)
    assert rec["official"]["session"]["recall_any@1"] == 0.0 and rec["official"]["turn"]["recall_any@1"] == 0.0
