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

    python benchmarks/bench_select.py [--quick] [--threads 1] [--no-real] [--no-synthetic]
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
``benchmarks/results/select.json``, ``select_scaling.json`` and PNGs (or ``--out-dir``).
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
HBM_BYTES_PER_S = 4.3e12  # H200


def _pin_threads(n: int) -> None:
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[v] = str(n)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def pct(xs, q):
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else float("nan")


# ----------------------------------------------------------------------------------------------
# implementations
# ----------------------------------------------------------------------------------------------
def run_batched(eng, ids, qs, Z, reps: int, min_s: float = 0.0) -> dict:
    """Warm call, then ``reps`` timed calls (more while under ``min_s``): per-batch latencies."""
    import torch

    from trawmem_gpu.select.steps.roles import demand_features_cached

    sync = (lambda: torch.cuda.synchronize()) if eng.device.type == "cuda" else (lambda: None)
    out = eng.select_units(ids, qs, Z)
    lat, stages, t_all = [], {}, time.perf_counter()
    while len(lat) < reps or (time.perf_counter() - t_all < min_s and len(lat) < 50):
        demand_features_cached.cache_clear()  # no text work carried over from the previous call
        sync()
        t = time.perf_counter()
        eng.select_units(ids, qs, Z)
        sync()
        lat.append(time.perf_counter() - t)
        for k, v in eng.last_timings.items():
            stages.setdefault(k, []).append(v)
    med = pct(lat, 50)
    Q = len(ids)
    return {"qps": Q / med, "p50_ms": med * 1e3, "p99_ms": pct(lat, 99) * 1e3, "latency_unit": "batch",
            "reps": len(lat), "stage_us_per_query": {k: round(pct(v, 50) / Q * 1e6, 2) for k, v in stages.items()},
            "_out": out}


def run_reference(ctxs, cfg, ids, qs, Z, n: int) -> dict:
    from trawmem_gpu.select.reference import select_reference

    n = min(n, len(ids))
    lat, out = [], []
    for b, q, z in zip(ids[:n], qs[:n], Z[:n]):
        t = time.perf_counter()
        out.append(select_reference(ctxs[b], q, z, cfg).units)
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


def run_apricot(eng, cfg, ids, qs, Z, n: int, threads: int) -> dict:
    import numpy as np
    import torch

    FLS, err = _apricot()
    if FLS is None:
        return {"skipped": err}
    n = min(n, len(ids))
    cands = eng.candidate_sets(ids[:n], qs[:n], Z[:n])
    Ks = [eng.candidate_kernel(b, c) for b, c in zip(ids[:n], cands)]
    for K in Ks[:2]:  # warm (compilation)
        if len(K) >= 2:
            FLS(min(cfg.budget, len(K) - 1), metric="precomputed", optimizer="lazy", verbose=False).fit(K)
    lat = []
    for K in Ks:
        B = max(1, min(cfg.budget, len(K)))
        t = time.perf_counter()
        if len(K) > B:
            FLS(B, metric="precomputed", optimizer="lazy", verbose=False).fit(np.ascontiguousarray(K))
        lat.append(time.perf_counter() - t)
    torch.set_num_threads(threads)  # numba may have touched the shared OpenMP runtime
    mean = sum(lat) / len(lat)
    return {"qps": 1.0 / mean, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "latency_unit": "query",
            "n_queries_timed": n, "scope": "greedy step only (facility location on the candidates' K)"}


