"""The query-level gates of ``benchmarks/experiments/bench_bridge_gate.py`` (which queries get the widened
pool), on small made-up affinity vectors."""
import numpy as np
import pytest

from benchmarks.experiments.bench_bridge_gate import auc, gate_signals, gated, mixed


def test_signals_read_the_top_k_units_threads_sessions_and_flatness():
    alpha = np.array([0.1, 1.0, 0.5, 0.5, 0.05, 0.4])
    thread = np.array([0, 1, 1, 2, 3, 3])
    session = np.array([0, 0, 0, 1, 1, 1])
    s = gate_signals(alpha, thread, session, k=3)  # top 3: units 1, 2, 3 (the tie goes to the lower unit)
    assert s == pytest.approx({"threads": 2 / 3, "sessions": 2 / 3, "flat": 0.5})
    s = gate_signals(alpha, thread, session, k=4)  # + unit 5
    assert s == pytest.approx({"threads": 3 / 4, "sessions": 2 / 4, "flat": 0.4})


def test_a_k_past_the_bank_and_a_non_positive_top_are_safe():
    s = gate_signals(np.array([0.0, 0.0]), np.array([0, 1]), np.array([0, 0]), k=8)
    assert s == {"threads": 1.0, "sessions": 0.5, "flat": 0.0}


def test_the_gate_passes_a_signal_at_the_threshold_and_mixes_records():
    sig = [{"threads": 6 / 8}, {"threads": 5 / 8}, {"threads": 1.0}]
    on = gated(sig, "threads", 0.75)
    assert on.tolist() == [True, False, True]
    assert mixed(on, ["a0", "a1", "a2"], ["d0", "d1", "d2"]) == ["a0", "d1", "a2"]


def test_auc_orders_the_positive_questions_signals_above_the_others():
    score = np.array([0.9, 0.8, 0.1, 0.8])
    pos = np.array([True, True, False, False])
    assert auc(score, pos) == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    assert auc(score, ~pos) == pytest.approx(1 - (1 + 1 + 1 + 0.5) / 4)
