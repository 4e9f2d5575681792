"""Many banks from one process under a resident budget (issue 33.5): the hot banks' latency beside an
all-resident process, and what a cold bank's first query costs.

One collection of ``B`` synthetic banks; a hot set of ``H`` of them. One process holds two
``Memory`` objects over it and times them side by side, query by query (the order of the two
alternates), so the machine's load falls on both alike:

* **all-resident**: loads the hot banks only (``only=``), all held, as a process serving just them;
* **lazy**: over all ``B`` banks with ``max_resident_bytes`` (``--budget``), after one pass over the
  hot banks; its traffic mixes the hot queries with queries to cold banks (one in
  ``--cold-every``), each opening its bank and pushing out the least recently used.

Reported: the hot queries' latency percentiles in both (their p99 ratio is the target: at most
1.5), the cold queries' latency (the cold-open cost), opens and evictions, and the process's
resident memory (``VmRSS`` / ``VmHWM``, both Memories together: target within 8 GiB at 10^5 banks).

``python -m benchmarks.scale_bench.many PATH H BUDGET ROUNDS COLD_EVERY`` runs it (JSON).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def point(path: Path, hot: int, budget: int, rounds: int, cold_every: int) -> dict:
    import numpy as np

    from trawmem_gpu import Memory
    from trawmem_gpu.store import Collection

    from .synthetic import query_set, rss_mb, stand_in_encoder

    ids = Collection(path).bank_ids
    rng = np.random.default_rng(11)
    hot_ids = [ids[i] for i in rng.choice(len(ids), size=min(hot, len(ids)), replace=False)]
    hot_set = set(hot_ids)
    cold_pool = [b for b in ids if b not in hot_set]
    t0 = time.perf_counter()
    lazy = Memory(path, encoder=stand_in_encoder(), max_resident_bytes=budget)
    open_lazy = time.perf_counter() - t0
    t0 = time.perf_counter()
    resident = Memory(path, encoder=stand_in_encoder(), only=hot_ids)
    open_resident = time.perf_counter() - t0
    order = [hot_ids[i] for i in np.random.default_rng(3).integers(0, len(hot_ids), size=rounds)]
    qs, Z = query_set(path, hot_ids)
    qmap = {b: (q, z) for b, q, z in zip(hot_ids, qs, Z)}
    n_cold = min(len(cold_pool), rounds // cold_every + 1) if cold_every else 0
    colds = [cold_pool[i] for i in rng.choice(len(cold_pool), size=n_cold, replace=False)] if n_cold else []
    cq, cz = query_set(path, colds) if colds else ([], [])
    for b in hot_ids:  # warm-up: every hot bank once in both
        for m in (lazy, resident):
            m.select(b, qmap[b][0], vector=qmap[b][1], budget=8)
    lat = {"resident": [], "lazy": []}
    cold_lat, ci = [], 0
    for k, b in enumerate(order):
        if colds and k % cold_every == cold_every - 1 and ci < len(colds):
            t0 = time.perf_counter()
            lazy.select(colds[ci], cq[ci], vector=cz[ci], budget=8)
            cold_lat.append(time.perf_counter() - t0)
            ci += 1
        for name in (("resident", "lazy") if k % 2 else ("lazy", "resident")):
            m = resident if name == "resident" else lazy
            t0 = time.perf_counter()
            m.select(b, qmap[b][0], vector=qmap[b][1], budget=8)
            lat[name].append(time.perf_counter() - t0)
    pct = lambda xs, p: round(float(np.percentile(xs, p)) * 1e3, 3) if xs else None  # noqa: E731
    summ = lambda xs: {"p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99), "n": len(xs)}  # noqa: E731
    res = lazy._core.resident
    out = {"banks": len(ids), "hot": len(hot_ids), "rounds": rounds, "cold_every": cold_every,
           "budget_bytes": budget, "open_s": {"lazy": round(open_lazy, 2), "resident": round(open_resident, 2)},
           "hot_ms": {k: summ(v) for k, v in lat.items()}, "cold_ms": summ(cold_lat),
           "opened": res.opened, "evicted": res.evicted, "resident_banks": len(res), "resident_bytes": res.total,
           "rss_mb": rss_mb()}
    r, z = out["hot_ms"]["resident"], out["hot_ms"]["lazy"]
    out["hot_p99_ratio"] = round(z["p99"] / r["p99"], 3)
    out["hot_p50_ratio"] = round(z["p50"] / r["p50"], 3)
    return out


def run(path: Path, hot: int, budget: int, rounds: int, cold_every: int, timeout_s: float, log=print) -> dict:
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "benchmarks.scale_bench.many", str(path), str(hot), str(budget),
                            str(rounds), str(cold_every)], capture_output=True, text=True, timeout=timeout_s,
                           env=dict(os.environ), cwd=Path(__file__).resolve().parents[2])
        rec = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else \
            {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
    except subprocess.TimeoutExpired:
        rec = {"error": f"over the {timeout_s:g} s limit"}
    rec["wall_s"] = round(time.perf_counter() - t0, 1)
    log(f"  many banks: " + (rec.get("error") or
        f"{rec['banks']} banks, hot p99 lazy/resident {rec['hot_p99_ratio']} (p50 {rec['hot_p50_ratio']}), cold p50 "
        f"{rec['cold_ms']['p50']} ms, RSS {rec['rss_mb'].get('VmRSS')} MB (peak {rec['rss_mb'].get('VmHWM')})"))
    return rec


def main(argv=None) -> int:
    a = sys.argv[1:] if argv is None else argv
    print(json.dumps(point(Path(a[0]), int(a[1]), int(a[2]), int(a[3]), int(a[4]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