# ----------------------------------------------------------------------------------------------
# datasets
# ----------------------------------------------------------------------------------------------
class RealData:
    name = "locomo_dev"

    def __init__(self, path):
        import numpy as np

        from trawmem_gpu.config import BuildConfig
        from trawmem_gpu.encode import get_encoder
        from trawmem_gpu.eval.retrieval import banks_for

        bc = BuildConfig()
        convs, self.banks, _ = banks_for(path, bc, progress=False)
        items = [(c.bank_id, q.question) for c in convs for q in c.questions if q.category in (1, 2, 3, 4)]
        self.ids = [b for b, _ in items]
        self.qs = [q for _, q in items]
        self.Z = np.asarray(get_encoder(bc.encoder).encode(self.qs, is_query=True, progress=False), dtype=np.float32)
        rng = np.random.default_rng(0)
        self.perm = rng.permutation(len(self.ids))

    def queries(self, Q):
        """Q queries; beyond the distinct questions, copies get c trailing spaces (distinct texts,
        same tokens and features) so no text work is shared between copies."""
        import numpy as np

        n = len(self.ids)
        idx = [self.perm[i % n] for i in range(Q)]
        qs = [self.qs[j] + " " * (i // n) for i, j in enumerate(idx)]
        return [self.ids[j] for j in idx], qs, self.Z[np.asarray(idx)]

    def config_for_U(self, U):
        return {64: 12, 145: 26, 256: 48, 512: 100}[U]  # neighborhood_cap giving mean |U_q| ~ U


class SynData:
    name = "synthetic"

    def __init__(self, U=145, n_banks=64, seed=0, pool=4096):
        from synthetic_banks import make_banks, make_queries

        self.U = U
        thread_len = U / 12.0
        units = int(round(2 * U))  # ~24 threads: the neighbourhood (12 threads) is half the bank
        self.banks = make_banks(n_banks, units=units, thread_len=thread_len, seed=seed)
        self.pool = make_queries(self.banks, pool, seed=seed + 1)

    def queries(self, Q):
        """The first Q queries of a fixed pool (so every implementation sees the same ones)."""
        ids, qs, Z = self.pool
        return ids[:Q], qs[:Q], Z[:Q]


# ----------------------------------------------------------------------------------------------
# sweeps
# ----------------------------------------------------------------------------------------------
def measure_point(data, banks, cfg, Q, args, impls, ctx_cache, eng_cache, ref_cache, key) -> dict:
    import numpy as np

    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.select.engine import SelectionEngine

    ids, qs, Z = data.queries(Q)
    row = {"dataset": data.name, "Q": Q, "B": cfg.budget, "H": cfg.hops, "neighborhood_cap": cfg.neighborhood_cap,
           "impls": {}}
    reps = 2 if args.quick else 3
    for impl in impls:
        if impl in ("batched_cpu", "batched_torch"):
            ek = (key, impl)
            if ek not in eng_cache:
                t = time.perf_counter()
                backend = "auto" if impl == "batched_cpu" else "tensor"
                for stale in [k for k in eng_cache if k[0] != key]:  # engines of other configs: drop
                    del eng_cache[stale]
                eng_cache[ek] = (SelectionEngine(banks, cfg, device="cpu", backend=backend), time.perf_counter() - t)
            eng, build_s = eng_cache[ek]
            big = Q * (4 if impl == "batched_torch" else 1)
            r = run_batched(eng, ids, qs, Z, reps=1 if big >= 4096 else reps, min_s=0.0 if args.quick else 1.0)
            r["engine_build_s"] = round(build_s, 3)
            r["backend"] = eng.plan.backend
            units = sum(b.n_units for b in banks)
            r["bytes_per_unit"] = {"vectors": eng.snapshot.nbytes(("unit_vecs", "head_vecs")) / units,
                                   "engine_total": eng.nbytes() / units, "tables": eng.table_nbytes() / units}
            row["impls"][impl] = r
        elif impl == "reference":
            if key not in ref_cache:  # per-query loop: timed once per config on the pool's first queries
                if id(banks) not in ctx_cache:
                    ctx_cache.clear()
                    ctx_cache[id(banks)] = {b.bank_id: BankContext.of(b) for b in banks}
                rids, rqs, rZ = data.queries(args.ref_queries)
                ref_cache[key] = (run_reference(ctx_cache[id(banks)], cfg, rids, rqs, rZ, args.ref_queries),
                                  (rids, rqs, rZ))
            row["impls"]["reference"] = dict(ref_cache[key][0])
        elif impl == "apricot_greedy":
            ek = (key, "batched_cpu")
            eng = eng_cache[ek][0] if ek in eng_cache else SelectionEngine(banks, cfg, device="cpu")
            row["impls"]["apricot_greedy"] = run_apricot(eng, cfg, ids, qs, Z, args.apricot_queries, args.threads)
    # agreement of batched with the reference on the reference's queries
    if "reference" in row["impls"] and (key, "batched_cpu") in eng_cache:
        eng = eng_cache[(key, "batched_cpu")][0]
        rids, rqs, rZ = ref_cache[key][1]
        got = eng.select_units(rids, rqs, rZ)
        ref_out = row["impls"]["reference"]["_out"]
        row["agreement_sets"] = float(np.mean([set(a) == set(b) for a, b in zip(got, ref_out)]))
        cs = eng.candidate_sets(ids[:256], qs[:256], Z[:256])
        row["U_mean"] = float(np.mean([len(c) for c in cs]))
    ref = row["impls"].get("reference", {}).get("qps")
    for name, r in row["impls"].items():
        r.pop("_out", None)
        if ref and "qps" in r and name != "reference":
            r["speedup_vs_reference"] = r["qps"] / ref
    return row


def target_interleaved(data, args, label) -> dict:
    """The target point (Q = 1024, U ~ 145, B = 16, H = 1), every implementation timed in
    alternating rounds: per round one batched call of 1024 queries per engine variant, then
    the reference on the next ``ref_per_round`` queries of the same pool. Machine speed drifts
    (a shared VM), so the ratio is taken within rounds: its median over rounds is the headline
    figure, with the median queries/s of each implementation and the spread of the ratio."""
    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.steps.roles import demand_features_cached

    real = data is not None
    if real:
        d, cfg = data, SelectConfig(budget=16, hops=1, n_seeds=8, neighborhood_cap=data.config_for_U(145))
    else:
        d = SynData(U=145)
        cfg = SelectConfig(budget=16, hops=1, n_seeds=8, neighborhood_cap=12)
    ids, qs, Z = d.queries(1024)
    ctx = {b.bank_id: BankContext.of(b) for b in d.banks}
    engines = {"batched_cpu": SelectionEngine(d.banks, cfg, device="cpu", threads=1),
               "batched_cpu_torch_front": SelectionEngine(d.banks, cfg, device="cpu", front="tensor", threads=1)}
    cores = os.cpu_count() or 1
    if cores > 1:  # every core of the machine: the reference's per-query loop cannot use them
        engines[f"batched_cpu_{cores}threads"] = SelectionEngine(d.banks, cfg, device="cpu", threads=cores)
    rounds = args.rounds or (5 if args.quick else 15)
    per = args.ref_per_round or (20 if args.quick else 40)
    qps = {k: [] for k in list(engines) + ["reference"]}
    stages = {k: [] for k in engines}
    outs = {k: e.select_units(ids, qs, Z) for k, e in engines.items()}  # warm (compilation, tables)
    ref_out = []
    for r in range(rounds):
        for k, e in engines.items():
            demand_features_cached.cache_clear()
            t = time.perf_counter()
            e.select_units(ids, qs, Z)
            qps[k].append(len(ids) / (time.perf_counter() - t))
            stages[k].append(dict(e.last_timings))
        demand_features_cached.cache_clear()
        lo = (r * per) % len(ids)
        rr = run_reference(ctx, cfg, ids[lo:lo + per], qs[lo:lo + per], Z[lo:lo + per], per)
        ref_out.extend(zip(range(lo, lo + per), rr["_out"]))
        qps["reference"].append(rr["qps"])
    ratios = {k: [a / b for a, b in zip(qps[k], qps["reference"])] for k in engines}
    agree = {k: float(np.mean([set(outs[k][i]) == set(u) for i, u in ref_out])) for k in engines}
    U = float(np.mean([len(c) for c in engines["batched_cpu"].candidate_sets(ids[:256], qs[:256], Z[:256])]))
    res = {"dataset": label, "Q": len(ids), "B": cfg.budget, "H": cfg.hops, "neighborhood_cap": cfg.neighborhood_cap,
           "U_mean": U, "rounds": rounds, "reference_queries_per_round": per, "threads": args.threads,
           "qps_median": {k: float(np.median(v)) for k, v in qps.items()},
           "speedup_median_of_rounds": {k: float(np.median(v)) for k, v in ratios.items()},
           "speedup_min_max": {k: [float(min(v)), float(max(v))] for k, v in ratios.items()},
           "agreement_sets": agree,
           "stage_us_per_query": {k: {s: round(float(np.median([x[s] for x in v])) / len(ids) * 1e6, 2)
                                      for s in v[0]} for k, v in stages.items()}}
    print(f"  target {label}: " + ", ".join(f"{k} {res['qps_median'][k]:,.0f} q/s" for k in qps)
          + " | speedup " + ", ".join(f"{k} {res['speedup_median_of_rounds'][k]:.1f}x "
                                      f"[{res['speedup_min_max'][k][0]:.1f}-{res['speedup_min_max'][k][1]:.1f}]"
                                      for k in engines) + f" | agree {agree['batched_cpu']:.3f}", flush=True)
    return res


def sweep(data, args, results, label):
    from trawmem_gpu.select.config import SelectConfig

    impls = ["reference", "batched_cpu", "batched_torch", "apricot_greedy"]
    rows = []
    ctx_cache, eng_cache, ref_cache = {}, {}, {}
    real = data is not None
    target_U = 145
    Qs = [1, 16, 256, 1024, 4096]
    Us = [64, 145, 256, 512]
    Bs = [4, 8, 16, 32]
    Hs = [1, 2, 3]
    syn_by_U = {}

    # n_seeds and the cap are held fixed (the defaults at B = 16) so that only the swept variable
    # moves: with the budget-scaled defaults (n_seeds = B/2, cap = 3B/4) a B sweep moves U too.
    def banks_cfg(U, B=16, H=1):
        if real:
            return data, data.banks, SelectConfig(budget=B, hops=H, n_seeds=8, neighborhood_cap=data.config_for_U(U))
        if U not in syn_by_U:
            syn_by_U.clear()
            syn_by_U[U] = SynData(U=U)
        d = syn_by_U[U]
        return d, d.banks, SelectConfig(budget=B, hops=H, n_seeds=8, neighborhood_cap=12)

    points = [("Q", Q, dict(U=target_U), Q) for Q in Qs]
    points += [("U", U, dict(U=U), 1024) for U in Us if U != target_U]
    points += [("B", B, dict(U=target_U, B=B), 1024) for B in Bs if B != 16]
    points += [("H", H, dict(U=target_U, H=H), 1024) for H in Hs if H != 1]
    # group points by config so engines are built once per config
    t0 = time.perf_counter()
    for var, val, kw, Q in points:
        d, banks, cfg = banks_cfg(**kw)
        key = (label, kw.get("U"), cfg.budget, cfg.hops)
        use = impls if not (var == "Q" and Q > 1024) else ["reference", "batched_cpu", "batched_torch"]
        row = measure_point(d, banks, cfg, Q, args, use, ctx_cache, eng_cache, ref_cache, key)
        row["sweep"] = var
        row["value"] = val
        row["U_target"] = kw.get("U")
        rows.append(row)
        bc = row["impls"].get("batched_cpu", {})
        print(f"  [{label}] {var}={val}: Q={Q} U~{row.get('U_mean', float('nan')):.0f} batched {bc.get('qps', 0):,.0f} q/s "
              f"({bc.get('speedup_vs_reference', float('nan')):.1f}x ref), torch "
              f"{row['impls'].get('batched_torch', {}).get('qps', 0):,.0f} q/s, ref "
              f"{row['impls'].get('reference', {}).get('qps', 0):,.0f} q/s, agree {row.get('agreement_sets', float('nan')):.3f}"
              f"  [{time.perf_counter() - t0:.0f}s]", flush=True)
    results["sweeps"][label] = rows


# ----------------------------------------------------------------------------------------------
# seed search: faiss with per-bank restriction vs batched per-bank similarity
# ----------------------------------------------------------------------------------------------
def seed_search_bench(args) -> dict:
    import numpy as np
    import torch

    from trawmem_gpu.select.steps.seeds import AUTO_MAX_BANKS, AUTO_MIN_HEADS, HeadIndex, faiss_available

    out = {"faiss_available": faiss_available(), "k": 24, "Q": 1024, "cases": [],
           "auto_thresholds": {"min_mean_heads": AUTO_MIN_HEADS, "max_banks_per_batch": AUTO_MAX_BANKS}}
    cases = [(10000, 13), (1000, 64), (64, 512), (16, 4096), (4, 32768)]
    if args.quick:
        cases = [(2000, 13), (64, 512), (4, 16384)]
    rng = np.random.default_rng(0)
    d = 384
    for n_banks, per in cases:
        H = rng.standard_normal((n_banks * per, d)).astype(np.float32)
        H /= np.linalg.norm(H, axis=1, keepdims=True)
        off = torch.arange(n_banks + 1, dtype=torch.int64) * per
        vecs = torch.from_numpy(H).double()
        bidx = torch.as_tensor(rng.integers(0, n_banks, size=1024))
        Z = vecs[off[bidx] + torch.as_tensor(rng.integers(0, per, size=1024))] + 0.05 * torch.randn(1024, d,
                                                                                                    dtype=torch.float64)
        Z = Z / Z.norm(dim=1, keepdim=True)
        idx = HeadIndex(vecs, off[:-1], off[1:] - off[:-1], mode="torch")
        case = {"banks": n_banks, "heads_per_bank": per, "distinct_banks_in_batch": int(len(torch.unique(bidx)))}
        res = {}
        for mode in ("torch", "faiss"):
            if mode == "faiss" and not faiss_available():
                case["faiss"] = "skipped: faiss not installed"
                continue
            idx.search(Z, bidx, out["k"], mode=mode)  # warm (builds the faiss index)
            ts = []
            for _ in range(2 if args.quick else 3):
                t = time.perf_counter()
                res[mode] = idx.search(Z, bidx, out["k"], mode=mode)
                ts.append(time.perf_counter() - t)
            case[f"{mode}_ms"] = round(pct(ts, 50) * 1e3, 2)
            case[f"{mode}_stats"] = {"faiss_calls": idx.stats.faiss_calls, "fallback_queries": idx.stats.fallback_queries}
        if "torch" in res and "faiss" in res:
            case["same_ids"] = bool(torch.equal(res["torch"][1], res["faiss"][1]))
            case["faster"] = "faiss" if case["faiss_ms"] < case["torch_ms"] else "torch"
        case["auto_picks"] = HeadIndex(vecs, off[:-1], off[1:] - off[:-1], mode="auto").choose(bidx)
        out["cases"].append(case)
        print(f"  seed search: {n_banks} banks x {per} heads: torch {case.get('torch_ms')} ms, faiss "
              f"{case.get('faiss_ms')} ms, auto -> {case['auto_picks']}, same ids {case.get('same_ids')}", flush=True)
        del H, vecs, idx
        gc.collect()
    return out


# ----------------------------------------------------------------------------------------------
# scaling
# ----------------------------------------------------------------------------------------------
def scaling(args) -> dict:
    import numpy as np
    import torch

    from synthetic_banks import make_banks, make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.select.engine import SelectionEngine

    sizes = [10, 100, 1000, 10000]
    sizes = [s for s in sizes if s <= args.max_banks]
    cfg = SelectConfig()
    rows = []
    for n in sizes:
        gc.collect()
        rss0 = rss_bytes()
        t = time.perf_counter()
        banks = make_banks(n, units=100, thread_len=8.0, seed=7)
        t_banks = time.perf_counter() - t
        rss_banks = rss_bytes()
        t = time.perf_counter()
        eng = SelectionEngine(banks, cfg, device="cpu")
        t_eng = time.perf_counter() - t
        rss_eng = rss_bytes()
        ids, qs, Z = make_queries(banks, 1024, seed=3)
        r = run_batched(eng, ids, qs, Z, reps=2 if args.quick else 3)
        rss_run = rss_bytes()
        nref = 30 if args.quick else 100
        ctx = {b.bank_id: BankContext.of(b) for b in banks if b.bank_id in set(ids[:nref])}
        ref = run_reference(ctx, cfg, ids, qs, Z, nref)
        units = sum(b.n_units for b in banks)
        row = {"banks": n, "units": units, "Q": 1024, "batched_qps": r["qps"], "batched_p50_ms": r["p50_ms"],
               "batched_p99_ms": r["p99_ms"], "reference_qps": ref["qps"], "speedup": r["qps"] / ref["qps"],
               "agreement_sets": float(np.mean([set(a) == set(b) for a, b in
                                                zip(eng.select_units(ids[:nref], qs[:nref], Z[:nref]), ref["_out"])])),
               "stage_us_per_query": r["stage_us_per_query"], "synthetic_build_s": t_banks, "engine_build_s": t_eng,
               "engine_tensor_bytes": eng.nbytes(), "vector_bytes": eng.snapshot.nbytes(("unit_vecs", "head_vecs")),
               "table_bytes": eng.table_nbytes(), "engine_bytes_per_unit": eng.nbytes() / units,
               "rss_bytes": {"before": rss0, "banks": rss_banks, "engine": rss_eng, "after_run": rss_run},
               "rss_per_unit_engine": (rss_eng - rss_banks) / units, "backend": eng.plan.backend}
        rows.append(row)
        print(f"  scaling: {n} banks / {units:,} units: {r['qps']:,.0f} q/s ({row['speedup']:.1f}x ref "
              f"{ref['qps']:.0f} q/s), engine {eng.nbytes() / 2**20:,.0f} MiB tensors "
              f"({row['engine_bytes_per_unit']:,.0f} B/unit), RSS {rss_run / 2**30:.2f} GiB, build {t_banks:.1f}s + "
              f"{t_eng:.1f}s", flush=True)
        del eng, banks, ctx
        torch.set_num_threads(args.threads)
    return {"config": cfg.to_dict(), "units_per_bank": 100, "thread_len": 8.0, "rows": rows}


# ----------------------------------------------------------------------------------------------
# GPU target
# ----------------------------------------------------------------------------------------------
def gpu_target(args) -> dict:
    import numpy as np
    import torch

    from synthetic_banks import make_banks, make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.steps.seeds import faiss_available, faiss_gpus

    dev = args.gpu_device
    out = {"target": "U=145, B=16, d=384", "hbm_bytes_per_s": HBM_BYTES_PER_S, "cuda": torch.cuda.is_available(),
           "faiss": faiss_available(), "faiss_gpus": faiss_gpus(), "device_arg": dev}
    if dev == "cuda" and not torch.cuda.is_available():
        out["skipped"] = "no CUDA device: the GPU benchmark did not run"
        print("  gpu target: skipped (no CUDA)")
        return out
    out["device"] = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (smoke run of the GPU benchmark code)"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    banks = make_banks(256, units=290, thread_len=145 / 12, seed=11)
    import importlib.util

    lexical_ok = all(importlib.util.find_spec(m) is not None for m in ("bm25s", "nltk"))
    cfg = SelectConfig(budget=16) if lexical_ok else SelectConfig(budget=16, affinity="dense")
    out["config"] = {"affinity": cfg.affinity, "budget": cfg.budget, "hops": cfg.hops,
                     "note": None if lexical_ok else "bm25s/nltk missing: dense affinity (no BM25) instead of rrf"}
    # chunks as large as memory allows: [Qc, U, U] float32 temporaries of ~2 GB
    chunk = int(os.environ.get("GPU_CHUNK_ELEMS", 1 << 29))
    out["chunk_elems"] = chunk
    runs = []
    for impl in ("triton", "torch"):
        try:
            eng = SelectionEngine(banks, cfg, device=dev, kernels=impl if dev == "cuda" else "torch",
                                  chunk_elems=chunk)
        except Exception as e:  # noqa: BLE001
            runs.append({"impl": impl, "error": repr(e)})
            continue
        for Q in args.gpu_q:
            ids, qs, Z = make_queries(banks, Q, seed=5)
            try:
                r = run_batched(eng, ids, qs, Z, reps=3)
            except torch.cuda.OutOfMemoryError as e:
                runs.append({"impl": impl, "Q": Q, "error": f"OOM: {e}"[:200]})
                torch.cuda.empty_cache()
                continue
            except Exception as e:  # noqa: BLE001 - report, keep going
                runs.append({"impl": impl, "Q": Q, "error": repr(e)[:300]})
                continue
            st = r["stage_us_per_query"]
            total = sum(st.values())
            device_us = total - st.get("text", 0.0) - st.get("output", 0.0)
            cs = eng.candidate_sets(ids[:512], qs[:512], Z[:512])
            U = sum(len(c) for c in cs) / len(cs)
            N = sum(b.n_units for b in banks) / len(banks)
            J = sum(b.n_threads for b in banks) / len(banks)
            # bytes a selection must move at least: the bank's unit vectors for affinity (N d 4),
            # the candidates' K (U^2 4), bridge rows (U T 4) and per-unit state (~16 floats)
            bytes_q = N * 384 * 4 + U * U * 4 + U * 12 * 4 + U * 16 * 4 + J * 8
            sel_s = 1e6 / device_us if device_us > 0 else float("nan")
            runs.append({"impl": impl, "Q": Q, "U_mean": U, "end_to_end_qps": r["qps"],
                         "device_selections_per_s": sel_s, "stage_us_per_query": st,
                         "bytes_per_selection_model": bytes_q,
                         "bandwidth_fraction": bytes_q * sel_s / HBM_BYTES_PER_S, "p50_ms": r["p50_ms"]})
            print(f"  gpu {impl} Q={Q}: end-to-end {r['qps']:,.0f} q/s, device stages {sel_s:,.0f} selections/s, "
                  f"{bytes_q * sel_s / HBM_BYTES_PER_S:.1%} of {HBM_BYTES_PER_S / 1e12:.1f} TB/s", flush=True)
        del eng
        if dev == "cuda":
            torch.cuda.empty_cache()
    out["runs"] = runs
    # seed search on the device: exact per-bank top-24 heads, torch vs faiss (GPU index if any)
    try:
        from trawmem_gpu.select.engine.batch import make_batch
        from trawmem_gpu.select.steps.seeds import HeadIndex

        eng = SelectionEngine(banks[:64], cfg, device=dev, chunk_elems=chunk)
        ids, qs, Z = make_queries(banks[:64], 4096, seed=6)
        qb = make_batch(eng.snapshot, ids, qs, Z, None, eng.device, eng.dtype)
        bidx, Zt = torch.as_tensor(qb.bidx, device=dev), qb.Z
        heads = torch.as_tensor(np.concatenate([b.head_vecs for b in banks[:64]]), dtype=eng.dtype, device=dev)
        counts = torch.as_tensor([b.n_threads for b in banks[:64]], device=dev)
        idx = HeadIndex(heads, torch.cumsum(counts, 0) - counts, counts, mode="torch")
        seed = {}
        for mode in ("torch", "faiss"):
            if mode == "faiss" and not faiss_available():
                seed[mode] = "skipped: faiss not installed"
                continue
            idx.search(Zt, bidx, 24, mode=mode)
            sync()
            t = time.perf_counter()
            r = idx.search(Zt, bidx, 24, mode=mode)
            sync()
            seed[mode] = {"ms": (time.perf_counter() - t) * 1e3, "faiss_gpu": idx._faiss_gpu,
                          "fallback_queries": idx.stats.fallback_queries}
            seed.setdefault("_ids", []).append(r[1])
        ids_l = seed.pop("_ids", [])
        if len(ids_l) == 2:
            seed["same_ids"] = bool(torch.equal(ids_l[0], ids_l[1]))
        out["seed_search"] = seed
        print(f"  gpu seed search (64 banks, Q=4096, k=24): {seed}", flush=True)
    except Exception as e:  # noqa: BLE001
        out["seed_search"] = {"error": repr(e)[:300]}
    return out


# ----------------------------------------------------------------------------------------------
# before / after: this tree against another checkout, interleaved
# ----------------------------------------------------------------------------------------------
def _target_setup(args):
    """The LoCoMo target point (Q = 1024, U ~ 145, B = 16, H = 1) and its config."""
    from trawmem_gpu.select.config import SelectConfig

    d = RealData(args.data)
    cfg = SelectConfig(budget=16, hops=1, n_seeds=8, neighborhood_cap=d.config_for_U(145))
    return d, cfg, d.queries(1024)


def _clear_text_cache() -> None:
    try:  # this tree
        from trawmem_gpu.select.steps.roles import demand_features_cached as cache
    except ImportError:  # an older tree
        from trawmem_gpu.select.engine import _demand_features_cached as cache
    cache.cache_clear()


def versus_worker(args) -> int:
    """Worker of ``--versus`` (runs with whichever ``trawmem_gpu`` PYTHONPATH gives it): builds the
    CPU default engine at the target point, warms it, prints a digest of its picks, then answers
    each ``run`` line on stdin with the wall and CPU seconds of one timed batch call."""
    import hashlib

    from trawmem_gpu.select.engine import SelectionEngine

    d, cfg, (ids, qs, Z) = _target_setup(args)
    eng = SelectionEngine(d.banks, cfg, device="cpu", threads=args.threads)
    picks = eng.select_units(ids, qs, Z)
    digest = hashlib.sha256(json.dumps([sorted(p) for p in picks]).encode()).hexdigest()
    print(f"ready {digest}", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        _clear_text_cache()
        t, c = time.perf_counter(), time.process_time()
        eng.select_units(ids, qs, Z)
        print(f"{time.perf_counter() - t:.9f} {time.process_time() - c:.9f}", flush=True)
    return 0


def versus(args) -> dict:
    """This tree's CPU default against ``args.versus``'s, in alternating rounds (order flipped every
    round); speed ratio = (this tree's queries/s) / (the other's) within each round, by wall time
    and by the process's CPU time (one thread: less sensitive to other load on the machine)."""
    import subprocess

    import numpy as np

    trees = {"this": str(ROOT), "other": str(Path(args.versus).resolve())}
    procs = {}
    for k, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=tree)
        procs[k] = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--versus-worker", "--data", args.data,
                                     "--threads", str(args.threads)], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, bufsize=1)
    digests = {}
    for k, p in procs.items():
        for line in p.stdout:
            if line.startswith("ready "):
                digests[k] = line.split()[1]
                break
        else:
            raise RuntimeError(f"the {k} worker ({trees[k]}) exited before it was ready")
    rounds = args.rounds or 15
    secs = {k: [] for k in procs}
    cpu = {k: [] for k in procs}
    for r in range(rounds):
        for k in (("this", "other") if r % 2 == 0 else ("other", "this")):
            procs[k].stdin.write("run\n")
            procs[k].stdin.flush()
            wall, c = procs[k].stdout.readline().split()
            secs[k].append(float(wall))
            cpu[k].append(float(c))
    for p in procs.values():
        p.stdin.write("stop\n")
        p.stdin.close()
        p.wait(timeout=60)
    def summary(t):
        ratios = [o / x for x, o in zip(t["this"], t["other"])]
        return {"qps_median": {k: 1024 / float(np.median(v)) for k, v in t.items()},
                "ratio_median": float(np.median(ratios)), "ratio_p25": float(np.percentile(ratios, 25)),
                "ratio_p75": float(np.percentile(ratios, 75)), "ratio_min": float(min(ratios)),
                "ratio_max": float(max(ratios)), "ratios": ratios}

    commits = {}
    for k, tree in trees.items():
        r = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True)
        commits[k] = r.stdout.strip() or None
    res = {"trees": trees, "commits": commits, "Q": 1024, "rounds": rounds, "threads": args.threads,
           "speed_ratio_is": "(this tree's queries/s) / (the other's), per round",
           "wall": summary(secs), "cpu": summary(cpu), "same_picks": digests["this"] == digests["other"]}
    for k in ("wall", "cpu"):
        r = res[k]
        print(f"  versus {trees['other']} ({k} time): this {r['qps_median']['this']:,.0f} q/s, other "
              f"{r['qps_median']['other']:,.0f} q/s, ratio median {r['ratio_median']:.3f} (IQR {r['ratio_p25']:.3f}-"
              f"{r['ratio_p75']:.3f}, range {r['ratio_min']:.3f}-{r['ratio_max']:.3f}) over {rounds} rounds", flush=True)
    print(f"  same picks: {res['same_picks']}", flush=True)
    return res


