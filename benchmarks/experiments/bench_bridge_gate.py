"""Query-adaptive pool widening (issue 25, a bridge idea): the candidate pool widened (or the set
selection replaced by the affinity's ranking filled to T) only for the queries a generic,
affinity-only gate marks as aggregation-like, at equal context tokens against the RRF hybrid and
the shipped defaults.

    git apply docs/examples/pool-top-affinity.patch     # SelectConfig.pool_top_affinity (not shipped)
    python -m benchmarks.experiments.bench_bridge_gate [--T 400,800] [--M 8,16,32] [--fresh] [--out-dir benchmarks/results/archive]

The gates read only the query's affinity over the whole bank (``alpha``, the fold's learned
affinity; no data set, speaker or phrasing key), at k = B_T = round(T / 50) units (8 at T = 400):

* ``threads``: the number of distinct threads among the k units of largest alpha, at least a threshold;
* ``sessions``: the same count over the turns' sessions (a field every bank exposes);
* ``flat``: alpha of the k-th unit over alpha of the first, at least a threshold (many near-equal
  candidates).

A gated query gets one action, the others the defaults: ``M=m``, the pool widened by the query's
top-m units of the bank (``SelectConfig.pool_top_affinity``, the NumPy reference, as
``bench_bridge_pool.py``); ``fill``, the whole bank's affinity ranking filled to T (the
``alpha-rank`` rule of the baselines). Each query's selection does not depend on the others', so a
gated variant's record of a question is that of the full run of its action or of the defaults; the
full runs' picks are cached under ``~/.cache/trawmem_gpu/bridge_gate/`` keyed by the fold weights,
the data files and the selection code (``--fresh`` recomputes them).

Protocol of ``bench_bridge.py``: its folds, its per-fold learned affinity (``fold_weights``), its
paired bootstraps (macro recall stratified by category, the target category's all-evidence hit:
LoCoMo multi-hop, LongMemEval multi-session). The defaults here are the NumPy reference with the
shipped config (``pool_top_affinity = 0``; the macro recall and target hits of the engine's
defaults in ``bridge.md``). Every (gate, threshold,
action) is scored on every fold; the nested rows choose per fold, among the defaults and a family's
variants (one gate, all its thresholds and actions; or every variant), the one with the best mean
(both sets) macro recall on the other folds at that T, and score it on the fold. Also, per variant,
the fraction of target-category questions and of the other questions the gate lets through.

Writes ``bridge_gate.json``, ``bridge_gate.md`` and ``bridge_gate.png`` under ``--out-dir`` (or
``TRAWMEM_BENCH_OUT``).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from .. import harness
from .bench_bridge import TARGET_CAT, compare, dev_checked, dev_parser, dev_sets, fold_weights, nested
from .bench_bridge_pool import fmt, reference_picks
from ..equal_tokens_bench.data import Dataset, fixed_setting, select, trawmem_setting
from ..equal_tokens_bench.stats import records, summary

GATES = ("threads", "sessions", "flat")
THRESHOLDS = {"threads": (0.625, 0.75, 0.875, 1.0), "sessions": (0.5, 0.625, 0.75, 0.875),
              "flat": (0.05, 0.1, 0.2, 0.3)}
"""Per gate, the thresholds tried: the dispersion gates' as a fraction of k (at k = 8: 5, 6, 7, 8
distinct threads; 4, 5, 6, 7 sessions), the flatness gate's as alpha_k / alpha_1."""


