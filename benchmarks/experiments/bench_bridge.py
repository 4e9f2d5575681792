"""Bridge mechanisms for multi-hop questions at small token budgets, the roles ablation and the
paper's configuration under a token budget (issue 25), at equal context tokens against the RRF hybrid.

    python -m benchmarks.experiments.bench_bridge [--locomo PATH] [--lme PATH] [--T 400,800,1600]
        [--parts headline,variants,roles,paper] [--out-dir benchmarks/results/archive]

Protocol (nothing is tuned on what it is scored on), the folds of ``bench_equal_tokens.py``:
LoCoMo dev one fold per conversation (7), LongMemEval-S dev 5 folds of questions. The learned
affinity of a fold is fitted on the other 11 folds of both sets. A variant with a free weight is
chosen per fold from the other folds (nested leave-one-fold-out: the mean over both sets of the
macro recall on the other folds at that T) and scored on the fold.

Parts, each merged into ``bridge.json`` (a partial run keeps the other parts' tables):

* ``headline``: the hybrid and TrawMem's shipped defaults at every T; per category / type recall
  and all-evidence hit; the paired category-stratified bootstrap of TrawMem minus the hybrid on
  macro recall, on multi-hop (LoCoMo category 1) hit and on LongMemEval's multi-session hit; the
  multi-hop questions won and lost against the hybrid and, for the lost ones, each missing gold
  turn (id, TrawMem's affinity rank in the bank, whether it was in TrawMem's candidate pool, its
  rank in the hybrid's ranking). Question and turn ids only, no text.
* ``variants``: the bridge ideas at T = 400 and 800 on both sets (``VARIANTS``), with the
  nested choice among the entity-coverage weights (run with the term applied from
  ``docs/examples/entity-coverage-term.patch``, which the package does not ship: left out without it); two anchor second-stage prototypes (a unit's
  affinity raised by its similarity to each of the query's top units, their own vector or their
  text as a BM25 query) run on the NumPy reference with a patched affinity.
* ``roles``: role conditioning and the multi-thread term switched on over the defaults (which
  have both off since issue 25) at every T (variant minus defaults, paired bootstrap).
* ``paper``: ``SelectConfig.paper()`` (H = 2) at B = 16 and under T, beside plain cosine, with the
  knapsack rules and the seeds switched one at a time (LoCoMo dev).

Writes ``bridge.json``, ``bridge.md`` and ``bridge.png`` under ``--out-dir`` (or ``TRAWMEM_BENCH_OUT``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from .. import harness
from ..equal_tokens_bench.data import Dataset, fixed_setting, select, trawmem_setting
from ..equal_tokens_bench.stats import margin_bootstrap, records, summary

PARTS = ("headline", "variants", "roles", "paper")
TARGET_CAT = {"locomo": 1, "longmemeval": 4}
"""The category whose all-evidence hit the targets name: LoCoMo multi-hop, LongMemEval multi-session."""
ENTITY_WEIGHTS = (0.0, 16.0, 64.0)
VARIANTS = [("hops 0 (seeds only)", {"hops": 0}), ("hops 2", {"hops": 2}),
            ("candidate pool x2", {"__pool": 2.0}),
            ("entity coverage w_ent 16", {"w_ent": 16.0}), ("entity coverage w_ent 64", {"w_ent": 64.0}),
            ("anchor second stage: cosine (prototype)", {"__anchor": "cos"}),
            ("anchor second stage: BM25 of the anchor (prototype)", {"__anchor": "lex"})]
def role_variants() -> list:
    """The roles and the multi-thread term switched on over the defaults (which have both off)."""
    from trawmem_gpu.select.config import MULTI_THREAD, ROLE_TERMS

    return [("+ role conditioning", dict(ROLE_TERMS)), ("+ multi-thread term", dict(MULTI_THREAD)),
            ("+ both (the defaults before issue 25)", {**ROLE_TERMS, **MULTI_THREAD})]
ANCHORS, ANCHOR_WEIGHT = 2, 0.5


def dev_parser(doc: str, T: str = "400,800") -> argparse.ArgumentParser:
    """The arguments every bridge benchmark takes: ``--locomo``, ``--lme`` (the dev sets, read in
    place), ``--T`` (token budgets, default ``T``) and ``--out-dir``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=harness.dev_data("locomo"))
    ap.add_argument("--lme", type=Path, default=harness.dev_data("longmemeval"))
    ap.add_argument("--T", default=T)
    ap.add_argument("--out-dir", type=Path)
    return ap


