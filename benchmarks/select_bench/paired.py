"""Paired, interleaved measurements: this tree against another checkout (``--versus``), and
the token budget against the unit budget (``--tokens``)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import harness

from .data import RealData


def target_setup(args):
    """The LoCoMo target point (Q = 1024, U ~ 145, B = 16, H = 1) and its config."""
    from trawmem_gpu.select.config import SelectConfig

    d = RealData(args.data)
    cfg = SelectConfig(budget=16, hops=1, n_seeds=8, neighborhood_cap=d.config_for_U(145))
    return d, cfg, d.queries(1024)


def clear_text_cache() -> None:
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

    d, cfg, (ids, qs, Z) = target_setup(args)
    eng = SelectionEngine(d.banks, cfg, device="cpu", threads=args.threads)
    picks = eng.select_units(ids, qs, Z)
    digest = hashlib.sha256(json.dumps([sorted(p) for p in picks]).encode()).hexdigest()
    print(f"ready {digest}", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        clear_text_cache()
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

    trees = {"this": str(harness.ROOT), "other": str(Path(args.versus).resolve())}
    procs = {}
    for k, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=tree)
        procs[k] = subprocess.Popen([sys.executable, str(harness.HERE / "bench_select.py"), "--versus-worker", "--data", args.data,
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
            clear_text_cache()
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
