"""Selection quality at equal context tokens on both dev sets, every learned part validated on
held-out folds (issue 12).

    python -m benchmarks run equal_tokens [--locomo PATH] [--lme PATH] [--T 400,800,1600]
        [--parts fit,grid,headline,margin,ablations] [--out-dir benchmarks/results]

Protocol (nothing is tuned on what it is scored on):

* **Folds.** LoCoMo dev: one fold per conversation (7); LongMemEval-S dev: 5 folds of questions
  (a seeded shuffle; abstention questions and questions without a gold user turn are left out,
  as the official protocol does). 12 folds in all.
* **The learned affinity** (``SelectConfig.relevance_weights``) of a fold is fitted on the
  other 11 folds of *both* data sets (``head.relevance.cross_validate``; every data set and every
  question weighs the same). The shipped weights (``DEFAULT_RELEVANCE_WEIGHTS``) are fitted on
  all 12 (part ``fit``); a test keeps the config equal to what this script wrote.
* **The rendering and the objective's weights under a token budget** (part ``grid``): a small
  grid (thread headings x knapsack rule x ``w_aff``) is scored per fold at the target budgets (T = 800 on LoCoMo, T = 400 on
  LongMemEval); for each fold the setting that does best on the *other* folds (mean of the two
  data sets' macro recall) is the one scored on it (nested leave-one-fold-out), and the
  setting chosen most often is the default.
* **Baselines** need no fitting: cosine, BM25 and the RRF hybrid in their strongest standard
  configuration (bm25s with English stop words and the Snowball stemmer over the embedded text,
  RRF k = 60 over the full dense ranking and the BM25 positives), each filling T in rank order
  (``fill="skip"``).
* **Margin** (part ``margin``): TrawMem minus the hybrid in macro recall at each T, with a paired
  bootstrap over questions stratified by category / type (95% interval, the chance of a margin
  of 3 points or more) and the metric's resolution (what one question moves the macro by).
* **Metrics**: macro evidence recall over LoCoMo categories 1-4 / LongMemEval question types,
  all-evidence hit, multi-hop (LoCoMo category 1) all-evidence hit, context tokens (cl100k_base,
  the rendered workspace, headings included), per category / type and per fold.

Writes ``equal_tokens.json`` (every table), ``equal_tokens.md`` and ``equal_tokens.png`` under
``--out-dir`` (or ``TRAWMEM_BENCH_OUT``); ``--parts fit`` also writes the shipped weights with
their provenance to their one home, the package's ``trawmem_gpu/select/affinity_weights.json``
(read by ``SelectConfig``), or to ``--weights-out``. The parts live in ``benchmarks/equal_tokens_bench/``.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from . import harness
from .equal_tokens_bench.data import (GRID, HEADLINE, PREVIOUS, TARGET_T, BASELINES, Dataset, fixed_setting, select,
                                     trawmem_setting)
from .equal_tokens_bench.report import fmt, markdown, plot
from .equal_tokens_bench.stats import losses, margin_bootstrap, nested_ablation_choice, records, score, summary

PARTS = ("fit", "grid", "headline", "margin", "ablations")
__all__ = ["margin_bootstrap", "main"]  # margin_bootstrap: tests/bench/test_bench_margin.py


def shipped_weights_path() -> Path:
    """The shipped affinity weights' one home: the package data file ``SelectConfig`` reads."""
    from trawmem_gpu.select.config import WEIGHTS_PATH

    return WEIGHTS_PATH


ABLATION_VARIANTS = [("defaults", {}), ("affinity rrf (hand-set fusion)", {"__rrf": True}),
                     ("alpha ranking only (no set selection)", {"__alpha": True}),
                     ("headings: date and gist", {"headings": "gist"}),
                     ("headings: none (a date on every line)", {"headings": "none"}),
                     ("knapsack best", {"knapsack": "best"}), ("knapsack gain", {"knapsack": "gain"}),
                     ("w_aff 1 (paper's weights)", {"w_aff": 1.0}),
                     ("no coverage term (w_cov 0)", {"w_cov": 0.0}), ("no role term (w_role 0)", {"w_role": 0.0}),
                     ("no thread term (w_thr 0)", {"w_thr": 0.0}),
                     ("seed_only", {"ablation": "seed_only"}), ("no_cross_edges", {"ablation": "no_cross_edges"}),
                     ("no_role_conditioning", {"ablation": "no_role_conditioning"}),
                     ("identity_k", {"ablation": "identity_k"}), ("no_multi_thread", {"ablation": "no_multi_thread"}),
                     ("hops 2", {"hops": 2})]