def dev_checked(a) -> argparse.Namespace:
    """``a`` with both dev sets checked (a clear error naming the flag) and ``out_dir`` resolved."""
    harness.require_data(a.locomo, "locomo", "--locomo")
    harness.require_data(a.lme, "longmemeval", "--lme")
    a.out_dir = harness.results_dir(a.out_dir, harness.ARCHIVE)
    return a


def dev_sets(a) -> dict:
    """Both dev sets of :func:`dev_parser`'s arguments, by name."""
    return {"locomo": Dataset("locomo", a.locomo), "longmemeval": Dataset("longmemeval", a.lme)}


def has_entity_term() -> bool:
    """Whether the entity-coverage term is in the tree (``git apply docs/examples/entity-coverage-term.patch``:
    measured here, not shipped); without it the ``w_ent`` variants are left out."""
    from trawmem_gpu.select.config import SelectConfig

    return "w_ent" in SelectConfig.__dataclass_fields__


def fold_weights(data: dict) -> dict:
    """The learned affinity per fold (fitted on the other 11), cached by the data files' hashes and
    the feature list."""
    from trawmem_gpu.head.relevance import cross_validate
    from trawmem_gpu.paths import file_sha256

    from trawmem_gpu.select.config import RELEVANCE_FEATURES

    key = hashlib.sha256(("".join(file_sha256(d.path) for d in data.values()) + ",".join(RELEVANCE_FEATURES))
                         .encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trawmem_gpu" / f"fold_weights_{key}.json"
    if cache.exists():
        return {g: tuple(w) for g, w in json.loads(cache.read_text()).items()}
    W = cross_validate([q for d in data.values() for q in d.questions])
    harness.write_text(cache, json.dumps({g: list(w) for g, w in W.items()}))
    return W


def hit_bootstrap(ours: list[dict], theirs: list[dict], cat: int, n_boot: int = 10_000, seed: int = 0) -> dict:
    """Paired bootstrap of the all-evidence hit difference on the questions of ``cat``."""
    d = np.array([a["hit"] - b["hit"] for a, b in zip(ours, theirs) if a["cat"] == cat])
    if not len(d):
        return {}
    rng = np.random.default_rng(seed)
    boot = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"margin": float(d.mean()), "ci95": [float(lo), float(hi)], "n": int(len(d)),
            "won_lost": [int((d > 0).sum()), int((d < 0).sum())]}


def compare(ds: Dataset, ours: list[dict], theirs: list[dict]) -> dict:
    return {"macro_recall": margin_bootstrap(ds, ours, theirs), "target_hit": hit_bootstrap(ours, theirs, TARGET_CAT[ds.name])}


def anchor_picks(ds: Dataset, W, T: int, mode: str) -> tuple:
    """Prototype: the reference with alpha(v) *= 1 + w * b(v), b(v) = max over the query's top
    ``ANCHORS`` units a (by alpha, other threads than v) of alpha(a) * s(a, v); s = the shifted
    cosine of the support kernel (``cos``) or a's text as a BM25 query over the bank, divided by its
    maximum (``lex``)."""
    import trawmem_gpu.select.reference as R
    from trawmem_gpu.select.objective import support_from_cosine

    orig = R.step3a.unit_affinity

    def bridged(ctx, z, question, cfg, now=float("nan")):
        a = orig(ctx, z, question, cfg, now)
        E, th = ctx.bank.unit_vecs.astype(np.float64), ctx.bank.unit_thread
        b = np.zeros(len(a))
        for u in np.lexsort((np.arange(len(a)), -a))[:ANCHORS]:
            if mode == "cos":
                s = support_from_cosine(E @ E[u], cfg.k_shift)
            else:
                s = ctx.bm25.scores(ctx.bank.turns[u].text)
                s = s / s.max() if s.max() > 0 else np.zeros(len(a))
            s = s * a[u]
            s[th == th[u]] = 0.0
            b = np.maximum(b, s)
        return a * (1.0 + ANCHOR_WEIGHT * b)

    setting = trawmem_setting(W, T=T)
    R.step3a.unit_affinity = bridged
    try:
        out = []
        for q in ds.questions:
            cfg, qp = setting(q.group)
            out.append(R.select_reference(ds.ctxs[q.bank_id], q.extra["question"], np.asarray(q.extra["z"], np.float64),
                                          cfg, qp, now=q.extra["date"]).units)
    finally:
        R.step3a.unit_affinity = orig
    return out, "date"


