"""Which attack of ``bench_serve.py --hostile`` makes the victim's slowest requests (issue 42 item 2).

Runs the default server under the hostile phases of ``serve_bench.hostile`` with some attacks left
out (``--abl full,noslow,noappend,nowhere,nobatch,onlybatch``), one fresh server each, and keeps
for every victim request its send time in the loaded phase, its latency and the server's own
``timings`` (queue, encode, select, assembly), so a slow request can be matched with what ran
then (the 408 burst of the slow connections at the header timeout, the end of the hostile
append, the large filter's parse at the start). JSON in ``--out`` (default ``results/archive/hostile_ablation.json``).

    PYTHONPATH=. python -m benchmarks.experiments.hostile_ablation --abl full,noslow --out /tmp/abl.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.serve_bench import hostile as H
from benchmarks.serve_bench.load import Conn
from benchmarks.serve_bench.hostile_run import tenants
from benchmarks.serve_bench.servers import Server

t_wall = [0.0]
ABLATIONS = {"full": {}, "noslow": dict(slow=0, idle=0), "noappend": dict(append_turns=0),
             "nowhere": dict(where_bytes=0, oversized_rounds=0), "nobatch": dict(big_batches=0),
             "onlybatch": dict(slow=0, idle=0, append_turns=0, where_bytes=0, oversized_rounds=0)}


async def _victim(port: int, key: str, bodies: list[bytes], rate: float, duration: float) -> list:
    free, rec, t_start = [Conn("127.0.0.1", port) for _ in range(8)], [], time.perf_counter()

    async def one(i: int):
        conn = free.pop() if free else Conn("127.0.0.1", port)
        t0 = time.perf_counter()
        status, body = await H._post(conn, "/v1/select", port, key, bodies[i % len(bodies)])
        lat = (time.perf_counter() - t0) * 1e3
        try:
            timings = json.loads(body).get("timings")
        except ValueError:
            timings = None
        rec.append({"sent_s": round(t0 - t_start, 3), "ms": round(lat, 1), "status": status, "timings": timings})
        free.append(conn)

    tasks, i = [], 0
    while i / rate < duration:
        await asyncio.sleep(max(0.0, t_start + i / rate - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one(i)))
        i += 1
    await asyncio.gather(*tasks)
    return sorted(rec, key=lambda r: r["sent_s"])


def _victim_sync(*a):
    return asyncio.run(_victim(*a))


async def _phases(port, kv, bodies, kh, bank, spec):
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        unloaded = await loop.run_in_executor(pool, _victim_sync, port, kv, bodies, spec.victim_rate_hz, spec.phase_s)
        stop = asyncio.Event()
        h = asyncio.ensure_future(H.hostile(port, kh, bank, spec, stop, "abl"))
        await asyncio.sleep(spec.settle_s)
        t_wall[0] = time.time()
        loaded = await loop.run_in_executor(pool, _victim_sync, port, kv, bodies, spec.victim_rate_hz, spec.phase_s)
        stop.set()
        attacks = await h
    return unloaded, loaded, attacks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--abl", default="full", help=f"comma-separated, of {', '.join(ABLATIONS)}")
    ap.add_argument("--phase", type=float, default=15.0, help="seconds per phase")
    ap.add_argument("--flags", default="", help="extra server options")
    ap.add_argument("--server-log", action="store_true", help="print each server's log after its run")
    ap.add_argument("--out", default=str(harness.ARCHIVE / "hostile_ablation.json"))
    a = ap.parse_args()

    class Args:
        encoder_runtime, threads = "torch", 1

    src, bank, _victim_banks, bodies, work, kv, kh, _keys = tenants("sample", "trawmem-hostile-abl-")
    out = []
    for k, abl in enumerate(a.abl.split(",")):
        spec = replace(H.Spec(phase_s=a.phase, big_append_turns=0), **ABLATIONS[abl])
        srv = Server(f"abl{k}-{abl}", src, work, Args, 0, 0.0, flags=["--keys", str(work / "keys.json"), *a.flags.split()])
        try:
            srv.wait_ready()
            unloaded, loaded, attacks = asyncio.run(_phases(srv.port, kv, bodies, kh, bank, spec))
        finally:
            srv.stop()
        if a.server_log:  # the server's own log lines (instrumented builds), with the loaded phase's start
            print(f"loaded phase from {t_wall[0]:.2f} (time.time())")
            print(Path(srv.log.name).read_text()[-20000:])
        p99 = [float(np.percentile([r["ms"] for r in ph], 99)) for ph in (unloaded, loaded)]
        slow = [r for r in loaded if r["ms"] > 2 * p99[0]]
        print(f"{abl}: victim p99 unloaded {p99[0]:.1f} loaded {p99[1]:.1f} ms, ratio {p99[1] / p99[0]:.2f}; "
              f"over twice the unloaded p99: {[(r['sent_s'], r['ms']) for r in slow]}", flush=True)
        out.append({"ablation": abl, "spec": ABLATIONS[abl], "p99_unloaded_ms": p99[0], "p99_loaded_ms": p99[1],
                    "unloaded": unloaded, "loaded": loaded,
                    "attacks": {k2: v for k2, v in attacks.items() if k2 in ("append", "big_where", "param_batch",
                                                                              "big_batches", "oversized")}})
    Path(a.out).write_text(json.dumps({"command": "python -m benchmarks.experiments.hostile_ablation", "args": vars(a),
                                       "runs": out}, indent=1))
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
