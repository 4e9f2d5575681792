"""The paper's retrieval-side analyses (Sections 5.4-5.8 and 6), with its numbers beside ours.

    python benchmarks/paper_analyses.py [--data PATH] [--modes default,paper] \
        [--parts fig7,fig8,fig9,fig10,fig12,table3] [--llm SPEC] [--out benchmarks/results]

On the LoCoMo file given (categories 1-4, questions with gold evidence), for the shipped
defaults (``SelectConfig()``) and the paper-faithful configuration (``SelectConfig.paper()``),
each at B = 16 and its own H unless the figure varies it:

- Fig. 8, workspace compression: candidate and selected units per category and the reduction
  ratio c_q = 1 - |S_q| / |U_q| (mean, median), 95% intervals from 2,000 bootstrap resamples of
  whole conversations;
- Fig. 9, coverage and redundancy against B: distinct relevant facts retained and repeated
  fact mentions for Random, Top-B cosine, Top-B hybrid (RRF) and TrawMem, with LoCoMo's
  ``observation`` facts as the annotation (definitions in ``trawmem_gpu/eval/analyses.py``);
- Fig. 10, context length (CDF per category; tokenizer tiktoken ``cl100k_base``) and
  retrieval time per query by category;
- Fig. 12, distinct threads per workspace by category and units per used thread;
- Fig. 7, role shifts: for a unit that is the only gold turn of one question and one of several
  gold turns of another, and is selected by both, the change of its (anchor, bridge, context)
  weights rho between the two;
- Table 3, efficiency columns for H = 1, 2, 3: construction and retrieval time per conversation
  ("root") and answer-context tokens; construction with extractive heads, and with LLM
  segmentation and heads when ``--llm`` names a server.

Timing follows ``trawmem sweep`` (``trawmem_gpu/eval/sweep.py``): banks built one conversation
at a time with the embedding cache off, each question encoded alone with the cache off, each
query selected alone with the configurations interleaved query by query; BLAS / torch pools
at ``--threads`` (default 1) for all of it, builds included. Writes ``paper_<part>.json`` and ``.png`` per part and
``paper_vs_ours.json`` / ``.md`` under ``--out``; metrics only, never data text.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
PARTS = ("fig7", "fig8", "fig9", "fig10", "fig12", "table3")
CATS = (1, 2, 3, 4)
CAT_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
B = 16
HOPS = (1, 2, 3)
FIG9_BUDGETS = (1, 2, 4, 8, 12, 16, 24, 32)

# The paper's reported numbers (Sections 5.4-5.8 and Table 3), 10 LoCoMo conversations, 1,540
# questions, Qwen3-Embedding-0.6B, LLM thread segmentation and heads, B = 16.
PAPER = {
    "fig8": {"candidates_mean": 144.8, "selected_mean": 15.4, "reduction_mean": 0.892,
             "candidates_category_range": [141.6, 145.6], "selected_category_range": [15.1, 15.8],
             "reduction_mean_by_category": {"1": 0.895, "2": 0.888, "3": 0.892, "4": 0.893},
             "reduction_median_by_category": {"1": 0.896, "2": 0.890, "3": 0.894, "4": 0.895},
             "questions_by_category": {"1": 282, "2": 321, "3": 96, "4": 841}},
    "fig10": {"tokens_mean": 2216, "tokens_p90": 2440, "tokens_p95": 2516, "tokens_category_mean_range": [2129, 2300],
              "tokenizer": "Qwen3.8-27B tokenizer", "time_median_s": 3.57, "time_p95_s": 7.12},
    "fig12": {"threads_mean": 10.54, "units_mean": 15.36, "units_per_used_thread": 1.53, "threads_min": 5,
              "threads_max": 16, "threads_by_category": {"1": 11.28, "2": 10.59, "3": 10.51, "4": 10.28}},
    "fig7": {"pairs": 356, "pairs_source": "query pairs written by gpt-5.6-luna per unit",
             "finding": "anchor weight falls and bridge weight rises from q_A to q_B; context has no consistent trend"},
    "fig9": {"finding": "TrawMem retains more distinct relevant facts than Top-B relevance over most budgets with "
                        "fewer repeated mentions; Random repeats least but retains far fewer facts"},
    "table3": {"Qwen3.5-9B": {"3": [96.1, 603.8, 699.9, 2050], "2": [75.8, 552.7, 628.5, 2050],
                              "1": [63.5, 508.2, 571.7, 2050]},
               "DeepSeek-V4-Flash": {"3": [54.4, 459.2, 513.6, 2406], "2": [43.2, 403.6, 446.8, 2406],
                                     "1": [37.2, 357.5, 394.7, 2406]},
               "columns": ["construction_s_per_root", "retrieval_s_per_root", "total_s_per_root",
                           "answer_context_tokens_per_q"]},
}

WHY = {
    "candidates": "Candidate-set size is set by the neighbourhood: the paper does not give its seed count or cap; "
                  "ours derive from B (n_seeds = B/2 = 8 seed threads, cap 3B/4 = 12 threads at B = 16) over "
                  "embedding-segmented threads of 3-12 turns (mean ~5), so |U_q| is about half the paper's 144.8.",
    "tokens": "The paper counts with the Qwen3.8-27B tokenizer and its thread heads are LLM summaries; ours are "
              "tiktoken cl100k_base counts of short extractive headings (the thread's date and its most central "
              "turn, clipped, left out when that turn is itself selected), so 16 turns under ~9-11 headings come "
              "to well under half the paper's ~2,200 tokens.",
    "time": "The paper embeds with Qwen3-Embedding-0.6B and lists an evidence-selection prompt (its Section 7.1); "
            "its retrieval takes seconds per query. Ours is LLM-free: one MiniLM question encoding plus the NumPy "
            "reference selection and the workspace rendering, one CPU thread, in milliseconds (on a shared "
            "2-core host under load: the absolute figures move with the load, see machine.loadavg).",
    "construction": "The paper's construction calls an LLM per segment (event segmentation and thread heads) and its "
                    "reported time changes with H (63.5 / 75.8 / 96.1 s); ours encodes turns and heads with MiniLM "
                    "on one CPU thread with extractive heads, and H is a query-time setting only, so construction "
                    "is the same for every H. With --llm the LLM-segmentation + LLM-head build is timed too.",
    "threads": "Fewer candidate threads (12 at most) bound the threads per workspace (range up to 12, not 16); "
               "the defaults take more units per thread than the paper's 1.53, while the paper-faithful mode "
               "(head seeds, Eq. 4 propagation) comes close to the paper's mean threads and units per thread.",
    "fig9": "The paper compares with Top-B relevance (embedding similarity). Against Top-B cosine the defaults "
            "retain more relevant facts with fewer repeated mentions at B = 16, as the paper reports; against "
            "the RRF hybrid (the strongest standard baseline here) they tie on both. The paper-faithful mode "
            "repeats least of the non-random methods at B = 16 but retains far fewer facts: its head-vector "
            "seeds miss many gold threads (see the README's headline table).",
    "fig7": "The paper's 356 query pairs were written by an LLM per unit; ours come from the gold evidence: a unit "
            "that is the only gold turn of one question (direct support) and one of several gold turns of "
            "another (it must be combined), selected by both (paper_fig7.json gives both sides' categories: the "
            "direct questions are single-hop or temporal, the bridging ones mostly multi-hop). On these pairs "
            "the hand-set role matrices move weight from context to anchor and leave bridge nearly unchanged, "
            "so the paper's direction (anchor down, bridge up) is not reproduced; a likely reason is that the "
            "hand-set rho follows the question's demand cues (a temporal cue raises the context demand) and the "
            "unit's affinity more than the unit's function in the answer.",
}


# ----------------------------------------------------------------------------------------------
# helpers

def _ci(values, clusters):
    from trawmem_gpu.eval.analyses import cluster_bootstrap

    est, lo, hi = cluster_bootstrap(values, clusters, n_boot=2000, seed=0)
    return {"mean": est, "ci95": [lo, hi]}


def _ci_median(values, clusters):
    from trawmem_gpu.eval.analyses import cluster_bootstrap

    est, lo, hi = cluster_bootstrap(values, clusters, stat=np.median, n_boot=2000, seed=0)
    return {"median": est, "ci95": [lo, hi]}


def _by_cat(rows, key):
    return {str(c): [r[key] for r in rows if r["category"] == c] for c in CATS}


def _write(out: Path, name: str, obj: dict) -> None:
    p = out / f"{name}.json"
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(p)


def _figure(rows: int, cols: int, width: float, row_height: float):
    """``(fig, axes [rows, cols])`` on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=(width, row_height * rows), squeeze=False)


