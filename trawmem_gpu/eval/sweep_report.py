"""The report of a ``trawmem sweep`` (``eval.sweep``): its Pareto-optimal cells, its markdown
table and its plot.

A cell is Pareto-optimal when no other cell is at least as good on both of macro evidence recall
and a cost (latency p50 ``L``, or mean context tokens ``T``) and better on one
(``eval.analyses.pareto_mask``); the table and the plot mark them.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import plural
from .analyses import pareto_mask





def mark_pareto(cells: list[dict]) -> None:
    """Set ``pareto_latency`` / ``pareto_tokens`` on each cell: Pareto-optimal in macro
    evidence recall against p50 latency / mean context tokens."""
    rec = [c["evidence_recall"] for c in cells]
    lat = pareto_mask(rec, [c["latency_ms"]["p50"] for c in cells])
    tok = pareto_mask(rec, [c["context_tokens"]["mean"] for c in cells])
    for c, a, b in zip(cells, lat, tok):
        c["pareto_latency"], c["pareto_tokens"] = bool(a), bool(b)


def format_table(res: dict) -> str:
    """The sweep as a markdown table (``*``: Pareto-optimal against latency ``L`` / tokens ``T``)."""
    head = ("| method | H | B | T | recall | all-hit | multi-hop hit | tokens mean | tokens p90 | latency p50 / p95 / p99 "
            "ms | batched q/s | Pareto |")
    lines = [head, "|" + "|".join(["---"] * 12) + "|"]
    for c in res["cells"]:
        tp = c.get("throughput")
        lat = c["latency_ms"]
        mark = ("L" if c["pareto_latency"] else "") + ("T" if c["pareto_tokens"] else "")
        dash = lambda v: "-" if v is None else v  # noqa: E731
        lines.append(f"| {c['method']} | {dash(c['hops'])} | {dash(c['budget'])} | {dash(c.get('token_budget'))} | "
                     f"{c['evidence_recall']:.3f} | {c['all_evidence_hit']:.3f} | {c['multi_hop_hit']:.3f} | "
                     f"{c['context_tokens']['mean']:.0f} | {c['context_tokens']['p90']:.0f} | "
                     f"{lat['p50']:.2f} / {lat['p95']:.2f} / {lat['p99']:.2f} | "
                     f"{'-' if tp is None else format(tp['qps'], ',.0f')} | {mark or '-'} |")
    b = res["build"]
    tp = next((c["throughput"] for c in res["cells"] if c.get("throughput")), None)
    notes = [f"{plural(res['n_questions'], 'question')}, categories {res['categories']}, mode {res['mode']}, "
             f"engine {res['engine']} (latency: one query at a time, selection + workspace assembly; "
             f"question encoding adds p50 {res['encode_ms']['p50']:.1f} ms, p95 {res['encode_ms']['p95']:.1f} ms "
             f"with {res['encoder']}); tokens: {res['tokenizer']}"]
    if tp:
        notes.append(f"batched q/s: SelectionEngine at batch size {tp['batch_size']}, {tp['threads']} thread(s), "
                     f"{tp['device']}, median of {tp['rounds']} rounds (selection only, vectors given)")
    if b["mean_build_s"] is not None:
        notes.append(f"build cost per bank: mean {b['mean_build_s']:.2f} s over {plural(len(b['per_bank']), 'bank')} "
                     f"({b['source']})")
    notes.append("Pareto: L = Pareto-optimal in macro evidence recall against latency p50 (no other cell is at "
                 "least as good on both and better on one), T = the same against mean context tokens, - = neither")
    return "\n".join(lines + [""] + notes)


def plot_pareto(res: dict, path: str | Path) -> None:
    """Recall against latency p50 (log scale) and against mean tokens; Pareto cells starred and
    joined by their frontier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = res["cells"]
    methods = list(dict.fromkeys(c["method"] for c in cells))
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    for ax, (xkey, flag, xlabel) in zip(axes, [
            (lambda c: c["latency_ms"]["p50"], "pareto_latency", "retrieval latency p50, one query at a time (ms)"),
            (lambda c: c["context_tokens"]["mean"], "pareto_tokens", f"context tokens, mean ({res['tokenizer']})")]):
        for m in methods:
            cs = [c for c in cells if c["method"] == m]
            ax.scatter([xkey(c) for c in cs], [c["evidence_recall"] for c in cs], color=colors[m], s=28, label=m,
                       alpha=0.8)
            for c in cs:
                size = f"B{c['budget']}" if c.get("token_budget") is None else f"T{c['token_budget']}"
                lab = size + ("" if c["hops"] is None else f"H{c['hops']}")
                ax.annotate(lab, (xkey(c), c["evidence_recall"]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        front = sorted((c for c in cells if c[flag]), key=xkey)
        if front:
            ax.step([xkey(c) for c in front], [c["evidence_recall"] for c in front], where="post", color="k",
                    lw=0.8, alpha=0.6)
            ax.scatter([xkey(c) for c in front], [c["evidence_recall"] for c in front], marker="*", s=170,
                       facecolors="none", edgecolors="k", linewidths=1.0, label="Pareto-optimal")
        if "latency" in flag:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("macro evidence recall")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"trawmem sweep: {res['n_questions']} questions, mode {res['mode']}, engine {res['engine']}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
