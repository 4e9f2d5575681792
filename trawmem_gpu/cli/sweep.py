"""``trawmem sweep``: the H x B trade-off tool (see :mod:`trawmem_gpu.eval.sweep`)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .args import MAX_BUDGET, MAX_HOPS, MAX_TOKEN_BUDGET, add_dayfirst, add_units, categories, nonneg_int, positive_int


def int_list(minimum: int, maximum: int):
    """argparse type: a comma-separated list of integers in ``minimum..maximum``."""
    def parse(text: str) -> list[int]:
        from ..errors import InputError
        from ..eval.sweep import parse_int_list

        try:
            vals = parse_int_list(text, minimum)
        except InputError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        big = [v for v in vals if v > maximum]
        if big:
            raise argparse.ArgumentTypeError(f"values must be at most {maximum}, got {big[0]}")
        return vals

    parse.__name__ = "integer list"
    return parse


def method_list(text: str) -> list[str]:
    """argparse type: comma-separated sweep methods."""
    from ..eval.sweep import SWEEP_METHODS

    methods = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in methods if m not in SWEEP_METHODS]
    if not methods or unknown:
        raise argparse.ArgumentTypeError(f"unknown method {unknown[0] if unknown else text!r}; "
                                         f"choose from {', '.join(SWEEP_METHODS)}")
    return methods


def cmd_sweep(a) -> int:
    from ..errors import InputError
    from ..eval.sweep import format_table, plot_pareto, run_sweep

    if not Path(a.data).exists():
        raise InputError(f"--data {a.data}: file not found")
    res = run_sweep(a.data, a.method, a.hops, a.budget, token_budgets=a.token_budget or (), paper=a.paper,
                    engine=a.engine, categories=a.categories,
                    batch_size=a.batch_size, rounds=a.rounds, threads=a.threads, warmup=a.warmup,
                    banks_dir=a.banks, max_questions=a.max_questions, progress=not a.quiet, units=a.units,
                    facts=a.facts,
                    time_builds=a.time_builds, dayfirst=a.dayfirst)
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    png = Path(a.plot) if a.plot else out.with_suffix(".png")
    plot_pareto(res, png)
    print(format_table(res))
    print(f"\n-> {out}, {png}")
    return 0


def configure(s) -> None:
    s.describe("For every (method, H, B or T) cell: macro evidence recall, multi-hop hit, context "
               "tokens and one-query latency p50/p95/p99; batched-engine throughput for "
               "TrawMem cells; build cost per bank once. Writes a table, a JSON and a Pareto PNG.")
    s.add_argument("--data", required=True, help="LoCoMo-layout JSON with questions and gold evidence")
    s.add_argument("--hops", type=int_list(0, MAX_HOPS), default=[1, 2, 3], metavar="H,H,...",
                   help="comma-separated hops H for TrawMem cells")
    s.add_argument("--budget", type=int_list(1, MAX_BUDGET), default=[4, 8, 16, 32], metavar="B,B,...",
                   help="comma-separated unit budgets B")
    s.add_argument("--token-budget", type=int_list(1, MAX_TOKEN_BUDGET), metavar="T,T,...",
                   help="comma-separated token budgets T (workspace tokens, cl100k_base, heads included): one more "
                        "cell per method and T, without a unit cap, e.g. 400,800,1600 (default: no token-budget "
                        "cells)")
    s.add_argument("--method", type=method_list, default=["trawmem", "hybrid"], metavar="M,M,...",
                   help="comma-separated: trawmem, cosine, bm25, hybrid (baselines get one cell per B)")
    s.add_argument("--engine", choices=["reference", "batched"], default="reference",
                   help="TrawMem selection for the one-query latency (throughput always uses the batched engine)")
    s.add_argument("--paper", action="store_true", help="Section 4.2 exactly as written (SelectConfig.paper())")
    s.add_argument("--categories", type=categories, default=(1, 2, 3, 4), metavar="C,C,...", help="question categories")
    s.add_argument("--batch-size", type=positive_int, default=256, help="batch size of the throughput measurement")
    s.add_argument("--rounds", type=positive_int, default=3, help="throughput rounds (median reported)")
    s.add_argument("--threads", type=positive_int, default=1,
                   help="threads of every timed path: BLAS / torch pools and the batched engine's workers")
    s.add_argument("--warmup", type=nonneg_int, default=10, help="untimed queries before each cell's timed pass")
    s.add_argument("--banks", help="use this bank collection; its banks must be built from exactly --data's turns "
                                   "(default: eval's automatic bank cache for --data, built once and reused)")
    s.add_argument("--time-builds", action="store_true",
                   help="build every bank afresh, one conversation at a time with the embedding cache off, and "
                        "report the build cost per bank (slow on a CPU: no embedding cache)")
    add_dayfirst(s)
    add_units(s, facts=True)
    s.add_argument("--max-questions", type=positive_int, help="a seeded sample of this many questions (default: all)")
    s.add_argument("--output", default="sweep.json", help="result JSON")
    s.add_argument("--plot", help="Pareto PNG (default: --output with .png)")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(fn=cmd_sweep)