def _save(fig, out: Path, name: str, title: str) -> None:
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)


def _box_by_category(ax, data: list[list[float]], mean_label: str) -> None:
    """Paper-style boxes per category: black medians, orange means, hollow outliers."""
    ax.boxplot(data, tick_labels=[CAT_NAMES[c] for c in CATS], medianprops={"color": "k"},
               flierprops={"marker": "o", "markerfacecolor": "none", "markersize": 3})
    ax.scatter(np.arange(1, len(data) + 1), [np.mean(d) for d in data], color="orange", zorder=5, label=mean_label)


def query_rows(runner, items, banks, enc_s) -> list[dict]:
    """Per question (no text): counts, ratio, threads, tokens, time, for one configuration."""
    from trawmem_gpu.eval.analyses import reduction_ratio, thread_usage

    rows = []
    for (bid, q), rec, sel, e in zip(items, runner.records, runner.selections, enc_s):
        n_thr, upt = thread_usage(sel.units, banks[bid].unit_thread)
        rows.append({"qid": q.qid, "bank_id": bid, "category": q.category, "n_candidates": int(len(sel.candidates)),
                     "n_selected": len(sel.units), "c_q": reduction_ratio(len(sel.units), len(sel.candidates)),
                     "n_threads": n_thr, "units_per_thread": upt, "context_tokens": rec["context_tokens"],
                     "time_s": float(e) + rec["latency_s"], "select_s": rec["select_s"],
                     "evidence_recall": rec["evidence_recall"]})
    return rows


# ----------------------------------------------------------------------------------------------
# Fig. 8

