"""Where one thread's time goes in the batched CPU engine at the target point (issue 46 item 3).

Builds the CPU default engine on the LoCoMo dev banks at the target point (Q = 1,024, U ~ 145,
B = 16, H = 1; the same set-up as ``bench_select.py --versus``), warms it, then runs
``select_units`` under cProfile with the demand-feature cache cleared before each call, pinned to
one thread. Writes the top functions by own time and by cumulative time as JSON (and prints
them)::

    python benchmarks/experiments/profile_select_cpu.py [--reps 3] [--out FILE.json]
"""
from __future__ import annotations

if not __package__:  # python benchmarks/experiments/NAME.py: run as a module of benchmarks
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.experiments"

import argparse
import cProfile
import json
import pstats
import time

from .. import harness
from ..select_bench.paired import clear_text_cache, select_units, target_setup


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    harness.require_data(args.data)
    with harness.pin_threads(1):
        from trawmem_gpu.select.engine import SelectionEngine

        args.threads = 1
        d, cfg, params, (ids, qs, Z) = target_setup(args)
        eng = SelectionEngine(d.banks, cfg, device="cpu", threads=1)
        select_units(eng, ids, qs, Z, params)  # warm (numba compilation, tables)
        walls = []
        for _ in range(args.reps):
            clear_text_cache()
            t = time.perf_counter()
            select_units(eng, ids, qs, Z, params)
            walls.append(time.perf_counter() - t)
        prof = cProfile.Profile()
        for _ in range(args.reps):
            clear_text_cache()
            prof.enable()
            select_units(eng, ids, qs, Z, params)
            prof.disable()
    st = pstats.Stats(prof)
    total = st.total_tt / args.reps
    rows = []
    for (f, line, name), (cc, nc, tt, ct, _) in st.stats.items():
        rows.append({"func": f"{f.split('trawmem_gpu/')[-1]}:{line}({name})", "calls": nc // args.reps,
                     "own_ms": 1e3 * tt / args.reps, "cum_ms": 1e3 * ct / args.reps})
    own = sorted(rows, key=lambda r: -r["own_ms"])[:args.top]
    cum = sorted(rows, key=lambda r: -r["cum_ms"])[:args.top]
    res = {"machine": harness.machine(threads=1), "Q": len(ids), "batch_wall_ms_unprofiled": [1e3 * w for w in walls],
           "profiled_total_ms": 1e3 * total, "by_own_time": own, "by_cumulative_time": cum}
    with open("/proc/loadavg") as fh:
        res["loadavg"] = fh.read().strip()
    print(f"batch wall (unprofiled) ms: {[round(1e3 * w, 1) for w in walls]}; profiled {1e3 * total:.1f} ms")
    for title, rs in (("own", own), ("cumulative", cum)):
        print(f"-- by {title} time")
        for r in rs:
            print(f"{r['own_ms']:9.2f} {r['cum_ms']:9.2f} {r['calls']:8d}  {r['func']}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
