"""Selection quality on LoCoMo: the H x B grid, the ablation table and the headline table.

One command regenerates everything (banks come from the on-disk cache, built if missing; the
questions are encoded once and shared by every run):

    python -m benchmarks run quality [--data PATH] [--parts grid ablations headline]

(a) grid: macro evidence recall, macro all-evidence hit, multi-hop (category 1) all-evidence
    hit and context tokens over H in {1, 2, 3} x B in {4, 8, 16, 32} for the default
    ``SelectConfig()``, the baselines cosine / bm25 / hybrid at each B, and the paper-faithful
    ``SelectConfig.paper()`` at B = 16, H in {1, 2, 3} (B, H, T: ``QueryParams`` per run);
(b) ablations: the default config at B = 16, H = 3 with each of ``ABLATIONS`` (none + six);
    ``fixed_segmentation`` runs on banks built with ``BuildConfig(segmentation="fixed")``;
(c) headline at B = 16 (each mode's default H): trawmem default, trawmem paper, cosine, bm25,
    hybrid, full context, beside the issue's anchors;
(d) tokens: every method (TrawMem defaults, cosine, BM25, hybrid) at equal context tokens,
    T = 400, 800, 1,600 (``QueryParams.token_budget``, no unit cap; baselines fill in rank order,
    the hybrid also with ``fill="stop"``), beside the same methods at B = 8 / 16 / 32, per
    category;
and the reference selection time per query (trawmem default, B = 16, plain NumPy reference).

Writes ``benchmarks/results/quality_grid.json``, ``quality_ablations.json``,
``quality_headline.json``, ``quality_tokens.json``, ``quality_grid.png``, ``quality_ablations.png``
and ``quality_tokens.png``, and prints the
tables as markdown. A run shared by two parts (e.g. trawmem B = 16 H = 3 is both a grid cell
and the ``none`` ablation) is evaluated once.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from . import harness

HOPS = (1, 2, 3)
BUDGETS = (4, 8, 16, 32)
BASELINES = ("cosine", "bm25", "hybrid")
HEAD_B = 16
ABL_H = 3
# Issue 3, item 6: dev data, all-MiniLM-L6-v2, turn units, B = 16
# (macro evidence recall, macro all-evidence hit, multi-hop all-evidence hit).
ANCHORS = {"cosine": (0.512, 0.412, 0.132), "bm25": (0.521, 0.442, 0.152), "hybrid": (0.585, 0.492, 0.221)}
PARTS = ("grid", "ablations", "headline", "tokens")
TOKEN_BUDGETS = (400, 800, 1600)
TOKEN_UNIT_BUDGETS = (8, 16, 32)


# ----------------------------------------------------------------------------------------------
# run specs: (method, mode, budget, hops, ablation, token_budget, fill, knapsack); mode is
# "default" | "paper" | "-" (baselines); with a token budget, budget is None (no unit cap)

def _spec(method, mode="-", budget=HEAD_B, hops=None, ablation="none", token_budget=None, fill="skip",
          knapsack="best"):
    return (method, mode, None if budget is None else int(budget), hops, ablation, token_budget, fill, knapsack)


def grid_specs():
    s = [_spec("trawmem", "default", b, h) for h in HOPS for b in BUDGETS]
    s += [_spec(m, "-", b) for m in BASELINES for b in BUDGETS]
    s += [_spec("trawmem", "paper", HEAD_B, h) for h in HOPS]
    return s


def ablation_specs():
    from trawmem_gpu.select.config import ABLATIONS

    return [_spec("trawmem", "default", HEAD_B, ABL_H, a) for a in ABLATIONS]


def headline_specs():
    from trawmem_gpu.select.config import PAPER_HOPS
    from trawmem_gpu.select.params import QueryParams

    return [_spec("trawmem", "default", HEAD_B, QueryParams().hops),
            _spec("trawmem", "paper", HEAD_B, PAPER_HOPS),
            *[_spec(m) for m in BASELINES], _spec("full")]


def token_specs():
    """Every method at B = 8 / 16 / 32 and at T = 400 / 800 / 1,600 (the hybrid also with fill="stop",
    TrawMem also with only the gain-ranked run of its knapsack greedy)."""
    from trawmem_gpu.select.params import QueryParams

    h = QueryParams().hops
    out = []
    for b in TOKEN_UNIT_BUDGETS:
        out += [_spec("trawmem", "default", b, h)] + [_spec(m, "-", b) for m in BASELINES]
    for t in TOKEN_BUDGETS:
        out += [_spec("trawmem", "default", None, h, token_budget=t)]
        out += [_spec("trawmem", "default", None, h, token_budget=t, knapsack="gain")]
        out += [_spec(m, "-", None, token_budget=t) for m in BASELINES]
        out += [_spec("hybrid", "-", None, token_budget=t, fill="stop")]
    return out


def select_setup(spec):
    """``(SelectConfig, QueryParams)`` of a run spec: the mode's method config with the spec's
    ablation and knapsack, and the spec's B, H (None: the mode's H), T and fill."""
    from trawmem_gpu.select.config import PAPER_HOPS, SelectConfig
    from trawmem_gpu.select.params import QueryParams

    method, mode, b, h, abl, t, fill, knapsack = spec
    base = SelectConfig.paper() if mode == "paper" else SelectConfig()
    mode_h = PAPER_HOPS if mode == "paper" else QueryParams().hops
    return (replace(base, ablation=abl, knapsack=knapsack),
            QueryParams(budget=b, hops=mode_h if h is None else h, token_budget=t, fill=fill))


def label(spec) -> str:
    method, mode, b, h, abl, t, fill, knapsack = spec
    if method != "trawmem":
        return method + (" (stop at overflow)" if t is not None and fill == "stop" else "")
    s = f"trawmem {mode} H={h}"
    return s + (f" [{abl}]" if abl != "none" else "") + (f" [knapsack={knapsack}]" if knapsack != "best" else "")


# ----------------------------------------------------------------------------------------------

def evaluate(data: Path, specs, progress: bool = True) -> dict:
    """Evaluate each distinct spec once; returns {spec: summary row}."""
    from tqdm.auto import tqdm

    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.retrieval import banks_for, run_eval

    build = BuildConfig()
    t0 = time.perf_counter()
    convs, banks, _ = banks_for(data, build, progress=progress)
    fixed = None
    enc = get_encoder(build.encoder)
    qs = [q for c in convs for q in c.questions if q.category in (1, 2, 3, 4) and q.evidence]
    Z = enc.encode([q.question for q in qs], is_query=True)
    print(f"banks + {len(qs)} question vectors ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    uniq = list(dict.fromkeys(specs))
    out = {}
    bar = tqdm(uniq, desc="quality runs", disable=not progress)
    for spec in bar:
        bar.set_postfix_str(f"{label(spec)} " + (f"B={spec[2]}" if spec[5] is None else f"T={spec[5]}"))
        cfg, params = select_setup(spec)
        bc = (convs, banks)
        if spec[4] == "fixed_segmentation":
            if fixed is None:
                fc, fb, _ = banks_for(data, BuildConfig(**(build.to_dict() | {"segmentation": "fixed"})),
                                      progress=False)
                assert [c.bank_id for c in fc] == [c.bank_id for c in convs]
                fixed = (fc, fb)
            bc = fixed
        t1 = time.perf_counter()
        r = run_eval(data, spec[0], cfg, build, progress=False, banks_and_convs=bc, query_vecs=Z,
                     keep_records=False, params=params)
        wall = time.perf_counter() - t1
        out[spec] = {
            "label": label(spec), "method": spec[0], "mode": spec[1], "budget": spec[2],
            "hops": params.hops if spec[0] == "trawmem" else None, "ablation": spec[4], "token_budget": spec[5],
            "fill": spec[6] if spec[5] is not None else None, "knapsack": spec[7] if spec[5] is not None else None,
            "macro": r["macro"], "per_category": r["per_category"],
            "multihop_all_evidence_hit": r["per_category"].get("1", {}).get("all_evidence_hit"),
            "selection_seconds_per_query": r["selection_seconds_per_query"], "run_wall_s": round(wall, 2),
            "n_questions": r["n_questions"], "config": r["config"],
        }
        meta = {k: r[k] for k in ("dataset", "encoder", "tokenizer", "package_version")}
    bar.close()
    return out, meta


def _row(spec, res):
    r = res[spec]
    m = r["macro"]
    return {**{k: r[k] for k in ("label", "method", "mode", "budget", "hops", "ablation", "token_budget", "fill",
                                 "knapsack")},
            "evidence_recall": m["evidence_recall"], "all_evidence_hit": m["all_evidence_hit"],
            "multihop_all_evidence_hit": r["multihop_all_evidence_hit"], "context_tokens": m["context_tokens"],
            "selection_ms_per_query": 1e3 * r["selection_seconds_per_query"],
            "per_category": r["per_category"], "config": r["config"]}


# ----------------------------------------------------------------------------------------------
# markdown

def _md(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def _f(x, d=3):
    return "-" if x is None else f"{x:.{d}f}"


def grid_table(g) -> str:
    rows = [(r["label"], r["budget"], _f(r["evidence_recall"]), _f(r["all_evidence_hit"]),
             _f(r["multihop_all_evidence_hit"]), _f(r["context_tokens"], 0), _f(r["selection_ms_per_query"], 2))
            for r in g["rows"]]
    return _md(("config", "B", "recall", "all-hit", "multi-hop hit", "tokens", "sel ms/q"), rows)


def ablation_table(a) -> str:
    base = next(r for r in a["rows"] if r["ablation"] == "none")
    rows = [(r["ablation"], _f(r["evidence_recall"]), f"{r['evidence_recall'] - base['evidence_recall']:+.3f}",
             _f(r["all_evidence_hit"]), _f(r["multihop_all_evidence_hit"]),
             f"{r['multihop_all_evidence_hit'] - base['multihop_all_evidence_hit']:+.3f}",
             _f(r["context_tokens"], 0)) for r in a["rows"]]
    return _md(("ablation", "recall", "Δrecall", "all-hit", "multi-hop hit", "Δmulti-hop", "tokens"), rows)


def headline_table(h) -> str:
    rows = []
    for r in h["rows"]:
        anc = ANCHORS.get(r["method"])
        a = " / ".join(f"{x:.3f}" for x in anc) if anc else "-"
        name = r["label"] if r["method"] == "trawmem" else r["method"]
        rows.append((name, _f(r["evidence_recall"]), _f(r["all_evidence_hit"]), _f(r["multihop_all_evidence_hit"]),
                     _f(r["context_tokens"], 0), a))
    return _md(("method (B=16)", "recall", "all-hit", "multi-hop hit", "tokens", "anchor recall / all-hit / MH hit"),
               rows)


def tokens_table(t) -> str:
    """Per method: recall / multi-hop hit / tokens at each B and at each T."""
    rows = []
    for r in t["rows"]:
        size = f"B={r['budget']}" if r["token_budget"] is None else f"T={r['token_budget']}"
        pc = r["per_category"]
        rows.append((r["label"], size, _f(r["evidence_recall"]), _f(r["all_evidence_hit"]),
                     _f(r["multihop_all_evidence_hit"]), _f(r["context_tokens"], 0),
                     " / ".join(_f(pc.get(c, {}).get("evidence_recall")) for c in ("1", "2", "3", "4"))))
    return _md(("method", "budget", "recall", "all-hit", "multi-hop hit", "tokens", "recall cat 1 / 2 / 3 / 4"), rows)


# ----------------------------------------------------------------------------------------------
# plots

def plot_grid(g):
    rows = g["rows"]
    fig, axes = harness.figure(1, 3, figsize=(16, 4.8))
    keys = (("evidence_recall", "macro evidence recall"), ("multihop_all_evidence_hit", "multi-hop all-evidence hit"),
            ("context_tokens", "context tokens (workspace)"))
    series = [(f"trawmem H={h}", [r for r in rows if r["method"] == "trawmem" and r["mode"] == "default"
                                  and r["hops"] == h], "-o") for h in HOPS]
    series += [(m, [r for r in rows if r["method"] == m], "--s") for m in BASELINES]
    paper = [r for r in rows if r["method"] == "trawmem" and r["mode"] == "paper"]
    for ax, (k, title) in zip(axes, keys):
        for name, rs, style in series:
            rs = sorted(rs, key=lambda r: r["budget"])
            ax.plot([r["budget"] for r in rs], [r[k] for r in rs], style, label=name, ms=4)
        for r, mk in zip(sorted(paper, key=lambda r: r["hops"]), ("^", "v", "D")):
            ax.plot([r["budget"]], [r[k]], mk, color="black", ms=6, label=f"paper mode H={r['hops']}")
        if k != "context_tokens":
            idx = 0 if k == "evidence_recall" else 2
            for m, anc in ANCHORS.items():
                ax.plot([HEAD_B], [anc[idx]], "x", color="gray", ms=7)
        ax.set_xscale("log", base=2)
        ax.set_xticks(BUDGETS)
        ax.set_xticklabels([str(b) for b in BUDGETS])
        ax.set_xlabel("budget B (units)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"LoCoMo dev, {g['meta']['encoder']}: selection quality vs budget (gray x = issue anchors at B=16)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_ablations(a):
    import numpy as np

    rows = a["rows"]
    names = [r["ablation"] for r in rows]
    x = np.arange(len(rows))
    w = 0.27
    fig, ax = harness.figure(figsize=(11, 4.8))
    for i, (k, lab) in enumerate((("evidence_recall", "evidence recall"), ("all_evidence_hit", "all-evidence hit"),
                                  ("multihop_all_evidence_hit", "multi-hop all-evidence hit"))):
        v = [r[k] for r in rows]
        ax.bar(x + (i - 1) * w, v, w, label=lab)
        base = rows[names.index("none")][k]
        ax.axhline(base, color=f"C{i}", lw=0.8, ls=":")
    for xi, r in zip(x, rows):
        ax.text(xi, max(r["evidence_recall"], r["all_evidence_hit"], r["multihop_all_evidence_hit"]) + 0.01, f"{r['context_tokens']:.0f} tok",
                ha="center", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=20)
    ax.set_ylabel("macro over categories 1-4 (multi-hop: category 1)")
    ax.set_title(f"ablations, trawmem default config, B={HEAD_B}, H={ABL_H} (dotted: none)", fontsize=10)
    ax.legend(fontsize=8)
    ax.set_ylim(0, 1)
    fig.tight_layout()
    return fig


def plot_tokens(t):
    """Recall and multi-hop hit against mean context tokens (B runs dashed, T runs solid), and
    per-category recall at T = 800."""
    import numpy as np

    rows = t["rows"]
    names = list(dict.fromkeys(r["label"] for r in rows))
    fig, axes = harness.figure(1, 3, figsize=(17, 4.8))
    for i, name in enumerate(names):
        for kind, style in (("B", "--s"), ("T", "-o")):
            rs = sorted([r for r in rows if r["label"] == name and (r["token_budget"] is None) == (kind == "B")],
                        key=lambda r: r["context_tokens"])
            if not rs:
                continue
            for ax, k in zip(axes[:2], ("evidence_recall", "multihop_all_evidence_hit")):
                ax.plot([r["context_tokens"] for r in rs], [r[k] for r in rs], style, color=f"C{i}", ms=4,
                        label=f"{name} ({'T' if kind == 'T' else 'B'})")
    for ax, title in zip(axes[:2], ("macro evidence recall", "multi-hop all-evidence hit")):
        ax.set_xlabel(f"context tokens, mean ({t['meta']['tokenizer']})")
        ax.set_title(title + " (dashed: B = 8/16/32, solid: T = 400/800/1600)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    at = [r for r in rows if r["token_budget"] == 800]
    x = np.arange(4)
    w = 0.8 / max(1, len(at))
    for i, r in enumerate(at):
        axes[2].bar(x + i * w, [r["per_category"].get(c, {}).get("evidence_recall", 0) for c in ("1", "2", "3", "4")],
                    w, label=r["label"], color=f"C{names.index(r['label'])}")
    axes[2].set_xticks(x + 0.4 - w / 2)
    axes[2].set_xticklabels(["1 multi-hop", "2 temporal", "3 open-domain", "4 single-hop"])
    axes[2].set_title("evidence recall per category at T = 800", fontsize=9)
    axes[2].set_ylim(0, 1.15)
    axes[2].legend(fontsize=6, ncol=2, loc="upper left")
    fig.suptitle(f"LoCoMo dev, {t['meta']['encoder']}: methods at equal context tokens", fontsize=10)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(harness.dev_data("locomo")), help="LoCoMo JSON (default: the dev split)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which tables to regenerate")
    p.add_argument("--out-dir", help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    data = harness.require_data(args.data)
    out = harness.results_dir(args.out_dir)

    want = {"grid": grid_specs, "ablations": ablation_specs, "headline": headline_specs, "tokens": token_specs}
    specs = {part: want[part]() for part in args.parts}
    t0 = time.perf_counter()
    res, meta = evaluate(data, [s for part in args.parts for s in specs[part]], progress=not args.no_progress)
    total = time.perf_counter() - t0
    from trawmem_gpu.select.params import QueryParams

    ref_spec = _spec("trawmem", "default", HEAD_B, QueryParams().hops)
    ref_time = res[ref_spec]["selection_seconds_per_query"] if ref_spec in res else None
    common = {"command": harness.command(), "meta": meta, "machine": harness.machine(), "wall_s_all_parts": round(total, 1),
              "reference_selection_seconds_per_query": ref_time,
              "reference_selection_note": "trawmem default config, B=16, engine=reference (NumPy), "
                                          "mean over the questions; excludes question encoding"}
    written = []
    if "grid" in specs:
        g = {"benchmark": "quality_grid", **common, "hops": HOPS, "budgets": BUDGETS,
             "rows": [_row(s, res) for s in specs["grid"]]}
        harness.save("quality_grid", g, plot_grid(g), out_dir=out)
        written += ["quality_grid.json", "quality_grid.png"]
        print(f"\n### Grid ({data.name}, {res[specs['grid'][0]]['n_questions']} questions; macro over "
              f"categories 1-4; multi-hop = category 1; sel ms/q = selection time per query)\n")
        print(grid_table(g))
    if "ablations" in specs:
        a = {"benchmark": "quality_ablations", **common, "budget": HEAD_B, "hops": ABL_H,
             "rows": [_row(s, res) for s in specs["ablations"]]}
        harness.save("quality_ablations", a, plot_ablations(a), out_dir=out)
        written += ["quality_ablations.json", "quality_ablations.png"]
        print(f"\n### Ablations (trawmem default config, B={HEAD_B}, H={ABL_H})\n")
        print(ablation_table(a))
        base = a["rows"][0]
        beats = [r["ablation"] for r in a["rows"][1:]
                 if r["evidence_recall"] > base["evidence_recall"]
                 or r["multihop_all_evidence_hit"] > base["multihop_all_evidence_hit"]]
        if beats:
            print(f"\nnote: ablations above the full model on recall or multi-hop hit: {', '.join(beats)}")
    if "headline" in specs:
        h = {"benchmark": "quality_headline", **common, "budget": HEAD_B,
             "anchors": {m: dict(zip(("evidence_recall", "all_evidence_hit", "multihop_all_evidence_hit"), v))
                         for m, v in ANCHORS.items()},
             "rows": [_row(s, res) for s in specs["headline"]]}
        harness.save("quality_headline", h, out_dir=out)
        written.append("quality_headline.json")
        print(f"\n### Headline (B={HEAD_B}; each trawmem mode at its default H)\n")
        print(headline_table(h))
    if "tokens" in specs:
        t = {"benchmark": "quality_tokens", **common, "token_budgets": TOKEN_BUDGETS, "budgets": TOKEN_UNIT_BUDGETS,
             "note": "T runs: QueryParams(token_budget=T, budget=None): TrawMem's cost-aware knapsack greedy "
                     "(SelectConfig.knapsack), baselines filled in rank order (fill='skip' unless labelled); "
                     "every workspace holds at most T tokens (cl100k_base, heads included)",
             "rows": [_row(s_, res) for s_ in specs["tokens"]]}
        harness.save("quality_tokens", t, plot_tokens(t), out_dir=out)
        written += ["quality_tokens.json", "quality_tokens.png"]
        print("\n### Equal tokens (T) beside equal units (B); macro over categories 1-4\n")
        print(tokens_table(t))
    if ref_time is not None:
        print(f"\nreference selection time per query (trawmem default, B={HEAD_B}): {1e3 * ref_time:.2f} ms "
              f"(1-min load average {common['machine']['loadavg_1m']} on {os.cpu_count()} CPUs)")
    print(f"\n{len(res)} distinct runs in {total:.0f}s; wrote {', '.join(str(out / w) for w in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
