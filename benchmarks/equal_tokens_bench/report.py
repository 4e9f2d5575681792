"""The markdown tables (``equal_tokens.md``) and the figure of ``bench_equal_tokens.py``."""
from __future__ import annotations

from .. import harness

from .data import HEADLINE, TARGET_T


def fmt(m: dict) -> str:
    s = f"{m['recall']:.3f} / {m['hit']:.3f}"
    if m.get("multi_hop_hit") is not None:
        s += f" / {m['multi_hop_hit']:.3f}"
    return s + f" / {m['tokens']:.0f}"


def markdown(res: dict) -> str:
    """``equal_tokens.md``: the headline, per-category, per-fold, margin, grid and ablation tables
    of the parts ``res`` holds (``ablation_nested`` set beside ``ablations``)."""
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
        nest = res["ablation_nested"]
        from collections import Counter

        lines += ["", "Variant chosen per fold on the other folds (nested): "
                  + ", ".join(f"{v} {c}" for v, c in Counter(nest["chosen"].values()).most_common())
                  + "; mean per-fold macro recall, nested vs defaults: "
                  + "; ".join(f"{n} {nest[n]['nested']:.4f} vs {nest[n]['defaults']:.4f}"
                              for n in ("locomo", "longmemeval")), ""]
    return "\n".join(lines) + "\n"


def plot(res: dict):
    """The figure: macro evidence recall against context tokens per method (None without the
    headline part)."""
    if "headline" not in res:
        return None
    fig, axes = harness.figure(1, 2, figsize=(11, 4.2))
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
    return fig
