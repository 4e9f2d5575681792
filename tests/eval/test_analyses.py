"""The paper-analysis metric definitions (trawmem_gpu/eval/analyses.py) on tiny hand-made banks
and hand-made annotations whose answers are known: the reduction ratio, cluster bootstrap
intervals, fact coverage and repeats, thread counts, role pairs and the Pareto set."""
from __future__ import annotations


import numpy as np
import pytest

from trawmem_gpu.data.types import Turn
from trawmem_gpu.errors import InputError
from trawmem_gpu.eval.analyses import (anchor_bridge_pairs, citation_matrix, cluster_bootstrap, describe,
                                       fact_coverage, fact_mentions, load_observation_facts, pareto_mask,
                                       reduction_ratio, relevant_facts, thread_usage)
from trawmem_gpu.store.bank import Bank
from locomo_files import write_tiny_locomo

SIZES = (2, 3, 4)  # three threads: units 0-1, 2-4, 5-8


def _bank() -> Bank:
    """Nine units in three threads, orthogonal-ish random vectors, a chain graph 0-1-2."""
    rng = np.random.default_rng(7)
    N, d = sum(SIZES), 12
    V = rng.normal(size=(N, d)).astype(np.float32)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    off = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int64)
    H = np.stack([V[off[j]:off[j + 1]].mean(0) for j in range(len(SIZES))])
    H /= np.linalg.norm(H, axis=1, keepdims=True)
    turns = [Turn(f"D{j + 1}:{i + 1}", "Ana" if i % 2 else "Ben", f"made up turn {j} {i}", j + 1, "9 May, 2031")
             for j, n in enumerate(SIZES) for i in range(n)]
    src = np.array([0, 1, 1, 2], dtype=np.int64)
    dst = np.array([1, 0, 2, 1], dtype=np.int64)
    return Bank("hand", turns, off, ["h0", "h1", "h2"], ["extractive"] * 3, V, H.astype(np.float32), src, dst,
                np.ones(4, np.float32), np.zeros(4, np.int8), "test-encoder")


def _select(bank, budget, n_seeds, cap, hops=0):
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.select.reference import select_reference

    qp = QueryParams(budget=budget, hops=hops, n_seeds=n_seeds, neighborhood_cap=cap)
    # unit 5 (thread 2) is the query itself; "qqq" matches no word, so BM25 adds nothing
    return select_reference(BankContext.of(bank), "qqq", bank.unit_vecs[5].astype(np.float64), SelectConfig(), qp,
                            keep_internals=True)


# ----------------------------------------------------------------------------------------------
# Fig. 8: reduction ratio

def test_reduction_ratio_values_and_errors():
    assert reduction_ratio(15, 150) == pytest.approx(0.9)
    assert reduction_ratio(16, 16) == 0.0
    assert reduction_ratio(0, 7) == 1.0
    with pytest.raises(ValueError, match="at least one candidate"):
        reduction_ratio(0, 0)
    with pytest.raises(ValueError, match="must lie in"):
        reduction_ratio(5, 4)


@pytest.mark.parametrize("budget, n_seeds, cap, n_cand, n_sel", [
    (3, 3, 3, 9, 3),     # every thread is a seed: all 9 units are candidates, 3 selected -> c = 2/3
    (100, 3, 3, 9, 9),   # B_q = min(B, |U_q|) = 9: nothing is left out -> c = 0
    (3, 1, 1, 4, 3),     # one seed: the query's own thread (units 5-8) -> c = 1/4
    (2, 1, 2, 7, 2),     # one hop from thread 2 reaches thread 1 (cap 2): 4 + 3 candidates
])
def test_reduction_ratio_on_a_hand_made_bank(budget, n_seeds, cap, n_cand, n_sel):
    sel = _select(_bank(), budget, n_seeds, cap, hops=1 if cap > n_seeds else 0)
    assert len(sel.candidates) == n_cand and len(sel.units) == n_sel
    assert reduction_ratio(len(sel.units), len(sel.candidates)) == pytest.approx(1 - n_sel / n_cand)


# ----------------------------------------------------------------------------------------------
# bootstrap over conversations

