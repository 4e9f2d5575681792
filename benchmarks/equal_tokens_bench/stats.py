"""Scores of a method's picks: per-question records, macro / per-category / per-fold
summaries, the paired margin bootstrap, where TrawMem loses, and the nested ablation choice."""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .data import Dataset


def records(ds: Dataset, selected: tuple[list[list[int]], str]) -> list[dict]:
    """Per question of ``ds``: category, fold, evidence recall, all-evidence hit, tokens, units of
    ``select``'s picks, rendered with its headings."""
    from trawmem_gpu.select.workspace import assemble

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


def losses(ds: Dataset, ours: list[list[int]], theirs: list[list[int]], setting_of_group) -> dict:
    """Where TrawMem loses to the hybrid: the questions where it finds fewer gold units, per
    category, and the gold units the hybrid found and TrawMem did not: their token cost over the
    bank's median unit, their rank by TrawMem's own affinity, and whether TrawMem's workspace
    holds anything else from their thread."""
    from trawmem_gpu.select.objective import date_seconds
    from trawmem_gpu.select.steps.affinity import unit_affinity

    per_cat, cost, rank, opened, units = defaultdict(int), [], [], [], []
    for q, o, h in zip(ds.questions, ours, theirs):
        ctx = ds.ctxs[q.bank_id]
        ev = set(q.extra["evidence"])
        gold = {i for i, t in enumerate(ctx.bank.turns) if t.turn_id in ev}
        if len(gold & set(o)) >= len(gold & set(h)):
            continue
        per_cat[ds.cat_name(q.category)] += 1
        a = unit_affinity(ctx, np.asarray(q.extra["z"], dtype=np.float64), q.extra["question"], setting_of_group(q.group)[0],
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