"""The ablation table's rows: a label and the setting it changes from the defaults (``__rrf``:
the hand-set fusion; ``__alpha``: the affinity ranking alone, no set selection)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=harness.dev_data("locomo"))
    ap.add_argument("--lme", type=Path, default=harness.dev_data("longmemeval"))
    ap.add_argument("--T", default="400,800,1600")
    ap.add_argument("--parts", default="fit,grid,headline,margin,ablations")
    ap.add_argument("--out-dir", type=Path, help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    ap.add_argument("--weights-out", type=Path, default=shipped_weights_path(),
                    help="where --parts fit writes the shipped weights (default: the package's, %(default)s)")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    bad = sorted(parts - set(PARTS))
    if bad:
        ap.error(f"--parts: unknown part {bad[0]!r}; choose from {', '.join(PARTS)}")
    harness.require_data(a.locomo, "locomo", "--locomo")
    harness.require_data(a.lme, "longmemeval", "--lme")
    a.out_dir = harness.results_dir(a.out_dir)
    with harness.pin_threads(1):
        return run(a, parts, [int(x) for x in a.T.split(",")])


def grid_part(data: dict, W: dict) -> tuple[dict, dict]:
    """The objective's weights under T (``GRID``), chosen per fold on the other folds (nested
    leave-one-fold-out): the grid's table, and the setting most folds chose (the default)."""
    grid = []
    for setting in GRID:
        row = {"setting": setting}
        for name, ds in data.items():
            T = TARGET_T[name]
            row[name] = score(ds, select(ds, "trawmem", trawmem_setting(W, T=T, **setting)))
        grid.append(row)
        print("grid", setting, {n: round(row[n]["macro"]["recall"], 4) for n in data}, flush=True)
    folds = [(n, g) for n, d in data.items() for g in d.groups]
    pick = {}
    for n, g in folds:
        def others(row):  # mean over the two data sets of the macro recall on every other fold
            return np.mean([np.mean([row[m]["per_fold"][h]["recall"] for h in data[m].groups if h != g])
                            for m in data])
        pick[g] = max(range(len(grid)), key=lambda i: (others(grid[i]), -i))
    counts = defaultdict(int)
    for i in pick.values():
        counts[i] += 1
    best = max(counts, key=lambda i: (counts[i], -i))
    chosen = GRID[best]
    out = {"settings": GRID, "rows": [{"setting": r["setting"], **{n: r[n]["macro"] for n in data}} for r in grid],
           "chosen_per_fold": {g: GRID[i] for g, i in pick.items()}, "default": chosen}
    nested = {}
    for n, ds in data.items():
        vals = [grid[pick[g]][n]["per_fold"][g]["recall"] for g in ds.groups]
        nested[n] = {"fold_recall": dict(zip(ds.groups, vals))}
    out["nested"] = nested
    print("chosen per fold:", {g: GRID[i] for g, i in pick.items()}, "-> default", chosen, flush=True)
    return out, chosen


def ablations_part(data: dict, W: dict, chosen: dict) -> list[dict]:
    """Each of ``ABLATION_VARIANTS`` from the chosen defaults, scored at each set's target T."""
    abl = []
    base = dict(chosen)
    for label, v in ABLATION_VARIANTS:
        row = {"variant": label}
        for name, ds in data.items():
            T = TARGET_T[name]
            if v.get("__rrf"):
                cfg, m = fixed_setting(T=T, affinity="rrf", **base), "trawmem"
            elif v.get("__alpha"):
                cfg, m = trawmem_setting(W, T=T), "alpha-rank"
            else:
                cfg, m = trawmem_setting(W, T=T, **{**base, **v}), "trawmem"
            row[name] = score(ds, select(ds, m, cfg))
        abl.append(row)
        print(f"ablation {label:>40}: " + " | ".join(f"{n}@{TARGET_T[n]} {fmt(row[n]['macro'])}" for n in data),
              flush=True)
    return abl


def save_results(res: dict, parts: set, seconds: float, out_dir) -> None:
    """``res`` merged into ``equal_tokens.json`` (a partial run keeps the other parts' tables),
    with ``equal_tokens.md`` and ``.png``."""
    full = set(PARTS) <= parts
    seconds = round(seconds, 1)
    res["seconds" if full else "seconds_" + "_".join(sorted(parts))] = seconds
    with harness.locked("equal_tokens", out_dir) as old:  # a partial run keeps the other parts' tables
        old.update(res)
        if "ablations" in old:
            old["ablation_nested"] = nested_ablation_choice(old)
        harness.write_text(out_dir / "equal_tokens.md", markdown(old))
        out = harness.save("equal_tokens", old, plot(old), out_dir=out_dir, dpi=120)
    print(f"wrote {out} ({seconds:.0f}s)")


