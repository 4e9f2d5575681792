"""A deeper read of impact-ordered BM25 postings re-scoring only the candidates it adds
(``select/engine/lexical_shortlist._rescored``) against re-scoring every candidate, side by side on
one synthetic bank, interleaved rounds, one thread, the outputs checked equal.

    python -m benchmarks.experiments.lexical_rescore [UNITS] [TOPICS]
"""
import sys
import time

import numpy as np


def main() -> None:
    from benchmarks import harness
    from benchmarks.synthetic_banks import make_banks, make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine, lexical_shortlist as lx
    from trawmem_gpu.select.steps import candidates as step3

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    topics = int(sys.argv[2]) if len(sys.argv) > 2 else max(6, n // 1000)
    banks = make_banks(1, units=n, d=384, seed=7, topics=topics)
    _ids, qs, _z = make_queries(banks, 40, seed=8)
    with harness.pin_threads(1):
        snap = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=None).snapshot
        bm = snap.bm25
        ptr, ids, _slow = step3.bm25_columns([0] * len(qs), qs, bm.vocabs, bm.plain, bm.store.col0)
        cols = [np.asarray(ids[ptr[k]:ptr[k + 1]], np.int64) for k in range(len(qs))]
        sample = np.arange(0, n, max(1, n // 4096))
        lx.EXACT_POSTINGS = 0  # every query through the impact order
        new = lx._rescored

        def every(units, had, scores, score):
            return score(units)

        lx.lexical(snap, 0, cols[0], 128, sample)  # compile
        ms: dict = {"every": [], "added": []}
        for _ in range(5):
            for name, fn in (("every", every), ("added", new)):
                lx._rescored = fn
                c = time.thread_time()
                outs = [lx.lexical(snap, 0, q, 128, sample) for q in cols]
                ms[name].append((time.thread_time() - c) / len(cols) * 1e3)
                if name == "every":
                    ref = outs
                else:
                    assert all(np.array_equal(a.top, b.top) and np.array_equal(a.scores, b.scores)
                               for a, b in zip(ref, outs))
        lx._rescored = new
        print({k: round(float(np.median(v)), 3) for k, v in ms.items()}, "ms per query; ratio every/added",
              round(float(np.median(np.array(ms["every"]) / np.array(ms["added"]))), 3))


if __name__ == "__main__":
    main()
