"""``transfer.md`` and ``transfer.png`` of ``bench_transfer.py``."""
from __future__ import annotations

from .. import harness
from .score import iv


def _mh(r: dict) -> str:
    if r.get("multi_hop_hit") is None:
        return ""
    return f"{r['multi_hop_hit']:.3f} vs {r['hybrid_multi_hop_hit']:.3f}"


def _sets_table(res: dict) -> list[str]:
    L = ["## The sets", "", "Messages and units (bursts) per set, their median words, the median gap between "
         "consecutive messages of a session, gold messages per question; the hybrid's macro recall on bursts / "
         "on messages at each T and the units its margins use (the stronger).", "",
         "| set | messages | units | words / message | words / unit | gap (s) | gold / q | hybrid: bursts | "
         "hybrid: messages | baseline on |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, s in res["sets"].items():
        h = res.get("hybrid", {}).get(label, {})
        by = h.get("by_units", {})
        cell = {u: " / ".join(f"{m['recall']:.3f}" for m in by[u].values()) if u in by else "=" for u in
                ("bursts", "messages")}
        gap = "" if s["gap_s_median"] is None else f"{s['gap_s_median']:.0f}"
        L.append(f"| {label} | {s['messages']} | {s['units']} | {s['message_words_median']:.0f} | "
                 f"{s['unit_words_median']:.0f} | {gap} | {s['gold_messages_per_question']:.1f} | {cell['bursts']} | "
                 f"{cell['messages']} | {h.get('baseline_units', '')} |")
    return L + [""]


def _views_table(res: dict) -> list[str]:
    L = ["## The margin on each view (shipped defaults, today's folds)", "",
         "TrawMem minus the RRF hybrid at equal context tokens, macro evidence recall in points, paired bootstrap "
         "95% interval; weights of each fold fitted on the other 11 folds of both plain sets; LoCoMo's multi-hop "
         "all-evidence hit, TrawMem vs hybrid.", "",
         "| set | T | TrawMem recall | hybrid recall | margin | multi-hop hit |", "|---|---|---|---|---|---|"]
    for r in res["views"]:
        L.append(f"| {r['set']} | {r['T']} | {r['recall']:.3f} | {r['hybrid_recall']:.3f} | {iv(r['vs_hybrid'])} | "
                 f"{_mh(r)} |")
    return L + [""]


def _transfer_table(res: dict) -> list[str]:
    L = ["## The transfer table", "",
         "Each column: weights fitted on one source's plain dev set (`fit`), scored on a set (transfer when the "
         "set is the other source's; the within-source folds when it is the fit's own source: a LoCoMo "
         "conversation / a LongMemEval fold held out at a time). Margin over the hybrid, and each candidate's "
         "difference from the defaults in the same column (points, paired 95% interval; multi-hop hit difference "
         "for LoCoMo).", ""]
    names = list(dict.fromkeys(r["variant"] for r in res["table"]))
    for v in names:
        rows = [r for r in res["table"] if r["variant"] == v]
        verdict = res.get("verdict", {}).get(v)
        tail = ""
        if verdict is not None:
            tail = (f": **{'survives' if verdict['survives'] else 'loses'}** (loses {len(verdict['loses'])}, "
                    f"gains {len(verdict['gains'])} of {verdict['columns']} columns)")
        L += [f"### {v}{tail}", "", "| fit | set | T | recall | margin vs hybrid | multi-hop hit | vs defaults | "
              "multi-hop vs defaults |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            d = r.get("vs_defaults")
            dm = d.get("multi_hop") if d else None
            L.append(f"| {r['fit']} | {r['set']} | {r['T']} | {r['recall']:.3f} | {iv(r['vs_hybrid'])} | {_mh(r)} | "
                     f"{iv(d) if d else ''} | {iv(dm, 'diff') if dm else ''} |")
        L.append("")
    return L


def markdown(res: dict) -> str:
    L = ["# Transfer between sources and real-chat views (issue 36)", "",
         f"`{res.get('command', '')}` ({res.get('seconds', 0):.0f} s); the protocol is the script's docstring "
         "(`benchmarks/bench_transfer.py`), the views `trawmem_gpu/data/chat_views.py`, the bursts "
         "`trawmem_gpu/data/bursts.py`.", ""]
    L += _sets_table(res)
    if "views" in res:
        L += _views_table(res)
    if "table" in res:
        L += _transfer_table(res)
    return "\n".join(L) + "\n"


def plot(res: dict):
    """Margin over the hybrid per column, one line per candidate (T = the first budget)."""
    fig, axes = harness.figure(1, len(res.get("T", [400])), figsize=(7 * len(res.get("T", [400])), 5), squeeze=False)
    rows = res.get("table") or res.get("views") or []
    for ax, T in zip(axes[0], res.get("T", [400])):
        cols = list(dict.fromkeys(f"{r['fit']}->{r['set']}" for r in rows if r["T"] == T))
        for v in dict.fromkeys(r["variant"] for r in rows):
            ys = {f"{r['fit']}->{r['set']}": 100 * r["vs_hybrid"]["margin"] for r in rows
                  if r["variant"] == v and r["T"] == T}
            ax.plot(range(len(cols)), [ys.get(c, float("nan")) for c in cols], marker="o", label=v)
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels(cols, rotation=70, ha="right", fontsize=7)
        ax.set_ylabel("margin over the hybrid (points of macro recall)")
        ax.set_title(f"T = {T}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
