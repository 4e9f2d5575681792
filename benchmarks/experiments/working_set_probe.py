"""The pieces of ``shortlist.working_sets`` timed apart on the queries of a 10^5-unit synthetic bank
(``large_bank_sweep.py``'s cached ``bank_100000_384_t100.pkl`` under ``CACHE``), the engine on one
thread: each piece replayed 20 times on each of 6 captured queries (so its rows are in cache:
cold-cache costs in the whole call are higher), CPU ms (``time.thread_time``), medians over the
queries. ``working_sets`` is the whole call; the pieces do not add up to it (the rest is its
Python, ``threads_units`` / ``np.union1d`` and cache misses of a first read).

    CACHE=/work/scratch python benchmarks/experiments/working_set_probe.py
"""
import os, sys
sys.path.insert(0, os.getcwd())
import json, pickle, time

import numpy as np
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, shortlist as sl
from trawmem_gpu.select.engine.tables import unit_block
from trawmem_gpu.select.steps.ann import AnnParams
from benchmarks.synthetic_banks import make_queries
from benchmarks import harness
banks = pickle.load(open(os.path.join(os.environ.get("CACHE", "/tmp"), "bank_100000_384_t100.pkl"), "rb"))
ids, qs, Z = make_queries(banks, 12, seed=8)
cap = []
orig = sl.working_sets
def spy(*a):
    cap.append(a); return orig(*a)
sl.working_sets = spy
T = {}
def tm(name, fn, reps=20):
    fn(); c = time.thread_time()
    for _ in range(reps): r = fn()
    T.setdefault(name, []).append(1e3 * (time.thread_time() - c) / reps); return r
with harness.pin_threads(1):
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index="ivf")
    for i in range(2, 8):
        eng.select_units(ids[i:i+1], qs[i:i+1], Z[i:i+1])
    for snap, plan, Zc, bidx, tok, context, *rest in cap:
        tm("working_sets", lambda: orig(snap, plan, Zc, bidx, tok, context, *rest))
        index, rows_b, svec = sl.unit_index(snap, 0, plan.ann_kind, False, plan.ann_vectors)
        vecs, base = unit_block(snap, 0)
        params = AnnParams(plan.ann_nprobe, plan.ann_ef_search)
        _, I = tm("ivf_search", lambda: index.search(Zc, 1024, params))
        i = I[0][I[0] >= 0]
        c = np.empty(len(i))
        tm("head_dots", lambda: sl._gather_dots(vecs, base + i, np.zeros(len(i), np.int64), Zc, c))
        tm("head_order", lambda: (np.lexsort((i, -c)), np.stack([c, i.astype(float)])))
        z32 = np.ascontiguousarray(Zc[0], dtype=np.float32); d = np.empty(len(svec), np.float32)
        tm("sample_dots", lambda: sl._sample_dots(svec, z32, d))
        tm("sample_sort", lambda: np.sort(d))
        sh = orig(snap, plan, Zc, bidx, tok, context, *rest)[0]
        W = sh.units
        cw = np.empty(len(W))
        tm("W_dots", lambda: sl._gather_dots(vecs, base + W, np.zeros(len(W), np.int64), Zc, cw))
        tm("W_bm25", lambda: sl.scores_at(snap, 0, sh.cols, W))
        tm("lexical", lambda: sl.lexical(snap, 0, sh.cols, 128, rows_b, None))
        tm("given_ranks", lambda: sl.given_ranks(sh, sh.cos, int(snap.off.nu[0])))
    print(json.dumps({k: round(float(np.median(v)), 3) for k, v in T.items()}))
