"""The implementations ``bench_select.py`` times, and the helpers the timing shares."""
from __future__ import annotations

import functools
import time

from .. import harness
from ..harness import pct


def rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_batched(eng, ids, qs, Z, reps: int, min_s: float = 0.0, params=None) -> dict:
    """Warm call, then ``reps`` timed calls (more while under ``min_s``): per-batch latencies.
    ``params``: the queries' ``QueryParams`` (None = the defaults)."""
    import torch

    from trawmem_gpu.select.steps.roles import demand_features_cached

    sync = (lambda: torch.cuda.synchronize()) if eng.device.type == "cuda" else (lambda: None)
    out = eng.select_units(ids, qs, Z, params=params)
    lat, stages, t_all = [], {}, time.perf_counter()
    while len(lat) < reps or (time.perf_counter() - t_all < min_s and len(lat) < 50):
        demand_features_cached.cache_clear()  # no text work carried over from the previous call
        sync()
        t = time.perf_counter()
        eng.select_units(ids, qs, Z, params=params)
        sync()
        lat.append(time.perf_counter() - t)
        for k, v in eng.last_timings.items():
            stages.setdefault(k, []).append(v)
    med = pct(lat, 50)
    Q = len(ids)
    return {"qps": Q / med, "p50_ms": med * 1e3, "p99_ms": pct(lat, 99) * 1e3, "latency_unit": "batch",
            "reps": len(lat), "stage_us_per_query": {k: round(pct(v, 50) / Q * 1e6, 2) for k, v in stages.items()},
            "_out": out}


def run_reference(ctxs, cfg, ids, qs, Z, n: int, params=None) -> dict:
    from trawmem_gpu.select.reference import select_reference

    n = min(n, len(ids))
    lat, out = [], []
    for b, q, z in zip(ids[:n], qs[:n], Z[:n]):
        t = time.perf_counter()
        out.append(select_reference(ctxs[b], q, z, cfg, params).units)
        lat.append(time.perf_counter() - t)
    mean = sum(lat) / len(lat)
    return {"qps": 1.0 / mean, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
            "latency_unit": "query", "n_queries_timed": n, "_out": out}


@functools.lru_cache(maxsize=1)
def _apricot():
    """apricot's FacilityLocationSelection with its per-fit numba compilation memoized: stock
    apricot 0.6 builds and compiles its gain functions inside every ``fit`` (~1 s each), which
    would measure the compiler, not the greedy."""
    try:
        from apricot import FacilityLocationSelection
        from apricot.functions import facilityLocation as fl
    except Exception as e:  # noqa: BLE001
        return None, f"apricot unavailable: {e}"
    for name in ("calculate_gains", "calculate_gains_sparse", "calculate_gains_sieve"):
        f = getattr(fl, name, None)
        if f is not None and not hasattr(f, "cache_info"):
            setattr(fl, name, functools.lru_cache(maxsize=None)(f))
    return FacilityLocationSelection, None


def run_apricot(eng, params, ids, qs, Z, n: int, threads: int) -> dict:
    """apricot's greedy on the candidates the engine selects from under ``params`` (a
    ``QueryParams``: its ``budget`` is apricot's B)."""
    import numpy as np

    FLS, err = _apricot()
    if FLS is None:
        return {"skipped": err}
    n = min(n, len(ids))
    cands = eng.candidate_sets(ids[:n], qs[:n], Z[:n], params=params)
    Ks = [eng.candidate_kernel(b, c) for b, c in zip(ids[:n], cands)]
    for K in Ks[:2]:  # warm (compilation)
        if len(K) >= 2:
            FLS(min(params.budget, len(K) - 1), metric="precomputed", optimizer="lazy", verbose=False).fit(K)
    lat = []
    for K in Ks:
        B = max(1, min(params.budget, len(K)))
        t = time.perf_counter()
        if len(K) > B:
            FLS(B, metric="precomputed", optimizer="lazy", verbose=False).fit(np.ascontiguousarray(K))
        lat.append(time.perf_counter() - t)
    harness.repin(threads)  # numba may have touched the shared OpenMP runtime
    mean = sum(lat) / len(lat)
    return {"qps": 1.0 / mean, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "latency_unit": "query",
            "n_queries_timed": n, "scope": "greedy step only (facility location on the candidates' K)"}
