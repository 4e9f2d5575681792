"""Memory and time of a batch over shortlists (large banks), by how the batch is cut into chunks.

A chunk over shortlists holds every query's working set and its compacted tables at once
(``engine/compiled.py``, ``APPROX_ROWS``). This runs one engine over one synthetic bank (d = 384,
``--topics`` topic centres: few topics give threads hundreds of neighbours) and, in interleaved
rounds, selects batches of each size with the chunk bound of this tree (``FRONT_ROWS`` queries x
units) and with 64 queries a chunk (the rule before: ``FRONT_ROWS`` raised to 64 banks). For each
it records the peak bytes Python allocated during the call (``tracemalloc``: NumPy's buffers
included), the wall time per query and a digest of the picks (the two cuts must pick alike)::

    python -m benchmarks.experiments.approx_chunk_memory --units 100000 --topics 6 [--batches 1,16,64]
        [--rounds 3] [--cache DIR] [--name approx_chunk_memory_t6]
"""
from __future__ import annotations

import argparse
import hashlib
import pickle
import statistics
import time
import tracemalloc
from pathlib import Path

from .. import harness


def _bank(units: int, topics: int, cache: str | None):
    from ..synthetic_banks import make_banks

    path = Path(cache) / f"approx_chunk_bank_{units}_t{topics}.pkl" if cache else None
    if path is not None and path.exists():
        return pickle.loads(path.read_bytes())
    banks = make_banks(1, units=units, d=384, seed=7, topics=topics)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(banks))
    return banks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=100_000)
    ap.add_argument("--topics", type=int, default=6)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", default=None, help="a folder to keep the built bank in")
    ap.add_argument("--name", default=None)
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    harness.pin_threads(1)
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine, compiled

    from ..synthetic_banks import make_queries

    banks = _bank(a.units, a.topics, a.cache)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1)
    sizes = [int(x) for x in a.batches.split(",")]
    ids, qs, Z = make_queries(banks, max(sizes), seed=5)
    eng.select_units(ids[:1], qs[:1], Z[:1])  # the index is built on the first query
    bound = compiled.FRONT_ROWS
    arms = {"bounded": bound, "64 a chunk": 64 * a.units}
    rows: dict = {(arm, B): {"peak_mib": [], "ms_per_query": [], "digest": set()} for arm in arms for B in sizes}
    for r in range(a.rounds):
        for arm in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            compiled.FRONT_ROWS = arms[arm]
            for B in sizes:
                tracemalloc.start()
                t = time.perf_counter()
                picks = eng.select_units(ids[:B], qs[:B], Z[:B])
                dt = time.perf_counter() - t
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                row = rows[(arm, B)]
                row["peak_mib"].append(peak / 2 ** 20)
                row["ms_per_query"].append(dt / B * 1e3)
                row["digest"].add(hashlib.sha256(repr(picks).encode()).hexdigest()[:16])
                print(f"round {r} {arm:>10} batch {B:>3}: peak {peak / 2 ** 20:8.1f} MiB, {dt / B * 1e3:6.1f} ms/query",
                      flush=True)
    compiled.FRONT_ROWS = bound
    out = []
    for (arm, B), row in rows.items():
        out.append({"arm": arm, "batch": B, "peak_mib_median": statistics.median(row["peak_mib"]),
                    "peak_mib_per_query": statistics.median(row["peak_mib"]) / B,
                    "ms_per_query_median": statistics.median(row["ms_per_query"]),
                    "ms_per_query": row["ms_per_query"], "digests": sorted(row["digest"])})
    same = all(r1["digests"] == r2["digests"] for r1 in out for r2 in out if r1["batch"] == r2["batch"])
    rec = {"machine": harness.machine(), "command": harness.command(), "units": a.units, "topics": a.topics,
           "front_rows": bound, "rounds": a.rounds, "rows": out, "same_picks_across_cuts": same}
    fig, (ax1, ax2) = harness.figure(1, 2, figsize=(9, 3.6))
    for arm in arms:
        pts = [r for r in out if r["arm"] == arm]
        ax1.plot([r["batch"] for r in pts], [r["peak_mib_median"] for r in pts], "o-", label=arm)
        ax2.plot([r["batch"] for r in pts], [r["ms_per_query_median"] for r in pts], "o-", label=arm)
    ax1.set(xlabel="queries in the call", ylabel="peak MiB allocated (tracemalloc)", xscale="log")
    ax2.set(xlabel="queries in the call", ylabel="ms per query (median)", xscale="log")
    ax1.legend()
    fig.suptitle(f"one bank of {a.units:,} units, {a.topics} topics, d = 384, approximate path")
    fig.tight_layout()
    harness.save(a.name or f"approx_chunk_memory_t{a.topics}", rec, fig=fig,
                 out_dir=a.out_dir or harness.results_dir(default=harness.ARCHIVE))
    print("same picks across cuts:", same)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