def fig8(rows_by_mode: dict, out: Path) -> dict:
    res = {"paper": PAPER["fig8"], "budget": B, "bootstrap": "2,000 resamples of whole conversations, 95% percentile",
           "why": [WHY["candidates"]], "modes": {}}
    for mode, rows in rows_by_mode.items():
        cl = [r["bank_id"] for r in rows]
        m = {"all": {"candidates": _ci([r["n_candidates"] for r in rows], cl),
                     "selected": _ci([r["n_selected"] for r in rows], cl),
                     "reduction": _ci([r["c_q"] for r in rows], cl) | _ci_median([r["c_q"] for r in rows], cl),
                     "n": len(rows)}}
        for c in CATS:
            rs = [r for r in rows if r["category"] == c]
            cc = [r["bank_id"] for r in rs]
            m[str(c)] = {"candidates": _ci([r["n_candidates"] for r in rs], cc),
                         "selected": _ci([r["n_selected"] for r in rs], cc),
                         "reduction": _ci([r["c_q"] for r in rs], cc) | _ci_median([r["c_q"] for r in rs], cc),
                         "n": len(rs)}
        m["per_question"] = {"category": [r["category"] for r in rows], "c_q": [r["c_q"] for r in rows],
                             "n_candidates": [r["n_candidates"] for r in rows],
                             "n_selected": [r["n_selected"] for r in rows]}
        res["modes"][mode] = m
    _write(out, "paper_fig8", res)
    modes = list(rows_by_mode)
    fig, axes = _figure(len(modes), 2, 12, 4.2)
    for k, mode in enumerate(modes):
        m = res["modes"][mode]
        ax = axes[k, 0]
        x = np.arange(len(CATS) + 1)
        labels = [CAT_NAMES[c] for c in CATS] + ["all"]
        keys = [str(c) for c in CATS] + ["all"]
        for off, what, col in ((-0.2, "candidates", "C0"), (0.2, "selected", "C1")):
            mu = [m[s][what]["mean"] for s in keys]
            lo = [m[s][what]["mean"] - m[s][what]["ci95"][0] for s in keys]
            hi = [m[s][what]["ci95"][1] - m[s][what]["mean"] for s in keys]
            ax.bar(x + off, mu, 0.4, yerr=[lo, hi], capsize=3, color=col, label=f"{what} units (ours)")
        ax.scatter(x[-1:] - 0.2, [PAPER["fig8"]["candidates_mean"]], marker="D", color="k", zorder=5,
                   label="paper: 144.8 candidates")
        ax.scatter(x[-1:] + 0.2, [PAPER["fig8"]["selected_mean"]], marker="x", color="k", zorder=5,
                   label="paper: 15.4 selected")
        ax.set_xticks(x, labels)
        ax.set_ylabel("units per query")
        ax.set_title(f"(a) candidates |U_q| and selected |S_q|, {mode} (95% CI, conversations resampled)", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[k, 1]
        data = [[100 * v for v, c in zip(m["per_question"]["c_q"], m["per_question"]["category"]) if c == cc]
                for cc in CATS]
        _box_by_category(ax, data, "mean (ours)")
        ax.scatter(np.arange(1, 5), [100 * PAPER["fig8"]["reduction_mean_by_category"][str(c)] for c in CATS],
                   marker="x", color="k", zorder=6, label="paper mean")
        ax.set_ylabel("100 c_q (%)")
        ax.set_title(f"(b) unit-count reduction per question, {mode}", fontsize=9)
        ax.legend(fontsize=7)
    _save(fig, out, "paper_fig8", "Fig. 8 reproduced: workspace compression (B = 16)")
    return res


# ----------------------------------------------------------------------------------------------
# Fig. 10

def fig10(rows_by_mode: dict, out: Path, tokenizer: str, encoder_id: str) -> dict:
    from trawmem_gpu.eval.analyses import describe

    res = {"paper": PAPER["fig10"], "tokenizer": tokenizer, "encoder": encoder_id, "budget": B,
           "time_definition": "per question, alone: question encoding (embedding cache off) + selection + "
                              "workspace assembly and rendering",
           "why": [WHY["tokens"], WHY["time"]], "modes": {}}
    for mode, rows in rows_by_mode.items():
        m = {"tokens": {"all": describe([r["context_tokens"] for r in rows])},
             "time_s": {"all": describe([r["time_s"] for r in rows])},
             "select_ms": describe([1e3 * r["select_s"] for r in rows])}
        for c in CATS:
            m["tokens"][str(c)] = describe([r["context_tokens"] for r in rows if r["category"] == c])
            m["time_s"][str(c)] = describe([r["time_s"] for r in rows if r["category"] == c])
        m["per_question"] = {"category": [r["category"] for r in rows],
                             "context_tokens": [r["context_tokens"] for r in rows],
                             "time_s": [round(r["time_s"], 6) for r in rows]}
        res["modes"][mode] = m
    _write(out, "paper_fig10", res)
    modes = list(rows_by_mode)
    fig, axes = _figure(len(modes), 2, 12, 4.2)
    for k, mode in enumerate(modes):
        pq = res["modes"][mode]["per_question"]
        ax = axes[k, 0]
        for c in CATS:
            v = np.sort([t for t, cc in zip(pq["context_tokens"], pq["category"]) if cc == c])
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), marker=".", ms=2, lw=0.8, label=CAT_NAMES[c])
        t = res["modes"][mode]["tokens"]["all"]
        for q, ls in (("mean", "-"), ("p90", "--"), ("p95", ":")):
            ax.axvline(t[q], color="grey", ls=ls, lw=0.8, label=f"{q} {t[q]:.0f}")
        ax.set_xlabel(f"context tokens ({tokenizer})")
        ax.set_ylabel("cumulative share of questions")
        ax.set_title(f"(a) context length CDF, {mode} (paper: mean 2,216 / p90 2,440 / p95 2,516, Qwen tokenizer)",
                     fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[k, 1]
        data = [[1e3 * s for s, cc in zip(pq["time_s"], pq["category"]) if cc == c] for c in CATS]
        _box_by_category(ax, data, "mean")
        ax.set_yscale("log")
        ta = res["modes"][mode]["time_s"]["all"]
        ax.set_ylabel("retrieval time per query (ms, log)")
        ax.set_title(f"(b) retrieval time, {mode}: median {1e3 * ta['median']:.1f} ms, p95 {1e3 * ta['p95']:.1f} ms "
                     f"(paper 3.57 s / 7.12 s)", fontsize=9)
        ax.legend(fontsize=7)
    _save(fig, out, "paper_fig10", "Fig. 10 reproduced: memory-context length and retrieval time (B = 16)")
    return res


# ----------------------------------------------------------------------------------------------
# Fig. 12

def fig12(rows_by_mode: dict, out: Path) -> dict:
    res = {"paper": PAPER["fig12"], "budget": B, "why": [WHY["threads"]], "modes": {}}
    for mode, rows in rows_by_mode.items():
        cl = [r["bank_id"] for r in rows]
        nt = [r["n_threads"] for r in rows]
        m = {"threads": _ci(nt, cl), "units": _ci([r["n_selected"] for r in rows], cl),
             "units_per_used_thread": _ci([r["units_per_thread"] for r in rows], cl),
             "threads_min": int(min(nt)), "threads_max": int(max(nt)), "by_category": {}}
        for c in CATS:
            rs = [r for r in rows if r["category"] == c]
            v = np.array([r["n_threads"] for r in rs])
            hist = {int(k): float((v == k).mean()) for k in np.unique(v)}
            m["by_category"][str(c)] = {"threads": _ci(v, [r["bank_id"] for r in rs]), "share_by_threads": hist,
                                        "n": len(rs)}
        res["modes"][mode] = m
    _write(out, "paper_fig12", res)
    modes = list(rows_by_mode)
    fig, axes = _figure(len(modes), 1, 11, 3.8)
    for k, mode in enumerate(modes):
        ax = axes[k, 0]
        m = res["modes"][mode]
        ks = sorted({t for c in CATS for t in m["by_category"][str(c)]["share_by_threads"]})
        x = np.arange(len(ks))
        for i, c in enumerate(CATS):
            sh = m["by_category"][str(c)]["share_by_threads"]
            ax.bar(x + (i - 1.5) * 0.2, [sh.get(t, 0.0) for t in ks], 0.2,
                   label=f"{CAT_NAMES[c]} (mean {m['by_category'][str(c)]['threads']['mean']:.2f}; paper "
                         f"{PAPER['fig12']['threads_by_category'][str(c)]})")
        ax.set_xticks(x, [str(t) for t in ks])
        ax.set_xlabel("distinct threads the selected units come from")
        ax.set_ylabel("share of questions")
        ax.set_title(f"{mode}: {m['units']['mean']:.2f} units from {m['threads']['mean']:.2f} threads, "
                     f"{m['units_per_used_thread']['mean']:.2f} units per used thread, range "
                     f"{m['threads_min']}-{m['threads_max']} (paper: 15.36 from 10.54, 1.53, 5-16)", fontsize=9)
        ax.legend(fontsize=7)
    _save(fig, out, "paper_fig12", "Fig. 12 reproduced: threads per workspace (B = 16)")
    return res


# ----------------------------------------------------------------------------------------------
# Fig. 7

def fig7(runner_by_mode: dict, items, banks, out: Path) -> dict:
    from trawmem_gpu.eval.analyses import anchor_bridge_pairs

    res = {"paper": PAPER["fig7"], "roles": ["anchor", "bridge", "context"], "budget": B,
           "pair_definition": "unit v with gold(q_A) = {v} and v in gold(q_B), |gold(q_B)| >= 2, same conversation, "
                              "v selected by both; delta = rho_qB(v) - rho_qA(v)",
           "why": [WHY["fig7"]], "modes": {}}
    for mode, runner in runner_by_mode.items():
        sel_of, qs = {}, []
        for (bid, q), sel in zip(items, runner.selections):
            idx = banks[bid].index_of()
            sel_of[q.qid] = sel
            qs.append({"qid": q.qid, "bank_id": bid, "gold": [idx[t] for t in q.evidence], "selected": sel.units})
        pairs = anchor_bridge_pairs(qs)
        loose = anchor_bridge_pairs(qs, require_selected=False)
        ra, rb = [], []
        for p in pairs:
            for sel, acc in ((sel_of[p.q_direct], ra), (sel_of[p.q_bridge], rb)):
                pos = int(np.searchsorted(sel.candidates, p.unit))
                assert sel.candidates[pos] == p.unit
                acc.append(sel.rho[pos].tolist())
        ra, rb = np.array(ra).reshape(-1, 3), np.array(rb).reshape(-1, 3)
        d = rb - ra
        order = np.argsort(ra[:, 0], kind="stable") if len(ra) else np.array([], dtype=int)
        cat = {q.qid: q.category for _, q in items}
        res["modes"][mode] = {
            "pairs": len(pairs), "pairs_without_selection_requirement": len(loose),
            "q_direct_categories": {str(c): sum(cat[p.q_direct] == c for p in pairs) for c in CATS},
            "q_bridge_categories": {str(c): sum(cat[p.q_bridge] == c for p in pairs) for c in CATS},
            "delta_mean": d.mean(0).tolist() if len(d) else None,
            "delta_median": np.median(d, 0).tolist() if len(d) else None,
            "share_delta_positive": (d > 0).mean(0).tolist() if len(d) else None,
            "rho_direct_mean": ra.mean(0).tolist() if len(ra) else None,
            "rho_bridge_mean": rb.mean(0).tolist() if len(rb) else None,
            "per_pair_sorted_by_anchor_direct": {"rho_direct": ra[order].round(6).tolist(),
                                                 "rho_bridge": rb[order].round(6).tolist()}}
    _write(out, "paper_fig7", res)
    modes = list(runner_by_mode)
    fig, axes = _figure(len(modes), 3, 15, 3.8)
    for k, mode in enumerate(modes):
        m = res["modes"][mode]
        ra = np.array(m["per_pair_sorted_by_anchor_direct"]["rho_direct"]).reshape(-1, 3)
        rb = np.array(m["per_pair_sorted_by_anchor_direct"]["rho_bridge"]).reshape(-1, 3)
        x = np.arange(len(ra))
        for r, name in enumerate(res["roles"]):
            ax = axes[k, r]
            ax2 = ax.twinx()
            ax2.bar(x, rb[:, r] - ra[:, r] if len(ra) else [], color="C2", alpha=0.25, width=1.0)
            ax2.set_ylabel("delta rho (q_B - q_A)", fontsize=8)
            ax.plot(x, ra[:, r] if len(ra) else [], "o-", ms=3, lw=0.6, color="C0", label="q_A (direct)")
            ax.plot(x, rb[:, r] if len(rb) else [], "s--", ms=3, lw=0.6, mfc="none", color="C3",
                    label="q_B (bridging)")
            ax.set_ylim(0, 1)
            dm = m["delta_mean"][r] if m["delta_mean"] else float("nan")
            ax.set_title(f"{mode}: {name}, mean delta {dm:+.3f} over {m['pairs']} pairs", fontsize=9)
            ax.set_xlabel("pairs, ordered by anchor weight under q_A")
            ax.set_ylabel(f"rho {name}")
            if r == 0:
                ax.legend(fontsize=7, loc="upper left")
    _save(fig, out, "paper_fig7",
          "Fig. 7 reproduced: role weights of the same unit under a direct and a bridging question")
    return res


# ----------------------------------------------------------------------------------------------
# Fig. 9

def fig9(args, modes: dict, items, banks, ctxs, Z, out: Path) -> dict:
    from tqdm.auto import tqdm

    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.analyses import (citation_matrix, fact_coverage, fact_mentions, load_observation_facts,
                                           relevant_facts)
    from trawmem_gpu.select.baselines import cosine_topk, hybrid_topk
    from trawmem_gpu.select.reference import select_reference

    facts = load_observation_facts(args.data, {b: bank.index_of() for b, bank in banks.items()})
    enc = get_encoder(banks[next(iter(banks))].build_config.get("encoder", "minilm"))
    ment, cit, theta = {}, {}, {}
    for bid, f in facts.items():
        fv = enc.encode(f.texts)
        ment[bid], theta[bid] = fact_mentions(fv, banks[bid].unit_vecs, f.cited)
        cit[bid] = citation_matrix(f.cited, banks[bid].n_units)
    keep, rel = [], []
    for i, (bid, q) in enumerate(items):
        idx = banks[bid].index_of()
        r = relevant_facts(facts[bid].cited, [idx[t] for t in q.evidence]) if bid in facts else np.zeros(0, int)
        if r.size:
            keep.append(i)
            rel.append(r)
    methods = ["random", "cosine", "hybrid"] + [f"trawmem ({m})" for m in modes]
    rng = np.random.default_rng(0)
    acc = {m: {b: {"retained": [], "repeats": [], "retained_cited": []} for b in args.fig9_budgets} for m in methods}
    for b in tqdm(args.fig9_budgets, desc="fig9 budgets"):
        for i, r in zip(keep, rel):
            bid, q = items[i]
            ctx = ctxs[bid]
            picks = {"cosine": [cosine_topk(ctx, Z[i], b)], "hybrid": [hybrid_topk(ctx, q.question, Z[i], b)],
                     "random": [rng.choice(banks[bid].n_units, min(b, banks[bid].n_units), replace=False)
                                for _ in range(args.random_draws)]}
            for mode, cfg in modes.items():
                picks[f"trawmem ({mode})"] = [select_reference(ctx, q.question, Z[i], replace(cfg, budget=b)).units]
            for m, sels in picks.items():
                got = np.array([fact_coverage(s, ment[bid], r) + fact_coverage(s, cit[bid], r)[:1] for s in sels],
                               dtype=float).mean(0)
                a = acc[m][b]
                a["retained"].append(got[0])
                a["repeats"].append(got[1])
                a["retained_cited"].append(got[2])
    clusters = [items[i][0] for i in keep]
    curves = {m: {str(b): {k: _ci(v, clusters) for k, v in acc[m][b].items()} for b in args.fig9_budgets}
              for m in methods}
    res = {"paper": PAPER["fig9"], "budgets": list(args.fig9_budgets), "methods": methods, "why": [WHY["fig9"]],
           "questions": len(keep), "questions_without_relevant_fact": len(items) - len(keep),
           "facts": {bid: {"n": len(f), "dropped": f.dropped, "theta": theta[bid]} for bid, f in facts.items()},
           "random_draws": args.random_draws,
           "definitions": {
               "fact": "one entry of LoCoMo's per-session 'observation' field, with the turns it cites",
               "relevant": "a fact is relevant to a question when it cites at least one of the question's gold "
                           "evidence turns; questions with no relevant fact are left out",
               "mention": "a unit mentions a fact when the fact cites it, or when the unit's MiniLM cosine to the "
                          "fact's text is at least that of the fact's best cited turn and at least theta, the "
                          "median of that own-source cosine over the conversation's facts",
               "retained": "relevant facts mentioned by at least one selected unit (retained_cited: by a cited turn)",
               "repeats": "over all facts of the conversation, selected units beyond the first mentioning the same "
                          "fact: sum_f max(0, mentions_f - 1)",
               "selection": "each method's first B units: random (uniform over the conversation, mean of "
                            "random_draws draws), top-B cosine, top-B RRF hybrid, TrawMem run at budget B"},
           "curves": curves}
    _write(out, "paper_fig9", res)
    fig, axes = _figure(1, 3, 16, 4.6)
    axes = axes[0]
    for ax, key, lab in zip(axes, ("retained", "retained_cited", "repeats"),
                            ("(a) distinct relevant facts retained per query", "(a') ... counting cited turns only",
                             "(b) repeated fact mentions per query")):
        for j, m in enumerate(methods):
            mu = [curves[m][str(b)][key]["mean"] for b in args.fig9_budgets]
            lo = [curves[m][str(b)][key]["ci95"][0] for b in args.fig9_budgets]
            hi = [curves[m][str(b)][key]["ci95"][1] for b in args.fig9_budgets]
            ax.plot(args.fig9_budgets, mu, marker="o", ms=3, label=m, color=f"C{j}")
            ax.fill_between(args.fig9_budgets, lo, hi, color=f"C{j}", alpha=0.12)
        ax.set_xlabel("budget B (selected units)")
        ax.set_title(lab, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    _save(fig, out, "paper_fig9", f"Fig. 9 reproduced: coverage and redundancy vs B ({len(keep)} questions with a "
                                  f"relevant observation fact; bands: 95% CI, conversations resampled)")
    return res


# ----------------------------------------------------------------------------------------------
# Table 3

def table3(runners: dict, items, enc_s, build_rows: list[dict], llm_rows: list[dict] | None, out: Path,
           llm_spec: str | None) -> dict:
    per_bank_q: dict[str, int] = {}
    for bid, _ in items:
        per_bank_q[bid] = per_bank_q.get(bid, 0) + 1
    cons = float(np.mean([r["build_s"] for r in build_rows]))
    res = {"paper": PAPER["table3"], "budget": B, "why": [WHY["construction"], WHY["time"], WHY["tokens"]],
           "construction_extractive": {"per_root_s": cons, "per_bank": build_rows,
                                       "protocol": "each conversation built alone, embedding cache off, encoder "
                                                   "loaded and warmed beforehand"},
           "construction_llm": ({"per_root_s": float(np.mean([r["build_s"] for r in llm_rows])), "per_bank": llm_rows,
                                 "llm": llm_spec, "protocol": "LLM segmentation and heads, LLM response cache off"}
                                if llm_rows else {"status": "no LLM configured (pass --llm http://HOST:PORT/v1[@MODEL])"}),
           "retrieval_protocol": "per root: the sum over its questions of (question encoding + selection + "
                                 "workspace assembly), each question alone",
           "questions_per_root": per_bank_q, "modes": {}}
    for (mode, h), r in runners.items():
        tot: dict[str, float] = {}
        for (bid, _), rec, e in zip(items, r.records, enc_s):
            tot[bid] = tot.get(bid, 0.0) + float(e) + rec["latency_s"]
        retr = float(np.mean(list(tot.values())))
        res["modes"].setdefault(mode, {})[str(h)] = {
            "construction_s_per_root": cons, "retrieval_s_per_root": retr, "total_s_per_root": cons + retr,
            "answer_context_tokens_per_q": float(np.mean([x["context_tokens"] for x in r.records])),
            "retrieval_ms_per_query": 1e3 * retr / np.mean(list(per_bank_q.values())),
            "evidence_recall_macro": float(np.mean([np.mean([x["evidence_recall"] for x in r.records
                                                             if x["category"] == c]) for c in CATS]))}
    _write(out, "paper_table3", res)
    fig, axes = _figure(1, 3, 15, 4.2)
    axes = axes[0]
    for ax, col, lab in zip(axes, range(3), ("construction s/root", "retrieval s/root", "total s/root")):
        x = np.arange(len(HOPS))
        series = [(f"paper, {bk}", [PAPER["table3"][bk][str(h)][col] for h in HOPS]) for bk in
                  ("Qwen3.5-9B", "DeepSeek-V4-Flash")]
        key = ["construction_s_per_root", "retrieval_s_per_root", "total_s_per_root"][col]
        series += [(f"ours, {m}", [res["modes"][m][str(h)][key] for h in HOPS]) for m in res["modes"]]
        if col == 0 and llm_rows:
            series.append(("ours, LLM heads", [res["construction_llm"]["per_root_s"]] * len(HOPS)))
        w = 0.8 / len(series)
        for j, (name, vals) in enumerate(series):
            ax.bar(x + (j - (len(series) - 1) / 2) * w, vals, w, label=name)
        ax.set_yscale("log")
        ax.set_ylim(bottom=1)
        ax.set_xticks(x, [f"H={h}" for h in HOPS])
        ax.set_title(lab, fontsize=9)
    axes[0].legend(fontsize=7)
    _save(fig, out, "paper_table3", "Table 3 reproduced (efficiency columns), log scale")
    return res


# ----------------------------------------------------------------------------------------------
# summary

def summary(res: dict, modes: list[str]) -> tuple[list[dict], str]:
    rows = []

    def add(what, paper, fn, fmt="{:.2f}"):
        vals = {}
        for m in modes:
            try:
                v = fn(m)
            except (KeyError, TypeError):
                v = None
            vals[m] = v
        rows.append({"quantity": what, "paper": paper, **{f"ours_{m}": vals[m] for m in modes}, "_fmt": fmt})

    if "fig8" in res:
        f = res["fig8"]["modes"]
        add("Fig. 8 candidate units per query (U_q), mean", 144.8, lambda m: f[m]["all"]["candidates"]["mean"], "{:.1f}")
        add("Fig. 8 selected units per query (S_q), mean", 15.4, lambda m: f[m]["all"]["selected"]["mean"], "{:.1f}")
        add("Fig. 8 reduction c_q, mean (%)", 89.2, lambda m: 100 * f[m]["all"]["reduction"]["mean"], "{:.1f}")
        add("Fig. 8 reduction c_q, median (%)", "89.0-89.6 by category",
            lambda m: 100 * f[m]["all"]["reduction"]["median"], "{:.1f}")
    if "fig10" in res:
        f = res["fig10"]["modes"]
        add("Fig. 10 context tokens, mean", 2216, lambda m: f[m]["tokens"]["all"]["mean"], "{:,.0f}")
        add("Fig. 10 context tokens, p90", 2440, lambda m: f[m]["tokens"]["all"]["p90"], "{:,.0f}")
        add("Fig. 10 context tokens, p95", 2516, lambda m: f[m]["tokens"]["all"]["p95"], "{:,.0f}")
        add("Fig. 10 retrieval time per query, median", "3.57 s", lambda m: 1e3 * f[m]["time_s"]["all"]["median"],
            "{:.1f} ms")
        add("Fig. 10 retrieval time per query, p95", "7.12 s", lambda m: 1e3 * f[m]["time_s"]["all"]["p95"],
            "{:.1f} ms")
    if "fig12" in res:
        f = res["fig12"]["modes"]
        add("Fig. 12 threads per workspace, mean", 10.54, lambda m: f[m]["threads"]["mean"])
        add("Fig. 12 units per used thread", 1.53, lambda m: f[m]["units_per_used_thread"]["mean"])
        add("Fig. 12 threads per workspace, range", "5-16", lambda m: f"{f[m]['threads_min']}-{f[m]['threads_max']}",
            "{}")
    if "fig7" in res:
        f = res["fig7"]["modes"]
        add("Fig. 7 pairs", 356, lambda m: f[m]["pairs"], "{}")
        for r, name in enumerate(("anchor", "bridge", "context")):
            add(f"Fig. 7 mean delta rho {name} (q_B - q_A)", {"anchor": "down", "bridge": "up",
                                                              "context": "no trend"}[name],
                lambda m, r=r: f[m]["delta_mean"][r], "{:+.3f}")
    if "fig9" in res and "16" in next(iter(res["fig9"]["curves"].values())):
        c = res["fig9"]["curves"]

        def f9(m, meth):  # baselines do not depend on the mode; a TrawMem row only under its own mode
            if meth.startswith("trawmem") and meth != f"trawmem ({m})":
                return None
            return f"{c[meth]['16']['retained']['mean']:.3f} / {c[meth]['16']['repeats']['mean']:.2f}"

        for meth in res["fig9"]["methods"]:
            add(f"Fig. 9 B=16 {meth}: relevant facts retained / repeated mentions",
                "TrawMem more facts, fewer repeats than Top-B" if meth == "random" else "",
                lambda m, meth=meth: f9(m, meth), "{}")
    if "table3" in res:
        t = res["table3"]
        for h in (3, 2, 1):
            p = PAPER["table3"]["Qwen3.5-9B"][str(h)]
            add(f"Table 3 H={h} construction s/root", p[0],
                lambda m, h=h: t["modes"][m][str(h)]["construction_s_per_root"])
            add(f"Table 3 H={h} retrieval s/root", p[1], lambda m, h=h: t["modes"][m][str(h)]["retrieval_s_per_root"])
            add(f"Table 3 H={h} answer-context tokens/q", f"~{p[3]}",
                lambda m, h=h: t["modes"][m][str(h)]["answer_context_tokens_per_q"], "{:,.0f}")
        llm = t["construction_llm"]
        add("Table 3 construction s/root with LLM heads", 96.1,
            lambda m: llm["per_root_s"] if "per_root_s" in llm else "not run (no LLM configured)",
            "{:.2f}" if "per_root_s" in llm else "{}")
    # ours in the same rows for every mode where a figure does not depend on it (Fig. 9 rows differ by method)
    head = "| quantity | paper | " + " | ".join(f"ours ({m})" for m in modes) + " |"
    lines = [head, "|" + "---|" * (2 + len(modes))]
    for r in rows:
        fmt = r.pop("_fmt")
        cells = []
        for m in modes:
            v = r[f"ours_{m}"]
            cells.append("-" if v is None else (fmt.format(v) if not isinstance(v, str) else v))
        pv = r["paper"]
        lines.append(f"| {r['quantity']} | {pv:,}" if isinstance(pv, (int, float)) and not isinstance(pv, bool)
                     else f"| {r['quantity']} | {pv}")
        lines[-1] += " | " + " | ".join(cells) + " |"
    return rows, "\n".join(lines)


# ----------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--modes", default="default,paper", help="default (SelectConfig()) and/or paper (SelectConfig.paper())")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--llm", help="LLM for the construction-time row with LLM segmentation and heads")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--fig9-budgets", default=",".join(map(str, FIG9_BUDGETS)))
    ap.add_argument("--random-draws", type=int, default=5)
    ap.add_argument("--max-conversations", type=int, help="only the first N conversations (quick runs)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS / torch threads of every timed path (builds too)")
    args = ap.parse_args(argv)

    from tqdm.auto import tqdm

    import trawmem_gpu
    from trawmem_gpu.config import BuildConfig
    from trawmem_gpu.data import load_conversations
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.retrieval import file_sha256
    from trawmem_gpu.eval.sweep import (Cell, CellRunner, build_timed, encode_timed, interleave, machine_info,
                                        parse_int_list, query_threads, question_items)
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.tokens import TOKENIZER_NAME

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"--parts: unknown part {bad[0]!r}; choose from {', '.join(PARTS)}")
    mode_names = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not mode_names or any(m not in ("default", "paper") for m in mode_names):
        ap.error("--modes: give default and/or paper")
    modes = {m: (SelectConfig.paper() if m == "paper" else SelectConfig()) for m in mode_names}
    try:
        args.fig9_budgets = parse_int_list(args.fig9_budgets, 1)
    except ValueError as e:
        ap.error(f"--fig9-budgets: {e}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    load0 = machine_info()["loadavg_1m"]

    convs = load_conversations(args.data)[:args.max_conversations]
    items = question_items(convs, CATS)
    build_cfg = BuildConfig()
    enc = get_encoder(build_cfg.encoder, cache=False)
    print(f"{len(convs)} conversations, {len(items)} questions; building banks (timed, embedding cache off)")
    llm_rows = None
    runners: dict[tuple[str, int], CellRunner] = {}
    with query_threads(args.threads):
        banks_list, build_rows = build_timed(convs, build_cfg, enc)
        if args.llm and "table3" in parts:
            from trawmem_gpu.llm.spec import backend_from_spec

            llm_cfg = BuildConfig(**(build_cfg.to_dict() | {"segmentation": "llm", "heads": "llm"}))
            _, llm_rows = build_timed(convs, llm_cfg, enc, llm=backend_from_spec(args.llm))
        banks = {b.bank_id: b for b in banks_list}
        ctxs = {b: BankContext.of(bank) for b, bank in banks.items()}
        need_runs = any(p in parts for p in ("fig7", "fig8", "fig10", "fig12", "table3"))
        hop_set = HOPS if "table3" in parts else ()
        Z, enc_s = encode_timed(enc, [q.question for _, q in items])
        if need_runs:
            for m, cfg in modes.items():
                for h in sorted(set(hop_set) | {cfg.hops}):
                    runners[(m, h)] = CellRunner(Cell("trawmem", B, h), banks, ctxs, cfg, "reference", args.threads)
            interleave(list(runners.values()), items, Z, keep_selections=True,
                       desc=f"select B={B} ({len(runners)} configurations interleaved)")
        res: dict[str, dict] = {}
        own = {m: runners[(m, cfg.hops)] for m, cfg in modes.items()} if need_runs else {}
        rows_by_mode = {m: query_rows(r, items, banks, enc_s) for m, r in own.items()}
        for p in tqdm(parts, desc="analyses"):
            if p == "fig8":
                res[p] = fig8(rows_by_mode, out)
            elif p == "fig10":
                res[p] = fig10(rows_by_mode, out, TOKENIZER_NAME, enc.id)
            elif p == "fig12":
                res[p] = fig12(rows_by_mode, out)
            elif p == "fig7":
                res[p] = fig7(own, items, banks, out)
            elif p == "fig9":
                res[p] = fig9(args, modes, items, banks, ctxs, Z, out)
            elif p == "table3":
                res[p] = table3({k: v for k, v in runners.items() if k[1] in HOPS}, items, enc_s, build_rows,
                                llm_rows, out, args.llm)
    rows, table = summary(res, mode_names)
    meta = {"command": "python benchmarks/paper_analyses.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "dataset": {"path": str(args.data), "sha256": file_sha256(args.data)}, "questions": len(items),
            "categories": list(CATS), "budget": B, "encoder": enc.id, "tokenizer": TOKENIZER_NAME,
            "select_configs": {m: c.to_dict() for m, c in modes.items()}, "build_config": build_cfg.to_dict(),
            "package_version": trawmem_gpu.__version__, "query_threads": args.threads,
            "machine": {**machine_info(), "loadavg_1m_before": load0},
            "wall_s": round(time.perf_counter() - t_start, 1), "why_numbers_differ": WHY}
    _write(out, "paper_vs_ours", {**meta, "rows": rows})
    (out / "paper_vs_ours.md").write_text(table + "\n")
    print(table)
    print("\nWhy our numbers differ:")
    for k, v in WHY.items():
        print(f"- {k}: {v}")
    print(f"\nwrote paper_*.json / .png and paper_vs_ours.json / .md under {out} "
          f"({meta['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
