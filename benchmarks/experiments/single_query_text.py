"""The text step of single-query selects (``engine.last_timings["text"]``: the BM25 columns, demand
and learned cues of a batch of one), the median over 200 queries in each of ``ROUNDS`` rounds, on
a 20,000-unit synthetic bank (d = 64), the engine on one thread. Run it from each tree's root with
that tree first on the path to compare trees side by side (``text_features.SMALL_BATCH``: calls of
fewer questions take the plain forms of the text work):

    PYTHONPATH=. python -m benchmarks.experiments.single_query_text NAME [OUT.jsonl]
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np


def main() -> None:
    from benchmarks import harness
    from benchmarks.synthetic_banks import make_banks, make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    name = sys.argv[1] if len(sys.argv) > 1 else "tree"
    rounds = int(os.environ.get("ROUNDS", 2))
    with harness.pin_threads(1):
        banks = make_banks(1, units=20000, d=64, seed=3, topics=20)
        ids, qs, Z = make_queries(banks, 202, seed=4)
        eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index="ivf")
        for i in range(2):
            eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
        out = []
        for _ in range(rounds):
            t = []
            for i in range(2, 202):
                eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
                t.append(eng.last_timings["text"])
            out.append(round(1e3 * float(np.median(t)), 4))
    rec = {"tree": name, "text_ms_p50_rounds": out, "load": os.getloadavg()[0]}
    print(json.dumps(rec), flush=True)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
