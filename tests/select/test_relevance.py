"""The ``learned`` affinity (select/steps/relevance.py) and its fit (head/relevance.py).

* features on a hand-made bank whose values are known (speaker named, session context, ranks,
  temporal cue, relative dates against the question's date);
* the engine (tensor front, compiled greedy; and the tensor backend) picks exactly what the
  reference picks under random weights, with dated queries and relative-date questions;
* the fit recovers a known logistic model, weighs data sets and questions equally, and
  cross-validation never scores a group with weights fitted on it.
"""
from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest

from engine_banks import D, make_bank
from trawmem_gpu.data.types import Turn
from trawmem_gpu.errors import ConfigError
from trawmem_gpu.head.relevance import LabelledQuestion, cross_validate, fit_relevance
from trawmem_gpu.select.config import RELEVANCE_FEATURES, SelectConfig
from trawmem_gpu.select.params import QueryParams
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.steps.relevance import (WORDS_CAP, affinity_from_logits, date_match, learned_affinity,
                                                logits, relevance_features, relevance_static, speakers_named,
                                                words_feature)
from trawmem_gpu.select.text_features import relative_dates

COL = {n: i for i, n in enumerate(RELEVANCE_FEATURES)}


def _dated_bank():
    """Two sessions (10 and 40 days before 2023-06-01), speakers Ann and Bob."""
    day = datetime(2023, 6, 1)
    texts = ["Ann adopted a cat", "Bob likes jazz", "the cat is grey", "yesterday we hiked",
             "Bob sold a car " + "and then " * 12]
    ses = [1, 1, 1, 2, 2]
    turns = [Turn(f"D{s}:{i}", "Ann" if i % 2 == 0 else "Bob", t, s, "x",
                  day - timedelta(days=10 if s == 1 else 40)) for i, (t, s) in enumerate(zip(texts, ses))]
    bank = make_bank("dated", [3, 2], seed=1)
    bank.turns = turns
    return bank, day


def test_features_on_a_hand_made_bank():
    bank, now = _dated_bank()
    st = relevance_static(bank)
    assert st.speakers == ("Ann", "Bob") and st.prev.tolist() == [-1, 0, 1, -1, 3]
    assert st.next.tolist() == [1, 2, -1, 4, -1]
    cos = np.array([0.1, 0.5, 0.3, 0.2, 0.4])
    bm = np.array([0.0, 2.0, 0.0, 1.0, 0.0])
    q = "What did Bob do about five weeks ago?"
    F = relevance_features(st, cos, bm, q, now.timestamp(), 60.0)
    assert F.shape == (5, len(RELEVANCE_FEATURES))
    np.testing.assert_array_equal(F[:, COL["speaker_named"]], [0, 1, 0, 1, 0])  # Bob named, Ann not
    np.testing.assert_allclose(F[:, COL["bm25"]], bm / 2.0)
    np.testing.assert_allclose(F[:, COL["rrf_cos"]], 1.0 / (60.0 + np.array([5, 1, 3, 4, 2])))
    np.testing.assert_allclose(F[:, COL["rrf_bm25"]], [0, 1 / 61, 0, 1 / 62, 0])
    np.testing.assert_allclose(F[:, COL["top_bm25"]], [0, 1 / 6, 0, 1 / 7, 0])
    # neighbours stay inside a session: unit 2's only neighbour is 1, unit 3's only neighbour is 4
    np.testing.assert_allclose(F[:, COL["context_cos"]], [0.5, 0.3, 0.5, 0.4, 0.2])
    # "five weeks ago" = 35 days +- 8.75: session 2 (40 days back) matches, session 1 (10) barely
    dm = F[:, COL["date_match"]]
    np.testing.assert_allclose(dm[3:], np.exp(-5 / 8.75))
    assert (dm[:3] < 0.1).all()
    assert F[:, COL["temporal_match"]].tolist() == [0, 0, 0, 1, 0]  # "ago" is a temporal cue; "yesterday"
    # no question date, or no relative time: the date feature is 0
    assert date_match(st.time, q, float("nan")) is None
    assert date_match(st.time, "What did Bob sell?", now.timestamp()) is None
    # words: log(1 + words), capped at WORDS_CAP (the last text has 4 + 24 words)
    np.testing.assert_array_equal(F[:, COL["words"]], np.log1p([4, 3, 4, 3, WORDS_CAP]))


