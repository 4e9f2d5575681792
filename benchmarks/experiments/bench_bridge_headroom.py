"""How far any selection from today's relevance signals can go on the bridge targets (issue 25):
the ceiling of the multi-hop all-evidence hit, and how strong a bridge signal the data holds.

    python -m benchmarks.experiments.bench_bridge_headroom [--locomo PATH] [--lme PATH] [--T 400,800,1600]
        [--out-dir benchmarks/results/archive]

Protocol of ``bench_bridge.py`` (its folds, its per-fold learned affinity fitted on the other 11
folds); nothing is chosen here, every number is a count over the dev questions of the target
category (LoCoMo multi-hop, LongMemEval multi-session), so there is nothing to tune on them.

* ``ceiling``: the fraction of target questions whose gold turns ALL lie among the top k units of
  the whole bank by the fold's learned affinity, by the hybrid's RRF ranking and by cosine, for
  k = 1..64. No method that takes its units from one of these rankings (in any order, under any
  set objective) gets a question whole with k units unless the question is counted here at k.
* ``at_T``: at each token budget T, side by side: the hybrid filled to T, TrawMem's shipped
  defaults, and the affinity's own ranking filled to T (``alpha-rank``: set selection and the
  thread pool switched off): macro recall, target hit and the mean number of units shown; the
  issue's target (the hybrid's hit + 4 points).
* ``bridge``: for the target questions with two or more gold turns, every gold turn that the
  affinity ranks below 2 B_T (B_T = T / 50 at T = 400, i.e. the turns a budget of T = 400 cannot
  reach by relevance) against the ORACLE anchor, the gold turn the affinity ranks best: its rank
  among the bank's other units by cosine to the anchor, by BM25 with the anchor's text as the
  query, and by cosine to the affinity's top unit (the anchor a method actually has). An oracle
  bridge bound: the fraction of target questions whose gold is covered by the affinity's top
  k1 units plus the oracle anchor's top k2 cosine neighbours, for the best split k1 + k2 = k.

Writes ``bridge_headroom.json``, ``bridge_headroom.md`` and ``bridge_headroom.png`` under
``--out-dir`` (or ``TRAWMEM_BENCH_OUT``). Question and turn ids only, no text.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from .. import harness
from .bench_bridge import TARGET_CAT, dev_checked, dev_parser, dev_sets, fold_weights, positions
from ..equal_tokens_bench.data import Dataset, fixed_setting, select, trawmem_setting
from ..equal_tokens_bench.stats import records, summary

KS = list(range(1, 65))
FAR_T = 400
"""The budget whose reach defines a far gold turn (affinity rank beyond 2 B_T)."""


def _rank_of(scores: np.ndarray, u: int, exclude: int) -> int:
    """1-based rank of unit ``u`` by ``scores`` (descending, ties to the lower unit), ``exclude`` left out."""
    s = scores.astype(np.float64).copy()
    s[exclude] = -np.inf
    return int((s > s[u]).sum() + ((s == s[u]) & (np.arange(len(s)) < u)).sum()) + 1


def question_ranks(ds: Dataset, W) -> list[dict]:
    """Per target-category question: the gold turns' positions under each ranking, and the bridge
    ranks of its far gold turns."""
    from trawmem_gpu.select.baselines import ranking
    from trawmem_gpu.select.objective import date_seconds
    from trawmem_gpu.select.steps.affinity import unit_affinity

    setting, cat, far_at = trawmem_setting(W, T=FAR_T), TARGET_CAT[ds.name], 2 * round(FAR_T / 50)
    out = []
    for q in ds.questions:
        if q.category != cat:
            continue
        ctx = ds.ctxs[q.bank_id]
        ev = set(q.extra["evidence"])
        gold = [i for i, t in enumerate(ctx.bank.turns) if t.turn_id in ev]
        if not gold:
            continue
        cfg, _ = setting(q.group)
        z = np.asarray(q.extra["z"], np.float64)
        a = unit_affinity(ctx, z, q.extra["question"], cfg, date_seconds(q.extra["date"]))
        E = ctx.bank.unit_vecs.astype(np.float64)
        pa = positions(a)
        ph = np.empty(len(a), np.int64)
        ph[ranking("hybrid", ctx, q.extra["question"], z)] = np.arange(len(a))
        pc = positions(E @ z)
        anchor = min(gold, key=lambda g: pa[g])
        top = int(np.argmax(pa == 0))
        cos_anchor = E @ E[anchor]
        lex_anchor = ctx.bm25.scores(ctx.bank.turns[anchor].text)
        cos_top = E @ E[top]
        pn = positions(np.where(np.arange(len(a)) == anchor, -np.inf, cos_anchor))  # anchor's neighbours
        far = [{"turn": ctx.bank.turns[g].turn_id, "affinity_rank": int(pa[g]) + 1,
                "cos_anchor": _rank_of(cos_anchor, g, anchor), "bm25_anchor": _rank_of(lex_anchor, g, anchor),
                "cos_top_unit": _rank_of(cos_top, g, top)}
               for g in gold if g != anchor and pa[g] >= far_at]
        out.append({"qid": q.qid, "n_gold": len(gold), "affinity": sorted(int(pa[g]) + 1 for g in gold),
                    "hybrid": sorted(int(ph[g]) + 1 for g in gold), "cosine": sorted(int(pc[g]) + 1 for g in gold),
                    "anchor_affinity_rank": int(pa[anchor]) + 1, "far": far,
                    "oracle_bridge": _bridge_need(pa, pn, gold, anchor)})
    return out


def _bridge_need(pa: np.ndarray, pn: np.ndarray, gold: list[int], anchor: int) -> list[int]:
    """For k1 = 1..64: the fewest anchor neighbours k2 that cover the gold the affinity's top k1
    misses (the anchor itself must be in the top k1), or -1 when k1 does not hold the anchor."""
    need = []
    for k1 in KS:
        if pa[anchor] >= k1:
            need.append(-1)
            continue
        rest = [g for g in gold if pa[g] >= k1]
        need.append(int(max((pn[g] + 1 for g in rest), default=0)))
    return need


def ceiling(rows: list[dict]) -> dict:
    """All-gold-within-top-k rates per ranking, and the oracle bridge bound (best split of k)."""
    out = {r: [float(np.mean([max(x[r]) <= k for x in rows])) for k in KS] for r in ("affinity", "hybrid", "cosine")}
    bound = []
    for k in KS:
        ok = 0
        for x in rows:
            need = x["oracle_bridge"]
            ok += any(need[k1 - 1] >= 0 and k1 + need[k1 - 1] <= k for k1 in range(1, k + 1))
        bound.append(ok / len(rows))
    out["affinity + oracle anchor's neighbours"] = bound
    return out


def bridge_stats(rows: list[dict]) -> dict:
    far = [f for x in rows for f in x["far"]]
    if not far:
        return {"n_far": 0}
    out = {"n_far": len(far), "n_questions_with_far": sum(bool(x["far"]) for x in rows),
           "n_multi_gold": sum(x["n_gold"] >= 2 for x in rows)}
    for k in ("affinity_rank", "cos_anchor", "bm25_anchor", "cos_top_unit"):
        v = np.array([f[k] for f in far])
        out[k] = {"median": float(np.median(v)), "within_8": float(np.mean(v <= 8)), "within_16": float(np.mean(v <= 16))}
    return out


def at_T(ds: Dataset, W, T: int) -> dict:
    cat = ds.cat_name(TARGET_CAT[ds.name])
    cells = {"hybrid": select(ds, "hybrid", fixed_setting(T=T)),
             "trawmem (shipped defaults)": select(ds, "trawmem", trawmem_setting(W, T=T)),
             "affinity ranking filled to T": select(ds, "alpha-rank", trawmem_setting(W, T=T))}
    out = {}
    for label, picks in cells.items():
        s = summary(ds, records(ds, picks))
        out[label] = {"macro_recall": s["macro"]["recall"], "target_hit": s["per_category"][cat]["hit"],
                      "target_units": s["per_category"][cat]["units"], "units": s["macro"]["units"]}
    out["target (hybrid + 4 points)"] = {"target_hit": out["hybrid"]["target_hit"] + 0.04}
    return out


def markdown(res: dict) -> str:
    L = ["# Bridge headroom: the ceiling of the multi-hop targets (issue 25)", "",
         f"`{res['command']}` ({res['seconds']:.0f} s). Counts over the dev questions of the target category "
         "(LoCoMo multi-hop, LongMemEval multi-session); the learned affinity per fold (fitted on the other folds).", ""]
    for n, r in res["sets"].items():
        L += [f"## {n} (target questions: {r['n']})", "",
              "| T | method | macro recall | target hit | units shown (target questions) |", "|---|---|---|---|---|"]
        for T, cells in r["at_T"].items():
            for lab, c in cells.items():
                if "macro_recall" in c:
                    L.append(f"| {T} | {lab} | {c['macro_recall']:.3f} | {c['target_hit']:.3f} | {c['target_units']:.1f} |")
                else:
                    L.append(f"| {T} | {lab} | | **{c['target_hit']:.3f}** | |")
        L += ["", "All gold within the top k of a ranking (the ceiling of any pick of k units from it):", "",
              "| k | " + " | ".join(r["ceiling"]) + " |", "|---|" + "---|" * len(r["ceiling"])]
        for k in (4, 6, 8, 9, 10, 12, 16, 18, 20, 24, 32, 48, 64):
            L.append(f"| {k} | " + " | ".join(f"{v[k - 1]:.3f}" for v in r["ceiling"].values()) + " |")
        b = r["bridge"]
        if b.get("n_far"):
            L += ["", f"Far gold turns (affinity rank beyond {2 * round(FAR_T / 50)}): {b['n_far']} in "
                  f"{b['n_questions_with_far']} of the {b['n_multi_gold']} questions with two or more gold turns. "
                  "Their rank among the bank's other units:", "",
                  "| signal | median rank | within 8 | within 16 |", "|---|---|---|---|"]
            for k, lab in (("affinity_rank", "the query's learned affinity"),
                           ("cos_anchor", "cosine to the oracle anchor (best-ranked gold turn)"),
                           ("bm25_anchor", "BM25 of the oracle anchor's text"),
                           ("cos_top_unit", "cosine to the affinity's top unit")):
                L.append(f"| {lab} | {b[k]['median']:.0f} | {b[k]['within_8']:.2f} | {b[k]['within_16']:.2f} |")
        L.append("")
    return "\n".join(L) + "\n"


def plot(res: dict):
    fig, axes = harness.figure(1, len(res["sets"]), figsize=(6.2 * len(res["sets"]), 4.4))
    axes = np.atleast_1d(axes)
    for ax, (n, r) in zip(axes, res["sets"].items()):
        for lab, v in r["ceiling"].items():
            ax.plot(KS, v, label=f"top k: {lab}", ls="--" if "oracle" in lab else "-")
        for T, cells in r["at_T"].items():
            for lab, mk in (("hybrid", "s"), ("trawmem (shipped defaults)", "o"), ("affinity ranking filled to T", "^")):
                c = cells[lab]
                ax.scatter([c["target_units"]], [c["target_hit"]], marker=mk, color="k" if "trawmem" in lab else "grey",
                           label=f"{lab} at T" if T == min(r["at_T"]) else None, zorder=3)
            tgt = cells["target (hybrid + 4 points)"]["target_hit"]
            u = cells["trawmem (shipped defaults)"]["target_units"]
            ax.hlines(tgt, u - 1.5, u + 1.5, color="red", lw=2, label="target (hybrid + 4 points)" if T == min(r["at_T"]) else None)
            ax.annotate(f"T={T}", (u, tgt), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set(title=f"{n}: all gold within k units", xlabel="units k", ylabel="target-category all-evidence hit",
               xlim=(0, 40))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def main() -> int:
    ap = dev_parser(__doc__, "400,800,1600")
    a = ap.parse_args()
    out_dir = dev_checked(a).out_dir
    Ts = [int(x) for x in a.T.split(",")]
    t0 = time.perf_counter()
    with harness.pin_threads(1):
        data = dev_sets(a)
        W = fold_weights(data)
        res = {"protocol": __doc__, "machine": harness.machine(), "command": harness.command(), "sets": {}}
        for n, ds in data.items():
            rows = question_ranks(ds, W)
            res["sets"][n] = {"n": len(rows), "ceiling": ceiling(rows), "bridge": bridge_stats(rows),
                              "at_T": {T: at_T(ds, W, T) for T in Ts}, "questions": rows}
            print(f"{n}: {len(rows)} target questions; top-k affinity ceiling at k=8/16: "
                  f"{res['sets'][n]['ceiling']['affinity'][7]:.3f}/{res['sets'][n]['ceiling']['affinity'][15]:.3f}",
                  flush=True)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    harness.write_text(out_dir / "bridge_headroom.md", markdown(res))
    out = harness.save("bridge_headroom", res, plot(res), out_dir=out_dir)
    print(f"wrote {out} ({res['seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
