"""An IVF index's codes at 10^6 units (``steps.ann.IVF_FLOAT32_CODES``): the flat float32 lists
against float16 (and bfloat16) scalar-quantizer lists over the same coarse quantizer, searched for
the shortlist's 1,024 proposals (``shortlist.RANK_DEPTH``) at ``nprobe`` 32 on one thread, queries
interleaved over the arms; the proposals' recall against the flat index's (``|A & F| / |F|``).

    CACHE=/work/scratch TOPICS=1000 python -m benchmarks.experiments.ivf_codes 1000000 384

Reads ``large_bank_sweep.py``'s cached bank and IVF index (``CACHE``); writes
``benchmarks/results/ivf_codes_1e6.json`` (``OUT`` to change it). ``QUANTIZER16=1`` adds float16
lists under a float16 coarse quantizer (``steps.ann.IVF_QUANTIZER16``; ``ivf_codes_q16_1e6.json``),
``INT8=1`` int8 codes of the residuals under it; ``ARMS`` (comma-separated) keeps only those arms.
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
    nq, rounds, nprobe, K = int(os.environ.get("NQ", 40)), int(os.environ.get("ROUNDS", 3)), 32, 1024
    faiss.omp_set_num_threads(1)
    banks = pickle.load(open(os.path.join(cache, f"bank_{N}_{d}_t{top}.pkl"), "rb"))
    X = np.ascontiguousarray(banks[0].unit_vecs, dtype=np.float32)
    _, _, Z = make_queries(banks, nq + 2, seed=8)
    flat = faiss.read_index(os.path.join(cache, f"ivf_{N}_{d}_t{top}.faiss"))
    quant = faiss.downcast_index(flat.quantizer)
    cent = quant.reconstruct_n(0, quant.ntotal)  # the same lists in every arm: the flat index's centroids
    keep = []  # an index does not own its quantizer from Python

    def lists(qt, coarse):
        """Scalar-quantizer lists ``qt`` of ``X`` under the centroids held by ``coarse``."""
        coarse.train(cent)
        coarse.add(cent)
        keep.append(coarse)
        sq = faiss.IndexIVFScalarQuantizer(coarse, d, flat.nlist, qt, faiss.METRIC_INNER_PRODUCT)
        sq.train(X[:1000])
        sq.add(X)
        return sq

    arms = {"float32": flat, "float16": lists(faiss.ScalarQuantizer.QT_fp16, faiss.IndexFlatIP(d))}
    if hasattr(faiss.ScalarQuantizer, "QT_bf16"):
        arms["bfloat16"] = lists(faiss.ScalarQuantizer.QT_bf16, faiss.IndexFlatIP(d))
    if os.environ.get("QUANTIZER16"):  # float16 lists under float16 centroids (``IVF_QUANTIZER16``)
        coarse = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        arms["float16_q16"] = lists(faiss.ScalarQuantizer.QT_fp16, coarse)
    if os.environ.get("INT8"):  # int8 codes of each vector's residual to its centroid, float16 centroids
        coarse = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        arms["int8_residual_q16"] = lists(faiss.ScalarQuantizer.QT_8bit, coarse)
    for k in [k for k in arms if k != "float32" and k not in os.environ.get("ARMS", ",".join(arms)).split(",")]:
        del arms[k]  # ``ARMS``: the arms to time (float32, the reference, always)
    sp = faiss.SearchParametersIVF(nprobe=nprobe)
    ms = {k: [] for k in arms}
    got = {k: [] for k in arms}
    for r in range(rounds):
        for i in range(2, nq + 2):
            for k, idx in arms.items():
                c = time.thread_time()
                _, ids = idx.search(Z[i:i + 1], K, params=sp)
                ms[k].append(1e3 * (time.thread_time() - c))
                if r == 0:
                    got[k].append(ids[0])
    out = dict(units=N, dim=d, topics=top, queries=nq, rounds=rounds, nprobe=nprobe, k=K, nlist=int(flat.nlist),
               load=os.getloadavg()[0], arms={})
    for k in arms:
        rec = [len(np.intersect1d(a, b)) / len(b) for a, b in zip(got[k], got["float32"])]
        out["arms"][k] = dict(p50_ms=round(float(np.median(ms[k])), 3), p99_ms=round(float(np.percentile(ms[k], 99)), 3),
                              recall_of_flat=round(float(np.mean(rec)), 5), min_recall=round(float(np.min(rec)), 4),
                              same_sets=float(np.mean([r == 1.0 for r in rec])))
    path = os.environ.get("OUT", "benchmarks/results/ivf_codes_1e6.json")
    json.dump(out, open(path, "w"), indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