def test_question_cues():
    assert speakers_named("what did ann and BOB do", ("Ann", "Bob", "Annie", "")).tolist() == [1, 1, 0, 0]
    assert relative_dates("What did I do two weeks ago and last month?") == [(14.0, 3.5), (30.44, 7.61)]
    assert relative_dates("yesterday") == [(1.0, 1.5)] and relative_dates("nothing relative") == []


def test_sigmoid_normalization():
    s = np.array([[0.0, 2.0, -1.0, 9.0], [1.0, -3.0, 5.0, 5.0]])
    out = affinity_from_logits(s, np.array([3, 4]))
    p = 1 / (1 + np.exp(-s))
    np.testing.assert_allclose(out[0, :3], p[0, :3] / p[0, :3].max(), rtol=1e-15)
    assert out[0, 3] == 0.0 and out[1].max() == 1.0
    w = np.arange(1.0, len(RELEVANCE_FEATURES) + 2)
    F = np.random.default_rng(0).normal(size=(7, len(RELEVANCE_FEATURES)))
    np.testing.assert_allclose(logits(F, w), F @ w[:-1] + w[-1], rtol=1e-12)


def test_config_checks_relevance_weights():
    with pytest.raises(ConfigError, match=f"`relevance_weights` must be {len(RELEVANCE_FEATURES) + 1} finite numbers"):
        SelectConfig(relevance_weights=(1.0, 2.0))
    with pytest.raises(ConfigError, match="finite"):
        SelectConfig(relevance_weights=(float("nan"),) * (len(RELEVANCE_FEATURES) + 1))


def test_shipped_weights_are_the_benchmarks_fit():
    """The default learned affinity is the package's ``select/affinity_weights.json`` (its one
    home), which is what ``bench_equal_tokens.py --parts fit`` fitted (on both dev sets), feature
    for feature; the default config uses it."""
    import json
    from pathlib import Path

    import trawmem_gpu.select as select_pkg
    from trawmem_gpu.head.relevance import load_weights
    from trawmem_gpu.select.config import DEFAULT_RELEVANCE_WEIGHTS

    path = Path(select_pkg.__file__).with_name("affinity_weights.json")
    assert load_weights(path) == DEFAULT_RELEVANCE_WEIGHTS
    doc = json.loads(path.read_text())
    assert doc["features"] == list(RELEVANCE_FEATURES) and "bench_equal_tokens.py --parts fit" in doc["meta"]["command"]
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    bench = json.loads((results / "equal_tokens.json").read_text())
    assert bench["features"] == list(RELEVANCE_FEATURES)
    assert tuple(bench["shipped_weights"]) == DEFAULT_RELEVANCE_WEIGHTS
    c = SelectConfig()
    assert c.affinity == "learned" and c.relevance_weights == DEFAULT_RELEVANCE_WEIGHTS