def test_cluster_bootstrap_resamples_whole_conversations():
    # Two conversations whose questions all score 1 and 3: resampling whole conversations can
    # only give means 1, 2 or 3 (each extreme with probability 1/4 > 2.5%), so the 95% interval
    # is exactly [1, 3]; resampling questions independently would give a narrow interval near 2.
    vals = np.array([1.0] * 50 + [3.0] * 50)
    conv = np.array(["a"] * 50 + ["b"] * 50)
    est, lo, hi = cluster_bootstrap(vals, conv, n_boot=2000, seed=1)
    assert (est, lo, hi) == (2.0, 1.0, 3.0)
    # identical conversations: no spread at all
    est, lo, hi = cluster_bootstrap(np.tile([1.0, 2.0, 6.0], 4), np.repeat(np.arange(4), 3))
    assert est == lo == hi == 3.0
    # another statistic goes through the general path
    est, lo, hi = cluster_bootstrap(vals, conv, stat=np.median, n_boot=500)
    assert est == 2.0 and lo == 1.0 and hi == 3.0
    assert np.isnan(cluster_bootstrap([], [])[0])
    with pytest.raises(ValueError, match="same length"):
        cluster_bootstrap([1.0, 2.0], ["a"])


def test_describe():
    d = describe([1, 2, 3, 4, 5])
    assert (d["n"], d["mean"], d["median"], d["min"], d["max"]) == (5, 3.0, 3.0, 1.0, 5.0)
    assert d["p90"] == pytest.approx(4.6) and d["p99"] == pytest.approx(4.96)
    assert np.isnan(describe([])["mean"])


# ----------------------------------------------------------------------------------------------
# Fig. 9: facts

# six units; f1 is cited by two turns (the same fact stated twice)
CITED = [np.array([0]), np.array([1, 2]), np.array([3]), np.array([5])]


def test_fact_coverage_and_repeats_by_citation():
    M = citation_matrix(CITED, 6)
    rel = relevant_facts(CITED, gold_units=[1, 3])
    assert rel.tolist() == [1, 2]                    # f1 cites 1, f2 cites 3
    assert fact_coverage([0, 1, 2, 4], M, rel) == (1, 1)   # f1 retained (twice: one repeat); f2 missed
    assert fact_coverage([3, 1], M, rel) == (2, 0)
    assert fact_coverage([2, 1, 3, 0, 5], M, rel) == (2, 1)
    assert fact_coverage([], M, rel) == (0, 0)
    assert fact_coverage([4], M, rel) == (0, 0)
    assert fact_coverage([0, 0, 0], M, rel) == (0, 0)      # one unit counts once
    assert relevant_facts(CITED, gold_units=[4]).size == 0


def test_fact_mentions_by_similarity():
    # f0's cited turn (unit 0) has cosine 0.8 with it, f1's cited turns 0.95 -> theta = median = 0.875.
    # unit 4: cosine 0.9 with f0 (>= 0.8 and >= theta): a restatement of f0.
    # unit 5: cosine 0.85 with f0 (>= 0.8 but < theta): not a mention.
    def v(c):
        return np.array([c, np.sqrt(1 - c * c), 0.0])

    facts = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    units = np.array([v(0.8), [0, np.sqrt(1 - .95 ** 2), .95], [0, 0.6, 0.8], [0, 1, 0], v(0.9), v(0.85)])
    M, theta = fact_mentions(facts, units, [np.array([0]), np.array([1, 2])])
    assert theta == pytest.approx(0.875)
    assert M[0].tolist() == [True, False, False, False, True, False]
    # f1: unit 1 (cos 0.95) is its best cited turn; unit 2 (0.8) is cited, so it mentions f1 too
    assert M[1].tolist() == [False, True, True, False, False, False]
    assert fact_coverage([0, 4, 5], M, [0]) == (1, 1)    # f0 retained, then repeated by unit 4
    assert fact_coverage([5], M, [0]) == (0, 0)


def test_load_observation_facts(tmp_path):
    p = write_tiny_locomo(tmp_path / "tiny.json")
    ids = [f"D1:{i}" for i in range(1, 7)] + [f"D2:{i}" for i in range(1, 7)]
    facts = load_observation_facts(p, {"tiny-1": {t: i for i, t in enumerate(ids)}, "absent": {}})
    assert list(facts) == ["tiny-1"]
    f = facts["tiny-1"]
    assert len(f) == 7 and f.dropped["no_known_turn"] == 1     # "D9:9" names no turn
    assert [c.tolist() for c in f.cited] == [[0, 2], [2], [3], [5], [7], [8, 9], [6]]  # D2:8 dropped
    assert f.sessions == [1, 1, 1, 1, 2, 2, 2]
    assert f.dropped["citation_repairs"]["dropped_unknown"] == 2
    # the question "What breed ... and what did he chew?" (gold D1:3, D2:2) has three relevant facts
    assert relevant_facts(f.cited, [2, 7]).tolist() == [0, 1, 4]


