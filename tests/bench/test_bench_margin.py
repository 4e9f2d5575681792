"""The margin bootstrap of ``benchmarks/bench_equal_tokens.py`` (how sure a dev set is of a
macro-recall margin), against the macro computed by hand."""
import numpy as np
import pytest

from benchmarks.bench_equal_tokens import margin_bootstrap


class _DS:
    def cat_name(self, c):
        return f"type{c}"


def _recs(cats, recalls):
    return [{"cat": c, "recall": r} for c, r in zip(cats, recalls)]


def test_margin_is_the_macro_difference_and_its_interval_holds_it():
    rng = np.random.default_rng(3)
    cats = rng.integers(1, 4, size=57)
    ours, theirs = rng.random(57), rng.random(57) * 0.8
    m = margin_bootstrap(_DS(), _recs(cats, ours), _recs(cats, theirs), n_boot=2000)
    macro = lambda r: np.mean([r[cats == c].mean() for c in np.unique(cats)])  # noqa: E731
    assert m["margin"] == pytest.approx(macro(ours) - macro(theirs), abs=1e-12)
    assert m["ci95"][0] < m["margin"] < m["ci95"][1]
    assert sum(m["questions_better_worse_equal"]) == 57
    # one question of a category moves the macro by 1 / (its size x the number of categories)
    for c in np.unique(cats):
        assert m["one_question_moves_macro_by"][f"type{c}"] == pytest.approx(1 / (cats == c).sum() / 3)


def test_equal_methods_give_a_zero_margin_and_a_point_interval():
    cats = [1, 1, 2, 2, 2]
    r = _recs(cats, [0.5, 1.0, 0.0, 1.0, 0.25])
    m = margin_bootstrap(_DS(), r, r, n_boot=500)
    assert m["margin"] == 0.0 and m["ci95"] == [0.0, 0.0]
    assert m["p_above_0"] == 0.0 and m["questions_better_worse_equal"] == [0, 0, 5]


def test_a_sure_margin_is_sure():
    cats = [1] * 40 + [2] * 40
    m = margin_bootstrap(_DS(), _recs(cats, [1.0] * 80), _recs(cats, [0.0] * 80), n_boot=500)
    assert m["margin"] == 1.0 and m["p_at_least_3_points"] == 1.0 and m["ci95"] == [1.0, 1.0]


def test_bridge_hit_bootstrap_and_kept_summary():
    """``bench_bridge.py``: the target-category hit margin is the mean paired difference on that
    category alone, with the questions won and lost; the report keeps a hand-written summary."""
    from benchmarks.experiments.bench_bridge import hit_bootstrap
    from benchmarks.experiments.bridge_report import markdown

    ours = [{"cat": c, "hit": h} for c, h in ((1, 1.0), (1, 0.0), (1, 1.0), (2, 0.0), (1, 1.0))]
    theirs = [{"cat": c, "hit": h} for c, h in ((1, 0.0), (1, 1.0), (1, 1.0), (2, 1.0), (1, 0.0))]
    m = hit_bootstrap(ours, theirs, 1, n_boot=500)
    assert m["margin"] == pytest.approx(0.25) and m["n"] == 4 and m["won_lost"] == [2, 1]
    assert m["ci95"][0] <= m["margin"] <= m["ci95"][1]
    assert hit_bootstrap(ours, theirs, 3) == {}
    prev = "# old\n\n<!-- summary -->\nwhat we found\n<!-- /summary -->\n\nold tables"
    md = markdown({}, prev)
    assert "what we found" in md and "old tables" not in md
    assert "<!-- summary -->" not in markdown({}, "no block here")
