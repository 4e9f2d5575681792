"""Does an IVF index built in this process answer as fast as the same index read back? One fresh
process: the engine builds its own index over ``large_bank_sweep.py``'s cached bank (as
``scale-query`` does), then rounds alternate three arms on that engine (order reversed every other
round): ``built`` (the engine's own), ``copied`` (the same index through
``faiss.serialize_index`` / ``deserialize_index``: the same codes, written afresh) and ``file``
(``large_bank_sweep.py``'s cached index file read back). Each round: the p50 CPU ms of 40
single-query selects, one thread.

    CACHE=/work/scratch TOPICS=1000 ROUNDS=6 OUT=FILE python -m benchmarks.experiments.built_vs_read 1000000 384

Before ``steps.ann.FILED_LISTS`` (faiss's ``add``), ``built`` read about 0.12 ms slower than the
other two (``docs/scaling.md``, eleventh pass); with the lists filed it should not.
"""
from __future__ import annotations

import copy
import os
import pickle
import sys
import time

import numpy as np

from benchmarks.experiments.working_set_pieces import emit, index_file


def main() -> None:
    import faiss

    from benchmarks import harness
    from benchmarks.synthetic_banks import make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.steps import ann

    N, d = int(sys.argv[1]), int(sys.argv[2])
    cache, top = os.environ.get("CACHE", "/tmp"), int(os.environ.get("TOPICS", 1000))
    rounds = int(os.environ.get("ROUNDS", 6))
    bank_path, index_path = os.path.join(cache, f"bank_{N}_{d}_t{top}.pkl"), index_file(cache, N, d, top)
    for p in (bank_path, index_path):
        if not os.path.exists(p):
            raise SystemExit(f"no cached {p}: run large_bank_sweep.py {N} {d} with CACHE and KIND=ivf first")
    with harness.pin_threads(1):
        with open(bank_path, "rb") as f:
            banks = pickle.load(f)
        ids, qs, Z = make_queries(banks, 42, seed=8)
        eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index="ivf")
        t = time.time()
        eng.select_units(ids[:2], qs[:2], Z[:2])  # builds the index
        build_s = time.time() - t
        key = ("unit_index", eng.plan.ann_kind)
        ent = eng.snapshot.infos[0].cache[key]
        cp, rd = copy.copy(ent[0]), copy.copy(ent[0])
        cp.index = faiss.deserialize_index(faiss.serialize_index(ent[0].index))
        rd.index = faiss.read_index(index_path)
        arms = {"built": ent, "copied": (cp,) + ent[1:], "file": (rd,) + ent[1:]}

        def p50() -> float:
            ts = []
            for i in range(2, len(ids)):
                c = time.thread_time()
                eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
                ts.append(time.thread_time() - c)
            return round(1e3 * float(np.median(ts)), 3)

        res: dict = {a: [] for a in arms}
        for r in range(rounds):
            for a in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                eng.snapshot.infos[0].cache[key] = arms[a]
                res[a].append(p50())
                print(r, a, res[a][-1], flush=True)
    emit(dict(what=__doc__.split("\n\n")[0].replace("\n", " "), units=N, dim=d, queries=len(ids) - 2, rounds=rounds,
              filed_lists=bool(ann.FILED_LISTS), build_s=round(build_s, 1), load=os.getloadavg()[0],
              arms={a: dict(p50=v, p50_median=round(float(np.median(v)), 3),
                            p50_median_past_round0=round(float(np.median(v[1:])), 3) if len(v) > 1 else None)
                    for a, v in res.items()}))


if __name__ == "__main__":
    main()