# ----------------------------------------------------------------------------------------------
# token budget against unit budget, interleaved, one process
# ----------------------------------------------------------------------------------------------
def tokens_vs_units(args) -> dict:
    """The CPU default engine at B = 16 and at T = 800 (each with its default pool: T = 800 sizes
    it like B = 16) over the same 1,024 dev queries, alternating rounds (order flipped every
    round); speed ratio = (T = 800 queries/s) / (B = 16 queries/s) within each round; the
    engines' stage seconds per query (median over rounds) say where the difference goes."""
    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.workspace import assemble

    d = RealData(args.data)
    ids, qs, Z = d.queries(1024)
    cfgs = {"B16": SelectConfig(budget=16), "T800": SelectConfig(token_budget=800, budget=None)}
    engs = {k: SelectionEngine(d.banks, c, device="cpu", threads=args.threads) for k, c in cfgs.items()}
    bank = {b.bank_id: b for b in d.banks}
    info = {}
    for k, e in engs.items():  # warm-up (numba load, tables) and what each mode selects
        picks = e.select_units(ids, qs, Z)
        toks = [assemble(bank[b], q, p, e.cfg.headings).n_tokens for b, q, p in zip(ids, qs, picks)]
        info[k] = {"units_mean": float(np.mean([len(p) for p in picks])), "tokens_mean": float(np.mean(toks)),
                   "tokens_max": int(max(toks))}
    rounds = args.rounds or 15
    secs = {k: [] for k in engs}
    stages = {k: [] for k in engs}
    for r in range(rounds):
        for k in (list(engs) if r % 2 == 0 else list(engs)[::-1]):
            _clear_text_cache()
            t = time.perf_counter()
            engs[k].select_units(ids, qs, Z)
            secs[k].append(time.perf_counter() - t)
            stages[k].append(dict(engs[k].last_timings))
    ratios = [b / t for b, t in zip(secs["B16"], secs["T800"])]
    res = {"Q": len(ids), "rounds": rounds, "threads": args.threads,
           "configs": {k: {"budget": c.budget, "token_budget": c.token_budget, "knapsack": c.knapsack}
                       for k, c in cfgs.items()},
           "qps_median": {k: len(ids) / float(np.median(v)) for k, v in secs.items()},
           "speed_ratio_is": "(T = 800 queries/s) / (B = 16 queries/s), per round",
           "ratio_median": float(np.median(ratios)), "ratio_p25": float(np.percentile(ratios, 25)),
           "ratio_p75": float(np.percentile(ratios, 75)), "ratios": ratios,
           "stage_us_per_query_median": {k: {s_: float(np.median([x.get(s_, 0.0) for x in v])) / len(ids) * 1e6
                                             for s_ in sorted({s_ for x in v for s_ in x})} for k, v in stages.items()},
           "selection": info}
    print(f"  tokens vs units: B=16 {res['qps_median']['B16']:,.0f} q/s, T=800 {res['qps_median']['T800']:,.0f} q/s, "
          f"ratio T/B median {res['ratio_median']:.3f} (IQR {res['ratio_p25']:.3f}-{res['ratio_p75']:.3f}) over "
          f"{rounds} rounds", flush=True)
    for k in engs:
        print(f"  {k}: {info[k]}; stages us/query {res['stage_us_per_query_median'][k]}", flush=True)
    return res


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------
def fmt_table(rows, cols, heads) -> str:
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(c(r) for c in cols) + " |")
    return "\n".join(lines)


