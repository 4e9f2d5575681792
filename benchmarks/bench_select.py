"""Selection throughput: every implementation side by side on the same inputs.

Implementations (same banks, same questions, same query vectors, same config):

``reference``      ``select_reference`` per query (NumPy float64, the statement of the method);
``batched_cpu``    ``SelectionEngine`` on CPU as shipped (float64; with numba the compiled backend,
                   ``select/engine/compiled.py``), one thread;
``batched_cpu_torch_front``  the same with ``front="tensor"`` (torch steps 1-3, compiled steps 4-7);
``batched_cpu_<n>threads``   the shipped path with one worker per core (target point only);
``batched_torch``  ``SelectionEngine(backend="tensor")``: the pure-torch CPU path (no numba);
``apricot_greedy`` apricot's ``FacilityLocationSelection(B_q, metric="precomputed",
                   optimizer="lazy")`` on each query's candidate support matrix ``K`` (the same
                   candidates the engine selects from): the anchor for the greedy step alone;
``cuda_torch`` / ``cuda_triton``  the engine on CUDA (float32) -- skipped without a GPU.

Target point, interleaved: every implementation in alternating rounds (one batched call each,
then 40 reference queries), the speedup taken within each round (the machine's speed drifts),
its median over rounds reported with its range. Demand-feature caches are cleared before every
timed batched call, so no text work carries over between repetitions.

Sweeps, one variable at a time around the target point (Q = 1024, U ~ 145, B = 16, H = 1), on
the LoCoMo dev banks (``banks_for``; U set through ``neighborhood_cap``) and on synthetic banks
(``synthetic_banks.py``; U set through thread length): Q in {1, 16, 256, 1024, 4096}, U in
{64, 145, 256, 512}, B in {4, 8, 16, 32}, H in {1, 2, 3}. Reported per point: queries/s, p50 and
p99 latency (per batch for the batched paths, per query for the per-query loops), mean |U_q|,
agreement of the batched sets with the reference, and bytes held per unit. A scaling run grows
a synthetic collection 10 -> 100 -> 1,000 -> 10,000 banks of 100 units (1M units at the top)
and reports throughput, build times and memory (RSS and the engine's tensor bytes). A seed-search
run times the two head-search paths of ``steps/seeds.py`` (faiss with per-bank restriction vs
batched per-bank similarity) on many small and a few large banks.

    python -m benchmarks run select [--quick] [--threads 1] [--no-real] [--no-synthetic]
                                    [--no-scaling] [--no-seed-search] [--max-banks 10000]
                                    [--update] [--gpu-target]

``--tokens`` pairs the CPU default engine at B = 16 against the same engine under a token budget
T = 800 (no unit cap; the cost-aware knapsack greedy and the check against T) on 1,024 LoCoMo dev
queries: one batch call each per round, alternating order, the ratio taken within each round and
the stage split per engine; writes ``select_tokens.json`` (``--versus TREE`` pairs B = 16 before and
after a change).

``--threads`` (default 1) pins torch, BLAS and numba to that many threads for *every*
implementation (per-core throughput; the numbers stay stable on a shared machine).
``--gpu-target`` runs only the GPU benchmark (U = 145, B = 16, d = 384, large Q; selections/s and
bytes moved / time against ~4.3 TB/s) and writes ``select_gpu.json``. ``--versus TREE`` pairs the
CPU default of this source tree against another checkout's (e.g. the commit before a refactor) at
the target point: one worker process per tree, one batch call each per round in alternating order,
the ratio taken within each round; writes ``select_versus.json``. Results go to
``benchmarks/results/select.json``, ``select_scaling.json`` and PNGs (or ``--out-dir``, or
``TRAWMEM_BENCH_OUT``). The parts live in ``benchmarks/select_bench/``.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import sys
import time
from pathlib import Path

from . import harness
from .select_bench.gpu import gpu_target
from .select_bench.paired import tokens_vs_units, versus, versus_worker
from .select_bench.report import plot_scaling, plot_sweeps, report
from .select_bench.scale import scaling, seed_search_bench
from .select_bench.sweeps import sweep, target_interleaved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and reference queries, smaller runs")
    ap.add_argument("--no-real", action="store_true")
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--no-seed-search", action="store_true")
    ap.add_argument("--no-target", action="store_true", help="skip the interleaved target-point measurement")
    ap.add_argument("--target-only", action="store_true",
                    help="only the interleaved target point (with --update: merged into select.json)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds at the target point (default 15)")
    ap.add_argument("--ref-per-round", type=int, default=None, help="reference queries per round (default 40)")
    ap.add_argument("--max-banks", type=int, default=10000, help="largest collection of the scaling run")
    ap.add_argument("--ref-queries", type=int, default=None, help="queries timed for the reference (default 200)")
    ap.add_argument("--apricot-queries", type=int, default=None)
    ap.add_argument("--update", action="store_true",
                    help="merge the sections that ran into an existing select.json instead of replacing it")
    ap.add_argument("--gpu-target", action="store_true", help="only the GPU benchmark (writes select_gpu.json)")
    ap.add_argument("--gpu-q", type=int, nargs="+", default=[4096, 65536])
    ap.add_argument("--gpu-device", default="cuda", help=argparse.SUPPRESS)  # "cpu": smoke-test the GPU code
    ap.add_argument("--versus", metavar="TREE", help="pair this tree's CPU default against another checkout's")
    ap.add_argument("--versus-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", action="store_true", help="B = 16 against T = 800, interleaved (select_tokens.json)")
    ap.add_argument("--out-dir", help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    args = ap.parse_args(argv)
    args.ref_queries = args.ref_queries or (60 if args.quick else 200)
    args.apricot_queries = args.apricot_queries or (40 if args.quick else 150)
    if args.versus or args.tokens or args.versus_worker:
        harness.require_data(args.data)
    with harness.pin_threads(args.threads):
        if args.versus_worker:
            return versus_worker(args)
        return run(args)


def run(args) -> int:
    import torch

    out_dir = harness.results_dir(args.out_dir)
    machine = harness.machine(threads=args.threads)
    t_start = time.perf_counter()
    if args.versus or args.tokens:  # one paired measurement, its own file
        name, key = ("select_versus", "versus") if args.versus else ("select_tokens", "tokens_vs_units")
        res = {"machine": machine, key: versus(args) if args.versus else tokens_vs_units(args)}
        print(f"wrote {harness.save(name, res, out_dir=out_dir)}")
        return 0
    if args.gpu_target:
        res = {"machine": machine, "gpu_target": gpu_target(args)}
        print(f"wrote {harness.save('select_gpu', res, out_dir=out_dir)}")
        return 0
    results = {"machine": machine, "command": harness.command(),
               "note": ("All implementations run on the same banks, questions and query vectors in one process, "
                        f"pinned to {args.threads} thread(s). Batched latencies are per batch (p99 of a few "
                        "repetitions is close to the max); reference and apricot latencies are per query. "
                        "apricot times only the greedy (facility location on the same candidate K), with its "
                        "per-fit numba compilation memoized. 'agree' = fraction of the reference's timed queries "
                        "whose selected set the batched engine reproduces exactly."),
               "sweeps": {}, "cuda": {"cuda_torch": "skipped: no CUDA device", "cuda_triton": "skipped: no CUDA device"}
               if not torch.cuda.is_available() else {"note": "run --gpu-target for the CUDA paths"}}
    real = None
    if not args.no_target:
        print("target point, interleaved:", flush=True)
        results["target"] = {}
        if not args.no_real and Path(args.data).exists():
            from .select_bench.data import RealData

            real = RealData(args.data)
            results["target"]["locomo_dev"] = target_interleaved(real, args, "locomo_dev")
        if not args.no_synthetic:
            results["target"]["synthetic"] = target_interleaved(None, args, "synthetic")
    if args.target_only:
        args.no_real = args.no_synthetic = args.no_seed_search = args.no_scaling = True
    if not args.no_real:
        if Path(args.data).exists():
            from .select_bench.data import RealData

            print("real LoCoMo dev banks:", flush=True)
            sweep(real or RealData(args.data), args, results, "locomo_dev")
        else:
            results["sweeps_note"] = f"dev data not found at {args.data}: real-bank sweeps skipped"
    if not args.no_synthetic:
        print("synthetic banks:", flush=True)
        sweep(None, args, results, "synthetic")
    if not args.no_seed_search:
        print("seed search:", flush=True)
        results["seed_search"] = seed_search_bench(args)
    results["wall_s"] = time.perf_counter() - t_start
    if not args.update:  # checkpoint before the (long) scaling run
        harness.save("select", results, out_dir=out_dir)
    if not args.no_scaling:
        print("scaling:", flush=True)
        sc = {"machine": machine, "command": results["command"]}
        sc.update(scaling(args))
        results["scaling"] = sc
        harness.save("select_scaling", sc, plot_scaling(sc), out_dir=out_dir)
    results["wall_s"] = time.perf_counter() - t_start
    body = {k: v for k, v in results.items() if k != "scaling"}
    with harness.locked("select", out_dir) as old:
        if args.update and old:
            old.setdefault("sweeps", {}).update(body.pop("sweeps"))
            old.setdefault("updates", []).append({"command": body.pop("command"), "machine": body.pop("machine"),
                                                  "sections": [k for k in body if k not in ("note", "cuda", "wall_s")]})
            old.update({k: v for k, v in body.items() if k not in ("note", "cuda", "wall_s")})
            body = old
        fig = plot_sweeps(results)
        written = [harness.save("select", body, fig, out_dir=out_dir)] + ([out_dir / "select.png"] if fig else [])
    if "scaling" in results:
        written += [out_dir / "select_scaling.json", out_dir / "select_scaling.png"]
    print(report(results))
    print(f"\nwrote {', '.join(map(str, written))} in {results['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
