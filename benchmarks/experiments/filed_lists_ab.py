"""IVF lists built by faiss's ``add`` against lists filed at once (``steps.ann.file_lists``,
``ann.FILED_LISTS``) at 10^6 units, in one fresh process: the engine builds its own index with
``add`` (as every build did before), a second ``VectorIndex`` over the same vectors files its lists;
their proposals are compared, then both are timed in the engine, rounds alternating.

    CACHE=/work/scratch TOPICS=1000 NQ=40 ROUNDS=4 OUT=FILE python -m benchmarks.experiments.filed_lists_ab 1000000 384

Uses ``large_bank_sweep.py``'s cached bank (``CACHE``); builds both indexes (about 3 minutes each
at 10^6 on this host). Output: one JSON object (``OUT`` appends it to a JSON-lines file).
"""
from __future__ import annotations

import os
import pickle
import sys
import time

import numpy as np


def main() -> None:
    from benchmarks import harness
    from benchmarks.experiments.working_set_pieces import emit, timed_picks
    from benchmarks.synthetic_banks import make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.engine.tables import unit_block
    from trawmem_gpu.select.steps import ann

    N, d = int(sys.argv[1]), int(sys.argv[2])
    cache, top = os.environ.get("CACHE", "/tmp"), int(os.environ.get("TOPICS", 1000))
    nq, rounds = int(os.environ.get("NQ", 40)), int(os.environ.get("ROUNDS", 4))
    path = os.path.join(cache, f"bank_{N}_{d}_t{top}.pkl")
    if not os.path.exists(path):
        raise SystemExit(f"no cached {path}: run large_bank_sweep.py {N} {d} with CACHE first")
    with harness.pin_threads(1):
        with open(path, "rb") as f:
            banks = pickle.load(f)
        ids, qs, Z = make_queries(banks, nq + 2, seed=8)
        eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index="ivf")
        keep, ann.FILED_LISTS = ann.FILED_LISTS, False
        try:
            t = time.time()
            eng.select_units(ids[:2], qs[:2], Z[:2])
            build = {"add": time.time() - t}
        finally:
            ann.FILED_LISTS = keep
        key = ("unit_index", eng.plan.ann_kind)
        ent = eng.snapshot.infos[0].cache[key]
        vecs, base = unit_block(eng.snapshot, 0)
        ann.FILED_LISTS, keep = True, ann.FILED_LISTS
        try:
            t = time.time()
            filed = ann.VectorIndex(vecs[base:base + N], "ivf")
            build["filed"] = time.time() - t
        finally:
            ann.FILED_LISTS = keep
        arms = {"add": ent, "filed": (filed,) + tuple(ent[1:])}
        params = ann.AnnParams(eng.plan.ann_nprobe, eng.plan.ann_ef_search)
        Da, Ia = ent[0].search(Z[2:], 1024, params)
        Db, Ib = filed.search(Z[2:], 1024, params)
        same = bool(np.array_equal(Ia, Ib) and np.array_equal(Da, Db))
        res: dict = {a: [] for a in arms}
        picks: dict = {}
        for rnd in range(rounds):
            for arm in (list(arms) if rnd % 2 == 0 else list(arms)[::-1]):
                eng.snapshot.infos[0].cache[key] = arms[arm]
                ms, pk = timed_picks(eng, ids, qs, Z)
                res[arm].append((round(float(np.median(ms)), 3), round(float(np.percentile(ms, 99)), 2)))
                picks[arm] = pk
                print(rnd, arm, res[arm][-1], flush=True)
    out = dict(units=N, dim=d, queries=nq, rounds=rounds, load=os.getloadavg()[0], same_proposals=same,
               same_picks=picks["add"] == picks["filed"], build_s={k: round(v, 1) for k, v in build.items()},
               arms={a: dict(p50=[x[0] for x in v], p99=[x[1] for x in v],
                             p50_median=round(float(np.median([x[0] for x in v])), 3),
                             p99_median=round(float(np.median([x[1] for x in v])), 2)) for a, v in res.items()})
    emit(out)


if __name__ == "__main__":
    main()