def report(results) -> str:
    out = []
    f0 = lambda x: f"{x:,.0f}" if isinstance(x, (int, float)) and x == x else "-"
    f2 = lambda x: f"{x:,.2f}" if isinstance(x, (int, float)) and x == x else "-"
    for label, t in results.get("target", {}).items():
        out.append(f"\n### Target point, interleaved ({label}): Q={t['Q']}, U~{t['U_mean']:.0f}, B={t['B']}, H={t['H']}, "
                   f"{t['threads']} thread(s), {t['rounds']} rounds\n")
        names = list(t["qps_median"])
        out.append(fmt_table(names, [lambda k: k, lambda k: f0(t["qps_median"][k]),
                                     lambda k: (f"{t['speedup_median_of_rounds'][k]:.1f}x" if k != "reference" else "1.0x"),
                                     lambda k: ("{:.1f}-{:.1f}x".format(*t["speedup_min_max"][k]) if k != "reference"
                                                else "-"),
                                     lambda k: (f"{t['agreement_sets'][k]:.3f}" if k != "reference" else "-")],
                             ["implementation", "median queries/s", "speedup (median of rounds)", "range", "agree"]))
    for label, rows in results.get("sweeps", {}).items():
        tgt = [r for r in rows if r["sweep"] == "Q" and r["value"] == 1024]
        if tgt:
            r = tgt[0]
            out.append(f"\n### Target point ({label}): Q=1024, U~{r.get('U_mean', 0):.0f}, B=16, H=1\n")
            body = []
            for name, m in r["impls"].items():
                if "qps" not in m:
                    body.append((name, m))
                    continue
                body.append((name, m))
            out.append(fmt_table(body, [lambda x: x[0], lambda x: f0(x[1].get("qps")), lambda x: f2(x[1].get("p50_ms")),
                                        lambda x: f2(x[1].get("p99_ms")), lambda x: x[1].get("latency_unit", "-"),
                                        lambda x: (f"{x[1]['speedup_vs_reference']:.1f}x"
                                                   if "speedup_vs_reference" in x[1] else "1.0x" if x[0] == "reference"
                                                   else "-")],
                                 ["implementation", "queries/s", "p50 ms", "p99 ms", "latency per", "vs reference"]))
            out.append("cuda_torch / cuda_triton: skipped (no CUDA device on this machine)" if not results["machine"]
                       ["cuda"] else "")
        out.append(f"\n### Sweeps ({label}): queries/s (batched_cpu / batched_torch / reference / apricot greedy-only)\n")
        out.append(fmt_table(rows, [lambda r: f"{r['sweep']}={r['value']}", lambda r: str(r["Q"]),
                                    lambda r: f"{r.get('U_mean', float('nan')):.0f}", lambda r: str(r["B"]),
                                    lambda r: str(r["H"]),
                                    lambda r: f0(r["impls"].get("batched_cpu", {}).get("qps")),
                                    lambda r: f0(r["impls"].get("batched_torch", {}).get("qps")),
                                    lambda r: f0(r["impls"].get("reference", {}).get("qps")),
                                    lambda r: f0(r["impls"].get("apricot_greedy", {}).get("qps")),
                                    lambda r: (f"{r['impls']['batched_cpu']['speedup_vs_reference']:.1f}x"
                                               if "speedup_vs_reference" in r["impls"].get("batched_cpu", {}) else "-"),
                                    lambda r: f2(r["impls"].get("batched_cpu", {}).get("p50_ms")),
                                    lambda r: f2(r["impls"].get("batched_cpu", {}).get("p99_ms")),
                                    lambda r: f"{r.get('agreement_sets', float('nan')):.3f}",
                                    lambda r: f0(r["impls"].get("batched_cpu", {}).get("bytes_per_unit", {})
                                                 .get("engine_total"))],
                                 ["point", "Q", "U", "B", "H", "batched", "torch", "reference", "apricot", "speedup",
                                  "p50 ms/batch", "p99 ms/batch", "agree", "B/unit"]))
    sc = results.get("scaling", {}).get("rows")
    if sc:
        out.append("\n### Scaling (synthetic, 100 units/bank, Q=1024, default config)\n")
        out.append(fmt_table(sc, [lambda r: f0(r["banks"]), lambda r: f0(r["units"]), lambda r: f0(r["batched_qps"]),
                                  lambda r: f0(r["reference_qps"]), lambda r: f"{r['speedup']:.1f}x",
                                  lambda r: f2(r["batched_p50_ms"]), lambda r: f0(r["engine_tensor_bytes"] / 2**20),
                                  lambda r: f0(r["engine_bytes_per_unit"]), lambda r: f2(r["rss_bytes"]["after_run"] / 2**30),
                                  lambda r: f2(r["engine_build_s"]), lambda r: f"{r['agreement_sets']:.3f}"],
                               ["banks", "units", "batched q/s", "reference q/s", "speedup", "p50 ms/batch",
                                "engine MiB", "engine B/unit", "RSS GiB", "engine build s", "agree"]))
    ss = results.get("seed_search", {}).get("cases")
    if ss:
        out.append("\n### Seed search (exact per-bank top-24 heads, Q=1024, d=384)\n")
        out.append(fmt_table(ss, [lambda r: f0(r["banks"]), lambda r: f0(r["heads_per_bank"]),
                                  lambda r: f0(r["distinct_banks_in_batch"]), lambda r: f2(r.get("torch_ms")),
                                  lambda r: f2(r.get("faiss_ms")) if "faiss_ms" in r else str(r.get("faiss", "-")),
                                  lambda r: str(r.get("faster", "-")), lambda r: r["auto_picks"],
                                  lambda r: str(r.get("same_ids", "-"))],
                               ["banks", "heads/bank", "banks in batch", "torch ms", "faiss ms", "faster", "auto",
                                "same ids"]))
    return "\n".join(out)