@pytest.mark.parametrize("bad, match", [
    (None, "no 'observation' object"),
    (["just a string"], r"observation.session_2_observation.Ben\[1\]"),
    ([42, "D1:1"], r"must be \[fact text, cited turn id\(s\)\]"),
])
def test_load_observation_facts_errors(tmp_path, bad, match):
    p = write_tiny_locomo(tmp_path / "t.json", observation=bad is not None, extra_obs=bad)
    with pytest.raises(InputError, match=match):
        load_observation_facts(p, {"tiny-1": {"D1:1": 0}})
    with pytest.raises(InputError, match="file not found"):
        load_observation_facts(tmp_path / "missing.json", {})


# ----------------------------------------------------------------------------------------------
# Fig. 12: threads per workspace

def test_thread_usage_known_answers():
    ut = np.repeat(np.arange(3), SIZES)       # [0 0 1 1 1 2 2 2 2]
    assert thread_usage([0, 1, 5], ut) == (2, 1.5)
    assert thread_usage([8, 2, 0, 6], ut) == (3, 4 / 3)
    assert thread_usage([5, 5], ut) == (1, 1.0)
    n, per = thread_usage([], ut)
    assert n == 0 and np.isnan(per)
    # a real selection: everything selectable and selected -> all three threads, 3 units each
    bank = _bank()
    sel = _select(bank, budget=9, n_seeds=3, cap=3)
    assert thread_usage(sel.units, bank.unit_thread) == (3, 3.0)
    sel = _select(bank, budget=3, n_seeds=1, cap=1)  # one thread in the neighbourhood
    assert thread_usage(sel.units, bank.unit_thread) == (1, 3.0)


# ----------------------------------------------------------------------------------------------
# Fig. 7: role pairs

def test_anchor_bridge_pairs():
    qs = [{"qid": "a1", "bank_id": "b", "gold": [4], "selected": [4, 1]},          # direct for unit 4
          {"qid": "a2", "bank_id": "b", "gold": [7], "selected": [3]},             # direct for 7, not selected
          {"qid": "m1", "bank_id": "b", "gold": [4, 7], "selected": [4, 7, 9]},    # bridges 4 and 7
          {"qid": "m2", "bank_id": "b", "gold": [4, 2], "selected": [2]},          # bridges 4, not selected
          {"qid": "o1", "bank_id": "other", "gold": [4, 5], "selected": [4, 5]}]   # another bank
    pairs = anchor_bridge_pairs(qs)
    assert [(p.unit, p.q_direct, p.q_bridge) for p in pairs] == [(4, "a1", "m1")]
    loose = anchor_bridge_pairs(qs, require_selected=False)
    assert [(p.unit, p.q_direct, p.q_bridge) for p in loose] == [(4, "a1", "m1"), (4, "a1", "m2"), (7, "a2", "m1")]


# ----------------------------------------------------------------------------------------------
# Pareto set

def test_pareto_mask_known_set():
    gain = [0.50, 0.60, 0.55, 0.50, 0.40, np.nan, 0.60, 0.30]
    cost = [10.0, 20.0, 25.0, 10.0, 5.00, 1.000, 20.0, 5.0]
    # C (0.55, 25) is dominated by B (0.60, 20); H (0.30, 5) by E (0.40, 5); A = D and B = G tie
    # and stay optimal; F has a NaN and neither counts nor dominates (else it would beat E).
    assert pareto_mask(gain, cost).tolist() == [True, True, False, True, True, False, True, False]
    assert pareto_mask([0.1], [1.0]).tolist() == [True]
    assert pareto_mask([], []).tolist() == []
    rng = np.random.default_rng(0)
    g, c = rng.random(40), rng.random(40)
    m = pareto_mask(g, c)
    # brute force: optimal iff nothing is at least as good on both and better on one
    brute = [not any((g[j] >= g[i] and c[j] <= c[i]) and (g[j] > g[i] or c[j] < c[i]) for j in range(40))
             for i in range(40)]
    assert m.tolist() == brute and m.any()
