"""The approximate search's recall measurement (``benchmarks/scale_bench/ann_recall.py``): the recall
formula on sets where the answer is known, and on a small bank with the approximate path forced on,
the measured recalls against what the engines give (a shortlist holding the whole bank: the
approximate path picks what exact search picks; a short one: the recall the bench reports is the
one computed here from the engines directly). No timing is asserted."""
import numpy as np
import pytest

from benchmarks.scale_bench import ann_recall
from benchmarks.synthetic_banks import make_banks, make_queries
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine


def test_recall_is_the_share_of_the_exact_set_the_approximate_set_holds():
    approx = [[1, 2, 3], [5], [], [9, 9, 4]]
    exact = [[1, 2, 4, 8], [], [7], [4]]
    np.testing.assert_allclose(ann_recall.recall(approx, exact), [0.5, 1.0, 0.0, 1.0])
    s = ann_recall.summary(ann_recall.recall(approx, exact))
    assert s["mean"] == pytest.approx(0.625) and s["min"] == 0.0 and s["all"] == 0.5 and s["n"] == 4
    with pytest.raises(ValueError, match="2 approximate sets against 1"):
        ann_recall.recall([[1], [2]], [[1]])


def test_thread_recall_counts_a_unit_of_the_same_thread_as_found():
    offsets = np.array([0, 3, 5, 9])  # threads: units 0-2, 3-4, 5-8
    assert [t.tolist() for t in ann_recall.thread_sets([[0, 4, 5, 8], []], offsets)] == [[0, 1, 2], []]
    r = ann_recall.recalls(approx_cands=[[1, 3]], exact_cands=[[0, 4, 6]], approx_picks=[[1]],
                           exact_picks=[[0, 4]], thread_offsets=offsets)
    assert r["units"]["mean"] == 0.0  # no unit in common ...
    assert r["threads"]["mean"] == pytest.approx(2 / 3)  # ... but two of the three threads
    assert r["picks"]["mean"] == 0.0 and r["same_picks"] == 0.0


@pytest.fixture(scope="module")
def small():
    banks = make_banks(1, units=1200, thread_len=6.0, d=32, seed=5, prefix="ann")
    return banks, make_queries(banks, 8, seed=6)


def test_forced_approximate_search_measured_against_exact(small):
    banks, (ids, qs, Z) = small
    n = banks[0].n_units
    rec = ann_recall.measure_bank(banks, ids, qs, Z, settings=[{"ann_shortlist": n}, {"ann_shortlist": 8}])
    whole, short = rec["rows"]
    # a shortlist of the whole bank: the working set is the bank, so the picks are exact search's
    assert whole["settings"]["ann_shortlist"] == n
    assert whole["search_at_M"]["mean"] > 0.99  # HNSW asked for every vector may still miss one or two
    for kind in ("units", "threads", "picks"):
        assert whole["recall"][kind]["mean"] == 1.0 and whole["recall"][kind]["n"] == len(ids)
    assert whole["recall"]["same_picks"] == 1.0 and rec["gate"]["met"] and rec["gate"]["value"] == 1.0
    # a short one: the bench's figures are the formula applied to the engines' own sets
    exact = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=None)
    approx = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=8)
    want_c, got_c = exact.candidate_sets(ids, qs, Z), approx.candidate_sets(ids, qs, Z)
    want_p, got_p = exact.select_units(ids, qs, Z), approx.select_units(ids, qs, Z)
    units = np.mean([len(set(a.tolist()) & set(e.tolist())) / len(e) for a, e in zip(got_c, want_c)])
    picks = np.mean([len(set(a) & set(e)) / len(e) for a, e in zip(got_p, want_p)])
    assert short["settings"]["ann_shortlist"] == 8
    assert short["recall"]["units"]["mean"] == pytest.approx(units)
    assert short["recall"]["picks"]["mean"] == pytest.approx(picks)
    assert 0.0 < short["recall"]["units"]["mean"] <= short["recall"]["threads"]["mean"] <= 1.0
