"""The markdown tables (``bridge.md``) and the figure (``bridge.png``) of ``bench_bridge.py``."""
from __future__ import annotations

from .. import harness

NAMES = {"locomo": "LoCoMo dev", "longmemeval": "LongMemEval-S dev"}
TARGET = {"locomo": "multi-hop hit", "longmemeval": "multi-session hit"}


def _pts(m: dict) -> str:
    return f"{100 * m['margin']:+.1f} [{100 * m['ci95'][0]:+.1f}, {100 * m['ci95'][1]:+.1f}]"


def _target(summ: dict, name: str) -> float:
    cat = "1" if name == "locomo" else "multi-session"
    return summ["per_category"][cat]["hit"]


SUMMARY = ("<!-- summary -->", "<!-- /summary -->")


def markdown(res: dict, previous: str = "") -> str:
    """The tables of ``res``, after the hand-written summary block of ``previous`` (kept as it is)."""
    i, j = previous.find(SUMMARY[0]), previous.find(SUMMARY[1])
    kept = [previous[i:j + len(SUMMARY[1])], ""] if 0 <= i < j else []
    L = ["# Bridge mechanisms, roles and the paper's config under T (issue 25)", ""] + kept + [
         "`python -m benchmarks.experiments.bench_bridge` (`bridge.json`, `bridge.png`). Equal context tokens (cl100k_base,",
         "rendered workspace), learned affinity per fold from the other 11 folds; margins in points with a",
         "paired bootstrap 95% interval (macro recall: stratified by category; hit: within the target category).", ""]
    if "headline" in res:
        L += ["## Shipped defaults against the RRF hybrid", "",
              "| set | T | macro recall TrawMem / hybrid | margin | target hit TrawMem / hybrid | margin | won / lost |",
              "|---|---|---|---|---|---|---|"]
        for key, c in res["headline"].items():
            n, T = key.split("@")
            th = c["vs_hybrid"]["target_hit"]
            L.append(f"| {NAMES[n]} | {T} | {c['defaults']['recall']:.3f} / {c['hybrid']['recall']:.3f} | "
                     f"{_pts(c['vs_hybrid']['macro_recall'])} | {_target(c['defaults'], n):.3f} / "
                     f"{_target(c['hybrid'], n):.3f} ({TARGET[n]}) | {_pts(th)} | {th['won_lost'][0]} / {th['won_lost'][1]} |")
        L += ["", "Per category / question type: recall / all-evidence hit, TrawMem (hybrid)", ""]
        for key, c in res["headline"].items():
            n, T = key.split("@")
            cats = list(c["defaults"]["per_category"])
            L += [f"{NAMES[n]}, T = {T}:", "", "| " + " | ".join(f"{k} (n={c['defaults']['per_category'][k]['n']})"
                                                           for k in cats) + " |", "|" + "---|" * len(cats)]
            L.append("| " + " | ".join(f"{c['defaults']['per_category'][k]['recall']:.3f} / "
                                       f"{c['defaults']['per_category'][k]['hit']:.3f} "
                                       f"({c['hybrid']['per_category'][k]['recall']:.3f} / "
                                       f"{c['hybrid']['per_category'][k]['hit']:.3f})" for k in cats) + " |")
            L.append("")
        L += ["Target-category questions the hybrid gets whole and TrawMem does not: the missing gold turns", "",
              "| set | T | lost | missing turns | in TrawMem's candidate pool | affinity rank (median) | hybrid rank (median) |",
              "|---|---|---|---|---|---|---|"]
        for key, c in res["headline"].items():
            n, T = key.split("@")
            w = c["won_lost"]
            if not w["missing"]:
                continue
            L.append(f"| {NAMES[n]} | {T} | {len(w['lost'])} | {len(w['missing'])} | {100 * w['missing_in_pool']:.0f}% | "
                     f"{w['missing_affinity_rank_median']:.0f} | {w['missing_hybrid_rank_median']:.0f} |")
        L.append("")
    if "variants" in res:
        L += ["## Bridge ideas (T = 400, 800)", "",
              "| variant | set @ T | macro recall | vs defaults | target hit | vs hybrid (target hit) |", "|---|---|---|---|---|---|"]
        for key, v in res["variants"].items():
            if key.startswith("nested"):
                for n in NAMES:
                    if n in v:
                        s = v[n]
                        L.append(f"| {key.split('@')[0]} (chosen per fold: {sorted(set(v['chosen'].values()))}) | "
                                 f"{n} @ {key.split('@')[1]} | {s['summary']['recall']:.3f} | "
                                 f"{_pts(s['vs_defaults']['macro_recall'])} | {_target(s['summary'], n):.3f} | "
                                 f"{_pts(s['vs_hybrid']['target_hit'])} |")
                continue
            where, label = key.split("|")
            n = where.split("@")[0]
            L.append(f"| {label} | {where.replace('@', ' @ ')} | {v['summary']['recall']:.3f} | "
                     f"{_pts(v['vs_defaults']['macro_recall'])} | {_target(v['summary'], n):.3f} | "
                     f"{_pts(v['vs_hybrid']['target_hit'])} |")
        L.append("")
    if "roles" in res:
        L += ["## Roles and the multi-thread term over the defaults (variant minus defaults)", "",
              "| variant | set @ T | macro recall | variant - defaults (recall) | variant - defaults (target hit) |",
              "|---|---|---|---|---|"]
        for key, v in res["roles"].items():
            where, label = key.split("|")
            m = v["variant_minus_defaults"]
            L.append(f"| {label} | {where.replace('@', ' @ ')} | {v['summary']['recall']:.3f} | {_pts(m['macro_recall'])} | "
                     f"{_pts(m['target_hit'])} |")
        L.append("")
    if "paper" in res:
        L += ["## `SelectConfig.paper()` (H = 2), LoCoMo dev", "",
              "| budget | config | macro recall | all-hit | multi-hop hit | tokens | units |", "|---|---|---|---|---|---|---|"]
        for r in res["paper"]:
            b = f"T = {r['T']}" if r["T"] else f"B = {r['B']}"
            L.append(f"| {b} | {r['config']} | {r['recall']:.3f} | {r['hit']:.3f} | {r['multi_hop_hit']:.3f} | "
                     f"{r['tokens']:.0f} | {r['units']:.1f} |")
        L.append("")
    return "\n".join(L)


def plot(res: dict):
    """Target-category hit per T: hybrid, defaults and the variants."""
    if "headline" not in res:
        return None
    fig, axes = harness.figure(1, 2, figsize=(11, 4))
    for ax, n in zip(axes, NAMES):
        cells = {int(k.split("@")[1]): c for k, c in res["headline"].items() if k.startswith(n + "@")}
        Ts = sorted(cells)
        ax.plot(Ts, [_target(cells[T]["hybrid"], n) for T in Ts], "k--o", label="RRF hybrid")
        ax.plot(Ts, [_target(cells[T]["defaults"], n) for T in Ts], "b-o", label="TrawMem defaults")
        ax.plot(Ts, [_target(cells[T]["hybrid"], n) + 0.04 for T in Ts], ":", color="grey", label="target: hybrid + 4")
        for key, v in res.get("variants", {}).items():
            if key.startswith(n + "@") and "|" in key:
                T = int(key.split("@")[1].split("|")[0])
                ax.scatter([T], [_target(v["summary"], n)], s=12, alpha=0.6)
        ax.set_title(f"{NAMES[n]}: {TARGET[n]} (dots: bridge variants)")
        ax.set_xlabel("context tokens T")
        ax.set_xscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
