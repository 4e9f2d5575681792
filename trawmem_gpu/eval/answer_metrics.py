"""Answer-quality metrics: LoCoMo F1, set F1 (A-MEM/Mem0/SimpleMem), BLEU-1, aggregation.

Two F1 variants are kept apart and labelled because published numbers use both:

* ``f1_locomo`` follows the original LoCoMo scorer: normalize (drop commas, lowercase, strip
  punctuation, drop the words a/an/the/and as that scorer does, fix whitespace), Porter-stem,
  counted token overlap; category 1 splits gold and prediction on ',' and averages over gold
  parts the best prediction part's F1; category 3 cuts the gold answer at the first ';';
  category 5 (opt-in) is a refusal check.
* ``f1_set`` is the variant later systems copied: lowercase, blank out ``. , ! ?``, split on
  whitespace, set overlap.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Optional

from nltk.stem import PorterStemmer
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

_STEMMER = PorterStemmer()
_PUNCT = set(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the|and)\b")
"""Words the LoCoMo normalizer removes (its 'articles' pattern includes 'and')."""

REFUSAL_PHRASES = (
    "not mentioned", "no information available", "not available", "no information",
    "not specified", "not stated", "does not mention", "doesn't mention", "not provided",
    "no mention", "unknown",
)
"""Category-5 refusal check: a prediction containing any of these scores 1."""

METRIC_KEYS = ("f1_locomo", "f1_set", "bleu1", "judge")
"""Per-record metric keys that ``aggregate`` averages."""

MACRO_CATEGORIES = ("1", "2", "3", "4")
"""Categories averaged into the macro figure (5, adversarial, is reported per category only)."""


def normalize_locomo(s: object) -> str:
    """LoCoMo normalization: drop commas, lowercase, strip punctuation, drop a/an/the/and, fix spaces."""
    s = str(s).replace(",", "").lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def _stems(s: object) -> list[str]:
    return [_STEMMER.stem(w) for w in normalize_locomo(s).split()]


def _counted_f1(pred_toks: list[str], gold_toks: list[str]) -> float:
    common = Counter(pred_toks) & Counter(gold_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    p = same / len(pred_toks)
    r = same / len(gold_toks)
    return 2 * p * r / (p + r)


def f1_stemmed(pred: object, gold: object) -> float:
    """LoCoMo token F1 of one prediction against one gold answer (no category rules)."""
    return _counted_f1(_stems(pred), _stems(gold))


def is_refusal(pred: object) -> bool:
    """True when the prediction says the information is not mentioned / not available."""
    p = " ".join(str(pred).lower().split())
    return any(ph in p for ph in REFUSAL_PHRASES)


def f1_locomo(pred: object, gold: object, category) -> float:
    """Original LoCoMo F1 with its per-category rules (see module docstring)."""
    try:
        cat = int(category)
    except (TypeError, ValueError):
        cat = None
    pred = "" if pred is None else str(pred)
    gold = "" if gold is None else str(gold)
    if cat == 5:
        return 1.0 if is_refusal(pred) else 0.0
    if cat == 3:
        gold = gold.split(";")[0].strip()
    if cat == 1:
        preds = [p.strip() for p in pred.split(",")]
        golds = [g.strip() for g in gold.split(",")]
        return sum(max(f1_stemmed(p, g) for p in preds) for g in golds) / len(golds)
    return f1_stemmed(pred, gold)


def _set_tokens(s: object) -> list[str]:
    s = str(s).lower()
    for ch in ".,!?":
        s = s.replace(ch, " ")
    return s.split()


def f1_set(pred: object, gold: object) -> float:
    """Set-overlap F1 on lowercase whitespace tokens (``. , ! ?`` blanked), as A-MEM/Mem0/SimpleMem."""
    pt, gt = set(_set_tokens(pred or "")), set(_set_tokens(gold or ""))
    if not pt or not gt:
        return 0.0
    common = len(pt & gt)
    if common == 0:
        return 0.0
    p, r = common / len(pt), common / len(gt)
    return 2 * p * r / (p + r)


_SMOOTH = SmoothingFunction().method1


def bleu1(pred: object, gold: object) -> float:
    """BLEU-1 (nltk ``sentence_bleu``, weights (1,0,0,0), smoothing method1) on lowercase whitespace tokens."""
    pt = str(pred or "").lower().split()
    gt = str(gold or "").lower().split()
    if not pt or not gt:
        return 0.0
    return float(sentence_bleu([gt], pt, weights=(1, 0, 0, 0), smoothing_function=_SMOOTH))


def all_metrics(pred: object, gold: object, category) -> dict:
    """f1_locomo, f1_set and bleu1 of one answer."""
    return {"f1_locomo": f1_locomo(pred, gold, category), "f1_set": f1_set(pred, gold), "bleu1": bleu1(pred, gold)}


def _mean(xs: list[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def aggregate(records: Iterable[dict], keys: tuple = METRIC_KEYS) -> dict:
    """Per-category means and their macro average over categories 1-4 present.

    ``records`` carry ``category`` and any of ``keys`` (None values are skipped, e.g. no judge).
    Returns ``{"macro": {key: mean|None, "n": N, "categories": [...]}, "per_category": {"1": {key:
    mean|None, "n": n}, ...}}``.
    """
    by_cat: dict[str, list[dict]] = {}
    for r in records:
        by_cat.setdefault(str(r.get("category")), []).append(r)

    def _order(c: str):
        return (0, int(c)) if c.isdigit() else (1, c)

    per: dict[str, dict] = {}
    for c in sorted(by_cat, key=_order):
        rows = by_cat[c]
        d: dict = {"n": len(rows)}
        for k in keys:
            vals = [float(r[k]) for r in rows if r.get(k) is not None]
            d[k] = _mean(vals)
        per[c] = d
    macro_cats = [c for c in MACRO_CATEGORIES if c in per]
    macro: dict = {"n": sum(per[c]["n"] for c in macro_cats), "categories": [int(c) for c in macro_cats]}
    for k in keys:
        macro[k] = _mean([per[c][k] for c in macro_cats if per[c][k] is not None])
    return {"macro": macro, "per_category": per}
