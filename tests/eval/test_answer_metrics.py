"""Answer metrics on hand-worked examples."""
from __future__ import annotations

import math

import pytest

from trawmem_gpu.eval.answer_metrics import aggregate, bleu1, f1_locomo, f1_set, is_refusal, normalize_locomo


def test_normalize_articles_punctuation():
    assert normalize_locomo("The cat, and a dog!") == "cat dog"
    assert normalize_locomo("  An   apple's pie.  ") == "apples pie"
    assert f1_locomo("the Eiffel Tower.", "Eiffel tower", 4) == 1.0


def test_porter_stemming():
    assert f1_locomo("running", "runs", 4) == 1.0  # both stem to "run"
    assert f1_set("running", "runs") == 0.0  # the set variant does not stem


def test_counted_vs_set_f1_on_repeated_tokens():
    # pred "paris paris london" vs gold "paris": counted overlap 1 -> P=1/3, R=1 -> F1=0.5;
    # set overlap: pred set {paris, london} -> P=1/2, R=1 -> F1=2/3
    assert f1_locomo("paris paris london", "paris", 4) == pytest.approx(0.5)
    assert f1_set("paris paris london", "paris") == pytest.approx(2 / 3)


def test_partial_overlap():
    # pred "went to paris in may" (after normalization 5 tokens), gold "paris" -> P=1/5 R=1 -> 1/3
    assert f1_locomo("went to Paris in May", "Paris", 4) == pytest.approx(1 / 3)
    assert f1_locomo("", "Paris", 4) == 0.0 and f1_set("", "Paris") == 0.0


def test_category1_comma_split():
    # gold parts: "hiking", "painting"; pred parts: "painting", "swimming"
    # hiking -> best 0, painting -> best 1 -> mean 0.5
    assert f1_locomo("painting, swimming", "hiking, painting", 1) == pytest.approx(0.5)
    # category 4 (no split): stems "paint swim" vs "hike paint": 1 common of 2 and 2 -> 0.5
    assert f1_locomo("painting, swimming", "hiking, painting", 4) == pytest.approx(0.5)
    # gold "cat" -> best part "black cat": P=1/2, R=1 -> 2/3; gold "dog" -> "dog": 1
    assert f1_locomo("dog, black cat", "cat, dog", 1) == pytest.approx((2 / 3 + 1.0) / 2)


def test_category3_semicolon_cut():
    gold = "Likely yes; she mentioned enjoying it"
    assert f1_locomo("likely yes", gold, 3) == 1.0
    assert f1_locomo("likely yes", gold, 4) < 1.0


def test_category5_refusal():
    assert f1_locomo("This is not mentioned in the conversation.", "anything", 5) == 1.0
    assert f1_locomo("No information available", "x", 5) == 1.0
    assert f1_locomo("Paris", "x", 5) == 0.0
    assert is_refusal("The info is NOT available")


def test_bleu1_hand_computed():
    # pred 3 tokens all matching, reference 6 tokens: p1 = 1, BP = exp(1 - 6/3) = e^-1
    assert bleu1("the cat sat", "the cat sat on the mat") == pytest.approx(math.exp(-1))
    # pred 3 tokens, 1 match, reference 2 tokens: p1 = 1/3, BP = 1
    assert bleu1("a x y", "a b") == pytest.approx(1 / 3)
    # case-insensitive exact match
    assert bleu1("Paris", "paris") == pytest.approx(1.0)
    # repeated prediction token is clipped: pred "paris paris" vs "paris" -> p1 = 1/2, BP = 1
    assert bleu1("paris paris", "paris") == pytest.approx(0.5)
    assert bleu1("", "paris") == 0.0 and bleu1("x", "") == 0.0
    assert bleu1("x", "a b") == 0.0  # no unigram match


def test_aggregate_macro_over_categories():
    recs = [
        {"category": 1, "f1_locomo": 1.0, "f1_set": 1.0, "bleu1": 1.0, "judge": 1},
        {"category": 1, "f1_locomo": 0.0, "f1_set": 0.0, "bleu1": 0.0, "judge": 0},
        {"category": 2, "f1_locomo": 1.0, "f1_set": 0.5, "bleu1": 0.5, "judge": 1},
        {"category": 5, "f1_locomo": 0.0, "f1_set": 0.0, "bleu1": 0.0, "judge": 0},
        {"category": 4, "f1_locomo": 0.25, "f1_set": 0.25, "bleu1": 0.25, "judge": None},
    ]
    agg = aggregate(recs)
    per = agg["per_category"]
    assert list(per) == ["1", "2", "4", "5"]
    assert per["1"] == {"n": 2, "f1_locomo": 0.5, "f1_set": 0.5, "bleu1": 0.5, "judge": 0.5}
    assert per["4"]["judge"] is None
    macro = agg["macro"]
    assert macro["categories"] == [1, 2, 4] and macro["n"] == 4
    assert macro["f1_locomo"] == pytest.approx((0.5 + 1.0 + 0.25) / 3)  # category 5 excluded
    assert macro["judge"] == pytest.approx((0.5 + 1.0) / 2)  # category 4 has no judge values
    assert aggregate([])["macro"]["f1_locomo"] is None
