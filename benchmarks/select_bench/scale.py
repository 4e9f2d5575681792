"""Seed search (faiss vs batched per-bank similarity) and the collection-scaling run."""
from __future__ import annotations

import gc
import time

from .. import harness
from .. import synthetic_banks
from ..harness import pct

from .impls import rss_bytes, run_batched, run_reference


def seed_search_bench(args) -> dict:
    import numpy as np
    import torch

    from trawmem_gpu.select.steps.seeds import (
        AUTO_MAX_BANKS,
        AUTO_MIN_HEADS,
        HeadIndex,
        faiss_available,
    )

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


def scaling(args) -> dict:
    import numpy as np

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
        banks = synthetic_banks.make_banks(n, units=100, thread_len=8.0, seed=7)
        t_banks = time.perf_counter() - t
        rss_banks = rss_bytes()
        t = time.perf_counter()
        eng = SelectionEngine(banks, cfg, device="cpu")
        t_eng = time.perf_counter() - t
        rss_eng = rss_bytes()
        ids, qs, Z = synthetic_banks.make_queries(banks, 1024, seed=3)
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
        harness.repin(args.threads)  # numba may have touched the shared OpenMP runtime
    return {"config": cfg.to_dict(), "units_per_bank": 100, "thread_len": 8.0, "rows": rows}
