"""Selection quality at equal context tokens on both dev sets, every learned part validated on
held-out folds (issue 12).

    python benchmarks/bench_equal_tokens.py [--locomo PATH] [--lme PATH] [--T 400,800,1600]
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
``--out-dir``; ``--parts fit`` also writes ``affinity_weights.json`` (the shipped weights with
their provenance).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"
LOCOMO = DATA / "locomo" / "locomo_dev.json"
LME = DATA / "longmemeval" / "longmemeval_s_dev.json.gz"
TARGET_T = {"locomo": 800, "longmemeval": 400}
BASELINES = ("cosine", "bm25", "hybrid")
GRID = [dict(headings=h, knapsack=k, w_aff=w) for h in ("date", "gist") for k in ("gain", "best")
        for w in (1.0, 4.0, 16.0)]
HEADLINE = BASELINES + ("trawmem-previous", "trawmem-rrf", "trawmem")
PREVIOUS = dict(affinity="rrf", w_aff=1.0, knapsack="best", headings="gist")
"""The defaults before this benchmark chose them (hand-set fusion, the paper's weights, gist headings)."""


class Dataset:
    """One dev set: its labelled questions (features for the fit), contexts and fold of each question."""

    def __init__(self, name: str, path: Path):
        from trawmem_gpu.head.relevance import load_labelled

        t0 = time.perf_counter()
        self.name, self.path = name, path
        self.questions, self.ctxs = load_labelled(path, dataset=name)
        self.banks = [c.bank for c in self.ctxs.values()]
        self.groups = sorted({q.group for q in self.questions})
        self.category_names = None
        if name == "longmemeval":
            from trawmem_gpu.data.longmemeval import QUESTION_TYPES

            self.category_names = {i + 1: t for i, t in enumerate(QUESTION_TYPES)}
        print(f"{name}: {len(self.questions)} questions, {len(self.banks)} banks, {len(self.groups)} folds "
              f"({time.perf_counter() - t0:.1f}s)", flush=True)

    def cat_name(self, c: int) -> str:
        return self.category_names.get(c, str(c)) if self.category_names else str(c)


def select(ds: Dataset, method: str, cfg_of_group) -> tuple[list[list[int]], str]:
    """Picks for every question of ``ds``, fold by fold (``cfg_of_group(group)`` -> SelectConfig),
    and the headings they are rendered (and were paid for) with."""
    from trawmem_gpu.workspace import headings_for

    from trawmem_gpu.select import SelectionEngine
    from trawmem_gpu.select.baselines import baseline_units

    out: list = [None] * len(ds.questions)
    by_group = defaultdict(list)
    for i, q in enumerate(ds.questions):
        by_group[q.group].append(i)
    cache = {}
    for g, rows in by_group.items():
        cfg = cfg_of_group(g)
        if method in BASELINES:
            for i in rows:
                q = ds.questions[i]
                out[i] = baseline_units(method, ds.ctxs[q.bank_id], q.extra["question"], q.extra["z"], cfg)
        elif method == "alpha-rank":  # ablation: every unit of the bank ranked by the affinity alone
            from trawmem_gpu.select.steps.candidates import unit_affinity
            from trawmem_gpu.select.baselines import take_within_tokens
            from trawmem_gpu.select.objective import date_seconds
            from trawmem_gpu.workspace import fit_to_tokens

            for i in rows:
                q = ds.questions[i]
                ctx = ds.ctxs[q.bank_id]
                a = unit_affinity(ctx, np.asarray(q.extra["z"], dtype=np.float64), q.extra["question"], cfg,
                                  date_seconds(q.extra["date"]))
                order = np.lexsort((np.arange(len(a)), -a))
                costs = ctx.token_costs("none")
                u = take_within_tokens(order, costs, ctx.bank.unit_thread, cfg.token_budget, "skip")
                out[i] = fit_to_tokens(ctx.bank, u, cfg.token_budget, "none", costs=costs)
        else:
            key = json.dumps(cfg.to_dict(), sort_keys=True)
            eng = cache.get(key) or SelectionEngine(ds.banks, cfg)
            cache = {key: eng}
            qs = [ds.questions[i] for i in rows]
            picks = eng.select_units([q.bank_id for q in qs], [q.extra["question"] for q in qs],
                                     np.stack([q.extra["z"] for q in qs]), dates=[q.extra["date"] for q in qs])
            for i, p in zip(rows, picks):
                out[i] = p
    return out, headings_for(method, cfg_of_group(ds.groups[0]))


def records(ds: Dataset, selected: tuple[list[list[int]], str]) -> list[dict]:
    """Per question of ``ds``: category, fold, evidence recall, all-evidence hit, tokens, units of
    ``select``'s picks, rendered with its headings."""
    from trawmem_gpu.workspace import assemble

    picks, headings = selected
    recs = []
    for q, p in zip(ds.questions, picks):
        bank = ds.ctxs[q.bank_id].bank
        ws = assemble(bank, q.extra["question"], p, headings)
        gold, got = set(q.extra["evidence"]), set(ws.unit_ids)
        recs.append({"cat": q.category, "group": q.group, "recall": len(gold & got) / len(gold),
                     "hit": float(gold <= got), "tokens": ws.n_tokens, "units": len(p)})
    return recs


def score(ds: Dataset, selected: tuple[list[list[int]], str]) -> dict:
    """Macro / per-category / per-fold metrics of ``select``'s picks, rendered with its headings."""
    return summary(ds, records(ds, selected))


def summary(ds: Dataset, recs: list[dict]) -> dict:
    """Macro / per-category / per-fold metrics of :func:`records`."""
    def agg(rs):
        per = defaultdict(list)
        for r in rs:
            per[r["cat"]].append(r)
        cats = {ds.cat_name(c): {k: float(np.mean([r[k] for r in v])) for k in ("recall", "hit", "tokens", "units")}
                | {"n": len(v)} for c, v in sorted(per.items())}
        macro = {k: float(np.mean([c[k] for c in cats.values()])) for k in ("recall", "hit", "tokens", "units")}
        mh = [r["hit"] for r in rs if r["cat"] == 1]
        macro["multi_hop_hit"] = float(np.mean(mh)) if mh and ds.name == "locomo" else None
        return {"macro": macro, "per_category": cats}

    out = agg(recs)
    out["per_fold"] = {g: agg([r for r in recs if r["group"] == g])["macro"] for g in ds.groups}
    return out


def margin_bootstrap(ds: Dataset, ours: list[dict], theirs: list[dict], n_boot: int = 10_000, seed: int = 0) -> dict:
    """How sure the dev set is of a macro-recall margin: a paired bootstrap of TrawMem minus the
    hybrid, questions resampled with replacement within each category / question type (the macro
    weighs categories, not questions), ``n_boot`` seeded resamples. Also the resolution of the
    metric: what one question of each category moves the macro by (its recall going from 0 to 1)."""
    rng = np.random.default_rng(seed)
    cats = sorted({r["cat"] for r in ours})
    diffs = {c: np.array([a["recall"] - b["recall"] for a, b in zip(ours, theirs) if a["cat"] == c]) for c in cats}
    point = float(np.mean([d.mean() for d in diffs.values()]))
    boot = np.mean([d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1) for d in diffs.values()], axis=0)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"margin": point, "ci95": [float(lo), float(hi)], "p_above_0": float((boot > 0).mean()),
            "p_at_least_3_points": float((boot >= 0.03).mean()), "n_boot": n_boot,
            "questions_better_worse_equal": [int(sum((d > 0).sum() for d in diffs.values())),
                                             int(sum((d < 0).sum() for d in diffs.values())),
                                             int(sum((d == 0).sum() for d in diffs.values()))],
            "one_question_moves_macro_by": {ds.cat_name(c): 1.0 / len(d) / len(cats) for c, d in diffs.items()}}


