"""Relevance features for the bridge targets (issue 25): what each candidate feature of the learned
affinity does at equal context tokens, and why ``words`` is the one shipped.

    python -m benchmarks.experiments.bench_bridge_features [--T 400,800] [--variants base,len,cap20,...]
        [--out-dir benchmarks/results/archive]

Protocol of ``bench_bridge.py`` (its folds; every number at equal context tokens against the RRF
hybrid, paired bootstraps): for each variant, the affinity's features are the ones before issue 25
(``RELEVANCE_FEATURES`` without ``words``) plus the variant's columns, and the weights of each
fold are fitted on the other 11 folds with those columns (``head.relevance.fit_relevance``). The
NumPy reference selects with that affinity (``select_reference`` with its affinity step
replaced), everything else as the shipped defaults. ``cap20`` is the shipped ``words`` feature:
its picks are checked against the engine's own defaults (they must be the same).

Variants (columns per unit v, all generic: no data set, speaker or phrasing keys):

* ``base``: none (the affinity before ``words``);
* ``len``: log(1 + words of v) (text and caption), uncapped;
* ``cap20`` / ``cap40``: log(1 + min(words, 20 / 40)) (``cap20`` = ``words``, shipped);
* ``q``: 1 when v's text ends with a question mark;
* ``qa``: 1 when v is such a question and the next unit of its session is another speaker's
  (a question someone answered: the answer holds the information);
* ``sess``: the largest cosine to the query among the units of v's session.

Writes ``bridge_features.json`` and ``bridge_features.md`` under ``--out-dir`` (or ``TRAWMEM_BENCH_OUT``).
"""
from __future__ import annotations

import sys
import time
from dataclasses import replace

import numpy as np

from .. import harness
from .bench_bridge import TARGET_CAT, compare, dev_checked, dev_parser, dev_sets
from ..equal_tokens_bench.data import fixed_setting, select, trawmem_setting
from ..equal_tokens_bench.stats import records, summary

VARIANTS = {"base": (), "len": ("len",), "cap20": ("cap20",), "cap40": ("cap40",), "cap20+q": ("cap20", "q"),
            "cap20+qa": ("cap20", "qa"), "cap20+q+sess": ("cap20", "q", "sess")}
SHIPPED = "cap20"
N_BASE = 11
"""The features before issue 25: the first 11 of ``RELEVANCE_FEATURES`` (``words`` is the 12th)."""


def columns(bank, cos: np.ndarray, cols: tuple) -> np.ndarray:
    """``[N, len(cols)]`` the variant's columns for one query over ``bank``."""
    from trawmem_gpu.select.steps.relevance import word_counts

    out, T = [], bank.turns
    for c in cols:
        if c == "len":
            out.append(np.log1p(word_counts(T)))
        elif c.startswith("cap"):
            out.append(np.log1p(np.minimum(word_counts(T), float(c[3:]))))
        elif c == "q":
            out.append(np.array([float((t.text or "").rstrip().endswith("?")) for t in T]))
        elif c == "qa":
            out.append(np.array([float((t.text or "").rstrip().endswith("?") and i + 1 < len(T)
                                       and T[i + 1].session == t.session and T[i + 1].speaker != t.speaker)
                                 for i, t in enumerate(T)]))
        elif c == "sess":
            s = np.array([t.session for t in T])
            m = np.full(s.max() + 1, -np.inf)
            np.maximum.at(m, s, cos)
            out.append(m[s])
        else:
            raise ValueError(f"unknown column {c!r}")
    return np.column_stack(out) if out else np.zeros((len(T), 0))


def variant_affinity(data: dict, cols: tuple):
    """``(W, affinity, cur)``: the variant's weights per fold, its affinity step (the reference's
    signature) and the dict whose ``"w"`` it reads (the weights of the question's fold)."""
    from trawmem_gpu.head.relevance import fit_relevance
    from trawmem_gpu.select.steps import relevance as REL

    aug = [replace(q, F=np.column_stack([q.F[:, :N_BASE], columns(ds.ctxs[q.bank_id].bank, q.F[:, 0], cols)]))
           for ds in data.values() for q in ds.questions]
    groups = sorted({q.group for q in aug})
    W = {g: np.asarray(fit_relevance([q for q in aug if q.group != g])) for g in groups}
    cur = {}

    def affinity(ctx, z, question, cfg, now=float("nan")):
        cos = ctx.bank.unit_vecs.astype(np.float64) @ z
        F = REL.relevance_features(ctx.relevance, cos, ctx.bm25.scores(question), question, now, float(cfg.rrf_k))
        F = np.column_stack([F[:, :N_BASE], columns(ctx.bank, cos, cols)])
        return REL.affinity_from_logits(REL.logits(F, cur["w"]))

    return W, affinity, cur


