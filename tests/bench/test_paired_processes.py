"""``benchmarks/experiments/paired_processes.py``'s summary: the pairs both arms completed, the old
p50 minus the new per pair, medians, and a hand-written note kept across summaries (plumbing over
hand-made run files; the reading itself is a benchmark)."""
import json

import pytest

from benchmarks.experiments import paired_processes as pp


def _run(root, name, arm, pair, p50, p99=6.0):
    res = root / arm / "benchmarks" / "results"
    res.mkdir(parents=True, exist_ok=True)
    point = {"approx_ms": p50, "approx_p99_ms": p99, "approx_pass_ms": [p50, p50, p50], "exact_ms": 250.0,
             "candidate_recall": {"mean": 0.99}, "pick_recall": {"mean": 0.98}, "same_picks": 0.9,
             "qps": {"exact": 4.0, "approx": 200.0}, "vmhwm_mib": 4000.0, "index_append_ms": {"1": 0.2, "8": 1.1},
             "engine_s": 120.0}
    (res / f"{name}_{arm}_{pair}.json").write_text(json.dumps({"ann": [point]}))


def test_summary_pairs_only_complete_pairs_and_keeps_a_note(tmp_path):
    dirs = {"old": str(tmp_path / "old"), "new": str(tmp_path / "new")}
    for pair, (o, n) in {1: (5.2, 4.9), 2: (5.0, 5.1), 3: (5.4, 4.8)}.items():
        _run(tmp_path, "r", "old", pair, o)
        _run(tmp_path, "r", "new", pair, n)
    _run(tmp_path, "r", "old", 4, 9.9)  # its new run never finished: no pair
    out = tmp_path / "out"
    out.mkdir()
    got = pp.summary(dirs, "r", out)
    assert got["pairs"] == [1, 2, 3]
    assert got["old_minus_new_p50"] == [0.3, -0.1, 0.6]
    assert got["old_minus_new_median"] == 0.3 and got["new_lower_in"] == "2 of 3 pairs"
    assert got["arms"]["old"]["p50_median"] == 5.2 and got["arms"]["new"]["p50_median"] == 4.9
    assert (out / "r.png").stat().st_size > 0
    saved = json.loads((out / "r.json").read_text())
    saved["note"] = "by hand"
    (out / "r.json").write_text(json.dumps(saved))
    assert pp.summary(dirs, "r", out)["note"] == "by hand"


def test_summary_without_a_complete_pair_says_so(tmp_path):
    _run(tmp_path, "r", "old", 1, 5.0)
    with pytest.raises(SystemExit, match="no complete pair"):
        pp.summary({"old": str(tmp_path / "old"), "new": str(tmp_path / "new")}, "r", tmp_path)