def plots(results, out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return []
    files = []
    sweeps = results.get("sweeps", {})
    if sweeps:
        fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
        colors = {"batched_cpu": "C0", "batched_torch": "C1", "reference": "C3", "apricot_greedy": "C2"}
        for ax, var in zip(axes, ("Q", "U", "B", "H")):
            for label, rows in sweeps.items():
                ls = "-" if label == "locomo_dev" else "--"
                rs = [r for r in rows if r["sweep"] == var or (r["sweep"] == "Q" and r["value"] == 1024 and var != "Q")]
                xs_key = (lambda r: r["Q"]) if var == "Q" else (lambda r: r.get("U_mean", r["U_target"])) if var == "U" \
                    else (lambda r: r["B"]) if var == "B" else (lambda r: r["H"])
                rs = sorted(rs, key=xs_key)
                for impl, c in colors.items():
                    pts = [(xs_key(r), r["impls"][impl]["qps"]) for r in rs if "qps" in r["impls"].get(impl, {})]
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=c, marker="o", ms=3,
                                label=f"{impl} ({label})")
            ax.set_xlabel({"Q": "batch size Q", "U": "mean candidates |U_q|", "B": "budget B", "H": "hops H"}[var])
            ax.set_yscale("log")
            if var == "Q":
                ax.set_xscale("log")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("queries / s (1 thread)")
        axes[-1].legend(fontsize=6)
        fig.suptitle("TrawMem selection throughput (solid: LoCoMo dev banks, dashed: synthetic)")
        fig.tight_layout()
        p = out_dir / "select.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(str(p))
    sc = results.get("scaling", {}).get("rows")
    if sc:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        x = [r["units"] for r in sc]
        a1.plot(x, [r["batched_qps"] for r in sc], "o-", label="batched_cpu")
        a1.plot(x, [r["reference_qps"] for r in sc], "o-", color="C3", label="reference")
        a1.set_xscale("log")
        a1.set_yscale("log")
        a1.set_xlabel("units in the collection")
        a1.set_ylabel("queries / s (Q=1024, 1 thread)")
        a1.legend()
        a1.grid(alpha=0.3)
        a2.plot(x, [r["engine_tensor_bytes"] / 2**20 for r in sc], "o-", label="engine tensors")
        a2.plot(x, [r["rss_bytes"]["after_run"] / 2**20 for r in sc], "o-", label="process RSS")
        a2.set_xscale("log")
        a2.set_yscale("log")
        a2.set_xlabel("units in the collection")
        a2.set_ylabel("MiB")
        a2.legend()
        a2.grid(alpha=0.3)
        fig.suptitle("Scaling: 10 -> 10,000 synthetic banks of 100 units")
        fig.tight_layout()
        p = out_dir / "select_scaling.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(str(p))
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("TRAWMEM_DEV_DATA", str(DEFAULT_DATA)))
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
    ap.add_argument("--out-dir", default=os.environ.get("OUT") or str(HERE / "results"))
    args = ap.parse_args(argv)
    args.ref_queries = args.ref_queries or (60 if args.quick else 200)
    args.apricot_queries = args.apricot_queries or (40 if args.quick else 150)
    _pin_threads(args.threads)
    sys.path.insert(0, str(HERE))

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "torch": torch.__version__, "numpy": np.__version__, "threads": args.threads,
               "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        import numba

        machine["numba"] = numba.__version__
    except Exception:  # noqa: BLE001
        machine["numba"] = None
    t_start = time.perf_counter()
    if args.versus_worker:
        return versus_worker(args)
    single = [("versus", "versus", "select_versus.json")] if args.versus else \
        [("tokens", "tokens_vs_units", "select_tokens.json")] if args.tokens else []
    for _, key, fname in single:  # one paired measurement, its own file
        res = {"machine": machine, "command": " ".join(["python", "benchmarks/bench_select.py"] + (argv or sys.argv[1:])),
               key: versus(args) if key == "versus" else tokens_vs_units(args)}
        p = out_dir / fname
        p.write_text(json.dumps(res, indent=1))
        print(f"wrote {p}")
        return 0
    if args.gpu_target:
        res = {"machine": machine, "gpu_target": gpu_target(args)}
        p = out_dir / "select_gpu.json"
        p.write_text(json.dumps(res, indent=1))
        print(f"wrote {p}")
        return 0
    results = {"machine": machine, "command": " ".join(["python", "benchmarks/bench_select.py"] + (argv or sys.argv[1:])),
               "note": ("All implementations run on the same banks, questions and query vectors in one process, "
                        f"pinned to {args.threads} thread(s). Batched latencies are per batch (p99 of a few "
                        "repetitions is close to the max); reference and apricot latencies are per query. "
                        "apricot times only the greedy (facility location on the same candidate K), with its "
                        "per-fit numba compilation memoized. 'agree' = fraction of the reference's timed queries "
                        "whose selected set the batched engine reproduces exactly."),
               "sweeps": {}, "cuda": {"cuda_torch": "skipped: no CUDA device", "cuda_triton": "skipped: no CUDA device"}
               if not torch.cuda.is_available() else {"note": "run --gpu-target for the CUDA paths"}}
    if not args.no_target:
        print("target point, interleaved:", flush=True)
        results["target"] = {}
        if not args.no_real and Path(args.data).exists():
            results["target"]["locomo_dev"] = target_interleaved(RealData(args.data), args, "locomo_dev")
        if not args.no_synthetic:
            results["target"]["synthetic"] = target_interleaved(None, args, "synthetic")
    if args.target_only:
        args.no_real = args.no_synthetic = args.no_seed_search = args.no_scaling = True
    if not args.no_real:
        if Path(args.data).exists():
            print("real LoCoMo dev banks:", flush=True)
            sweep(RealData(args.data), args, results, "locomo_dev")
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
        (out_dir / "select.json").write_text(json.dumps(results, indent=1, default=float))
    if not args.no_scaling:
        print("scaling:", flush=True)
        sc = {"machine": machine, "command": results["command"]}
        sc.update(scaling(args))
        results["scaling"] = sc
        (out_dir / "select_scaling.json").write_text(json.dumps(sc, indent=1, default=float))
    results["wall_s"] = time.perf_counter() - t_start
    body = {k: v for k, v in results.items() if k != "scaling"}
    if args.update and (out_dir / "select.json").exists():
        old = json.loads((out_dir / "select.json").read_text())
        old.setdefault("sweeps", {}).update(body.pop("sweeps"))
        old.setdefault("updates", []).append({"command": body.pop("command"), "machine": body.pop("machine"),
                                              "sections": [k for k in body if k not in ("note", "cuda", "wall_s")]})
        old.update({k: v for k, v in body.items() if k not in ("note", "cuda", "wall_s")})
        body = old
    (out_dir / "select.json").write_text(json.dumps(body, indent=1, default=float))
    files = plots(results, out_dir)
    print(report(results))
    print(f"\nwrote {out_dir / 'select.json'}" + (f", {out_dir / 'select_scaling.json'}" if "scaling" in results else "")
          + (", " + ", ".join(files) if files else "") + f" in {results['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