def run_variant(data: dict, cols: tuple, Ts: list[int], W_shipped) -> dict:
    """``{(set, T): picks}`` of the reference with the variant's affinity, fold by fold."""
    import trawmem_gpu.select.reference as R

    W, affinity, cur = variant_affinity(data, cols)
    orig = R.step3a.unit_affinity
    R.step3a.unit_affinity = affinity
    out = {}
    try:
        for T in Ts:
            for n, ds in data.items():
                setting = trawmem_setting(W_shipped, T=T)
                picks = []
                for q in ds.questions:
                    cur["w"] = W[q.group]
                    cfg, qp = setting(q.group)
                    picks.append(R.select_reference(ds.ctxs[q.bank_id], q.extra["question"],
                                                    np.asarray(q.extra["z"], np.float64), cfg, qp,
                                                    now=q.extra["date"]).units)
                out[(n, T)] = picks
    finally:
        R.step3a.unit_affinity = orig
    return out


def main() -> int:
    from .bench_bridge import fold_weights

    ap = dev_parser(__doc__, "400,800")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    names = a.variants.split(",")
    if set(names) - set(VARIANTS):
        ap.error(f"--variants: unknown {sorted(set(names) - set(VARIANTS))[0]!r}; choose from {', '.join(VARIANTS)}")
    out_dir = dev_checked(a).out_dir
    Ts = [int(x) for x in a.T.split(",")]
    t0 = time.perf_counter()
    with harness.pin_threads(1):
        data = dev_sets(a)
        W_shipped = fold_weights(data)  # the engine's defaults (features with words), fold by fold
        base = {}
        for T in Ts:
            for n, ds in data.items():
                shipped = select(ds, "trawmem", trawmem_setting(W_shipped, T=T))
                base[(n, T)] = (records(ds, select(ds, "hybrid", fixed_setting(T=T))), shipped[0])
        rows, recs = [], {}
        for name in names:
            tv = time.perf_counter()
            picks = run_variant(data, VARIANTS[name], Ts, W_shipped)
            for (n, T), p in picks.items():
                ds = data[n]
                r = records(ds, (p, "date"))
                recs[(name, n, T)] = r
                hyb, shipped = base[(n, T)]
                if name == SHIPPED:
                    same = [list(x) for x in p] == [list(x) for x in shipped]
                    print(f"{n} T={T}: the shipped words feature's picks {'equal' if same else 'DIFFER FROM'} "
                          "the engine's defaults", flush=True)
                s = summary(ds, r)
                cat = ds.cat_name(TARGET_CAT[n])
                row = {"variant": name, "set": n, "T": T, "macro_recall": s["macro"]["recall"],
                       "target_hit": s["per_category"][cat]["hit"],
                       "per_category": {c: v["recall"] for c, v in s["per_category"].items()},
                       "vs_hybrid": compare(ds, r, hyb)}
                if (("base", n, T)) in recs and name != "base":
                    row["vs_base"] = compare(ds, r, recs[("base", n, T)])
                rows.append(row)
                print(f"{name} {n} T={T}: macro {row['macro_recall']:.3f} target hit {row['target_hit']:.3f}", flush=True)
            print(f"{name}: {time.perf_counter() - tv:.0f}s", flush=True)
    res = {"protocol": __doc__, "machine": harness.machine(), "command": harness.command(), "rows": rows,
           "seconds": round(time.perf_counter() - t0, 1)}
    harness.write_text(out_dir / "bridge_features.md", markdown(res))
    out = harness.save("bridge_features", res, out_dir=out_dir)
    print(f"wrote {out} ({res['seconds']:.0f}s)")
    return 0


def _iv(m: dict, key: str) -> str:
    x = m[key]
    return f"{100 * x['margin']:+.1f} [{100 * x['ci95'][0]:+.1f}, {100 * x['ci95'][1]:+.1f}]"


def markdown(res: dict) -> str:
    L = ["# Relevance features for the bridge targets (issue 25)", "",
         f"`{res['command']}` ({res['seconds']:.0f} s); protocol in the script's docstring. Margins in points, "
         "paired bootstrap 95% interval; target hit: LoCoMo multi-hop, LongMemEval multi-session all-evidence hit; "
         "`base` is the affinity before `words`, `cap20` the shipped `words` feature.", "",
         "| variant | set @ T | macro recall | vs base (macro) | target hit | vs hybrid (target hit) | won / lost |",
         "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        vb = _iv(r["vs_base"], "macro_recall") if "vs_base" in r else ""
        th = r["vs_hybrid"]["target_hit"]
        L.append(f"| {r['variant']} | {r['set']} @ {r['T']} | {r['macro_recall']:.3f} | {vb} | {r['target_hit']:.3f} | "
                 f"{_iv(r['vs_hybrid'], 'target_hit')} | {th['won_lost'][0]} / {th['won_lost'][1]} |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
