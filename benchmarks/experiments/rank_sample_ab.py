"""The rank sample's codes at 10^6 units (``engine/rank_sample.py``): float32 vectors (the form
before) against int8 codes, interleaved on one engine, with the candidate pool's and the picks'
agreement with exact search, on ``large_bank_sweep.py``'s cached bank and IVF index.

    CACHE=/work/scratch TOPICS=1000 NQ=40 ROUNDS=4 OUT=FILE python -m benchmarks.experiments.rank_sample_ab 1000000 384

Each round times both arms (the order alternating per round): the engine's select p50 / p99 of
one query at a time (CPU ms, ``time.thread_time``, one thread) and, in the same round, the
sample's dots alone (``rank_sample.dots``, a 16 MB buffer touched between calls so the sample is
read as a query leaves it). Output: one JSON object per run (``OUT`` appends it to a JSON-lines file).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np


def main() -> None:
    from benchmarks import harness
    from benchmarks.experiments.working_set_pieces import agreement, emit, exact_reference, load, timed_picks
    from trawmem_gpu.select.engine import rank_sample as rs
    from trawmem_gpu.select.engine.tables import unit_block

    N, d = int(sys.argv[1]), int(sys.argv[2])
    rounds = int(os.environ.get("ROUNDS", 4))
    arms = ("float32", "int8")
    with harness.pin_threads(1):
        _, eng, (ids, qs, Z), ent = load(N, d)
        key = ("unit_index", eng.plan.ann_kind)
        vecs, base = unit_block(eng.snapshot, 0)
        units = ent[1].units
        ents = {a: (ent[0], rs.rank_sample(units, vecs[base + units], codes=a)) for a in arms}
        eng.select_units(ids[:2], qs[:2], Z[:2])
        exact = exact_reference(eng, ids, qs, Z)
        junk = np.ones(1 << 22, np.float32)
        rows: dict = {a: [] for a in arms}
        for rnd in range(rounds):
            for arm in (arms if rnd % 2 == 0 else arms[::-1]):
                eng.snapshot.infos[0].cache[key] = ents[arm]
                ms, picks = timed_picks(eng, ids, qs, Z)
                dt = []
                for i in range(2, len(ids)):
                    junk[::16] += 1.0
                    c = time.thread_time()
                    rs.dots(ents[arm][1], Z[i])
                    dt.append(time.thread_time() - c)
                row = dict(p50=round(float(np.median(ms)), 3), p99=round(float(np.percentile(ms, 99)), 2),
                           sample_dots_ms=round(1e3 * float(np.median(dt)), 4), **agreement(eng, ids, qs, Z, picks, exact))
                rows[arm].append(row)
                print(rnd, arm, json.dumps(row), flush=True)
    out = dict(units=N, dim=d, queries=len(ids) - 2, rounds=rounds, load=os.getloadavg()[0],
               sample=int(len(units)), sample_mib={a: round(ents[a][1].codes.nbytes / 2 ** 20, 2) for a in arms},
               arms={a: dict(rows=rows[a], p50_median=round(float(np.median([r["p50"] for r in rows[a]])), 3),
                             p99_median=round(float(np.median([r["p99"] for r in rows[a]])), 2),
                             sample_dots_ms=round(float(np.median([r["sample_dots_ms"] for r in rows[a]])), 4))
                     for a in arms})
    emit(out)


if __name__ == "__main__":
    main()
