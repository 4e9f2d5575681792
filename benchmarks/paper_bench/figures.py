"""Figs. 8, 10 and 12: workspace compression, context length and time, threads per workspace."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .common import box_by_category, ci, ci_median, grid_figure, save_figure
from .paper import CAT_NAMES, CATS, PAPER, WHY, B


def fig8(rows_by_mode: dict, out: Path) -> dict:
    res = {"paper": PAPER["fig8"], "budget": B, "bootstrap": "2,000 resamples of whole conversations, 95% percentile",
           "why": [WHY["candidates"]], "modes": {}}
    for mode, rows in rows_by_mode.items():
        cl = [r["bank_id"] for r in rows]
        m = {"all": {"candidates": ci([r["n_candidates"] for r in rows], cl),
                     "selected": ci([r["n_selected"] for r in rows], cl),
                     "reduction": ci([r["c_q"] for r in rows], cl) | ci_median([r["c_q"] for r in rows], cl),
                     "n": len(rows)}}
        for c in CATS:
            rs = [r for r in rows if r["category"] == c]
            cc = [r["bank_id"] for r in rs]
            m[str(c)] = {"candidates": ci([r["n_candidates"] for r in rs], cc),
                         "selected": ci([r["n_selected"] for r in rs], cc),
                         "reduction": ci([r["c_q"] for r in rs], cc) | ci_median([r["c_q"] for r in rs], cc),
                         "n": len(rs)}
        m["per_question"] = {"category": [r["category"] for r in rows], "c_q": [r["c_q"] for r in rows],
                             "n_candidates": [r["n_candidates"] for r in rows],
                             "n_selected": [r["n_selected"] for r in rows]}
        res["modes"][mode] = m
    modes = list(rows_by_mode)
    fig, axes = grid_figure(len(modes), 2, 12, 4.2)
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
        box_by_category(ax, data, "mean (ours)")
        ax.scatter(np.arange(1, 5), [100 * PAPER["fig8"]["reduction_mean_by_category"][str(c)] for c in CATS],
                   marker="x", color="k", zorder=6, label="paper mean")
        ax.set_ylabel("100 c_q (%)")
        ax.set_title(f"(b) unit-count reduction per question, {mode}", fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, out, "paper_fig8", res=res, title= "Fig. 8 reproduced: workspace compression (B = 16)")
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
    modes = list(rows_by_mode)
    fig, axes = grid_figure(len(modes), 2, 12, 4.2)
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
        box_by_category(ax, data, "mean")
        ax.set_yscale("log")
        ta = res["modes"][mode]["time_s"]["all"]
        ax.set_ylabel("retrieval time per query (ms, log)")
        ax.set_title(f"(b) retrieval time, {mode}: median {1e3 * ta['median']:.1f} ms, p95 {1e3 * ta['p95']:.1f} ms "
                     f"(paper 3.57 s / 7.12 s)", fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, out, "paper_fig10", res=res, title= "Fig. 10 reproduced: memory-context length and retrieval time (B = 16)")
    return res


# ----------------------------------------------------------------------------------------------
# Fig. 12

def fig12(rows_by_mode: dict, out: Path) -> dict:
    res = {"paper": PAPER["fig12"], "budget": B, "why": [WHY["threads"]], "modes": {}}
    for mode, rows in rows_by_mode.items():
        cl = [r["bank_id"] for r in rows]
        nt = [r["n_threads"] for r in rows]
        m = {"threads": ci(nt, cl), "units": ci([r["n_selected"] for r in rows], cl),
             "units_per_used_thread": ci([r["units_per_thread"] for r in rows], cl),
             "threads_min": int(min(nt)), "threads_max": int(max(nt)), "by_category": {}}
        for c in CATS:
            rs = [r for r in rows if r["category"] == c]
            v = np.array([r["n_threads"] for r in rs])
            hist = {int(k): float((v == k).mean()) for k in np.unique(v)}
            m["by_category"][str(c)] = {"threads": ci(v, [r["bank_id"] for r in rs]), "share_by_threads": hist,
                                        "n": len(rs)}
        res["modes"][mode] = m
    modes = list(rows_by_mode)
    fig, axes = grid_figure(len(modes), 1, 11, 3.8)
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
    save_figure(fig, out, "paper_fig12", res=res, title= "Fig. 12 reproduced: threads per workspace (B = 16)")
    return res


# ----------------------------------------------------------------------------------------------
# Fig. 7