def _banks():
    return [make_bank("odd", [3, 1, 5, 2, 7, 4, 1, 6, 3], seed=11, n_semantic=5),
            make_bank("tiny", [1, 2], seed=12), make_bank("wide", [2, 3, 4, 5] * 6, seed=13, n_semantic=12)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("backend", ["auto", "tensor"])
def test_engine_agrees_with_reference(seed, backend):
    rng = np.random.default_rng(seed)
    banks = _banks()
    for b in banks:  # two sessions a month apart per bank, so relative dates select some units
        half = b.n_units // 2
        b.turns = [Turn(t.turn_id, t.speaker, t.text, t.session, "x",
                        datetime(2023, 5, 1) + timedelta(days=30 if i >= half else 0)) for i, t in enumerate(b.turns)]
    w = tuple(rng.normal(size=len(RELEVANCE_FEATURES) + 1) * np.r_[[2, 2, 200, 200, 10, 10, 2, 2, 2, 50, 2, 2], 1])
    cfg, qp = SelectConfig(affinity="learned", relevance_weights=w), QueryParams(budget=5)
    ids, qs, zs, dates = [], [], [], []
    stems = ["What did Ann do two weeks ago", "When did Bob", "Which lake last month", "Did Ann and Bob"]
    for b in banks:
        for i in range(6):
            z = b.unit_vecs[int(rng.integers(b.n_units))] + 0.4 * rng.normal(size=D)
            ids.append(b.bank_id)
            qs.append(f"{stems[i % 4]} dog cat?")
            zs.append(z / np.linalg.norm(z))
            dates.append(datetime(2023, 6, 15) if i % 3 else None)
    Z = np.array(zs, dtype=np.float32)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    ref = [select_reference(ctx[b], q, z, cfg, qp, now=d).units for b, q, z, d in zip(ids, qs, Z, dates)]
    eng = SelectionEngine(banks, cfg, device="cpu", backend=backend)
    assert eng.plan.front == ("compiled" if backend == "auto" else "tensor")
    assert eng.select_units(ids, qs, Z, dates=dates, params=qp) == ref
    # alpha itself: the engine's CPU path and the reference give the same bits
    b = ctx["odd"]
    cos = b.bank.unit_vecs.astype(np.float64) @ Z[0].astype(np.float64)
    a = learned_affinity(b.relevance, cos, b.bm25.scores(qs[0]), qs[0], float("nan"), cfg)
    assert a.max() == 1.0 and (a > 0).all()


def _synthetic(n_q, n_units, w_true, rng, dataset="a"):
    out = []
    for i in range(n_q):
        F = rng.normal(size=(n_units, len(RELEVANCE_FEATURES)))
        p = 1 / (1 + np.exp(-(F @ w_true[:-1] + w_true[-1])))
        y = (rng.random(n_units) < p).astype(float)
        out.append(LabelledQuestion(dataset, f"b{i}", f"q{i}", f"{dataset}:{i % 4}", 1, F, y))
    return out


def test_fit_recovers_a_known_model():
    rng = np.random.default_rng(0)
    w_true = np.r_[rng.normal(size=len(RELEVANCE_FEATURES)), -1.0]
    qs = _synthetic(60, 200, w_true, rng)
    w = np.array(fit_relevance(qs, C=1e4))
    np.testing.assert_allclose(w, w_true, atol=0.15)  # 12,000 rows: the MLE is within ~0.05


def test_cross_validation_holds_each_group_out():
    rng = np.random.default_rng(1)
    w_true = np.r_[rng.normal(size=len(RELEVANCE_FEATURES)), 0.0]
    qs = _synthetic(12, 40, w_true, rng)
    W = cross_validate(qs)
    assert sorted(W) == ["a:0", "a:1", "a:2", "a:3"]
    for g, w in W.items():
        assert w == fit_relevance([q for q in qs if q.group != g])


def test_datasets_weigh_the_same():
    """Doubling every question of one data set changes (almost) nothing: each data set weighs the
    same. (Only the regularization's relative strength moves with the row count; without the
    balancing, data set ``a``, fitted to the opposite model of ``b``, would pull every weight by ~0.1.)"""
    rng = np.random.default_rng(2)
    w_true = np.r_[rng.normal(size=len(RELEVANCE_FEATURES)), 0.0]
    a, b = _synthetic(6, 50, w_true, rng, "a"), _synthetic(6, 50, -w_true, rng, "b")
    np.testing.assert_allclose(fit_relevance(a + b + a), fit_relevance(a + b), atol=2e-3)
    with pytest.raises(ValueError, match="no labelled questions"):
        fit_relevance([])


HELD_OUT = ("conv-41", "conv-50")


def test_learned_affinity_beats_rrf_on_held_out_conversations(dev_path):
    """Quality floor on real data: fitted on five dev conversations, the learned affinity selects
    more gold evidence than the rank fusion on the two others, at B = 16, through ``run_eval``."""
    from trawmem_gpu.eval.retrieval import run_eval
    from trawmem_gpu.head.relevance import load_labelled

    qs, ctxs = load_labelled(dev_path)
    w = fit_relevance([q for q in qs if q.bank_id not in HELD_OUT])
    from trawmem_gpu.data import load_conversations

    convs = [c for c in load_conversations(dev_path) if c.bank_id in HELD_OUT]
    banks = [ctxs[c.bank_id].bank for c in convs]
    res = {}
    for name, cfg in (("rrf", SelectConfig(affinity="rrf")), ("learned", SelectConfig(affinity="learned", relevance_weights=w))):
        r = run_eval(dev_path, "trawmem", cfg, engine="batched", progress=False, banks_and_convs=(convs, banks),
                     keep_records=False)
        res[name] = r["macro"]["evidence_recall"]
    assert res["learned"] > res["rrf"] + 0.01, res


def test_train_affinity_cli_and_weights_file(tmp_path, dev_path, capsys):
    from trawmem_gpu.cli import main
    from trawmem_gpu.head.relevance import load_weights

    out = tmp_path / "w.json"
    assert main(["train-affinity", "--data", str(dev_path), "--out", str(out), "--quiet"]) == 0
    w = load_weights(out)
    assert len(w) == len(RELEVANCE_FEATURES) + 1
    bank = _sample_collection(tmp_path)
    assert main(["query", "--bank", str(bank), "--question", "Where does Clara live?",
                 "--affinity-weights", str(out), "--json"]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "trawmem-affinity-weights", "features": ["bm25"], "weights": [1, 2]}')
    for f, msg in ((bad, "fitted for the features"), (tmp_path / "none.json", "file not found")):
        with pytest.raises(Exception, match=msg):
            load_weights(f)
    capsys.readouterr()
    assert main(["query", "--bank", str(bank), "--question", "x", "--affinity-weights", str(bad)]) == 2
    assert "--affinity-weights" in capsys.readouterr().err


def _sample_collection(tmp_path):
    from trawmem_gpu.cli import main

    out = tmp_path / "sample"
    from trawmem_gpu.data import sample_path

    assert main(["build", "--input", str(sample_path()), "--out", str(out), "--quiet"]) == 0
    return out


def test_a_weights_file_of_fewer_features_reads_with_zero_for_the_later_ones(tmp_path):
    """A file fitted before a feature was added (its features a prefix of this version's) gives the
    affinity it was fitted as: weight 0 for the features it lacks; any other list is an error."""
    import json

    from trawmem_gpu.head.relevance import load_weights

    old = list(RELEVANCE_FEATURES[:-1])
    f = tmp_path / "old.json"
    f.write_text(json.dumps({"format": "trawmem-affinity-weights", "features": old,
                             "weights": [float(i + 1) for i in range(len(old))] + [-3.0]}))
    w = load_weights(f)
    assert w == tuple(float(i + 1) for i in range(len(old))) + (0.0, -3.0) and len(w) == len(RELEVANCE_FEATURES) + 1
    for bad in (old[1:], old[::-1], []):
        f.write_text(json.dumps({"format": "trawmem-affinity-weights", "features": bad, "weights": [1.0] * (len(bad) + 1)}))
        with pytest.raises(Exception, match="fitted for the features"):
            load_weights(f)


def test_words_feature_counts_text_and_caption():
    t = [Turn("a", "Ann", "two words", 1, "x", None, "a red boat"), Turn("b", "Bob", "", 1, "x", None, "photo"),
         Turn("c", "Ann", "  spaced\tout\n words ", 1, "x", None)]
    np.testing.assert_array_equal(words_feature(t), np.log1p([5, 1, 3]))
