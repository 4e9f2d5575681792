"""Table 3's efficiency columns, and the summary table of the paper's numbers beside ours."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .common import grid_figure, save_figure
from .paper import CATS, HOPS, PAPER, WHY, B


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
    fig, axes = grid_figure(1, 3, 15, 4.2)
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
    save_figure(fig, out, "paper_table3", res=res, title= "Table 3 reproduced (efficiency columns), log scale")
    return res


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
    return rows, _markdown(rows, modes)


def _markdown(rows: list[dict], modes: list[str]) -> str:
    """The rows of :func:`summary` as a markdown table (each row's ``_fmt`` popped)."""
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
    return "\n".join(lines)