def losses(ds: Dataset, ours: list[list[int]], theirs: list[list[int]], cfg_of_group) -> dict:
    """Where TrawMem loses to the hybrid: the questions where it finds fewer gold units, per
    category, and the gold units the hybrid found and TrawMem did not: their token cost over the
    bank's median unit, their rank by TrawMem's own affinity, and whether TrawMem's workspace
    holds anything else from their thread."""
    from trawmem_gpu.select.objective import date_seconds
    from trawmem_gpu.select.steps.candidates import unit_affinity

    per_cat, cost, rank, opened, units = defaultdict(int), [], [], [], []
    for q, o, h in zip(ds.questions, ours, theirs):
        ctx = ds.ctxs[q.bank_id]
        ev = set(q.extra["evidence"])
        gold = {i for i, t in enumerate(ctx.bank.turns) if t.turn_id in ev}
        if len(gold & set(o)) >= len(gold & set(h)):
            continue
        per_cat[ds.cat_name(q.category)] += 1
        a = unit_affinity(ctx, np.asarray(q.extra["z"], dtype=np.float64), q.extra["question"], cfg_of_group(q.group),
                          date_seconds(q.extra["date"]))
        pos = np.empty(len(a), dtype=np.int64)
        pos[np.lexsort((np.arange(len(a)), -a))] = np.arange(len(a))
        c = ctx.token_costs("none").unit
        th = ctx.bank.unit_thread
        ours_threads = {int(th[v]) for v in o}
        units.append(len(o))
        for u in (gold & set(h)) - set(o):
            cost.append(float(c[u] / np.median(c)))
            rank.append(int(pos[u]) + 1)
            opened.append(int(th[u]) in ours_threads)
    n = sum(per_cat.values())
    return {"questions": n, "per_category": dict(per_cat), "missed_gold_units": len(cost),
            "missed_cost_over_bank_median": float(np.median(cost)) if cost else None,
            "missed_affinity_rank_median": float(np.median(rank)) if rank else None,
            "trawmem_units_median": float(np.median(units)) if units else None,
            "missed_thread_in_trawmem_workspace": float(np.mean(opened)) if opened else None}


