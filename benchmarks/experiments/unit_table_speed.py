"""Per-query CPU time of the float32 ``unit_vecs`` table (``Layout.vec_dtype``) against the float64
one it replaced, side by side in one process (issue 46 item 2): one engine over a float32 bank,
one over the same vectors held as float64 (which keeps a float64 table, as before the change),
interleaved rounds of a batch of one on one thread, on the exact path and the approximate one
(``ann_min_units`` below the bank's size). Also checks that both pick the same units.

    python -m benchmarks.experiments.unit_table_speed [--units 20000] [--rounds 5] [--queries 20]
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np

from .. import harness


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--name", default="unit_table_speed")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    from ..synthetic_banks import make_banks, make_queries

    bank = make_banks(1, units=a.units, d=384, seed=7, topics=20)[0]
    b64 = replace(bank, unit_vecs=bank.unit_vecs.astype(np.float64))
    ids, qs, Z = make_queries([bank], a.queries, seed=8)
    rec = {"units": a.units, "d": 384, "rounds": a.rounds, "queries": a.queries, "paths": {}}
    with harness.pin_threads(1):
        for path, opts in (("exact", {"ann_min_units": None}), ("approximate", {"ann_min_units": a.units // 2})):
            engines = {"float32": SelectionEngine([bank], SelectConfig(), device="cpu", threads=1, **opts),
                       "float64": SelectionEngine([b64], SelectConfig(), device="cpu", threads=1, **opts)}
            picks = {k: e.select_units(ids, qs, Z) for k, e in engines.items()}  # warm: index, numba
            ms = {k: [] for k in engines}
            for _ in range(a.rounds):
                for k, e in engines.items():
                    for i in range(a.queries):
                        c = time.thread_time()
                        e.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
                        ms[k].append(1e3 * (time.thread_time() - c))
            rec["paths"][path] = {
                "p50_ms": {k: round(float(np.median(v)), 3) for k, v in ms.items()},
                "ratio_p50_f32_over_f64": round(float(np.median(ms["float32"]) / np.median(ms["float64"])), 3),
                "identical_picks": [list(p) for p in picks["float32"]] == [list(p) for p in picks["float64"]],
                "unit_table_mib": {k: round(e.snapshot.nbytes(["unit_vecs"]) / 2 ** 20, 1) for k, e in engines.items()}}
            print(path, json.dumps(rec["paths"][path]), flush=True)
    harness.save(a.name, rec, out_dir=a.out_dir or harness.results_dir(default=harness.ARCHIVE))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
