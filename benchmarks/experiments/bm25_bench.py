"""``bm25_probe bench``: the BM25 pieces of the approximate front replayed on captured queries
(``bm25_probe dump``), arms interleaved query by query; see ``bm25_probe``'s docstring."""
from __future__ import annotations

import json
import os
import time

import numpy as np

from benchmarks.experiments.bm25_probe import load
from trawmem_gpu.select.engine import lexical_dense as ld
from trawmem_gpu.select.engine import lexical_shortlist as lx


def _cols(q):
    hi = np.cumsum(q["len"]).astype(np.int64)
    return hi - q["len"].astype(np.int64), hi


def pieces_main(q) -> dict:
    """main's pieces: accumulation, top, rank table, table ranks, the working set's scores."""
    lo, hi = _cols(q)
    out = {}
    c = time.thread_time()
    u, s = ld.dense_scores(q["idx"], q["data"], lo, hi, q["n"])
    out["accumulate"] = time.thread_time() - c
    c = time.thread_time()
    top = ld.top_units(u, s, q["M"])
    out["top"] = time.thread_time() - c
    c = time.thread_time()
    tab = ld.rank_table(u, s, ld.radix_scratch(len(u)))
    out["rank_table"] = time.thread_time() - c
    got = [top]
    rk = sc = 0.0
    for kind, wu, ws, _ in q["calls"]:
        c = time.thread_time()
        if kind == "ranks":
            r = np.zeros(len(wu))
            pos = np.flatnonzero(ws > 0)
            r[pos] = ld.table_ranks(*tab, np.ascontiguousarray(wu[pos], dtype=np.int64), np.ascontiguousarray(ws[pos], dtype=np.float32))
            rk += time.thread_time() - c
        else:
            r = lx._scores_at(q["idx"], q["data"], lo, hi, np.ascontiguousarray(wu, dtype=np.int64))
            sc += time.thread_time() - c
        got.append(r)
    out["table_ranks"], out["scores_at"] = rk, sc
    out["T"], out["R"] = len(u), len(tab[2]) - 1
    out["distinct"] = len(np.unique(s))
    return out, got


def pieces_merge(q, blocked=0) -> dict:
    """The merged columns (``lexical_merge``): units ascending, the table by counting, its top,
    table ranks, the working set's scores by a binary search in the units."""
    from trawmem_gpu.select.engine import lexical_merge as lm
    lo, hi = _cols(q)
    out = {}
    c = time.thread_time()
    if blocked:
        u, s = lm.blocked_scores(q["idx"], q["data"], lo, hi, q["n"], blocked, ACC, BITS)
    else:
        u, s = lm.merged_scores(q["idx"], q["data"], lo, hi)
    out["accumulate"] = time.thread_time() - c
    c = time.thread_time()
    tab = lm.score_table(u, s, ld.radix_scratch(len(u)))
    out["rank_table"] = time.thread_time() - c
    c = time.thread_time()
    top = lm.table_top(tab[0], tab[1], q["M"])
    out["top"] = time.thread_time() - c
    got = [top]
    rk = sc = 0.0
    for kind, wu, ws, _ in q["calls"]:
        c = time.thread_time()
        if kind == "ranks":
            r = np.zeros(len(wu))
            pos = np.flatnonzero(ws > 0)
            r[pos] = ld.table_ranks(*tab, np.ascontiguousarray(wu[pos], dtype=np.int64), np.ascontiguousarray(ws[pos], dtype=np.float32))
            rk += time.thread_time() - c
        else:
            r = lm.scores_in(u, s, np.ascontiguousarray(wu, dtype=np.int64))
            sc += time.thread_time() - c
        got.append(r)
    out["table_ranks"], out["scores_at"] = rk, sc
    out["T"], out["R"] = len(u), len(tab[2]) - 1
    out["distinct"] = 0
    return out, got


ACC, BITS = np.zeros(1 << 20, np.float32), np.zeros(1 << 14, np.int64)
ARMS = {"main": pieces_main, "merge": pieces_merge, **{f"block{b}": (lambda q, b=b: pieces_merge(q, 1 << b)) for b in (15, 16, 17, 18)}}


def check(q, got) -> None:
    np.testing.assert_array_equal(got[0], q["top"])
    for (kind, wu, ws, want), g in zip(q["calls"], got[1:]):
        np.testing.assert_array_equal(g, want)


def main(path: str, out: str | None) -> None:
    qs = load(path)
    reps = int(os.environ.get("REPS", 5))
    arms = [a for a in os.environ.get("ARMS", ",".join(ARMS)).split(",")]
    fine = bool(os.environ.get("FINE"))
    if fine:  # each posting's weight moved by under 0.1%: many distinct scores (as real text's), past FEW_SCORES
        rng = np.random.default_rng(0)
        for q in qs:
            q["data"] = (q["data"] * (1 + 1e-3 * rng.random(len(q["data"])))).astype(np.float32)
    for q in qs:  # compile + check (the arms against each other when FINE moved the weights)
        got = [ARMS[a](q)[1] for a in arms]
        for g in got:
            if fine:
                for x, y in zip(g, got[0]):
                    np.testing.assert_array_equal(x, y)
            else:
                check(q, g)
    ms: dict = {a: {} for a in arms}
    info = []
    for q in qs:
        per = {a: {} for a in arms}
        for _ in range(reps):
            for a in arms:
                r, _ = ARMS[a](q)
                for k, v in r.items():
                    per[a].setdefault(k, []).append(v)
        for a in arms:
            for k, v in per[a].items():
                if k in ("T", "R", "distinct", "P"):
                    continue
                ms[a].setdefault(k, []).append(1e3 * float(np.median(v)))
        info.append(dict(P=int(q["len"].sum()), C=len(q["len"]), T=per[arms[0]]["T"][0], R=per[arms[0]]["R"][0],
                         distinct=per[arms[0]]["distinct"][0]))
    res = {a: {k: round(float(np.median(v)), 4) for k, v in d.items()} for a, d in ms.items()}
    for a in res:
        res[a]["sum"] = round(float(np.median(np.sum([v for v in ms[a].values()], axis=0))), 4)
    summary = dict(queries=len(qs), reps=reps, fine=fine, load=os.getloadavg()[0], ms_median_over_queries=res,
                   P=[int(np.percentile([i["P"] for i in info], p)) for p in (0, 50, 100)],
                   T=[int(np.percentile([i["T"] for i in info], p)) for p in (0, 50, 100)],
                   R=[int(np.percentile([i["R"] for i in info], p)) for p in (0, 50, 100)],
                   distinct=[int(np.percentile([i["distinct"] for i in info], p)) for p in (0, 50, 100)])
    print(json.dumps(summary, indent=1))
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(summary) + "\n")
