"""Paired, interleaved measurements: this tree against another checkout (``--versus``), and
the token budget against the unit budget (``--tokens``)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .. import harness

from .data import RealData


TARGET = dict(budget=16, hops=1, n_seeds=8)
"""The target point's query fields (Q = 1024, U ~ 145 through the cap, B = 16, H = 1)."""


def per_call_params() -> bool:
    """Whether the ``trawmem_gpu`` on the path takes per-call query parameters
    (``select.params.QueryParams``); a tree before that change holds them in ``SelectConfig``.
    ``--versus`` runs this module over either."""
    import importlib.util

    return importlib.util.find_spec("trawmem_gpu.select.params") is not None


def target_setup(args):
    """The LoCoMo target point: ``(data, cfg, params, queries)``; ``params`` is the point's
    ``QueryParams``, or None on a tree without them (its ``cfg`` then carries the same fields), so
    both trees select the same thing."""
    from trawmem_gpu.select.config import SelectConfig

    d = RealData(args.data)
    query = dict(TARGET, neighborhood_cap=d.config_for_U(145))
    if per_call_params():
        from trawmem_gpu.select.params import QueryParams

        cfg, params = SelectConfig(), QueryParams(**query)
    else:
        cfg, params = SelectConfig(**query), None
    return d, cfg, params, d.queries(1024)


def select_units(eng, ids, qs, Z, params):
    """``eng.select_units`` with ``params`` on a tree that takes them (None: the old signature)."""
    return eng.select_units(ids, qs, Z) if params is None else eng.select_units(ids, qs, Z, params=params)


def clear_text_cache() -> None:
    try:  # this tree
        from trawmem_gpu.select.steps.roles import demand_features_cached as cache
    except ImportError:  # an older tree
        from trawmem_gpu.select.engine import _demand_features_cached as cache
    cache.cache_clear()


def versus_worker(args) -> int:
    """Worker of ``--versus`` (runs with whichever ``trawmem_gpu`` PYTHONPATH gives it, with or
    without per-call query parameters): builds the CPU default engine, selects at the target
    point, warms it, prints a digest of its picks, then answers
    each ``run`` line on stdin with the wall and CPU seconds of one timed batch call."""
    import hashlib

    from trawmem_gpu.select.engine import SelectionEngine

    d, cfg, params, (ids, qs, Z) = target_setup(args)
    eng = SelectionEngine(d.banks, cfg, device="cpu", threads=args.threads)
    picks = select_units(eng, ids, qs, Z, params)
    digest = hashlib.sha256(json.dumps([sorted(p) for p in picks]).encode()).hexdigest()
    print(f"ready {digest}", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        clear_text_cache()
        t, c = time.perf_counter(), time.process_time()
        select_units(eng, ids, qs, Z, params)
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
        # each tree's own worker script, with the trawmem_gpu that PYTHONPATH names (each tree's
        # own): a worker's imports follow its tree's layout, so trees across a move still pair;
        # the digest of the picks (checked below) says whether both select the same
        env = dict(os.environ, PYTHONPATH=tree)
        script = Path(tree) / "benchmarks" / "bench_select.py"
        procs[k] = subprocess.Popen([sys.executable, str(script), "--versus-worker", "--data", args.data,
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
    """The CPU default engine (one engine) at B = 16 and at T = 800 (each with its default pool:
    T = 800 sizes it like B = 16) over the same 1,024 dev queries, alternating rounds (order
    flipped every round); speed ratio = (T = 800 queries/s) / (B = 16 queries/s) within each
    round; the engine's stage seconds per query (median over rounds) say where the difference
    goes."""
    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.select.workspace import assemble

    d = RealData(args.data)
    ids, qs, Z = d.queries(1024)
    cfg = SelectConfig()
    modes = {"B16": QueryParams(budget=16), "T800": QueryParams(token_budget=800, budget=None)}
    eng = SelectionEngine(d.banks, cfg, device="cpu", threads=args.threads)
    bank = {b.bank_id: b for b in d.banks}
    info = {}
    for k, p in modes.items():  # warm-up (numba load, tables) and what each mode selects
        picks = eng.select_units(ids, qs, Z, params=p)
        toks = [assemble(bank[b], q, u, cfg.headings).n_tokens for b, q, u in zip(ids, qs, picks)]
        info[k] = {"units_mean": float(np.mean([len(p) for p in picks])), "tokens_mean": float(np.mean(toks)),
                   "tokens_max": int(max(toks))}
    rounds = args.rounds or 15
    secs = {k: [] for k in modes}
    stages = {k: [] for k in modes}
    for r in range(rounds):
        for k in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            clear_text_cache()
            t = time.perf_counter()
            eng.select_units(ids, qs, Z, params=modes[k])
            secs[k].append(time.perf_counter() - t)
            stages[k].append(dict(eng.last_timings))
    ratios = [b / t for b, t in zip(secs["B16"], secs["T800"])]
    res = {"Q": len(ids), "rounds": rounds, "threads": args.threads,
           "configs": {k: {"budget": p.budget, "token_budget": p.token_budget, "knapsack": cfg.knapsack}
                       for k, p in modes.items()},
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
    for k in modes:
        print(f"  {k}: {info[k]}; stages us/query {res['stage_us_per_query_median'][k]}", flush=True)
    return res
