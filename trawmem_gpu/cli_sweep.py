"""``trawmem sweep``: the H x B trade-off tool (see :mod:`trawmem_gpu.eval.sweep`)."""
from __future__ import annotations

import json
from pathlib import Path


def cmd_sweep(a) -> int:
    from .eval.sweep import SWEEP_METHODS, format_table, parse_int_list, plot_pareto, run_sweep
    from .errors import InputError

    hops = parse_int_list(a.hops, "--hops", 0)
    budgets = parse_int_list(a.budget, "--budget", 1)
    cats = tuple(parse_int_list(a.categories, "--categories", 1))
    methods = [m.strip() for m in a.method.split(",") if m.strip()]
    unknown = [m for m in methods if m not in SWEEP_METHODS]
    if not methods or unknown:
        raise InputError(f"--method: unknown method {unknown[0] if unknown else a.method!r}; "
                         f"choose from {', '.join(SWEEP_METHODS)}")
    for flag, v, lo in (("--batch-size", a.batch_size, 1), ("--rounds", a.rounds, 1), ("--threads", a.threads, 1),
                        ("--warmup", a.warmup, 0)):
        if v < lo:
            raise InputError(f"{flag} must be >= {lo}, got {v}")
    if not Path(a.data).exists():
        raise InputError(f"--data {a.data}: file not found")
    res = run_sweep(a.data, methods, hops, budgets, paper=a.paper, engine=a.engine, categories=cats,
                    batch_size=a.batch_size, rounds=a.rounds, threads=a.threads, warmup=a.warmup,
                    banks_dir=a.banks, max_questions=a.max_questions, progress=not a.quiet)
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


def add_commands(sub) -> None:
    s = sub.add_parser("sweep", help="quality, context tokens and latency over a hops x budget grid, "
                                     "with the Pareto-optimal cells (table, JSON, PNG)")
    s.add_argument("--data", required=True, help="LoCoMo-layout JSON with questions and gold evidence")
    s.add_argument("--hops", default="1,2,3", help="comma-separated H values for TrawMem (default 1,2,3)")
    s.add_argument("--budget", default="4,8,16,32", help="comma-separated unit budgets B (default 4,8,16,32)")
    s.add_argument("--method", default="trawmem,hybrid",
                   help="comma-separated: trawmem, cosine, bm25, hybrid (baselines get one cell per B)")
    s.add_argument("--engine", choices=["reference", "batched"], default="reference",
                   help="TrawMem selection for the per-query latency (throughput always uses the batched engine)")
    s.add_argument("--paper", action="store_true", help="Section 4.2 exactly as written (SelectConfig.paper())")
    s.add_argument("--categories", default="1,2,3,4")
    s.add_argument("--batch-size", type=int, default=256, help="batch size of the throughput measurement")
    s.add_argument("--rounds", type=int, default=3, help="throughput rounds (median reported)")
    s.add_argument("--threads", type=int, default=1, help="threads of the timed query paths: BLAS / torch pools and the batched engine's workers (default 1)")
    s.add_argument("--warmup", type=int, default=10, help="untimed queries before each cell's timed pass")
    s.add_argument("--banks", help="reuse this bank collection instead of timed fresh builds")
    s.add_argument("--max-questions", type=int, help="a seeded sample of this many questions")
    s.add_argument("--output", default="sweep.json")
    s.add_argument("--plot", help="Pareto PNG (default: --output with .png)")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(fn=cmd_sweep)
