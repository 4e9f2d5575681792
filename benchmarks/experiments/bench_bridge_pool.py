"""The candidate pool widened by the query's top units of the whole bank (issue 25, a bridge idea):
``SelectConfig.pool_top_affinity = M`` on the NumPy reference (``git apply
docs/examples/pool-top-affinity.patch``: measured, not shipped), at equal context tokens against
the RRF hybrid and the shipped defaults.

    python -m benchmarks.experiments.bench_bridge_pool [--T 400,800] [--lme-T 400,800] [--M 8,16,32]
        [--max-questions N] [--out-dir benchmarks/results/archive]

Protocol of ``bench_bridge.py`` (its folds, its per-fold learned affinity, its paired bootstraps):
each M is scored on every fold; the nested row chooses per fold, among the defaults (M = 0) and
the Ms, the one with the best mean (over the sets run at that T) macro recall on the other folds,
and scores it on the fold. Writes ``bridge_pool.json`` under ``--out-dir`` (one entry per ``--source``).
"""
from __future__ import annotations

import sys
import time

import numpy as np

from .. import harness
from .bench_bridge import TARGET_CAT, compare, dev_checked, dev_parser, dev_sets, fold_weights, nested
from ..equal_tokens_bench.data import Dataset, fixed_setting, select, trawmem_setting
from ..equal_tokens_bench.stats import records, summary


def reference_picks(ds: Dataset, W, T: int, source: str = "affinity", **kw) -> tuple:
    """Every question's picks by ``select_reference`` with the fold's config and ``kw``; prototypes:
    ``source = "hybrid"``, the added units are the hybrid's top ones instead of the affinity's;
    ``"affinity-low-r"``, an added thread's r~ is the lowest r~ of H_q instead of its seed score."""
    import trawmem_gpu.select.reference as R
    from trawmem_gpu.select.baselines import ranking

    setting = trawmem_setting(W, T=T, **kw)
    orig, score = R.step3.widen_pool, {}

    def by_hybrid(unit_thread, cand, r_t, r0, alpha, m):
        return orig(unit_thread, cand, r_t, r0, score["s"], m)

    def low_r(unit_thread, cand, r_t, r0, alpha, m):  # an added thread's r~: the lowest of H_q's
        return orig(unit_thread, cand, r_t, np.full(len(r0), min(r_t.values())), alpha, m)

    out = []
    if source != "affinity":
        R.step3.widen_pool = by_hybrid if source == "hybrid" else low_r
    try:
        for q in ds.questions:
            cfg, qp = setting(q.group)
            ctx, z = ds.ctxs[q.bank_id], np.asarray(q.extra["z"], np.float64)
            if source == "hybrid":
                s = np.zeros(ctx.bank.n_units)
                order = ranking("hybrid", ctx, q.extra["question"], z)
                s[np.asarray(order, np.int64)] = -np.arange(len(order), dtype=np.float64) - 1.0
                score["s"] = s - (len(order) + 1) * (s == 0)
            out.append(R.select_reference(ctx, q.extra["question"], z, cfg, qp, now=q.extra["date"]).units)
    finally:
        R.step3.widen_pool = orig
    return out, cfg.headings


def main() -> int:
    ap = dev_parser(__doc__, "400,800")
    ap.add_argument("--lme-T", default="400,800")
    ap.add_argument("--M", default="8,16,32")
    ap.add_argument("--sets", default="locomo,longmemeval")
    ap.add_argument("--source", choices=("affinity", "hybrid", "affinity-low-r"), default="affinity",
                    help="which ranking the added units come from (hybrid: a prototype; affinity-low-r: the "
                         "affinity's, an added thread's r~ the lowest of H_q's, a prototype)")
    a = ap.parse_args()
    from trawmem_gpu.select.config import SelectConfig

    if "pool_top_affinity" not in SelectConfig.__dataclass_fields__:
        ap.error("needs SelectConfig.pool_top_affinity, which the package does not ship: "
                 "git apply docs/examples/pool-top-affinity.patch")
    dev_checked(a)
    Ms = [int(x) for x in a.M.split(",")]
    paths = {"locomo": a.locomo, "longmemeval": a.lme}
    with harness.pin_threads(1):
        data = {n: Dataset(n, paths[n]) for n in a.sets.split(",")}
        W = fold_weights(dev_sets(a))
        Ts = {"locomo": [int(x) for x in a.T.split(",")], "longmemeval": [int(x) for x in a.lme_T.split(",")]}
        cache: dict = {}
        res = {"protocol": __doc__, "machine": harness.machine(), "source": a.source, "cells": {}}
        for n, ds in data.items():
            for T in Ts[n]:
                for label, fn in [("hybrid", lambda: select(ds, "hybrid", fixed_setting(T=T))),
                                  ("defaults", lambda: select(ds, "trawmem", trawmem_setting(W, T=T)))] + [
                                  (f"M={m}", lambda m=m: reference_picks(ds, W, T, a.source, pool_top_affinity=m)) for m in Ms]:
                    t0 = time.perf_counter()
                    picks = fn()
                    recs = records(ds, picks)
                    cache[(n, T, label)] = {"records": recs, "summary": summary(ds, recs)}
                    s = cache[(n, T, label)]["summary"]
                    print(f"{n} T={T} {label}: recall {s['macro']['recall']:.3f} target hit "
                          f"{s['per_category'][ds.cat_name(TARGET_CAT[n])]['hit']:.3f} ({time.perf_counter() - t0:.0f}s)",
                          flush=True)
                    if label.startswith("M="):
                        res["cells"][f"{n}@{T}|{label}"] = cell(ds, cache, n, T, label, recs)
        labels = ["defaults"] + [f"M={m}" for m in Ms]
        for T in sorted({t for n in data for t in Ts[n]}):
            sub = {n: ds for n, ds in data.items() if T in Ts[n]}
            nest = nested(sub, cache, T, labels)
            for n, recs in nest["records"].items():
                res["cells"][f"{n}@{T}|nested"] = {**cell(data[n], cache, n, T, "nested", recs),
                                                   "chosen": nest["chosen"], "over": sorted(sub)}
    with harness.locked("bridge_pool", a.out_dir) as old:  # one entry per source, the others kept
        old[a.source] = {**res, "command": harness.command()}
        harness.save("bridge_pool", old, out_dir=a.out_dir)
    for k, c in res["cells"].items():
        print(k, {x: round(c[x], 4) if isinstance(c[x], float) else c[x] for x in ("recall", "target_hit")},
              "vs defaults", fmt(c["vs_defaults"]["macro_recall"]), "hit vs hybrid", fmt(c["vs_hybrid"]["target_hit"]),
              c.get("chosen", ""))
    return 0


def cell(ds, cache, n, T, label, recs) -> dict:
    s = summary(ds, recs)
    return {"recall": s["macro"]["recall"], "target_hit": s["per_category"][ds.cat_name(TARGET_CAT[n])]["hit"],
            "tokens": s["macro"]["tokens"], "vs_defaults": compare(ds, recs, cache[(n, T, "defaults")]["records"]),
            "vs_hybrid": compare(ds, recs, cache[(n, T, "hybrid")]["records"])}


def fmt(m: dict) -> str:
    return f"{100 * m['margin']:+.1f} [{100 * m['ci95'][0]:+.1f}, {100 * m['ci95'][1]:+.1f}]" if m else "-"


if __name__ == "__main__":
    sys.exit(main())
