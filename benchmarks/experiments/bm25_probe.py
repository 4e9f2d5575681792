"""The BM25 side of the approximate front (``lexical_shortlist`` / ``lexical_dense``) timed apart on
captured queries of a large synthetic bank, one thread, CPU ms (``time.thread_time``).

    CACHE=/work/scratch N=1000000 TOPICS=1000 python -m benchmarks.experiments.bm25_probe dump FILE.npz
    python -m benchmarks.experiments.bm25_probe bench FILE.npz [OUT.json]

``dump`` builds the engine over ``large_bank_sweep.py``'s cached bank (``bank_N_384_tTOPICS.pkl``
and its IVF index under ``CACHE``; at 10^6 units hold ``/work/scratch/big.lock``), runs ``NQ``
queries (default 40) and keeps, per query whose BM25 takes the compiled pass: its columns'
postings (units and weights, column after column), the bank's size, ``M``, and every
``ranks_of`` / ``scores_at`` call's units and scores (the working set's rounds), with their
answers. ``bench`` replays them: each arm on each query in turn (interleaved), ``REPS`` times
(default 5), medians per query, then the median over queries; the arms' answers are checked
against the captured ones first.
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import time

import numpy as np


def dump(path: str) -> None:
    from benchmarks import harness
    from benchmarks.synthetic_banks import make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine, shortlist as sl, lexical_shortlist as lx
    from benchmarks.experiments.working_set_pieces import plant_index

    N, top, cache = int(os.environ.get("N", 1000000)), int(os.environ.get("TOPICS", 1000)), os.environ.get("CACHE", "/tmp")
    nq = int(os.environ.get("NQ", 40))
    bpath, ipath = os.path.join(cache, f"bank_{N}_384_t{top}.pkl"), os.path.join(cache, f"ivf_{N}_384_t{top}.faiss")
    for p in (bpath, ipath):
        if not os.path.exists(p):
            raise SystemExit(f"no cached {p}: run large_bank_sweep.py {N} 384 with CACHE set first")
    if "EXACT_POSTINGS" in os.environ:  # e.g. 0: every query through the compiled pass (a small bank's test)
        lx.EXACT_POSTINGS = int(os.environ["EXACT_POSTINGS"])
    t = time.time()
    with open(bpath, "rb") as f:
        banks = pickle.load(f)
    ids, qs, Z = make_queries(banks, nq + 2, seed=8)
    cap: dict = {}
    cur = {"q": -1}
    o_lex, o_ranks, o_scores = sl.lexical, sl.ranks_of, sl.scores_at

    def lex_spy(snap, bank, cols, M, rows, keep=None):
        out = o_lex(snap, bank, cols, M, rows, keep)
        if out.counted:
            lo, hi = lx.columns(snap, bank, cols)
            st = snap.bm25.store
            parts = [(st.idx[a:b], st.data[a:b]) for a, b in zip(lo.tolist(), hi.tolist())]
            c = cap.setdefault(cur["q"], {"calls": []})
            c.update(idx=np.concatenate([p[0] for p in parts]), data=np.concatenate([p[1] for p in parts]),
                     len=np.array([len(p[0]) for p in parts], np.int64), n=out.n_bank, M=M, top=out.top)
        return out

    def ranks_spy(lex, units, scores):
        out = o_ranks(lex, units, scores)
        if lex.counted:
            cap[cur["q"]]["calls"].append(("ranks", units.copy(), scores.copy(), out.copy()))
        return out

    def scores_spy(snap, bank, cols, units):
        out = o_scores(snap, bank, cols, units)
        if cur["q"] in cap:
            cap[cur["q"]]["calls"].append(("scores", np.asarray(units).copy(), out.copy(), out.copy()))
        return out

    with harness.pin_threads(1):
        eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index="ivf")
        plant_index(eng, ipath, "ivf", sl.RANK_SAMPLE)  # the cached index and the engine's rank sample
        print("loaded", round(time.time() - t, 1), flush=True)
        sl.lexical, sl.ranks_of, sl.scores_at = lex_spy, ranks_spy, scores_spy
        for i in range(2, nq + 2):
            cur["q"] = i
            eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
    arrays = {}
    for q, c in cap.items():
        for k in ("idx", "data", "len", "top"):
            arrays[f"q{q}_{k}"] = c[k]
        arrays[f"q{q}_nM"] = np.array([c["n"], c["M"]], np.int64)
        for j, (kind, u, s, r) in enumerate(c["calls"]):
            arrays[f"q{q}_{kind}{j}_u"], arrays[f"q{q}_{kind}{j}_s"], arrays[f"q{q}_{kind}{j}_r"] = u, s, r
    np.savez(path, **arrays)
    print("dumped", len(cap), "queries of", nq, "in", round(time.time() - t, 1), "s", flush=True)


def load(path: str) -> list[dict]:
    """The captured queries: ``idx, data, len, n, M, top, calls [(kind, units, scores, answer)]``."""
    z = np.load(path)
    qs = sorted({int(k[1:].split("_")[0]) for k in z.files})
    out = []
    for q in qs:
        n, M = z[f"q{q}_nM"].tolist()
        calls = []
        j = 0
        while True:
            kind = "ranks" if f"q{q}_ranks{j}_u" in z.files else "scores" if f"q{q}_scores{j}_u" in z.files else None
            if kind is None:
                break
            calls.append((kind, z[f"q{q}_{kind}{j}_u"], z[f"q{q}_{kind}{j}_s"], z[f"q{q}_{kind}{j}_r"]))
            j += 1
        out.append(dict(P=int(z[f"q{q}_len"].sum()), idx=z[f"q{q}_idx"], data=z[f"q{q}_data"], len=z[f"q{q}_len"], n=n, M=M, top=z[f"q{q}_top"], calls=calls))
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["dump"]:
        dump(sys.argv[2])
    elif sys.argv[1:2] == ["bench"]:
        from benchmarks.experiments import bm25_bench
        bm25_bench.main(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        raise SystemExit(__doc__)