def run(a, parts: set, Ts: list[int]) -> int:
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.head.relevance import cross_validate, fit_relevance, save_weights
    from trawmem_gpu.select.config import RELEVANCE_FEATURES

    t_all = time.perf_counter()
    data = {"locomo": Dataset("locomo", a.locomo), "longmemeval": Dataset("longmemeval", a.lme)}
    allq = [q for d in data.values() for q in d.questions]
    res: dict = {"protocol": __doc__, "machine": harness.machine(), "features": list(RELEVANCE_FEATURES),
                 "data": {k: {"path": os.path.relpath(d.path, harness.ROOT), "sha256": file_sha256(d.path), "questions": len(d.questions),
                              "folds": d.groups} for k, d in data.items()}}
    t0 = time.perf_counter()
    W = cross_validate(allq)
    res["fold_weights"] = {g: list(w) for g, w in W.items()}
    print(f"fold weights fitted in {time.perf_counter() - t0:.0f}s", flush=True)
    if "fit" in parts:
        shipped = fit_relevance(allq)
        res["shipped_weights"] = list(shipped)
        wrote = save_weights(a.weights_out, shipped,
                             {"data": [{"path": os.path.relpath(d.path, harness.ROOT),
                                        "sha256": res["data"][k]["sha256"], "questions": len(d.questions)}
                                       for k, d in data.items()],
                              "command": "python benchmarks/bench_equal_tokens.py --parts fit"})
        print(f"wrote {wrote}")
        print("shipped weights:", ", ".join(f"{n} {w:.4g}" for n, w in zip(RELEVANCE_FEATURES + ("bias",), shipped)))
    chosen = {}
    if "grid" in parts:  # nested leave-one-fold-out over the objective's weights under T
        res["grid"], chosen = grid_part(data, W)
    chosen = chosen or dict(headings="date", knapsack="gain", w_aff=16.0)
    picked: dict = {}

    def picks_of(name: str, method: str, T, cfg) -> tuple:
        """(selection, records) of ``method`` on ``name`` at ``T``, once per run: the headline and
        the margin share TrawMem's and the hybrid's."""
        key = (name, method, T)
        if key not in picked:
            ds = data[name]
            sel = select(ds, "trawmem" if method.startswith("trawmem") else method, cfg)
            picked[key] = (sel, records(ds, sel))
        return picked[key]

    if "headline" in parts:
        rows = []
        for T in Ts + [None]:
            for method in HEADLINE:
                row = {"method": method, "T": T, "B": None if T else 16}
                for name, ds in data.items():
                    if method in BASELINES:
                        cfg = fixed_setting(T=T)
                    elif method == "trawmem-previous":
                        cfg = fixed_setting(T=T, **PREVIOUS)
                    elif method == "trawmem-rrf":
                        cfg = fixed_setting(T=T, **{**chosen, "affinity": "rrf"})
                    else:
                        cfg = trawmem_setting(W, T=T, **chosen)
                    row[name] = summary(ds, picks_of(name, method, T, cfg)[1])
                rows.append(row)
                print(f"T={T} {method:>12}: " + " | ".join(f"{n} {fmt(row[n]['macro'])}" for n in data), flush=True)
        res["headline"] = rows
    if "margin" in parts:  # how sure the dev sets are of TrawMem's margin over the hybrid
        res["margin"] = {}
        for T in Ts:
            for name, ds in data.items():
                cfg = trawmem_setting(W, T=T, **chosen)
                ours_sel, ours = picks_of(name, "trawmem", T, cfg)
                theirs_sel, theirs = picks_of(name, "hybrid", T, fixed_setting(T=T))
                m = res["margin"][f"{name}@{T}"] = margin_bootstrap(ds, ours, theirs)
                m["losses"] = losses(ds, ours_sel[0], theirs_sel[0], cfg)
                print(f"margin {name} T={T}: {100 * m['margin']:+.1f} points, 95% CI "
                      f"[{100 * m['ci95'][0]:+.1f}, {100 * m['ci95'][1]:+.1f}], P(>= +3) {m['p_at_least_3_points']:.2f}, "
                      f"better/worse/equal {m['questions_better_worse_equal']}", flush=True)
    if "ablations" in parts:
        res["ablations"] = ablations_part(data, W, chosen)
    save_results(res, parts, time.perf_counter() - t_all, a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