def trawmem_cfg(W, T=None, B=None, **kw):
    from trawmem_gpu.select.config import SelectConfig

    def f(g):
        c = SelectConfig(affinity="learned", relevance_weights=W[g], **kw)
        return replace(c, token_budget=T, budget=B) if T else replace(c, budget=B or 16)
    return f


def fixed_cfg(T=None, B=None, **kw):
    from trawmem_gpu.select.config import SelectConfig

    c = SelectConfig(**kw)
    c = replace(c, token_budget=T, budget=B) if T else replace(c, budget=B or 16)
    return lambda g: c


def fmt(m: dict) -> str:
    s = f"{m['recall']:.3f} / {m['hit']:.3f}"
    if m.get("multi_hop_hit") is not None:
        s += f" / {m['multi_hop_hit']:.3f}"
    return s + f" / {m['tokens']:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=LOCOMO)
    ap.add_argument("--lme", type=Path, default=LME)
    ap.add_argument("--T", default="400,800,1600")
    ap.add_argument("--parts", default="fit,grid,headline,margin,ablations")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    Ts = [int(x) for x in a.T.split(",")]
    import torch

    torch.set_num_threads(1)
    from trawmem_gpu.head.relevance import cross_validate, fit_relevance, save_weights
    from trawmem_gpu.eval.retrieval import file_sha256
    from trawmem_gpu.select.config import RELEVANCE_FEATURES

    t_all = time.perf_counter()
    data = {"locomo": Dataset("locomo", a.locomo), "longmemeval": Dataset("longmemeval", a.lme)}
    allq = [q for d in data.values() for q in d.questions]
    res: dict = {"protocol": __doc__, "machine": platform.platform(), "features": list(RELEVANCE_FEATURES),
                 "data": {k: {"path": os.path.relpath(d.path, ROOT), "sha256": file_sha256(d.path), "questions": len(d.questions),
                              "folds": d.groups} for k, d in data.items()}}
    t0 = time.perf_counter()
    W = cross_validate(allq)
    res["fold_weights"] = {g: list(w) for g, w in W.items()}
    print(f"fold weights fitted in {time.perf_counter() - t0:.0f}s", flush=True)
    if "fit" in parts:
        shipped = fit_relevance(allq)
        res["shipped_weights"] = list(shipped)
        save_weights(a.out_dir / "affinity_weights.json", shipped,
                     {"data": [{"path": os.path.relpath(d.path, ROOT), "sha256": res["data"][k]["sha256"],
                                "questions": len(d.questions)} for k, d in data.items()],
                      "command": "python benchmarks/bench_equal_tokens.py --parts fit"})
        print("shipped weights:", ", ".join(f"{n} {w:.4g}" for n, w in zip(RELEVANCE_FEATURES + ("bias",), shipped)))
    chosen = {}
    if "grid" in parts:  # nested leave-one-fold-out over the objective's weights under T
        grid = []
        for setting in GRID:
            row = {"setting": setting}
            for name, ds in data.items():
                T = TARGET_T[name]
                row[name] = score(ds, select(ds, "trawmem", trawmem_cfg(W, T=T, **setting)))
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
        res["grid"] = {"settings": GRID, "rows": [{"setting": r["setting"], **{n: r[n]["macro"] for n in data}}
                                                   for r in grid],
                       "chosen_per_fold": {g: GRID[i] for g, i in pick.items()}, "default": chosen}
        nested = {}
        for n, ds in data.items():
            vals = [grid[pick[g]][n]["per_fold"][g]["recall"] for g in ds.groups]
            nested[n] = {"fold_recall": dict(zip(ds.groups, vals))}
        res["grid"]["nested"] = nested
        print("chosen per fold:", {g: GRID[i] for g, i in pick.items()}, "-> default", chosen, flush=True)
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
                        cfg = fixed_cfg(T=T)
                    elif method == "trawmem-previous":
                        cfg = fixed_cfg(T=T, **PREVIOUS)
                    elif method == "trawmem-rrf":
                        cfg = fixed_cfg(T=T, **{**chosen, "affinity": "rrf"})
                    else:
                        cfg = trawmem_cfg(W, T=T, **chosen)
                    row[name] = summary(ds, picks_of(name, method, T, cfg)[1])
                rows.append(row)
                print(f"T={T} {method:>12}: " + " | ".join(f"{n} {fmt(row[n]['macro'])}" for n in data), flush=True)
        res["headline"] = rows
    if "margin" in parts:  # how sure the dev sets are of TrawMem's margin over the hybrid
        res["margin"] = {}
        for T in Ts:
            for name, ds in data.items():
                cfg = trawmem_cfg(W, T=T, **chosen)
                ours_sel, ours = picks_of(name, "trawmem", T, cfg)
                theirs_sel, theirs = picks_of(name, "hybrid", T, fixed_cfg(T=T))
                m = res["margin"][f"{name}@{T}"] = margin_bootstrap(ds, ours, theirs)
                m["losses"] = losses(ds, ours_sel[0], theirs_sel[0], cfg)
                print(f"margin {name} T={T}: {100 * m['margin']:+.1f} points, 95% CI "
                      f"[{100 * m['ci95'][0]:+.1f}, {100 * m['ci95'][1]:+.1f}], P(>= +3) {m['p_at_least_3_points']:.2f}, "
                      f"better/worse/equal {m['questions_better_worse_equal']}", flush=True)
    if "ablations" in parts:
        abl = []
        base = dict(chosen)
        variants = [("defaults", {}), ("affinity rrf (hand-set fusion)", {"__rrf": True}),
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
        for label, v in variants:
            row = {"variant": label}
            for name, ds in data.items():
                T = TARGET_T[name]
                if v.get("__rrf"):
                    cfg, m = fixed_cfg(T=T, affinity="rrf", **base), "trawmem"
                elif v.get("__alpha"):
                    cfg, m = trawmem_cfg(W, T=T), "alpha-rank"
                else:
                    cfg, m = trawmem_cfg(W, T=T, **{**base, **v}), "trawmem"
                row[name] = score(ds, select(ds, m, cfg))
            abl.append(row)
            print(f"ablation {label:>40}: " + " | ".join(f"{n}@{TARGET_T[n]} {fmt(row[n]['macro'])}" for n in data),
                  flush=True)
        res["ablations"] = abl
    full = {"fit", "grid", "headline", "margin", "ablations"} <= parts
    seconds = round(time.perf_counter() - t_all, 1)
    res["seconds" if full else "seconds_" + "_".join(sorted(parts))] = seconds
    a.out_dir.mkdir(parents=True, exist_ok=True)
    out = a.out_dir / "equal_tokens.json"
    old = json.loads(out.read_text()) if out.exists() else {}
    old.update(res)
    write_md(old, a.out_dir / "equal_tokens.md")
    out.write_text(json.dumps(old, indent=1, default=str))
    plot(old, a.out_dir / "equal_tokens.png")
    print(f"wrote {out} ({seconds:.0f}s)")
    return 0


def nested_ablation_choice(res: dict) -> dict:
    """Would any config variant of the ablation table beat the defaults on held-out folds? For
    each fold, the variant with the best mean macro recall on the *other* folds (mean over the two
    data sets) is scored on it; compared with the defaults fold by fold."""
    data = ("locomo", "longmemeval")
    cands = [a for a in res["ablations"] if not a["variant"].startswith(("alpha", "affinity rrf", "knapsack gain"))]
    out = {"chosen": {}, "per_fold": {}}
    for n in data:
        for g in res["data"][n]["folds"]:
            def others(a):
                return np.mean([np.mean([a[m]["per_fold"][h]["recall"] for h in res["data"][m]["folds"] if h != g])
                                for m in data])
            best = max(range(len(cands)), key=lambda i: (others(cands[i]), -i))
            out["chosen"][g] = cands[best]["variant"]
            out["per_fold"][g] = {"nested": cands[best][n]["per_fold"][g]["recall"],
                                  "defaults": cands[0][n]["per_fold"][g]["recall"]}
    for n in data:
        fs = res["data"][n]["folds"]
        out[n] = {k: float(np.mean([out["per_fold"][g][k] for g in fs])) for k in ("nested", "defaults")}
    return out


def write_md(res: dict, path: Path) -> None:
    lines = ["# Equal-token quality (issue 12)", "",
             "macro evidence recall / all-evidence hit / [multi-hop hit] / context tokens; TrawMem's learned",
             "affinity per fold from the other 11 folds (`benchmarks/bench_equal_tokens.py`).", ""]
    if "headline" in res:
        lines += ["| budget | method | LoCoMo dev | LongMemEval dev |", "|---|---|---|---|"]
        for r in res["headline"]:
            b = f"T = {r['T']}" if r["T"] else f"B = {r['B']}"
            lines.append(f"| {b} | {r['method']} | {fmt(r['locomo']['macro'])} | {fmt(r['longmemeval']['macro'])} |")
        lines.append("")
    if "headline" in res:  # per category / question type and per fold at the target budgets
        for name, title in (("locomo", "LoCoMo dev"), ("longmemeval", "LongMemEval dev")):
            T = TARGET_T[name]
            rows = {r["method"]: r[name] for r in res["headline"] if r["T"] == T}
            if "trawmem" not in rows:  # --T without this data set's target budget
                continue
            cats = list(rows["trawmem"]["per_category"])
            lines += [f"{title}, T = {T}: evidence recall / all-evidence hit per "
                      f"{'category' if name == 'locomo' else 'question type'} (n questions)", "",
                      "| | " + " | ".join(f"{c} ({rows['trawmem']['per_category'][c]['n']})" for c in cats) + " |",
                      "|---|" + "---|" * len(cats)]
            for m, r in rows.items():
                lines.append(f"| {m} | " + " | ".join(f"{r['per_category'][c]['recall']:.3f} / "
                                                      f"{r['per_category'][c]['hit']:.3f}" for c in cats) + " |")
            folds = list(rows["trawmem"]["per_fold"])
            lines += ["", f"{title}, T = {T}: macro evidence recall per held-out fold", "",
                      "| | " + " | ".join(f.split(":")[1] for f in folds) + " |", "|---|" + "---|" * len(folds)]
            for m in ("hybrid", "trawmem-previous", "trawmem"):
                lines.append(f"| {m} | " + " | ".join(f"{rows[m]['per_fold'][f]['recall']:.3f}" for f in folds) + " |")
            lines.append("")
    if "margin" in res:
        lines += ["TrawMem minus hybrid, macro evidence recall in points: paired bootstrap over questions within each "
                  "category / type (10,000 resamples)", "",
                  "| set @ T | margin | 95% interval | P(margin >= 3) | questions better / worse / equal | "
                  "one question moves the macro by (smallest - largest category) |", "|---|---|---|---|---|---|"]
        for k, m in res["margin"].items():
            lines.append(f"| {k} | {100 * m['margin']:+.1f} | [{100 * m['ci95'][0]:+.1f}, {100 * m['ci95'][1]:+.1f}] | "
                         f"{m['p_at_least_3_points']:.2f} | {' / '.join(map(str, m['questions_better_worse_equal']))} | "
                         f"{100 * min(m['one_question_moves_macro_by'].values()):.2f} - "
                         f"{100 * max(m['one_question_moves_macro_by'].values()):.1f} |")
        lines += ["", "Where TrawMem loses: questions where it finds fewer gold units than the hybrid (per category), "
                  "and the gold units the hybrid found and TrawMem missed", "",
                  "| set @ T | questions (per category) | missed gold units | their cost / bank median | "
                  "their rank by TrawMem's affinity (median) | TrawMem's units (median) | "
                  "their thread elsewhere in TrawMem's workspace |", "|---|---|---|---|---|---|---|"]
        for k, m in res["margin"].items():
            lo = m.get("losses")
            if not lo or not lo["questions"]:
                continue
            cats = ", ".join(f"{c}: {v}" for c, v in sorted(lo["per_category"].items()))
            lines.append(f"| {k} | {lo['questions']} ({cats}) | {lo['missed_gold_units']} | "
                         f"{lo['missed_cost_over_bank_median']:.2f} | {lo['missed_affinity_rank_median']:.1f} | "
                         f"{lo['trawmem_units_median']:.0f} | {100 * lo['missed_thread_in_trawmem_workspace']:.0f}% |")
        lines.append("")
    if "grid" in res:
        lines += ["Grid (nested leave-one-fold-out; macro recall at LoCoMo T = 800 / LongMemEval T = 400)", "",
                  "| headings | knapsack | w_aff | LoCoMo | LongMemEval |", "|---|---|---|---|---|"]
        for r in res["grid"]["rows"]:
            s = r["setting"]
            lines.append(f"| {s['headings']} | {s['knapsack']} | {s['w_aff']:g} | {fmt(r['locomo'])} | "
                         f"{fmt(r['longmemeval'])} |")
        lines += ["", f"default (chosen in most folds): {res['grid']['default']}", ""]
    if "ablations" in res:
        lines += ["| variant (LoCoMo T = 800, LongMemEval T = 400) | LoCoMo | LongMemEval |", "|---|---|---|"]
        for r in res["ablations"]:
            lines.append(f"| {r['variant']} | {fmt(r['locomo']['macro'])} | {fmt(r['longmemeval']['macro'])} |")
        nest = res["ablation_nested"] = nested_ablation_choice(res)
        from collections import Counter

        lines += ["", "Variant chosen per fold on the other folds (nested): "
                  + ", ".join(f"{v} {c}" for v, c in Counter(nest["chosen"].values()).most_common())
                  + "; mean per-fold macro recall, nested vs defaults: "
                  + "; ".join(f"{n} {nest[n]['nested']:.4f} vs {nest[n]['defaults']:.4f}"
                              for n in ("locomo", "longmemeval")), ""]
    path.write_text("\n".join(lines) + "\n")


def plot(res: dict, path: Path) -> None:
    if "headline" not in res:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, name in zip(axes, ("locomo", "longmemeval")):
        for method in HEADLINE:
            pts = sorted((r[name]["macro"]["tokens"], r[name]["macro"]["recall"]) for r in res["headline"]
                         if r["method"] == method and r["T"])
            ax.plot(*zip(*pts), marker="o", label=method, lw=2.5 if method == "trawmem" else 1.2)
        ax.set_title(f"{name} dev: macro evidence recall at equal tokens")
        ax.set_xlabel("context tokens (cl100k_base)")
        ax.set_ylabel("macro evidence recall")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
