"""The target point (every implementation interleaved) and the one-variable sweeps around it."""
from __future__ import annotations

import os
import time

from .data import SynData
from .impls import run_apricot, run_batched, run_reference


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
