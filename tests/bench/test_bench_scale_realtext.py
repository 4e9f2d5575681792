"""Issue 46's real-text check (``benchmarks/scale_bench/realtext_ann.py``) on a made-up LoCoMo-layout
file (``tests/support/locomo_files.py``; no dataset record): the repeated bank has the asked size,
both searches answer every question, the agreement figures lie in [0, 1], and bad input is refused."""
import pytest
from locomo_files import write_data

from benchmarks.scale_bench import realtext_ann


def test_realtext_check_measures_exact_against_approximate_on_the_repeated_bank(tmp_path):
    path = write_data(tmp_path / "locomo.json")
    rec = realtext_ann.point({"units": 70, "data": str(path), "rounds": 3, "seed": 1, "batch": 4})
    assert rec["units"] == 70 and rec["threads"] >= 1
    assert 1 <= rec["questions"] <= 3
    assert 0 < rec["exact_ms"] <= rec["exact_p99_ms"] and 0 < rec["approx_ms"] <= rec["approx_p99_ms"]
    for k in ("candidate_recall", "pick_recall"):
        assert 0.0 <= rec[k]["min"] <= rec[k]["mean"] <= 1.0, rec[k]
    assert 0.0 <= rec["same_picks"] <= 1.0 and rec["qps"]["exact"] > 0 and rec["qps"]["approx"] > 0
    assert set(rec["index_append_ms"]) == {"1", "8"}
    assert rec["settings"]["dim"] > 0 and rec["vmhwm_mib"] > 0
    for k in ("candidates", "picks"):  # by original turn (a copy of the same turn counts)
        assert 0.0 <= rec["agreement_by_text"][k]["min"] <= rec["agreement_by_text"][k]["mean"] <= 1.0


def test_text_agreement_counts_any_copy_of_a_repeated_turn():
    keys = ["c:D1:1", "c:D1:2", "c:D1:1", "c:D1:2", "c:D1:3"]  # units 0/2 and 1/3: copies of one turn each
    got = realtext_ann.text_agreement([[2, 3], [4], []], [[0, 1], [0], []], keys)
    assert got["mean"] == 0.5 and got["min"] == 0.0 and abs(got["p5"] - 0.05) < 1e-12  # 1.0 and 0.0; the empty one skipped
    assert realtext_ann.text_agreement([], [], keys) == {"mean": 1.0, "p5": 1.0, "min": 1.0}


def test_realtext_check_refuses_an_empty_bank_and_a_file_without_questions(tmp_path):
    path = write_data(tmp_path / "locomo.json")
    with pytest.raises(ValueError, match="units must be at least 1"):
        realtext_ann.point({"units": 0, "data": str(path)})
    with pytest.raises(ValueError, match="no questions"):
        realtext_ann._questions(_without_questions(tmp_path, path), 3, 0)


def _without_questions(tmp_path, path):
    import json

    samples = json.loads(path.read_text())
    for s in samples:
        s["qa"] = []
    out = tmp_path / "noqa.json"
    out.write_text(json.dumps(samples))
    return out
