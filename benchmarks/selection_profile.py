"""What kind of units a config selects under a token budget: units per question, their length,
and how often the same units recur across questions (LoCoMo dev, T = 800 by default).

    python -m benchmarks run selection_profile [--data PATH] [--T 800] [--rounds 11] [--out benchmarks/results/selection_profile.json]

With ``--rounds N`` it also times both configs in the batched engine (one thread, all questions
per call, the configs alternating over N rounds), at T and at B = 16: median queries/s and the
median per-round ratio.

Compares the defaults with the defaults before the equal-token work (benchmarks/results/quality.md);
descriptive only (the shipped affinity weights, fitted on this data, not held out).
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

from . import harness


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=harness.dev_data("locomo"))
    ap.add_argument("--T", type=int, default=800)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--out", type=Path, help="result file (default: selection_profile.json in the results folder)")
    a = ap.parse_args()
    harness.require_data(a.data)
    out = harness.out_file(a.out, "selection_profile.json")
    with harness.pin_threads(1):
        return run(a, out)


def run(a, out: Path) -> int:
    from trawmem_gpu.head.relevance import load_labelled
    from trawmem_gpu.select import SelectionEngine
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams

    qs, ctxs = load_labelled(a.data, dataset="locomo")
    banks = [c.bank for c in ctxs.values()]
    configs = {"previous defaults": SelectConfig(affinity="rrf", w_aff=1.0, knapsack="best", headings="gist"),
               "defaults": SelectConfig()}
    engs = {n: SelectionEngine(banks, c, threads=1) for n, c in configs.items()}  # one per method config
    at_T = QueryParams(token_budget=a.T, budget=None)
    res = {"data": str(a.data.name), "T": a.T, "questions": len(qs), "configs": {}}
    for name, eng in engs.items():
        picks = eng.select_units(
            [q.bank_id for q in qs], [q.extra["question"] for q in qs], np.stack([q.extra["z"] for q in qs]),
            dates=[q.extra["date"] for q in qs], params=at_T)
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
    if a.rounds:
        args = ([q.bank_id for q in qs], [q.extra["question"] for q in qs], np.stack([q.extra["z"] for q in qs]))
        dates = [q.extra["date"] for q in qs]
        res["speed"] = {}
        for mode, params in (("T", at_T), ("B16", QueryParams(budget=16))):
            for e in engs.values():
                e.select_units(*args, dates=dates, params=params)  # warm: numba, tables
            qps = {n: [] for n in engs}
            for _ in range(a.rounds):
                for n, e in engs.items():
                    t0 = time.perf_counter()
                    e.select_units(*args, dates=dates, params=params)
                    qps[n].append(len(qs) / (time.perf_counter() - t0))
            ratio = [d / p for d, p in zip(qps["defaults"], qps["previous defaults"])]
            res["speed"][mode] = {"qps_median": {n: float(np.median(v)) for n, v in qps.items()},
                                  "ratio_defaults_over_previous_median": float(np.median(ratio)),
                                  "ratio_p25_p75": [float(np.percentile(ratio, 25)), float(np.percentile(ratio, 75))]}
            print(mode, res["speed"][mode], flush=True)
    print(f"-> {harness.save(out.stem, res, out_dir=out.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
