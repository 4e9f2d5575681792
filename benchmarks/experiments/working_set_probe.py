"""The pieces of ``shortlist.working_sets`` timed apart on the queries of a 10^5-unit synthetic bank
(``large_bank_sweep.py``'s cached ``bank_100000_384_t100.pkl`` under ``CACHE``), the engine on one
thread: each piece replayed 20 times on each of 6 captured queries (so its rows are in cache:
cold-cache costs in the whole call are higher), CPU ms (``time.thread_time``), medians over the
queries. ``working_sets`` is the whole call; the pieces do not add up to it (the rest is its
Python, ``threads_units`` / ``np.union1d`` and cache misses of a first read).

    CACHE=/work/scratch python -m benchmarks.experiments.working_set_probe
"""
from __future__ import annotations

import json
import os
import pickle
import time

import numpy as np


class Timer:
    """CPU ms per call (``time.thread_time``) of each named piece, one list entry per query."""

    def __init__(self, reps: int = 20):
        self.reps, self.ms = reps, {}

    def __call__(self, name: str, fn):
        fn()  # in cache: the pieces' rows are read once before they are timed
        c = time.thread_time()
        for _ in range(self.reps):
            r = fn()
        self.ms.setdefault(name, []).append(1e3 * (time.thread_time() - c) / self.reps)
        return r


def _pieces(tm: Timer, sl, orig, call) -> None:
    """Time ``working_sets`` and its pieces on one captured call ``(snap, plan, Zc, bidx, tok, context, ...)``."""
    from trawmem_gpu.select.engine.tables import unit_block
    from trawmem_gpu.select.steps.ann import AnnParams

    snap, plan, Zc, bidx, tok, context, *rest = call
    tm("working_sets", lambda: orig(snap, plan, Zc, bidx, tok, context, *rest))
    index, rsample = sl.unit_index(snap, 0, plan.ann_kind, False, plan.ann_vectors)
    vecs, base = unit_block(snap, 0)
    params = AnnParams(plan.ann_nprobe, plan.ann_ef_search)
    _, I = tm("ivf_search", lambda: index.search(Zc, 1024, params))
    i = I[0][I[0] >= 0]
    c = np.empty(len(i))
    tm("head_dots", lambda: sl._gather_dots(vecs, base + i, np.zeros(len(i), np.int64), Zc, c, sl.PREFETCH_ROWS))
    tm("head_order", lambda: (np.lexsort((i, -c)), np.stack([c, i.astype(float)])))
    z32 = np.ascontiguousarray(Zc[0], dtype=np.float32)
    d = tm("sample_dots", lambda: sl.sample_dots(rsample, z32))
    tm("sample_sort", lambda: np.sort(d))
    sh = orig(snap, plan, Zc, bidx, tok, context, *rest)[0]
    W = sh.units
    cw = np.empty(len(W))
    tm("W_dots", lambda: sl._gather_dots(vecs, base + W, np.zeros(len(W), np.int64), Zc, cw, sl.PREFETCH_ROWS))
    tm("W_bm25", lambda: sl.scores_at(snap, 0, sh.cols, W))
    tm("lexical", lambda: sl.lexical(snap, 0, sh.cols, 128, rsample.units, None))
    tm("given_ranks", lambda: sl.given_ranks(sh, sh.cos, int(snap.off.nu[0])))


def main() -> None:
    from benchmarks import harness
    from benchmarks.synthetic_banks import make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine, shortlist as sl

    path = os.path.join(os.environ.get("CACHE", "/tmp"), "bank_100000_384_t100.pkl")
    if not os.path.exists(path):
        raise SystemExit(f"no cached bank at {path}: run large_bank_sweep.py 100000 384 with CACHE set first")
    with open(path, "rb") as f:
        banks = pickle.load(f)
    ids, qs, Z = make_queries(banks, 12, seed=8)
    cap, orig = [], sl.working_sets

    def spy(*a):
        cap.append(a)
        return orig(*a)

    sl.working_sets = spy
    tm = Timer()
    with harness.pin_threads(1):
        eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index="ivf")
        for i in range(2, 8):
            eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
        sl.working_sets = orig
        for call in cap:
            _pieces(tm, sl, orig, call)
    print(json.dumps({k: round(float(np.median(v)), 3) for k, v in tm.ms.items()}))


if __name__ == "__main__":
    main()