def pool_setting(W, T: int, mult: float):
    B = max(1, round(T / 50))
    ns = max(2, round(mult * B / 2))
    return trawmem_setting(W, T=T, n_seeds=ns, neighborhood_cap=max(ns, round(mult * 3 * B / 4)))


def variant_picks(ds: Dataset, W, T: int, v: dict) -> tuple:
    if "__anchor" in v:
        return anchor_picks(ds, W, T, v["__anchor"])
    if "__pool" in v:
        return select(ds, "trawmem", pool_setting(W, T, v["__pool"]))
    return select(ds, "trawmem", trawmem_setting(W, T=T, **v))


def positions(scores: np.ndarray) -> np.ndarray:
    """0-based position of every unit in the descending order of ``scores`` (ties to the lower unit)."""
    pos = np.empty(len(scores), np.int64)
    pos[np.lexsort((np.arange(len(scores)), -scores))] = np.arange(len(scores))
    return pos


def lost_detail(ds: Dataset, W, T: int, ours: list, theirs: list) -> dict:
    """Multi-hop (or multi-session) questions TrawMem's defaults lose and win against the hybrid
    (all-evidence hit), and for each lost one the gold turns TrawMem misses: affinity rank, in
    TrawMem's candidate pool or not, rank in the hybrid's ranking."""
    from trawmem_gpu.select.baselines import ranking
    from trawmem_gpu.select.objective import date_seconds
    from trawmem_gpu.select.reference import select_reference
    from trawmem_gpu.select.steps.affinity import unit_affinity

    setting, cat = trawmem_setting(W, T=T), TARGET_CAT[ds.name]
    won, lost, missing = [], [], []
    for q, o, h in zip(ds.questions, ours, theirs):
        if q.category != cat:
            continue
        ctx = ds.ctxs[q.bank_id]
        ev = set(q.extra["evidence"])
        gold = {i for i, t in enumerate(ctx.bank.turns) if t.turn_id in ev}
        ours_hit, theirs_hit = gold <= set(o), gold <= set(h)
        if ours_hit and not theirs_hit:
            won.append(q.qid)
        if ours_hit or not theirs_hit:
            continue
        lost.append(q.qid)
        cfg, qp = setting(q.group)
        z = np.asarray(q.extra["z"], np.float64)
        a = unit_affinity(ctx, z, q.extra["question"], cfg, date_seconds(q.extra["date"]))
        pos = positions(a)
        hyb = {int(u): r for r, u in enumerate(ranking("hybrid", ctx, q.extra["question"], z))}
        pool = set(select_reference(ctx, q.extra["question"], z, cfg, qp, keep_internals=True,
                                    now=q.extra["date"]).candidates.tolist())
        for u in sorted(gold - set(o)):
            missing.append({"qid": q.qid, "turn": ctx.bank.turns[u].turn_id, "affinity_rank": int(pos[u]) + 1,
                            "in_pool": u in pool, "hybrid_rank": hyb.get(u, -1) + 1})
    ranks = [m["affinity_rank"] for m in missing]
    return {"won": won, "lost": lost, "missing": missing, "missing_in_pool": float(np.mean([m["in_pool"] for m in missing]))
            if missing else None, "missing_affinity_rank_median": float(np.median(ranks)) if ranks else None,
            "missing_hybrid_rank_median": float(np.median([m["hybrid_rank"] for m in missing])) if missing else None}


