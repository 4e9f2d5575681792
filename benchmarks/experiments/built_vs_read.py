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
import sys
import time

import numpy as np

from benchmarks.experiments.working_set_pieces import cached, emit, timed_picks


def main() -> None:
    import faiss

    from benchmarks import harness
    from benchmarks.synthetic_banks import make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.steps import ann

    N, d = int(sys.argv[1]), int(sys.argv[2])
    rounds = int(os.environ.get("ROUNDS", 6))
    with harness.pin_threads(1):
        banks, index_path = cached(N, d)
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

        res: dict = {a: [] for a in arms}
        for r in range(rounds):
            for a in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                eng.snapshot.infos[0].cache[key] = arms[a]
                res[a].append(round(float(np.median(timed_picks(eng, ids, qs, Z)[0])), 3))
                print(r, a, res[a][-1], flush=True)
    emit(dict(what=__doc__.split("\n\n")[0].replace("\n", " "), units=N, dim=d, queries=len(ids) - 2, rounds=rounds,
              filed_lists=bool(ann.FILED_LISTS), build_s=round(build_s, 1), load=os.getloadavg()[0],
              arms={a: dict(p50=v, p50_median=round(float(np.median(v)), 3),
                            p50_median_past_round0=round(float(np.median(v[1:])), 3) if len(v) > 1 else None)
                    for a, v in res.items()}))


if __name__ == "__main__":
    main()
