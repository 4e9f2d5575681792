"""What kind of units a config selects under a token budget: units per question, their length,
and how often the same units recur across questions (LoCoMo dev, T = 800 by default).

    python benchmarks/selection_profile.py [--data PATH] [--T 800] [--out benchmarks/results/selection_profile.json]

Compares the defaults with the defaults before the equal-token work (README "Equal tokens");
descriptive only (the shipped affinity weights, fitted on this data, not held out).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json")
    ap.add_argument("--T", type=int, default=800)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "selection_profile.json")
    a = ap.parse_args()
    from trawmem_gpu.head.relevance import load_labelled
    from trawmem_gpu.select import SelectionEngine
    from trawmem_gpu.select.config import SelectConfig

    qs, ctxs = load_labelled(a.data, dataset="locomo")
    banks = [c.bank for c in ctxs.values()]
    configs = {"previous defaults": SelectConfig(affinity="rrf", w_aff=1.0, knapsack="best", headings="gist"),
               "defaults": SelectConfig()}
    res = {"data": str(a.data.name), "T": a.T, "questions": len(qs), "configs": {}}
    for name, cfg in configs.items():
        cfg = SelectConfig.from_dict(cfg.to_dict() | {"token_budget": a.T, "budget": None})
        picks = SelectionEngine(banks, cfg).select_units(
            [q.bank_id for q in qs], [q.extra["question"] for q in qs], np.stack([q.extra["z"] for q in qs]),
            dates=[q.extra["date"] for q in qs])
        words, uses = [], collections.Counter()
        for q, p in zip(qs, picks):
            for u in p:
                words.append(len(ctxs[q.bank_id].bank.turns[u].text.split()))
                uses[(q.bank_id, u)] += 1
        w = np.array(words)
        top = uses.most_common(50)
        res["configs"][name] = {
            "units_per_question": round(len(w) / len(qs), 2), "median_words_per_unit": float(np.median(w)),
            "share_of_units_with_at_most_6_words": round(float(np.mean(w <= 6)), 4),
            "share_of_picks_on_the_50_most_reused_units": round(sum(c for _, c in top) / len(w), 4),
            "mean_words_of_the_50_most_reused_units": round(float(np.mean(
                [len(ctxs[b].bank.turns[u].text.split()) for (b, u), _ in top])), 1)}
        print(name, res["configs"][name], flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
