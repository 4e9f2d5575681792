"""An HNSW coarse quantizer for the IVF index against its flat one (``IndexFlatIP`` over the
lists' centroids, ``steps/ann.py``), on ``large_bank_sweep.py``'s cached bank and index
(``CACHE``, ``TOPICS``): per ``M`` (links) and ``efSearch``, the share of 40 queries whose
``nprobe`` lists are the flat quantizer's (the same lists, in the same order) and both
quantizers' CPU ms per query (medians; a buffer larger than the cache is written between calls,
so each reads its centroids as a query after other work would).

    CACHE=/work/scratch TOPICS=100 python -m benchmarks.experiments.ivf_quantizer_probe 100000 384
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import time

import numpy as np


def main() -> None:
    import faiss

    from benchmarks.synthetic_banks import make_queries

    N, d = int(sys.argv[1]), int(sys.argv[2])
    cache, top = os.environ.get("CACHE", "/tmp"), int(os.environ.get("TOPICS", 1000))
    nprobe = int(os.environ.get("NPROBE", 32))
    paths = os.path.join(cache, f"ivf_{N}_{d}_t{top}.faiss"), os.path.join(cache, f"bank_{N}_{d}_t{top}.pkl")
    for p in paths:
        if not os.path.exists(p):
            raise SystemExit(f"no cached {p}: run large_bank_sweep.py {N} {d} with CACHE and KIND=ivf first")
    faiss.omp_set_num_threads(1)
    idx = faiss.read_index(paths[0])
    with open(paths[1], "rb") as f:
        banks = pickle.load(f)
    Z = np.ascontiguousarray(make_queries(banks, 42, seed=8)[2][2:], dtype=np.float32)
    del banks
    C = idx.quantizer.reconstruct_n(0, idx.nlist)
    out = {"units": N, "nlist": int(idx.nlist), "nprobe": nprobe, "queries": len(Z), "arms": {}}
    evict = np.zeros(6_000_000)
    for M in (16, 32):
        h = faiss.IndexHNSWFlat(d, M, faiss.METRIC_INNER_PRODUCT)
        h.hnsw.efConstruction = 200
        h.add(C)
        for ef in (32, 64, 128, 256):
            same, t_h, t_f = 0, [], []
            for z in Z:
                evict += 1
                c = time.thread_time()
                _, If = idx.quantizer.search(z[None], nprobe)
                t_f.append(time.thread_time() - c)
                evict += 1
                c = time.thread_time()
                _, Ih = h.search(z[None], nprobe, params=faiss.SearchParametersHNSW(efSearch=ef))
                t_h.append(time.thread_time() - c)
                same += bool(np.array_equal(If, Ih))
            out["arms"][f"M{M}_ef{ef}"] = dict(same_lists=same / len(Z), flat_ms=round(1e3 * float(np.median(t_f)), 3),
                                               hnsw_ms=round(1e3 * float(np.median(t_h)), 3))
            print(M, ef, out["arms"][f"M{M}_ef{ef}"], flush=True)
    out["load"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
