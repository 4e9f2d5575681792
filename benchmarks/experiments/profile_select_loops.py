"""Inside the compiled loops at the target point (issue 46 item 3): where ``front_loop`` and
``stage_loop`` spend one thread's time.

cProfile sees each compiled loop as one call. This records the arguments of one batch call's
``front_loop`` / ``stage_loop`` (the CPU default engine on the LoCoMo dev banks at the target point,
Q = 1,024, U ~ 145, B = 16, H = 1; ``select_bench.paired.target_setup``), then times each loop on
them (process CPU time, median of ``--reps``) together with variants of the loop whose source has
one part cut out (compiled on the spot, uncached). The difference to the whole loop is what that
part costs in place; the variants select nothing meaningful and only ever serve this timing::

    python benchmarks/experiments/profile_select_loops.py [--reps 7] [--rounds 2] [--out FILE.json]
"""
from __future__ import annotations

if not __package__:  # python benchmarks/experiments/NAME.py: run as a module of benchmarks
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.experiments"

import argparse
import inspect
import json
import time

from .. import harness
from ..select_bench.paired import select_units, target_setup

_GREEDY = "            n_sel[q] = lazy_greedy_one(g, gs, sel[q])"
_ROLES = "            phi = step4.unit_roles(f[u], x.Mq, x.delta, q, p.T_R, lg, rho, u)"
_LEARNED = "            step3l.learned_logits(vals, m, bm, u0, ltab, lq, q, ls, given, live)\n"
_BM25 = "                bm[tab.bm_idx[nz + e]] += tab.bm_data[nz + e]\n"
VARIANTS = {
    "stage_loop": {
        "no greedy (step 7)": [(_GREEDY, "            n_sel[q] = 0")],
        "no rho / phi (step 4's roles)": [(_ROLES, "            phi = 0.1")],
        "no roles, no greedy": [(_ROLES, "            phi = 0.1"), (_GREEDY, "            n_sel[q] = 0")],
    },
    "front_loop": {
        "no learned affinity (logit = cosine)": [(_LEARNED, "            for j in range(m):\n"
                                                            "                ls.logit[j] = vals[j]\n")],
        "ranks only (no learned features)": [(_LEARNED, "            step3l.rank_features(vals, m, bmbits, bm, lq.rrf_k, "
                                                        "ls, given)\n            for j in range(m):\n"
                                                        "                ls.logit[j] = vals[j]\n")],
        "no BM25 (scores all 0)": [(_BM25, "                pass\n")],
    },
}


def _variant(fn, pairs):
    """``fn`` (a compiled loop of ``engine.compiled_loops``) recompiled from its source with
    ``pairs`` replaced, or None when a pattern is not in the source (the loop changed)."""
    from trawmem_gpu.select.engine import compiled_loops

    src = inspect.getsource(fn.py_func).replace("cache=True, ", "")
    for a, b in pairs:
        if a not in src:
            return None
        src = src.replace(a, b)
    ns = dict(vars(compiled_loops))
    exec(compile(src, f"<{fn.__name__} variant>", "exec"), ns)
    return ns[fn.__name__]


def _cpu_ms(fn, calls, reps):
    import numpy as np

    for a in calls:
        fn(*a)
    ts = []
    for _ in range(reps):
        t = time.process_time()
        for a in calls:
            fn(*a)
        ts.append(time.process_time() - t)
    return 1e3 * float(np.median(ts))



def record_loop_calls(args) -> tuple[dict, dict, list]:
    """The compiled loops at the target point (``target_setup(args)``, one thread: call it under
    ``harness.pin_threads(1)``) and the arguments of each call they got in one batch, after a
    warm-up batch: ``(loops {name: fn}, calls {name: [args]}, the batch's bank ids)``."""
    from trawmem_gpu.select.engine import SelectionEngine, compiled

    args.threads = 1
    d, cfg, params, (ids, qs, Z) = target_setup(args)
    eng = SelectionEngine(d.banks, cfg, device="cpu", threads=1)
    select_units(eng, ids, qs, Z, params)  # warm
    loops = {"front_loop": compiled.front_loop, "stage_loop": compiled.stage_loop}
    calls = {k: [] for k in loops}

    def recorder(k):
        def rec(*a):
            calls[k].append(a)
            return loops[k](*a)
        return rec

    for k in loops:
        setattr(compiled, k, recorder(k))
    try:
        select_units(eng, ids, qs, Z, params)
    finally:
        for k, fn in loops.items():
            setattr(compiled, k, fn)
    return loops, calls, ids

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2, help="rounds over all variants (order kept, medians per round)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    harness.require_data(args.data)
    with harness.pin_threads(1):
        loops, calls, ids = record_loop_calls(args)
        x = calls["stage_loop"][0][2]
        sizes = {"Q": len(ids), "units_per_bank_mean": float(calls["front_loop"][0][1].nu[x.bidx].mean()),
                 "candidates_mean": float(x.n_cand.mean()), "neighbourhood_threads_mean": float(x.n_h.mean()),
                 "roles": int(x.Mq.shape[1]), "features": int(x.Mq.shape[2])}
        fns = {k: {"whole loop": fn, **{n: _variant(fn, p) for n, p in VARIANTS[k].items()}} for k, fn in loops.items()}
        ms = {k: {n: [] for n in v} for k, v in fns.items()}
        for _ in range(args.rounds):
            for k, v in fns.items():
                for n, fn in v.items():
                    if fn is not None:
                        ms[k][n].append(_cpu_ms(fn, calls[k], args.reps))
    import numpy as np

    res = {"machine": harness.machine(threads=1), "sizes": sizes, "reps": args.reps, "rounds": args.rounds,
           "batch_cpu_ms": {k: {n: (float(np.median(t)) if t else None) for n, t in v.items()} for k, v in ms.items()},
           "per_round_ms": ms, "source": {k: VARIANTS[k] for k in VARIANTS}}
    with open("/proc/loadavg") as fh:
        res["loadavg"] = fh.read().strip()
    for k, v in res["batch_cpu_ms"].items():
        print(k)
        for n, t in v.items():
            print(f"  {n:40s} {'-' if t is None else f'{t:8.2f} ms per batch'}")
    print("sizes", sizes, "loadavg", res["loadavg"])
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
