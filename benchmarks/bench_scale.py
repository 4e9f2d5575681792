"""How the engine and its store scale (issue 33): curves against the bank's size, the number of banks
and the collection's size, with a model of where the time goes.

    python -m benchmarks run scale                    # writes, opening, many banks, query curves
    python -m benchmarks run scale --quick            # small sizes: a smoke run (seconds to minutes)
    python -m benchmarks run scale --parts writes --write-sizes 1000,12009,100075

Parts (``--parts``, default all):

* ``writes`` (``scale_bench.writes``): appending one turn, forgetting one, compacting, against one
  real-text bank's size (``scale_bench.realtext``: the LoCoMo dev conversations repeated under new
  ids); ``Memory.add`` with the engine's refresh up to ``--engine-max-units``. Checks the targets
  append(12,009) <= 3 x append(1,000) and append(10^5) <= 10 x append(1,000) (medians).
* ``opening`` (``scale_bench.opening``): open time, resident memory and cold / warm select latency
  against the number of 100-unit synthetic banks, eager (every bank loaded) and lazy (a budget).
* ``many`` (``scale_bench.many``): ``--many-banks`` banks from one process under a budget: the hot
  banks' p99 beside an all-resident process (target <= 1.5x), the cold-open latency, the memory.
* ``ray`` (``scale_bench.ray_scaling``): ``trawmem score`` on Ray Data with 1 to ``--ray-workers``
  workers on one local Ray instance, beside the single-process job (LongMemEval-S dev questions);
  needs the ray extra (recorded as unavailable without it).
* ``query``: per-query latency against one bank's size, the number of banks and the batch size:
  the module ``scale_bench.query`` (``scale_bench.QUERY_MODULE``), when the tree has it.

Banks and collections are made in a temporary directory (``--work``) and removed after; nothing
of the dev data is written under the repository. Writes ``scale.json`` and ``scale.png``; a run of
some parts keeps the other parts of the file it replaces (``kept_from_earlier_run`` names them).
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import importlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import harness

PARTS = ("writes", "opening", "many", "ray", "query")
FULL = {"write_sizes": "1000,3000,6000,12009", "repeats": 3, "engine_max_units": 3000, "open_banks": "10,100,1000,10000",
        "many_banks": 10000, "hot": 50, "rounds": 2000, "cold_every": 20, "ray_workers": 4, "ray_rounds": 2}
QUICK = {"write_sizes": "300,1200", "repeats": 1, "engine_max_units": 300, "open_banks": "10,100", "many_banks": 200,
         "hot": 10, "rounds": 60, "cold_every": 6, "ray_workers": 2, "ray_rounds": 1}
"""Defaults of the sized flags, full and ``--quick`` (a flag given on the command line wins)."""
WRITE_PARTS = ["encode_units_s", "segment_s", "heads_s", "encode_heads_s", "graph_s", "write_and_checks_s"]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench_scale.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat each: a smoke run")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    ap.add_argument("--data", default=None, help="LoCoMo dev file (default: the dev data beside the repository)")
    ap.add_argument("--write-sizes", default=None, help=f"real-text bank sizes, units (default {FULL['write_sizes']}; --quick {QUICK['write_sizes']})")
    ap.add_argument("--repeats", type=int, default=None, help="appends and forgets per size (their median)")
    ap.add_argument("--engine-max-units", type=int, default=None,
                    help="largest bank whose Memory.add (with the engine's refresh) is timed")
    ap.add_argument("--open-banks", default=None, help="collection sizes (banks of 100 units)")
    ap.add_argument("--eager-max-banks", type=int, default=2000, help="largest collection opened eagerly")
    ap.add_argument("--budget-mb", type=float, default=64.0, help="resident budget of the lazy opens (MB)")
    ap.add_argument("--many-banks", type=int, default=None, help="banks of the many-banks run (10^5: the target)")
    ap.add_argument("--hot", type=int, default=None, help="hot banks of the many-banks run")
    ap.add_argument("--rounds", type=int, default=None, help="hot queries of the many-banks run")
    ap.add_argument("--cold-every", type=int, default=None, help="one cold query per this many hot ones")
    ap.add_argument("--ray-workers", type=int, default=None, help="most Ray workers of the ray part (from 1)")
    ap.add_argument("--ray-rounds", type=int, default=None, help="rounds of the ray part (medians)")
    ap.add_argument("--lme", default=None, help="LongMemEval-S dev file of the ray part (default: the dev data)")
    ap.add_argument("--threads", type=int, default=1, help="torch / BLAS threads of every child process")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds per child process")
    ap.add_argument("--work", default=None, help="where the temporary banks go (default: the system temp dir)")
    ap.add_argument("--out-dir", default=None, help="results folder (default benchmarks/results/)")
    ap.add_argument("--name", default="scale", help="result file name (NAME.json, NAME.png)")
    a = ap.parse_args(argv)
    for k, v in (QUICK if a.quick else FULL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in a.parts if p not in PARTS]
    if bad:
        ap.error(f"--parts: unknown {bad}; choose from {', '.join(PARTS)}")
    return a


def run(a) -> dict:
    from .scale_bench import QUERY_MODULE, many, model, opening, writes
    from .scale_bench.synthetic import make_collection

    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    work = Path(tempfile.mkdtemp(prefix="trawmem-bench-scale-", dir=a.work))
    rec: dict = {"benchmark": "scale", "command": harness.command(), "quick": a.quick, "parts": a.parts}
    t_all = time.perf_counter()
    try:
        if "writes" in a.parts:
            data = harness.require_data(a.data or harness.dev_data("locomo"))
            rows = writes.run(_ints(a.write_sizes), data, a.repeats, a.engine_max_units, a.timeout, log)
            base = min((r["n_units"] for r in rows if "append_store" in r), default=None)
            rec["writes"] = {"rows": rows, "model": {
                "append_store": model.where_time_goes(rows, "append_store", WRITE_PARTS),
                "forget_store": model.where_time_goes(rows, "forget_store", []),
                "append_memory": model.where_time_goes(rows, "append_memory", ["store_s", "engine_s"])},
                "targets": {"append_store": model.ratios(rows, "append_store", base, {12009: 3.0, 100075: 10.0})
                            if base else {}, "append_memory": model.ratios(rows, "append_memory", base,
                                                                           {12009: 3.0, 100075: 10.0}) if base else {}}}
        if "opening" in a.parts:
            points = []
            for n in _ints(a.open_banks):
                path = work / f"open-{n}"
                log(f"  writing {n} synthetic banks")
                rec.setdefault("collections", {})[path.name] = make_collection(path, n)
                points += [(path, "lazy")] + ([(path, "eager")] if n <= a.eager_max_banks else [])
            rec["opening"] = opening.run(points, int(a.budget_mb * 2 ** 20), 20 if not a.quick else 5, a.timeout, log)
            for path, _ in points:
                shutil.rmtree(path, ignore_errors=True)
        if "many" in a.parts:
            path = work / "many"
            log(f"  writing {a.many_banks} synthetic banks")
            rec.setdefault("collections", {})["many"] = make_collection(path, a.many_banks, log=log)
            rec["many"] = many.run(path, a.hot, int(a.budget_mb * 2 ** 20), a.rounds, a.cold_every, a.timeout, log)
            shutil.rmtree(path, ignore_errors=True)
        if "ray" in a.parts:
            from importlib.util import find_spec

            if find_spec("ray") is None:
                rec["ray"] = {"available": False, "why": "the ray extra is not installed"}
            else:
                from .scale_bench import ray_scaling

                lme = harness.require_data(a.lme or harness.dev_data("longmemeval"), "longmemeval", "--lme")
                rec["ray"] = ray_scaling.run(lme, list(range(1, a.ray_workers + 1)), a.ray_rounds, log)
        if "query" in a.parts:
            try:
                mod = importlib.import_module(QUERY_MODULE)
            except ImportError:
                rec["query"] = {"available": False, "why": f"{QUERY_MODULE} is not in this tree (the engine's "
                                                           f"query-side curves plug in there: run(args) -> dict)"}
            else:
                rec["query"] = {"available": True, **mod.run(a)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rec["total_s"] = round(time.perf_counter() - t_all, 1)
    rec["machine"] = harness.machine(threads=a.threads)
    return rec


def figure(rec: dict):
    from .scale_bench.report import figure as fig

    return fig(rec)


def main(argv=None) -> int:
    a = parse(argv)
    with harness.pin_threads(a.threads):
        rec = run(a)
    from .scale_bench.report import summary

    with harness.locked(a.name, a.out_dir) as old:  # a run of some parts keeps the other parts' results
        kept = [p for p in PARTS if p not in a.parts and p in old]
        rec = {**{p: old[p] for p in kept}, **rec}
        if kept:
            rec["kept_from_earlier_run"] = {p: old.get("command") for p in kept}
        print(summary(rec))
        out = harness.save(a.name, rec, figure(rec), out_dir=a.out_dir)
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
