"""Query-side scaling curves (issue 33): per-query latency and throughput against one bank's size
(10^3 to 10^6 units), the number of banks (10 to 10^5) and the batch size, with a per-step model
of where the time goes (``benchmarks/scale_bench/query.py`` says how each point is measured).

    python -m benchmarks run scale-query                 # scale_query.json / .png under results/
    python -m benchmarks run scale-query --quick         # the smallest sizes (a smoke run)
    python -m benchmarks run scale-query --sizes 1000,10000 --banks 10,100 --batches 1,64
    python -m benchmarks run scale-query --only ann              # exact against approximate search only
    python -m benchmarks run scale-query --dev-quality           # the dev sets, threshold forced low
    python -m benchmarks run scale-query --realtext 100000       # LoCoMo dev turns repeated, exact vs approximate
    python -m benchmarks run scale-query --merge A.json,B.json --name scale_query_full   # pieces into one
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # `python benchmarks/bench_scale_query.py`
    import importlib.util as _u
    _s = _u.spec_from_file_location("benchmarks._boot", Path(__file__).resolve().parent / "_boot.py")
    _b = _u.module_from_spec(_s)
    _s.loader.exec_module(_b)
    _b.run_file(__file__)
    raise SystemExit(0)

from . import harness  # noqa: E402
from .scale_bench import query  # noqa: E402


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(float(x)) for x in s.split(",") if x.strip())


def _realtext(args) -> int:
    """``--realtext``: the check in a child process (its own peak memory), saved or its error shown."""
    if args.realtext < 1:
        print(f"--realtext must be at least 1 unit, got {args.realtext}", file=sys.stderr)
        return 2
    data = harness.require_data(args.data or harness.dev_data("locomo"))
    spec = dict(units=args.realtext, data=str(Path(data).resolve()), rounds=args.rounds, seed=7, batch=64,
                passes=args.passes)
    rec = query._child(spec, args.timeout, module="benchmarks.scale_bench.realtext_ann")
    if "error" in rec:
        print(f"real-text check failed: {rec['error']}", file=sys.stderr)
        return 1
    rec["machine"] = harness.machine(threads=1)
    print(harness.save(args.name + "_realtext", rec, out_dir=args.out_dir))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the smallest sizes only (seconds, for tests)")
    ap.add_argument("--sizes", type=_ints, default=query.SIZES, help="bank sizes of the d = 64 series")
    ap.add_argument("--sizes-wide", type=_ints, default=query.SIZES_WIDE, help="bank sizes of the d = 384 series")
    ap.add_argument("--banks", type=_ints, default=query.BANKS, help="numbers of banks")
    ap.add_argument("--batches", type=_ints, default=query.BATCHES, help="batch sizes")
    ap.add_argument("--units", type=int, default=20, help="units per bank of the number-of-banks curve")
    ap.add_argument("--batch-banks", type=int, default=1000, help="banks of the batch-size curve")
    ap.add_argument("--rounds", type=int, default=20, help="single-query selects per point")
    ap.add_argument("--threads", type=int, default=1, help="engine threads (pinned)")
    ap.add_argument("--ann-sizes", type=lambda s: tuple(tuple(int(float(y)) for y in x.split("x")) for x in s.split(",") if x.strip()),
                    default=query.ANN_SIZES, help="UNITSxDIM[xTOPICS] of the exact-against-approximate banks (100000x64,1000000x384x6,...; "
                         "topics default: one per 1,000 units, at least 6: scale_bench.ann.topics_for)")
    ap.add_argument("--bank-cache", default=None, metavar="DIR",
                    help="read an approximate point's bank from DIR/bank_UNITS_DIM_tTOPICS.pkl when it is there "
                         "(large_bank_sweep.py's CACHE; never written)")
    ap.add_argument("--only", choices=("ann",), help="only the exact-against-approximate points")
    ap.add_argument("--passes", type=int, default=3,
                    help="times the approximate points' queries are timed in a row (p50 / p99 over all of them)")
    ap.add_argument("--processes", type=int, default=1,
                    help="fresh processes per approximate point (their p50s' median: the reading past one)")
    ap.add_argument("--dev-quality", action="store_true",
                    help="the dev sets at equal tokens, exact against approximate (scale_query_ann_dev.json)")
    ap.add_argument("--realtext", type=int, default=None, metavar="UNITS",
                    help="only the real-text check: the LoCoMo dev turns repeated to UNITS units, exact against "
                         "approximate (scale_bench/realtext_ann.py; NAME_realtext.json)")
    ap.add_argument("--data", default=None, help="the LoCoMo dev file of --realtext (default: the dev data's)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per child process of --realtext")
    ap.add_argument("--merge", default=None, metavar="A.json,B.json",
                    help="only merge these results files (a curve run in pieces: scale_bench.query.merge) into NAME")
    ap.add_argument("--name", default="scale_query", help="results file name")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    for flag in ("passes", "processes"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.dev_quality:
        from .scale_bench.ann import dev_quality

        rec = dev_quality()
        print(harness.save(args.name + "_ann_dev", dict(rec, machine=harness.machine()), out_dir=args.out_dir))
        return 0
    if args.realtext is not None:
        return _realtext(args)
    if args.merge:
        import json

        rec = query.merge([json.loads(Path(p).read_text(encoding="utf-8")) for p in args.merge.split(",") if p.strip()])
        print(harness.save(args.name, rec, query.figure(rec), out_dir=args.out_dir))
        return 0
    kw = {} if args.quick else dict(units=args.units, batch_banks=args.batch_banks, rounds=args.rounds)
    if args.bank_cache:
        kw["bank_cache"] = args.bank_cache
    kw.update(passes=args.passes, processes=args.processes)
    if args.only == "ann":
        kw.update(sizes=(), sizes_wide=(), banks=(), batches=())
    head = query.commit()
    rec = query.run_query_curves(args.out_dir, **dict(dict(sizes=args.sizes, sizes_wide=args.sizes_wide, banks=args.banks,
                                                           batches=args.batches), **kw),
                                 quick=args.quick, threads=args.threads, ann_sizes=args.ann_sizes)
    rec["machine"] = harness.machine(threads=args.threads)
    rec["commit"] = head  # the code measured: read before the run (edits while it runs are not its)
    print(harness.save(args.name, rec, query.figure(rec), out_dir=args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
