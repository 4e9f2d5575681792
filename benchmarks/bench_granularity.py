"""TrawMem over three granularities on LoCoMo dev (issue 21.7-21.8): turns, facts beside them.

    python -m benchmarks run granularity [--data PATH] [--T 400,800,1600] [--methods M,M,...]
        [--out-dir benchmarks/results]

The facts are LoCoMo's per-session observations (``build --facts locomo``: LLM-extracted facts,
each citing its source turn), encoded with the banks' encoder and made units by the banks' unit
view (``store.view.unit_view``). Methods, every one filling the token budget T:

* ``cosine``, ``bm25``, ``hybrid``: the standard baselines over the turns (``select.baselines``);
* ``hybrid+facts``: the hybrid ranking over turns and facts together;
* ``trawmem``: TrawMem over the turns (``--units turns``, today's default);
* ``trawmem+facts``: TrawMem over turns and facts (``--units turns,facts``), the fact-support
  setting chosen per fold (below);
* ``trimem``: TriMem's retrieval (``--method trimem``: facts top-K, their source turns; no
  planning LLM, the question is the only search) over the same observations as facts.

Protocol (nothing is tuned on what it is scored on): TrawMem's learned affinity is the fold's
(``fold_weights`` of ``results/equal_tokens.json``: each LoCoMo conversation's weights fitted on
the other 11 folds of both dev sets by ``bench_equal_tokens.py``); the baselines fit nothing. The
knobs of facts as units, ``SelectConfig.fact_support`` (how much a fact supports its source turn
in K), the group affinity ``SelectConfig.w_grp`` and the knapsack rule are chosen per conversation as the setting of :data:`SETTINGS` with the
best recall with citations on the *other* six conversations at each T (nested leave-one-conversation-
out), and each setting's own scores are reported beside it.

Metrics per method and T, macro over categories 1-4 and per category: evidence recall (gold turns
shown), evidence recall with citations (gold turns shown or cited by a shown fact), all-evidence
hit (both ways), multi-hop (category 1) all-evidence hit, context tokens (cl100k_base, the rendered
workspace), and the mix (turns / facts / profile sections shown per workspace). Writes
``granularity.json`` and ``granularity.png`` under ``--out-dir`` and prints the tables.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import copy
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from . import harness

SETTINGS = ({"fact_support": 0.5, "knapsack": "gain"}, {"fact_support": 0.5, "knapsack": "best"},
            {"fact_support": 1.0, "knapsack": "best"}, {"fact_support": 0.5, "knapsack": "gain", "w_grp": 16.0},
            {"fact_support": 0.5, "knapsack": "best", "w_grp": 16.0})
"""The settings of facts as units the nested choice ranges over (the first: the shipped defaults):
``fact_support`` (K of a fact for its source turn), the knapsack rule (``gain``: the shipped
one, chosen for turns by ``bench_equal_tokens.py``; ``best``: the better of gain and gain per token)
and ``w_grp`` (the group affinity: a fact and its source turns count their affinity once, at the
affinity's own weight ``w_aff = 16``; 0 = off)."""
METHODS = ("cosine", "bm25", "hybrid", "hybrid+facts", "trawmem", "trawmem+facts", "trimem")
KEYS = ("recall", "recall_cited", "hit", "hit_cited", "tokens", "n_turns", "n_facts", "n_profiles")


def fold_weights(path) -> dict:
    """Each LoCoMo conversation's learned-affinity weights, fitted without it (bench_equal_tokens)."""
    import json

    rec = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if "fold_weights" not in rec:
        raise SystemExit(f"bench_granularity: {path} has no fold_weights; run "
                         "`python -m benchmarks run equal_tokens --parts fit` first")
    return {g: tuple(w) for g, w in rec["fold_weights"].items()}


def with_facts(ds):
    """A copy of the dev set whose banks carry LoCoMo's observations as units (turns + facts)."""
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.retrieval import layered_banks
    from trawmem_gpu.select.context import BankContext

    enc = get_encoder(ds.banks[0].build_config.get("encoder", "minilm") if ds.banks[0].build_config else "minilm")
    views = layered_banks(ds.banks, ds.path, ("turns", "facts"), "locomo", enc)
    out = copy.copy(ds)
    out.banks = views
    out.ctxs = {b.bank_id: BankContext.of(b) for b in views}
    return out


def records(ds, picks: list[list[int]], headings: str) -> list[dict]:
    """Per question: category, fold, the recalls and hits (plain and with citations), tokens, mix."""
    from trawmem_gpu.eval.retrieval import layer_scores
    from trawmem_gpu.select.workspace import assemble

    out = []
    for q, p in zip(ds.questions, picks):
        ws = assemble(ds.ctxs[q.bank_id].bank, q.extra["question"], p, headings)
        gold, got = set(q.extra["evidence"]), set(ws.unit_ids)
        ls = layer_scores([t for b in ws.blocks for t in b.units], q.extra["evidence"])
        out.append({"cat": q.category, "group": q.group, "recall": len(gold & got) / len(gold),
                    "hit": float(gold <= got), "recall_cited": ls["evidence_recall_cited"],
                    "hit_cited": ls["all_evidence_hit_cited"], "tokens": ws.n_tokens, "n_turns": ls["n_turns"],
                    "n_facts": ls["n_facts"], "n_profiles": ls["n_profiles"]})
    return out


def summary(recs: list[dict], groups) -> dict:
    def agg(rs):
        per = defaultdict(list)
        for r in rs:
            per[r["cat"]].append(r)
        cats = {str(c): {k: float(np.mean([r[k] for r in v])) for k in KEYS} | {"n": len(v)}
                for c, v in sorted(per.items())}
        macro = {k: float(np.mean([c[k] for c in cats.values()])) for k in KEYS}
        mh = [r for r in rs if r["cat"] == 1]
        macro["multi_hop_hit"] = float(np.mean([r["hit"] for r in mh])) if mh else None
        macro["multi_hop_hit_cited"] = float(np.mean([r["hit_cited"] for r in mh])) if mh else None
        return {"macro": macro, "per_category": cats}

    out = agg(recs)
    out["per_fold"] = {g: agg([r for r in recs if r["group"] == g])["macro"] for g in groups}
    return out


def run_method(ds, dsf, method: str, T: int, W: dict, setting: dict | None = None):
    """``(records, seconds)`` of one method at T (``dsf``: the dev set with facts as units)."""
    from .equal_tokens_bench.data import fixed_setting, select, trawmem_setting

    t0 = time.perf_counter()
    if method in ("cosine", "bm25", "hybrid"):
        picks, h = select(ds, method, fixed_setting(T=T))
        data = ds
    elif method == "hybrid+facts":
        picks, h = select(dsf, "hybrid", fixed_setting(T=T))
        data = dsf
    elif method == "trawmem":
        picks, h = select(ds, "trawmem", trawmem_setting(W, T=T))
        data = ds
    elif method == "trawmem+facts":
        picks, h = select(dsf, "trawmem", trawmem_setting(W, T=T, **(setting or {})))
        data = dsf
    elif method == "trimem":
        (data, picks), h = trimem_run(ds, T), "none"
    else:
        raise ValueError(method)
    return records(data, picks, h), time.perf_counter() - t0


def trimem_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("trawmem_gpu.select.trimem.method") is not None


def trimem_run(ds, T: int):
    """``(dev set whose contexts are the TriMem views, picks)``: TriMem's retrieval (``--method
    trimem``; no planning LLM, the question is the only search) over the banks with LoCoMo's
    observations as their facts layer, under the token budget T."""
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.retrieval import layered_banks
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.select.trimem.method import TriMemRankers

    enc = get_encoder(ds.banks[0].build_config.get("encoder", "minilm") if ds.banks[0].build_config else "minilm")
    banks = layered_banks(ds.banks, ds.path, ("turns",), "locomo", enc)
    rankers = TriMemRankers.prepared({b.bank_id: b for b in banks})
    qp = QueryParams(budget=None, token_budget=T)
    picks = [rankers[q.bank_id].plain_units(q.extra["question"], q.extra["z"], qp) for q in ds.questions]
    out = copy.copy(ds)
    out.banks, out.ctxs = [r.view for r in rankers.values()], {b: r.ctx for b, r in rankers.items()}
    return out, picks


def nested_choice(per_setting: list[list[dict]], groups) -> tuple[list[dict], dict]:
    """Per conversation, the records of the setting whose recall with citations is best on the other
    conversations (macro over categories; ties to the earlier setting), and the setting chosen for each."""
    def score(recs, gs):
        return summary([r for r in recs if r["group"] in gs], [])["macro"]["recall_cited"]

    chosen = {g: max(range(len(per_setting)), key=lambda k: (score(per_setting[k], [h for h in groups if h != g]), -k))
              for g in groups}
    out = [per_setting[chosen[r["group"]]][i] for i, r in enumerate(per_setting[0])]
    return out, {g: SETTINGS[k] for g, k in chosen.items()}


def tables(res: dict) -> str:
    """The markdown tables of a result."""
    lines = ["| T | method | recall | recall w/ citations | all-ev. hit | hit w/ cit. | multi-hop hit | "
             "multi-hop hit w/ cit. | tokens | turns / facts per workspace |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in res["rows"]:
        m = row["summary"]["macro"]
        lines.append(f"| {row['T']} | {row['method']} | {m['recall']:.3f} | {m['recall_cited']:.3f} | {m['hit']:.3f} | "
                     f"{m['hit_cited']:.3f} | {m['multi_hop_hit']:.3f} | {m['multi_hop_hit_cited']:.3f} | "
                     f"{m['tokens']:.0f} | {m['n_turns']:.1f} / {m['n_facts']:.1f} |")
    lines += ["", "Per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop): recall / recall with "
              "citations", "", "| T | method | 1 | 2 | 3 | 4 |", "|---|---|---|---|---|---|"]
    for row in res["rows"]:
        pc = row["summary"]["per_category"]
        lines.append(f"| {row['T']} | {row['method']} | " + " | ".join(
            f"{pc[c]['recall']:.3f} / {pc[c]['recall_cited']:.3f}" for c in ("1", "2", "3", "4")) + " |")
    return "\n".join(lines)


def plot(res: dict):
    fig, axes = harness.figure(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "recall_cited", "evidence recall with citations"),
                           (axes[1], "multi_hop_hit_cited", "multi-hop all-evidence hit (with citations)")):
        for m in dict.fromkeys(r["method"] for r in res["rows"]):
            rows = [r for r in res["rows"] if r["method"] == m]
            ax.plot([r["summary"]["macro"]["tokens"] for r in rows], [r["summary"]["macro"][key] for r in rows],
                    marker="o", label=m)
        ax.set_xlabel("context tokens (mean)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("LoCoMo dev: granularity at T = " + ", ".join(map(str, res["T"])))
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=str, default=None, help="LoCoMo dev file (default: ../shared/data)")
    ap.add_argument("--T", default="400,800,1600", help="token budgets")
    ap.add_argument("--methods", default=",".join(METHODS), help="methods to run")
    ap.add_argument("--out-dir", default=None, help="results folder (default: benchmarks/results)")
    ap.add_argument("--weights", type=Path, default=harness.RESULTS / "equal_tokens.json",
                    help="the result file holding the per-fold affinity weights")
    a = ap.parse_args(argv)
    from .equal_tokens_bench.data import Dataset

    path = harness.require_data(a.data or harness.dev_data("locomo"), "locomo")
    Ts = [int(x) for x in a.T.split(",")]
    methods = [m for m in a.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SystemExit(f"bench_granularity: unknown method {bad[0]!r} (choose from {', '.join(METHODS)})")
    W = fold_weights(a.weights)
    t0 = time.perf_counter()
    ds = Dataset("locomo", path)
    dsf = with_facts(ds)
    n_facts = sum(len(b.turns) for b in dsf.banks) - sum(len(b.turns) for b in ds.banks)
    print(f"facts as units: {n_facts} LoCoMo observations over {len(ds.banks)} banks "
          f"({time.perf_counter() - t0:.0f}s with the dev set)", flush=True)
    res = {"protocol": __doc__.split("Protocol")[1].split("\n\n")[0].strip(), "T": Ts, "rows": [],
           "settings": list(SETTINGS), "n_facts": n_facts, "n_questions": len(ds.questions),
           "folds": ds.groups, "notes": []}
    if "trimem" in methods and not trimem_available():
        methods.remove("trimem")
        res["notes"].append("trimem: not in this build (no trawmem_gpu.select.trimem); skipped")
    for T in Ts:
        for m in methods:
            if m == "trawmem+facts":
                per_setting, secs = [], 0.0
                for st in SETTINGS:
                    recs, sec = run_method(ds, dsf, m, T, W, st)
                    per_setting.append(recs)
                    secs += sec
                    name = ", ".join(f"{k}={v}" for k, v in st.items())
                    res["rows"].append({"T": T, "method": f"trawmem+facts ({name})", "seconds": sec,
                                        "summary": summary(recs, ds.groups)})
                recs, chosen = nested_choice(per_setting, ds.groups)
                row = {"T": T, "method": m, "seconds": secs, "summary": summary(recs, ds.groups),
                       "chosen_per_fold": chosen}
            else:
                recs, sec = run_method(ds, dsf, m, T, W)
                row = {"T": T, "method": m, "seconds": sec, "summary": summary(recs, ds.groups)}
            res["rows"].append(row)
            mm = row["summary"]["macro"]
            print(f"T={T} {row['method']}: recall {mm['recall']:.3f}, with citations {mm['recall_cited']:.3f}, "
                  f"multi-hop hit {mm['multi_hop_hit']:.3f} (cited {mm['multi_hop_hit_cited']:.3f}), tokens "
                  f"{mm['tokens']:.0f}, mix {mm['n_turns']:.1f} turns / {mm['n_facts']:.1f} facts "
                  f"({row['seconds']:.0f}s)", flush=True)
    res["seconds"] = time.perf_counter() - t0
    with harness.locked("granularity", a.out_dir) as old:  # runs of other T / methods are kept
        done = {(r["T"], r["method"]) for r in res["rows"]}
        res["rows"] += [r for r in old.get("rows", []) if (r["T"], r["method"]) not in done]
        res["T"] = sorted(set(res["T"]) | set(old.get("T", [])))
        res["notes"] = list(dict.fromkeys(old.get("notes", []) + res["notes"]))
        _finish(res, a.out_dir)
    return 0


def _finish(res: dict, out_dir) -> None:
    """Sort the rows, state the target (issue 21.8), save the JSON and figure, print the tables."""
    res["rows"].sort(key=lambda r: (r["T"], METHODS.index(r["method"].split(" ")[0])
                                    if r["method"].split(" ")[0] in METHODS else 99, r["method"]))
    target = {}
    by = {(r["T"], r["method"]): r["summary"]["macro"] for r in res["rows"]}
    if (400, "trawmem+facts") in by and (800, "trawmem") in by and (400, "trawmem") in by:
        f4, t8, t4 = by[(400, "trawmem+facts")], by[(800, "trawmem")], by[(400, "trawmem")]
        target = {"trawmem+facts@400 recall_cited": f4["recall_cited"], "trawmem@800 recall_cited": t8["recall_cited"],
                  "reached": f4["recall_cited"] >= t8["recall_cited"],
                  "multi_hop_hit_cited trawmem+facts@400": f4["multi_hop_hit_cited"],
                  "multi_hop_hit trawmem@400": t4["multi_hop_hit"],
                  "multi_hop_kept": f4["multi_hop_hit_cited"] >= t4["multi_hop_hit"]}
        print("target (issue 21.8):", target)
    res["target"] = target
    harness.save("granularity", res, plot(res), out_dir)
    print(tables(res))


if __name__ == "__main__":
    raise SystemExit(main())