def top_k(alpha: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` units of largest ``alpha``, ties to the lower unit (the order of ``widen_pool``)."""
    return np.lexsort((np.arange(len(alpha)), -alpha))[:k]


def gate_signals(alpha: np.ndarray, unit_thread: np.ndarray, unit_session: np.ndarray, k: int) -> dict:
    """The query-level signals of the gates from the query's affinity over the whole bank:
    ``threads`` / ``sessions``, the distinct threads / sessions among the top-``k`` units over ``k``;
    ``flat``, alpha of the ``k``-th unit over alpha of the first (0 when the first is not positive)."""
    k = max(1, min(k, len(alpha)))
    top = top_k(alpha, k)
    a1, ak = float(alpha[top[0]]), float(alpha[top[-1]])
    return {"threads": len(set(unit_thread[top].tolist())) / k, "sessions": len(set(unit_session[top].tolist())) / k,
            "flat": ak / a1 if a1 > 0 else 0.0}


def gated(signals: list[dict], gate: str, threshold: float) -> np.ndarray:
    """Which queries the gate lets through: signal at least the threshold (a small tolerance, so
    that 6 / 8 passes 0.75)."""
    return np.array([s[gate] >= threshold - 1e-9 for s in signals], dtype=bool)


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """The probability that a positive question's signal exceeds a negative one's (ties count
    half): how well a gate on ``score`` can separate them at any threshold (0.5: not at all)."""
    pos, neg = score[positive], score[~positive]
    if not len(pos) or not len(neg):
        return float("nan")
    return float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg)))


def mixed(chosen: np.ndarray, action: list, default: list) -> list:
    """The per-question records of a gated variant: the action's where ``chosen``, else the defaults'."""
    return [a if c else d for c, a, d in zip(chosen, action, default)]


def code_key(data: dict, W: dict) -> str:
    """What the cached picks depend on: the fold weights, the data files, the selection code."""
    from trawmem_gpu.paths import file_sha256

    h = hashlib.sha256(json.dumps({g: list(w) for g, w in sorted(W.items())}).encode())
    for d in data.values():
        h.update(file_sha256(d.path).encode())
    pkg = harness.ROOT / "trawmem_gpu"
    for p in sorted((pkg / "select").rglob("*.py")):  # the workspace (select/workspace.py) included
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cached_picks(key: str, name: str, fresh: bool, fn) -> tuple:
    """``fn()`` (picks, headings), read from / written to the picks cache."""
    path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trawmem_gpu" / "bridge_gate" / f"{name}_{key}.json"
    if path.exists() and not fresh:
        d = json.loads(path.read_text())
        return d["picks"], d["headings"]
    picks, headings = fn()
    harness.write_text(path, json.dumps({"picks": [[int(u) for u in p] for p in picks], "headings": headings}))
    return picks, headings


def signals_of(ds: Dataset, W, k: int) -> list[dict]:
    from trawmem_gpu.select.objective import date_seconds
    from trawmem_gpu.select.steps.affinity import unit_affinity

    setting, out, sess = trawmem_setting(W), [], {}
    for q in ds.questions:
        ctx = ds.ctxs[q.bank_id]
        if q.bank_id not in sess:
            sid = {s: i for i, s in enumerate(dict.fromkeys(str(t.session) for t in ctx.bank.turns))}
            sess[q.bank_id] = np.array([sid[str(t.session)] for t in ctx.bank.turns], np.int64)
        a = unit_affinity(ctx, np.asarray(q.extra["z"], np.float64), q.extra["question"], setting(q.group)[0],
                          date_seconds(q.extra["date"]))
        out.append(gate_signals(a, ctx.bank.unit_thread, sess[q.bank_id], k))
    return out


def main() -> int:
    ap = dev_parser(__doc__, "400,800")
    ap.add_argument("--M", default="8,16,32")
    ap.add_argument("--fresh", action="store_true", help="recompute the cached picks")
    a = ap.parse_args()
    from trawmem_gpu.select.config import SelectConfig

    if "pool_top_affinity" not in SelectConfig.__dataclass_fields__:
        ap.error("needs SelectConfig.pool_top_affinity, which the package does not ship: "
                 "git apply docs/examples/pool-top-affinity.patch")
    dev_checked(a)
    with harness.pin_threads(1):
        return run(a, [int(x) for x in a.T.split(",")], [int(x) for x in a.M.split(",")])


def run(a, Ts: list[int], Ms: list[int]) -> int:
    t_all = time.perf_counter()
    data = dev_sets(a)
    W = fold_weights(data)
    key = code_key(data, W)
    actions = [f"M={m}" for m in Ms] + ["fill"]
    rows: dict = {}
    res: dict = {"protocol": __doc__, "machine": harness.machine(), "thresholds": THRESHOLDS, "cells": {},
                 "separation": {}, "nested": {}, "ceiling": {}, "auc": {}}

    def put(n, T, label, recs):
        rows[(n, T, label)] = {"records": recs, "summary": summary(data[n], recs)}

    for T in Ts:
        sigs = {}
        for n, ds in data.items():
            runs = {"hybrid": lambda: select(ds, "hybrid", fixed_setting(T=T)),
                    "defaults": lambda: reference_picks(ds, W, T),
                    "fill": lambda: select(ds, "alpha-rank", trawmem_setting(W, T=T))}
            runs.update({f"M={m}": (lambda m=m: reference_picks(ds, W, T, pool_top_affinity=m)) for m in Ms})
            for label, fn in runs.items():
                t0 = time.perf_counter()
                put(n, T, label, records(ds, cached_picks(key, f"{n}_{T}_{label}", a.fresh, fn)))
                s = rows[(n, T, label)]["summary"]
                print(f"{n} T={T} {label}: recall {s['macro']['recall']:.3f} target hit "
                      f"{s['per_category'][ds.cat_name(TARGET_CAT[n])]['hit']:.3f} ({time.perf_counter() - t0:.0f}s)",
                      flush=True)
            sigs[n] = signals_of(ds, W, max(1, round(T / 50)))
        for n, ds in data.items():
            tgt = np.array([q.category == TARGET_CAT[n] for q in ds.questions])
            res["auc"][f"{n}@{T}"] = {g: auc(np.array([x[g] for x in sigs[n]]), tgt) for g in GATES}
        variants = [(g, th, act) for g in GATES for th in THRESHOLDS[g] for act in actions]
        for g, th, act in variants:
            label = f"{g}>={th:g} -> {act}"
            for n, ds in data.items():
                on = gated(sigs[n], g, th)
                put(n, T, label, mixed(on, rows[(n, T, act)]["records"], rows[(n, T, "defaults")]["records"]))
                tgt = np.array([q.category == TARGET_CAT[n] for q in ds.questions])
                res["separation"][f"{n}@{T}|{g}>={th:g}"] = {"target": float(on[tgt].mean()), "other": float(on[~tgt].mean())}
        for n, ds in data.items():  # what no gate over these actions can beat: a per-question oracle
            tgt = [i for i, q in enumerate(ds.questions) if q.category == TARGET_CAT[n]]
            hit = {lab: np.array([rows[(n, T, lab)]["records"][i]["hit"] for i in tgt]) for lab in ["defaults"] + actions}
            res["ceiling"][f"{n}@{T}"] = {"defaults": float(hit["defaults"].mean()),
                                          "hybrid": rows[(n, T, "hybrid")]["summary"]["per_category"][ds.cat_name(TARGET_CAT[n])]["hit"],
                                          "units": {lab: rows[(n, T, lab)]["summary"]["macro"]["units"] for lab in ["defaults"] + actions},
                                          **{f"defaults or {act}": float(np.maximum(hit["defaults"], hit[act]).mean()) for act in actions},
                                          "defaults or any action": float(np.max(list(hit.values()), axis=0).mean())}
        for n, ds in data.items():  # the actions on every query, for reference
            for act in actions:
                res["cells"][f"{n}@{T}|all -> {act}"] = cell(ds, rows, n, T, act)
            for g, th, act in variants:
                label = f"{g}>={th:g} -> {act}"
                res["cells"][f"{n}@{T}|{label}"] = {**cell(ds, rows, n, T, label),
                                                    "gated": res["separation"][f"{n}@{T}|{g}>={th:g}"]}
        families = {g: [f"{g}>={th:g} -> {act}" for th in THRESHOLDS[g] for act in actions] for g in GATES}
        families["any gate"] = [lab for labs in families.values() for lab in labs]
        for fam, labs in families.items():
            nest = nested(data, rows, T, ["defaults"] + labs)
            chosen = sorted(set(nest["chosen"].values()))
            res["nested"][f"{fam}@{T}"] = {"chosen": nest["chosen"], "counts": {c: list(nest["chosen"].values()).count(c)
                                                                               for c in chosen}}
            for n, recs in nest["records"].items():
                put(n, T, f"nested {fam}", recs)
                res["cells"][f"{n}@{T}|nested {fam}"] = cell(data[n], rows, n, T, f"nested {fam}")
        print(f"T={T} done ({time.perf_counter() - t_all:.0f}s)", flush=True)
    res["targets"] = targets(res, Ts)
    res["seconds"] = round(time.perf_counter() - t_all, 1)
    res["command"] = harness.command()
    md = a.out_dir / "bridge_gate.md"
    harness.write_text(md, markdown(res, Ts, Ms, md.read_text(encoding="utf-8") if md.exists() else ""))
    out = harness.save("bridge_gate", res, plot(res, Ts), out_dir=a.out_dir, dpi=110)
    print(f"wrote {out} ({res['seconds']:.0f}s)")
    return 0


def cell(ds, rows, n, T, label) -> dict:
    recs = rows[(n, T, label)]["records"]
    s = rows[(n, T, label)]["summary"]
    return {"recall": s["macro"]["recall"], "target_hit": s["per_category"][ds.cat_name(TARGET_CAT[n])]["hit"],
            "tokens": s["macro"]["tokens"], "vs_defaults": compare(ds, recs, rows[(n, T, "defaults")]["records"]),
            "vs_hybrid": compare(ds, recs, rows[(n, T, "hybrid")]["records"])}


def meets(res: dict, label: str, Ts: list[int]) -> bool:
    """The issue's targets for a row: target hit at least the hybrid's + 4 points (LoCoMo at every
    T, LongMemEval at 400) and macro recall no lower than the defaults' on both sets at every T."""
    for T in Ts:
        for n in ("locomo", "longmemeval"):
            c = res["cells"].get(f"{n}@{T}|{label}")
            if c is None or c["vs_defaults"]["macro_recall"]["margin"] < -1e-12:
                return False
            if (n == "locomo" or T == 400) and c["vs_hybrid"]["target_hit"]["margin"] < 0.04 - 1e-9:
                return False
    return True


def targets(res: dict, Ts: list[int]) -> dict:
    labels = sorted({k.split("|", 1)[1] for k in res["cells"]})
    return {"rows_meeting_all_targets": [lab for lab in labels if meets(res, lab, Ts)]}


def markdown(res: dict, Ts: list[int], Ms: list[int], previous: str = "") -> str:
    """The tables of ``res``, after the hand-written summary block of ``previous`` (kept as it is)."""
    from .bridge_report import SUMMARY

    i, j = previous.find(SUMMARY[0]), previous.find(SUMMARY[1])
    kept = [previous[i:j + len(SUMMARY[1])], ""] if 0 <= i < j else []
    met = res["targets"]["rows_meeting_all_targets"]
    acts = [f"M={m}" for m in Ms] + ["fill"]
    lines = ["# Query-adaptive pool widening (issue 25, `bench_bridge_gate.py`)", ""] + kept + [
             f"`{res['command']}` (after `git apply docs/examples/pool-top-affinity.patch`), {res['seconds']:.0f} s.",
             "Margins in points, paired bootstrap 95% intervals; macro recall vs the defaults, target hit "
             "(LoCoMo multi-hop, LongMemEval multi-session) vs the RRF hybrid; gated: the fraction of "
             "target-category / other questions the gate lets through.", "",
             "**Rows meeting every target** (hit >= hybrid + 4 points on LoCoMo at each T and LongMemEval at 400, "
             "macro recall no lower than the defaults on both sets at each T): "
             + (", ".join(f"`{m}`" for m in met) if met else "none."), "",
             "## Ceiling: the target hit of a per-question oracle over the defaults and the actions", "",
             "| set @ T | hybrid | target (hybrid + 4) | defaults | " + " | ".join(f"defaults or {a}" for a in acts)
             + " | defaults or any | units: defaults / " + " / ".join(acts) + " |",
             "|---|---|---|---|" + "---|" * (len(acts) + 2)]
    for k, c in res["ceiling"].items():
        lines.append(f"| {k} | {c['hybrid']:.3f} | {c['hybrid'] + 0.04:.3f} | {c['defaults']:.3f} | "
                     + " | ".join(f"{c['defaults or ' + a]:.3f}" for a in acts) + f" | {c['defaults or any action']:.3f} | "
                     + " / ".join(f"{c['units'][x]:.1f}" for x in ["defaults"] + acts) + " |")
    lines += ["", "How well each signal separates the target category from the other questions (AUC; 0.5 = not at all): "
              + "; ".join(f"{k}: " + ", ".join(f"{g} {v:.2f}" for g, v in c.items()) for k, c in res["auc"].items()), "",
             "## Nested choices (per fold, by the other folds' mean macro recall over both sets)", "",
             "| family | T | chosen per fold | set | macro recall | vs defaults | target hit | vs hybrid | won / lost |",
             "|---|---|---|---|---|---|---|---|---|"]
    for T in Ts:
        for fam in list(GATES) + ["any gate"]:
            nd = res["nested"][f"{fam}@{T}"]
            ch = ", ".join(f"{c} x{k}" for c, k in nd["counts"].items())
            for n in ("locomo", "longmemeval"):
                c = res["cells"][f"{n}@{T}|nested {fam}"]
                lines.append(f"| {fam} | {T} | {ch} | {n} | {c['recall']:.3f} | {fmt(c['vs_defaults']['macro_recall'])} | "
                             f"{c['target_hit']:.3f} | {fmt(c['vs_hybrid']['target_hit'])} | "
                             f"{' / '.join(map(str, c['vs_hybrid']['target_hit']['won_lost']))} |")
    lines += ["", "## Every variant (gate >= threshold -> action; `all`: the action on every query)", "",
              "| variant | T | LoCoMo macro vs defaults | multi-hop hit, vs hybrid, won/lost | gated tgt / other | "
              "LME macro vs defaults | multi-session hit, vs hybrid, won/lost | gated tgt / other |", "|---|---|---|---|---|---|---|---|"]
    for T in Ts:
        labels = [f"all -> {act}" for act in [f"M={m}" for m in Ms] + ["fill"]] + [
            f"{g}>={th:g} -> {act}" for g in GATES for th in THRESHOLDS[g] for act in [f"M={m}" for m in Ms] + ["fill"]]
        for lab in labels:
            row = [lab, str(T)]
            for n in ("locomo", "longmemeval"):
                c = res["cells"][f"{n}@{T}|{lab}"]
                h = c["vs_hybrid"]["target_hit"]
                g = c.get("gated")
                row += [fmt(c["vs_defaults"]["macro_recall"]),
                        f"{c['target_hit']:.3f}, {fmt(h)}, {h['won_lost'][0]}/{h['won_lost'][1]}",
                        f"{g['target']:.2f} / {g['other']:.2f}" if g else "1 / 1"]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot(res: dict, Ts: list[int]):
    """Per T and set: each variant's macro recall margin over the defaults against its target-hit
    margin over the hybrid (the target: hit >= +4, recall >= 0)."""
    fig, axes = harness.figure(len(Ts), 2, figsize=(10, 4 * len(Ts)), squeeze=False)
    colors = {"threads": "C0", "sessions": "C1", "flat": "C2", "all": "C3", "nested": "k"}
    for i, T in enumerate(Ts):
        for j, n in enumerate(("locomo", "longmemeval")):
            ax = axes[i][j]
            for k, c in res["cells"].items():
                if not k.startswith(f"{n}@{T}|"):
                    continue
                lab = k.split("|", 1)[1]
                fam = "nested" if lab.startswith("nested") else lab.split(">=")[0].split(" ")[0]
                ax.scatter(100 * c["vs_defaults"]["macro_recall"]["margin"], 100 * c["vs_hybrid"]["target_hit"]["margin"],
                           s=30 if fam == "nested" else 12, c=colors.get(fam, "C4"), marker="*" if fam == "nested" else "o")
            lo, hi = ax.get_ylim()
            ax.set_ylim(min(lo, -1.0), max(hi, 5.0))
            ax.axhline(4, ls="--", c="grey", lw=0.8)
            ax.axvline(0, ls="--", c="grey", lw=0.8)
            ax.set_title(f"{n} @ T={T}", fontsize=9)
            ax.set_xlabel("macro recall vs defaults (points)", fontsize=8)
            ax.set_ylabel("target hit vs hybrid (points)", fontsize=8)
    for fam, col in colors.items():
        axes[0][0].scatter([], [], c=col, s=12, label=fam)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