def nested(data: dict, rows: dict, T: int, labels: list[str]) -> dict:
    """Per fold, the label among ``labels`` with the best mean (both sets) macro recall on the other
    folds at ``T``; the records of the chosen label on each fold."""
    out, chosen = {}, {}
    for n, ds in data.items():
        for g in ds.groups:
            def others(lab):
                return np.mean([np.mean([rows[(m, T, lab)]["summary"]["per_fold"][h]["recall"]
                                         for h in data[m].groups if h != g]) for m in data])
            chosen[g] = max(labels, key=lambda lab: (others(lab), -labels.index(lab)))
        recs = [dict(r) for r in rows[(n, T, labels[0])]["records"]]
        for i, q in enumerate(ds.questions):
            recs[i] = rows[(n, T, chosen[q.group])]["records"][i]
        out[n] = recs
    return {"chosen": chosen, "records": out}


def main() -> int:
    ap = dev_parser(__doc__, "400,800,1600")
    ap.add_argument("--lme-T", help="budgets of the roles part on LongMemEval (default: --T)")
    ap.add_argument("--parts", default=",".join(PARTS))
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    if parts - set(PARTS):
        ap.error(f"--parts: unknown part {sorted(parts - set(PARTS))[0]!r}; choose from {', '.join(PARTS)}")
    dev_checked(a)
    with harness.pin_threads(1):
        return run(a, parts, [int(x) for x in a.T.split(",")])


def brief(s: dict) -> dict:
    """A summary's macro recall, hit and tokens, and its per-category table."""
    m = s["macro"]
    return {"recall": m["recall"], "hit": m["hit"], "tokens": m["tokens"], "per_category": s["per_category"]}


def paper_rows(ds) -> list[dict]:
    """The paper's configuration on LoCoMo at B = 16 and under T = 800, with its knapsack and seed
    variants, beside cosine top-B: one row per (T, config)."""
    from trawmem_gpu.select.config import PAPER, PAPER_HOPS

    rows = []
    paper = dict(PAPER, hops=PAPER_HOPS)
    for T in (None, 800):
        cells = [("cosine", "cosine", fixed_setting(T=T)), ("paper", "trawmem", fixed_setting(T=T, **paper)),
                 ("paper, knapsack best (before the fix)", "trawmem", fixed_setting(T=T, **{**paper, "knapsack": "best"})),
                 ("paper, knapsack ratio", "trawmem", fixed_setting(T=T, **{**paper, "knapsack": "ratio"})),
                 ("paper, best-unit seeds", "trawmem", fixed_setting(T=T, **{**paper, "seed_score": "best_unit"}))]
        for label, m, setting in cells:
            if T is None and "knapsack" in label:
                continue
            picks = select(ds, m, setting)
            s = summary(ds, records(ds, picks))
            rows.append({"T": T, "B": None if T else 16, "config": label, "recall": s["macro"]["recall"],
                         "hit": s["macro"]["hit"], "multi_hop_hit": s["macro"]["multi_hop_hit"],
                         "tokens": s["macro"]["tokens"], "units": s["macro"]["units"]})
            print(f"paper T={T} {label}: recall {s['macro']['recall']:.3f} units {s['macro']['units']:.1f}", flush=True)
    return rows


def save_results(res: dict, out_dir) -> Path:
    """``res`` merged into ``bridge.json`` (a run over some parts or budgets keeps the others'),
    with ``bridge.md`` (its hand-written summary kept) and ``bridge.png``."""
    from .bridge_report import markdown, plot

    with harness.locked("bridge", out_dir) as old:
        for k in ("headline", "variants", "roles"):  # a run over some budgets keeps the others' cells
            if k in res and isinstance(old.get(k), dict):
                res[k] = {**old[k], **res[k]}
        old.update(res)
        md = out_dir / "bridge.md"
        harness.write_text(md, markdown(old, md.read_text(encoding="utf-8") if md.exists() else ""))
        out = harness.save("bridge", old, plot(old), out_dir=out_dir, dpi=110)
    return out


