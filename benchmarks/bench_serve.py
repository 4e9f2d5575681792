"""Load test of `trawmem serve`: the real server on 127.0.0.1 under N concurrent clients.

Servers: one ``trawmem serve`` subprocess per configuration, all started up front on free ports
(each over its own copy of the collection, since appends write to it): dynamic batching with
``--max-batch 64`` and each ``--max-wait-ms`` of ``--waits``, and batch-size-1 serving
(``--max-batch 1``). Clients: ``--conc`` closed-loop clients (keep-alive HTTP/1.1 connections
on one asyncio loop, requests serialized in advance, so the load generator costs tens of
microseconds per request), each sending the next dev question as soon as its previous answer
came back, for ``--duration`` seconds per cell (bounded in time and in count by
``--max-requests``), while one append client adds a turn to a random bank every
``--append-every`` seconds. Cells (server x concurrency) run in ``--rounds`` rounds, alternating
servers within a round; figures are medians over rounds.

First, the query encoder's CPU time per question one at a time and in chunks of 8-64 (the
ceiling of what batching can gain on this CPU). Per cell: throughput, p50 / p95 / p99 latency,
failed requests (must be 0), the mean batch size (per batch, from the answers'
``timings.batch_size``), how busy the server's batch worker was (its batch seconds from
``/metrics`` over the cell's wall time), and the server's CPU per query by thread role (event
loop = HTTP, batch worker = encoder + engine, assembly, appends; from ``/proc``). Around each
cell, in this process, the in-process rate at that cell's batch size: ``encoder.encode`` +
``SelectionEngine.select_units`` on batches of that size (the same banks, config and threads),
half measured before the cell and half after; the ratio served / in-process is taken within the
cell, and dynamic batching over batch-size-1 within each round. At the end: turns appended
(answered 200) against turns stored (the servers' ``GET /v1/banks`` and the collections reloaded
from disk), which must match.

"Where the time goes" runs the reference server (``--ref-wait``, the default 5 ms) at
``--where-conc`` clients with client-supplied ``question_vector`` s (no encoder), once per request
(``/v1/select``) and once in ``/v1/select/batch`` calls of ``--batch-call`` requests: the
server's CPU per query by thread role, the worker's busy fraction, and a request's latency split
into queueing, the batch's engine call, assembly and HTTP (client latency minus the server's own
time). The batch-size-1 server takes the same ``/v1/select`` vector cells beside it in each round:
dynamic batching over batch-size-1 serving without the encoder. So does a server configured as
the reference one with each ``--http-workers N`` (HTTP in N front processes, one engine process;
its CPU per query adds a ``fronts`` role). With ``--baseline-src DIR`` (a source tree of an earlier version, e.g. ``git archive COMMIT |
tar -x -C DIR`` and, for a tree from before the kernels moved into ``trawmem_gpu/``, ``ln -s ../kernels DIR/trawmem_gpu/kernels``) a server of that tree, configured as the reference one, runs the same cells,
alternating with it in each round: this version over that one, per round, in one run.

    python -m benchmarks run serve [--quick] [--duration 4] [--rounds 4] [--waits 0,5,20]
                                   [--conc 1,8,64,256] [--threads 1] [--data PATH|sample]
                                   [--encoder-runtime torch|onnx] [--baseline-src DIR] [--skip-text]

``--hostile`` runs the adversarial test instead (``serve_bench/hostile.py``): a victim tenant's
single selects at a steady rate, alone and then beside a hostile tenant sending oversized fields,
a 4 MB ``where`` filter, a 64-distinct-parameter batch, a large append, 256-query batches and
hundreds of slow and idle connections, on the default server and on ``--http-workers 2``
(results ``serve_hostile.json`` / ``.png``; ``--data sample`` by default there). tests/serve/test_serve_hostile.py runs a short form.

Results: ``benchmarks/results/serve.json`` and ``serve.png`` (or ``--out-dir`` / ``TRAWMEM_BENCH_OUT``,
``--name``). Dev data is read in place (``../shared/data/locomo/locomo_dev.json``, or
``TRAWMEM_DEV_DATA``); ``--data sample`` uses 8 copies of the bundled sample conversation instead.
The parts live in ``benchmarks/serve_bench/``.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from . import harness
from .serve_bench.inproc import InProcess, encoder_chunks
from .serve_bench.load import run_cell
from .serve_bench.report import median_cells, plot, table, targets
from .serve_bench.servers import Server, load_data


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(harness.dev_data("locomo")), help="LoCoMo-layout dev file, or 'sample'")
    p.add_argument("--waits", default="0,5,20", help="--max-wait-ms settings of the batching servers")
    p.add_argument("--ref-wait", type=float, default=5.0,
                   help="the batching server the targets are read from (the server's default --max-wait-ms)")
    p.add_argument("--conc", default="1,8,64,256", help="concurrent clients per cell")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each cell")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-requests", type=int, default=100_000, help="bound on measured requests per cell")
    p.add_argument("--append-every", type=float, default=1.0, help="seconds between appends (0: none)")
    p.add_argument("--inproc-seconds", type=float, default=3.0, help="in-process seconds per cell (half before it)")
    p.add_argument("--threads", type=int, default=1, help="torch / engine threads, server and in-process alike")
    p.add_argument("--switch-interval-ms", type=float, default=0.5, help="the servers' GIL switch interval")
    p.add_argument("--encode-chunk", type=int, default=16, help="questions per encoder pass, server and in-process")
    p.add_argument("--where-conc", type=int, default=64)
    p.add_argument("--batch-call", type=int, default=16, help="requests per /v1/select/batch call")
    p.add_argument("--encoder-runtime", default="torch", choices=("torch", "onnx"),
                   help="TRAWMEM_ENCODER_RUNTIME of the servers and the in-process reference")
    p.add_argument("--baseline-src", default=None,
                   help="a source tree of an earlier version (e.g. `git archive COMMIT | tar -x -C DIR`): its "
                        "server, configured as the reference one, runs the client-vector cells too, alternating "
                        "with it in every round (before / after in one run)")
    p.add_argument("--skip-text", action="store_true", help="only the client-vector cells (no text questions)")
    p.add_argument("--http-workers", default="1",
                   help="comma list: a reference-configured server with each --http-workers N (front processes) "
                        "also runs the client-vector cells, alternating with the others ('' for none)")
    p.add_argument("--hostile", action="store_true", help="the adversarial two-tenant test (see above)")
    p.add_argument("--hostile-rate", type=float, default=8.0, help="--hostile: victim selects per second")
    p.add_argument("--hostile-phase", type=float, default=20.0, help="--hostile: seconds per phase")
    p.add_argument("--hostile-append", type=int, default=300, help="--hostile: turns in the hostile append")
    p.add_argument("--hostile-big-append", type=int, default=1000,
                   help="--hostile: turns of the append-only phase (0: none)")
    p.add_argument("--hostile-flags", default="", help="--hostile: extra options of both servers (default: none)")
    p.add_argument("--hostile-slow", type=int, default=300, help="--hostile: slow-header connections")
    p.add_argument("--hostile-idle", type=int, default=200, help="--hostile: idle connections")
    p.add_argument("--quick", action="store_true", help="1 round, 3 s cells, waits 0,5, clients 1,8,64")
    p.add_argument("--out-dir", help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    p.add_argument("--name", default="serve", help="result files: NAME.json and NAME.png in --out-dir")
    a = p.parse_args(argv)
    if a.hostile:
        from .serve_bench.hostile_run import bench

        if a.data == str(harness.dev_data("locomo")) and "--data" not in (argv or sys.argv):
            a.data = "sample"
        return bench(a)
    if a.quick:
        a.rounds, a.duration, a.waits, a.conc, a.inproc_seconds = 1, 3.0, "0,5", "1,8,64", 1.0
    if a.data != "sample":
        harness.require_data(a.data)
    os.environ["TRAWMEM_ENCODER_RUNTIME"] = a.encoder_runtime  # the in-process reference's encoder too
    random.seed(0)
    with harness.pin_threads(a.threads):  # the in-process reference; the servers get --threads
        return run(a)


def text_rounds(a, servers, concs, inproc, bodies, bank_ids) -> list[dict]:
    """The text cells: every server at every concurrency, ``a.rounds`` rounds in alternating order,
    each cell paired with the in-process rate at its batch size (measured right before and after)."""
    prev_batch: dict = {}
    cells = []
    for rnd in range(a.rounds):
        order = [(s, c) for c in concs
                 for s in (servers if (rnd + concs.index(c)) % 2 == 0 else servers[::-1])]
        for s, c in order:
            # in-process at this cell's batch size right before (the previous round's batch size,
            # else the concurrency bound) and right after the cell; their mean pairs with the cell
            guess = prev_batch.get((s.name, c), min(c, s.max_batch))
            before = inproc.rate(guess, a.inproc_seconds / 2)
            cell = run_cell(s, bodies, "/v1/select", c, a, bank_ids, f"{s.name}-{c}-{rnd}")
            cell["round"] = rnd
            after = inproc.rate(cell["mean_batch"], a.inproc_seconds / 2)
            cell["inproc_qps"] = after if round(guess) != round(cell["mean_batch"]) else (before + after) / 2
            cell["served_over_inproc"] = cell["throughput_qps"] / cell["inproc_qps"]
            prev_batch[(s.name, c)] = cell["mean_batch"]
            cells.append(cell)
            print(f"round {rnd} {s.name:>18} x{c:<4} {cell['throughput_qps']:7.1f} q/s  p50 {cell['p50_ms']:7.1f}"
                  f"  p99 {cell['p99_ms']:7.1f} ms  batch {cell['mean_batch']:5.1f}  in-process "
                  f"{cell['inproc_qps']:7.1f} q/s ({cell['served_over_inproc']:.2f})  busy "
                  f"{cell['worker_busy']:.2f}  failed {cell['failed']}", flush=True)
    return cells


def vector_rounds(a, refs, fronts, b1, vec_and_batch_bodies, bank_ids) -> list[dict]:
    """Client-supplied vectors (single and batch calls) on the reference servers ``refs`` (the
    baseline's too), the front-process servers and, for single calls, batch-size-1 serving."""
    vec_bodies, batch_bodies = vec_and_batch_bodies
    where = []
    for rnd in range(a.rounds):
        for route, bodies, per in (("/v1/select", vec_bodies, 1), ("/v1/select/batch", batch_bodies, a.batch_call)):
            conc = a.where_conc if per == 1 else max(1, a.where_conc // per)
            pair = list(refs) + fronts
            if per == 1:  # batch-size-1 serving of the same vectors, next to the reference server
                pair.append(b1)
            pair = pair if rnd % 2 == 0 else pair[::-1]
            for srv in pair:
                cell = run_cell(srv, bodies, route, conc, a, bank_ids, f"vec-{srv.name}-{route[-5:]}-{rnd}", per)
                cell["vectors"], cell["round"] = True, rnd
                where.append(cell)
                print(f"vectors {srv.name:>18} {route:>16} x{conc:<4} ({per}/call) {cell['throughput_qps']:7.1f} "
                      f"q/s  p50 {cell['p50_ms']:7.1f} ms  batch {cell['mean_batch']:5.1f}  busy "
                      f"{cell['worker_busy']:.2f}  cpu {cell['server_cpu_cores']:.2f}  per query "
                      f"{cell.get('server_cpu_ms_per_query')}  split {cell.get('latency_split_ms')}", flush=True)
    return where


def print_report(rows: list[dict], wrows: list[dict], tg: dict) -> None:
    """The text cells' table, the client-supplied vectors' rows and the targets."""
    print("\n" + table(rows))
    print("\nclient-supplied vectors (where the time goes):")
    for r in wrows:
        print(f"  {r['server']} {r['route']} ({r['queries_per_call']}/call, {r['conc']} clients): "
              f"{r['throughput_qps']:.0f} q/s, "
              f"worker busy {r['worker_busy']:.2f}, server CPU {r['server_cpu_cores']:.2f} cores, per query "
              f"{r.get('per_query_ms')}, latency split {r.get('latency_split_ms')}")
    print("\ntargets:", json.dumps(tg, indent=1))


def run(a) -> int:
    waits = [float(w) for w in a.waits.split(",")]
    concs = [int(c) for c in a.conc.split(",")]

    src, banks, items = load_data(a.data)
    bank_ids = sorted({b for b, _ in items})
    print(f"data: {len(banks)} banks, {sum(b.n_units for b in banks)} units, {len(items)} questions; "
          f"threads {a.threads}", flush=True)
    inproc = InProcess(banks, items, a.threads, a.encode_chunk)
    Z = inproc.enc.encode([q for _, q in items], is_query=True)
    chunks = encoder_chunks(inproc.enc, [q for _, q in items])
    print("encoder CPU ms per question by chunk size: " + ", ".join(f"{c}: {v:.2f}" for c, v in chunks.items()),
          flush=True)
    text_bodies = [json.dumps({"bank_id": b, "question": q}).encode() for b, q in items]
    vec_bodies = [json.dumps({"bank_id": b, "question": q, "question_vector": [round(float(x), 6) for x in z]}).encode()
                  for (b, q), z in zip(items, Z)]
    batch_bodies = [b"{\"requests\": [" + b", ".join(vec_bodies[(i + j) % len(vec_bodies)] for j in range(a.batch_call))
                    + b"]}" for i in range(0, len(vec_bodies), a.batch_call)]

    work = Path(tempfile.mkdtemp(prefix="trawmem-bench-serve-"))
    servers = [Server(f"batch{a.max_batch}-wait{w:g}ms", src, work, a, a.max_batch, w) for w in waits]
    # batch-size-1 serving sits next to the reference server, so their cells of a round are adjacent
    servers.insert(next((i + 1 for i, w in enumerate(waits) if w == a.ref_wait), len(servers)),
                   Server("batch1", src, work, a, 1, 0.0))
    base = None
    if a.baseline_src:
        base = Server(f"baseline-wait{a.ref_wait:g}ms", src, work, a, a.max_batch, a.ref_wait,
                      root=Path(a.baseline_src).resolve())
        servers.append(base)
    fronts = [Server(f"fronts{n}-wait{a.ref_wait:g}ms", src, work, a, a.max_batch, a.ref_wait, http_workers=n)
              for n in (int(x) for x in a.http_workers.split(",") if x.strip())]
    servers += fronts
    stored0 = {s.name: sum(b.n_units for b in banks) for s in servers}
    try:
        for s in servers:
            s.wait_ready()
        print(f"{len(servers)} servers ready", flush=True)
        text_servers = [s for s in servers if s is not base and s not in fronts]
        cells = [] if a.skip_text else text_rounds(a, text_servers, concs, inproc, text_bodies, bank_ids)
        # where the time goes: client-supplied vectors on the reference batching server
        bs = next((s for s in servers if s.max_wait_ms == a.ref_wait and s.max_batch > 1), servers[0])
        b1 = next(s for s in servers if s.name == "batch1")
        where = vector_rounds(a, [bs] if base is None else [bs, base], fronts, b1, (vec_bodies, batch_bodies), bank_ids)
        # turns appended vs stored
        import httpx

        appended = {s.name: 0 for s in servers}
        for c in cells + where:
            appended[c["server"]] += c["appended"]
        api_stored = {s.name: sum(b["n_units"] for b in httpx.get(s.url + "/v1/banks", timeout=30).json()["banks"])
                      - stored0[s.name] for s in servers}
    finally:
        for s in servers:
            s.stop()
    from trawmem_gpu.store import Collection

    disk_stored = {s.name: sum(Collection(s.coll).load(b).n_units for b in Collection(s.coll).bank_ids)
                   - stored0[s.name] for s in servers}
    shutil.rmtree(work, ignore_errors=True)

    rows = median_cells(cells)
    wrows = median_cells(where)
    tg = targets(cells, where, rows, bs.name, None if base is None else base.name, [f.name for f in fronts], concs,
                 a.rounds, appended, api_stored, disk_stored)
    print_report(rows, wrows, tg)
    res = {"machine": harness.machine(threads=a.threads), "args": vars(a), "n_banks": len(banks), "n_units": int(sum(b.n_units for b in banks)),
           "n_questions": len(items), "encoder_cpu_ms_per_question_by_chunk": chunks, "cells": cells,
           "where": where, "table": rows, "where_table": wrows,
           "targets": tg}
    path = harness.save(a.name, res, plot(rows), out_dir=a.out_dir, dpi=120)
    print(f"-> {path}, {path.with_suffix('.png')}")
    return 0 if tg["failed"] == 0 and tg["turns_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
