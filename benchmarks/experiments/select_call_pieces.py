"""Where one batch call's CPU time goes at the target point, outside and inside the compiled loops
(issue 46 item 3, seventh pass): ``time.thread_time`` around the whole ``select_units`` call, the
input checks (``make_batch``), the text work (``compiled._texts`` and its parts: BM25 columns,
demand features, step 4's demand, the learned cues), the cosines (``compiled._similarity``: the
GEMMs) and the chunks (``compiled._chunk``: the front loop and the stage loop with their
arguments), each repeated ``--reps`` times with the demand-feature cache cleared, medians, plus
the engine's own stage laps of the last whole call. One thread, the LoCoMo dev banks, Q = 1,024::

    python benchmarks/experiments/select_call_pieces.py [--reps 9] [--out FILE.json]

Run it with each tree on PYTHONPATH to compare trees (it imports ``trawmem_gpu`` from the path).
"""
from __future__ import annotations

if not __package__:  # python benchmarks/experiments/NAME.py: run as a module of benchmarks
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.append(str(_Path(__file__).resolve().parents[2]))  # after PYTHONPATH: its tree's trawmem_gpu
    __package__ = "benchmarks.experiments"

import argparse
import json
import time

from .. import harness
from ..select_bench.paired import clear_text_cache, select_units, target_setup


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    harness.require_data(args.data)
    import numpy as np

    with harness.pin_threads(1):
        import trawmem_gpu
        from trawmem_gpu.select.engine import SelectionEngine, compiled
        from trawmem_gpu.select.engine.batch import make_batch
        from trawmem_gpu.select.steps import candidates as step3, roles as step4
        from trawmem_gpu.select.text_features import demand_matrix

        args.threads = 1
        d, cfg, params, (ids, qs, Z) = target_setup(args)
        eng = SelectionEngine(d.banks, cfg, device="cpu", threads=1)
        select_units(eng, ids, qs, Z, params)  # warm (numba, tables)
        snap, plan = eng._store.snapshot, eng.plan
        batch = make_batch(snap, ids, qs, Z, None, plan.device, plan.dtype, params, cfg)
        rows = np.lexsort((batch.bidx,))
        qtext = [batch.questions[i] for i in rows.tolist()]
        bl = batch.bidx[rows].tolist()
        bm = snap.bm25
        words = (bm.words,) if hasattr(bm, "words") else ()  # a tree with the kept word maps
        Zn = batch.Z.numpy()
        T: dict = {}

        def tm(name, f):
            t = time.thread_time()
            r = f()
            T.setdefault(name, []).append(1e3 * (time.thread_time() - t))
            return r

        for _ in range(args.reps):
            clear_text_cache()
            tm("whole call", lambda: select_units(eng, ids, qs, Z, params))
            tm("make_batch", lambda: make_batch(snap, ids, qs, Z, None, plan.device, plan.dtype, params, cfg))
            clear_text_cache()
            texts = tm("_texts", lambda: compiled._texts(snap, plan, cfg, eng.head, batch))
            tm("_texts: bm25_columns", lambda: step3.bm25_columns(bl, qtext, bm.vocabs, bm.plain, bm.store.col0, *words))
            X = tm("_texts: demand_matrix", lambda: demand_matrix(qtext))
            tm("_texts: demand", lambda: step4.demand(qtext, cfg, eng.head, X))
            tm("_texts: learned_queries", lambda: compiled._learned_queries(snap, cfg, batch, rows, qtext, X[:, 1]))
            tm("_similarity", lambda: compiled._similarity(snap, plan, batch.bidx[rows], np.ascontiguousarray(Zn[rows])))
            tm("_chunk (similarity, front, stage, output)",
               lambda: [compiled._chunk(snap, plan, cfg, batch, Zn, *t) for t in texts])
        laps = {k: 1e3 * v for k, v in eng.last_timings.items()}
    with open("/proc/loadavg") as fh:
        load = fh.read().strip()
    res = {"machine": harness.machine(threads=1), "trawmem_gpu": trawmem_gpu.__file__, "Q": len(ids), "reps": args.reps,
           "thread_cpu_ms_median": {k: float(np.median(v)) for k, v in T.items()},
           "thread_cpu_ms": T, "last_call_stage_laps_ms": laps, "loadavg": load}
    for k, v in res["thread_cpu_ms_median"].items():
        print(f"{v:8.2f}  {k}")
    print("stage laps of the last call (ms):", {k: round(v, 2) for k, v in laps.items()}, "| loadavg", load)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