def run(a, parts: set, Ts: list[int]) -> int:
    t_all = time.perf_counter()
    data = dev_sets(a)
    res: dict = {"protocol": __doc__, "machine": harness.machine()}
    W = fold_weights(data) if parts - {"paper"} else None
    cache: dict = {}

    def get(n, T, label, picks_fn):
        if (n, T, label) not in cache:
            picks = picks_fn()
            recs = records(data[n], picks)
            cache[(n, T, label)] = {"picks": picks[0], "records": recs, "summary": summary(data[n], recs)}
        return cache[(n, T, label)]

    def base(n, T):
        return (get(n, T, "hybrid", lambda: select(data[n], "hybrid", fixed_setting(T=T))),
                get(n, T, "defaults", lambda: select(data[n], "trawmem", trawmem_setting(W, T=T))))

    if "headline" in parts:
        res["headline"] = {}
        for T in Ts:
            for n, ds in data.items():
                h, d = base(n, T)
                cell = {"hybrid": brief(h["summary"]), "defaults": brief(d["summary"]),
                        "vs_hybrid": compare(ds, d["records"], h["records"]),
                        "won_lost": lost_detail(ds, W, T, d["picks"], h["picks"])}
                res["headline"][f"{n}@{T}"] = cell
                th = cell["vs_hybrid"]["target_hit"]
                print(f"{n} T={T}: recall {d['summary']['macro']['recall']:.3f} vs {h['summary']['macro']['recall']:.3f}; "
                      f"target hit {th['margin']:+.3f} [{th['ci95'][0]:+.3f}, {th['ci95'][1]:+.3f}] won/lost {th['won_lost']}",
                      flush=True)
    if "variants" in parts:
        res["variants"] = {}
        for T in [t for t in Ts if t <= 800]:
            for n, ds in data.items():
                h, d = base(n, T)
                for label, v in VARIANTS:
                    if "w_ent" in v and not has_entity_term():
                        continue
                    t0 = time.perf_counter()
                    r = get(n, T, label, lambda: variant_picks(ds, W, T, v))
                    res["variants"][f"{n}@{T}|{label}"] = {"summary": brief(r["summary"]),
                                                          "vs_hybrid": compare(ds, r["records"], h["records"]),
                                                          "vs_defaults": compare(ds, r["records"], d["records"])}
                    print(f"{n} T={T} {label}: recall {r['summary']['macro']['recall']:.3f} target hit "
                          f"{r['summary']['per_category'][ds.cat_name(TARGET_CAT[n])]['hit']:.3f} "
                          f"({time.perf_counter() - t0:.0f}s)", flush=True)
            labels = ["defaults"] + [lab for lab, v in VARIANTS if "w_ent" in v]
            if not has_entity_term():
                continue
            nest = nested(data, cache, T, labels)
            res["variants"][f"nested entity coverage@{T}"] = {
                "chosen": nest["chosen"], **{n: {"summary": brief(summary(data[n], recs)),
                                                 "vs_hybrid": compare(data[n], recs, cache[(n, T, "hybrid")]["records"]),
                                                 "vs_defaults": compare(data[n], recs, cache[(n, T, "defaults")]["records"])}
                                             for n, recs in nest["records"].items()}}
    if "roles" in parts:
        res["roles"] = {}
        lme_T = [int(x) for x in a.lme_T.split(",")] if a.lme_T else Ts
        for T in Ts:
            for n, ds in data.items():
                if n == "longmemeval" and T not in lme_T:
                    continue
                h, d = base(n, T)
                for label, v in role_variants():
                    r = get(n, T, label, lambda: select(ds, "trawmem", trawmem_setting(W, T=T, **v)))
                    res["roles"][f"{n}@{T}|{label}"] = {"summary": brief(r["summary"]),
                                                       "variant_minus_defaults": compare(ds, r["records"], d["records"])}
                    m = res["roles"][f"{n}@{T}|{label}"]["variant_minus_defaults"]["macro_recall"]
                    print(f"roles {n} T={T} {label}: variant - defaults {100 * m['margin']:+.2f} points "
                          f"[{100 * m['ci95'][0]:+.2f}, {100 * m['ci95'][1]:+.2f}]", flush=True)
    if "paper" in parts:
        res["paper"] = paper_rows(data["locomo"])
    seconds = round(time.perf_counter() - t_all, 1)
    res["seconds_" + "_".join(sorted(parts))] = seconds
    out = save_results(res, a.out_dir)
    print(f"wrote {out} ({seconds:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
