"""Recall of an IVF index's codes after the float32 re-rank, per code and re-rank factor, against
exact search (issue 46 item 2: the ``pq`` choice's ``PQ_RERANK_FETCH``).

The pickled synthetic bank of ``engine_resident`` / ``large_bank_sweep`` (``--bank``, 10^5 units,
d = 384, 100 topics), 40 queries (``make_queries``, seed 8); each code's IVF index built as
``steps/ann.py`` builds it (1,024 lists, 65,536 training vectors, seed 0), searched with ``nprobe``
64 for ``fetch x 1024`` proposals, which are re-ranked exactly; per query ``|A & E| / |E|`` of the
best 128 and 1,024 against exact search's (mean, min), CPU ms per query (one thread).

    python -m benchmarks.experiments.pq_recall --codes int8,pq --fetch 2,4,8
"""
from __future__ import annotations

import argparse
import pickle
import time

import numpy as np

from .. import harness


def main(argv=None) -> int:
    import faiss

    from trawmem_gpu.select.steps.ann import VectorIndex

    from ..synthetic_banks import make_queries

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", default="/work/scratch/bank_100000_384_t100.pkl")
    ap.add_argument("--codes", default="int8,pq")
    ap.add_argument("--fetch", default="2,4,8")
    ap.add_argument("--name", default="pq_recall_1e5")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    faiss.omp_set_num_threads(1)
    with open(a.bank, "rb") as f:
        banks = pickle.load(f)
    x = np.ascontiguousarray(banks[0].unit_vecs, dtype=np.float32)
    _, _, Z = make_queries(banks, 40, seed=8)
    z = np.ascontiguousarray(Z, dtype=np.float32)
    K = 1024
    exact = np.argsort(-(z @ x.T), axis=1, kind="stable")[:, :K]
    rows = []
    for codes in a.codes.split(","):
        t = time.perf_counter()
        ix = VectorIndex(x, "ivf", vectors=codes)
        build = time.perf_counter() - t
        for fetch in map(int, a.fetch.split(",")):
            sp = faiss.SearchParametersIVF(nprobe=64)
            c = time.thread_time()
            _, I = ix.index.search(z, fetch * K, params=sp)
            ms = 1e3 * (time.thread_time() - c) / len(z)
            rec = {}
            for k in (128, K):
                got = []
                for r in range(len(z)):
                    cand = I[r][I[r] >= 0]
                    top = cand[np.lexsort((cand, -(x[cand] @ z[r])))[:k]]
                    got.append(len(np.intersect1d(top, exact[r, :k])) / k)
                rec[k] = (round(float(np.mean(got)), 4), round(float(np.min(got)), 4))
            row = {"codes": ix.codes, "code_bytes": ix.code_size, "index_mib": round(ix.nbytes() / 2 ** 20, 1),
                   "build_s": round(build, 1), "fetch": fetch, "search_ms": round(ms, 2),
                   "recall_128": rec[128], "recall_1024": rec[K]}
            rows.append(row)
            print(row, flush=True)
    harness.save(a.name, {"bank": a.bank, "units": len(x), "queries": len(z), "nprobe": 64, "rows": rows},
                 out_dir=a.out_dir or harness.results_dir())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
