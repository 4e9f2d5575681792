"""The scale-query outlier at 10^5 units, d = 384 (6 topics, the approximate path): which query is
slow and why, for a tree (this one or another checkout) and a numba cache state, side by side.

    python benchmarks/experiments/outlier_probe.py OUT.json TREE_A TREE_B [ROUNDS_INTERLEAVED] [UNITS] [QUERIES]

Each run is a child process (``--child TREE CACHE_DIR``) that does what ``scale_bench.query.point``
does for a size point (``make_banks(1, UNITS, 384, seed=7)``, ``SelectionEngine(threads=1)``, two
warm-up queries, then one query at a time), with ``SelectionEngine.warm_up`` before them when the
tree has it (timed apart), and reports per query its thread CPU ms, whether it took the compiled
BM25 pass past ``lexical_shortlist.EXACT_POSTINGS`` (``lexical_dense``), and the numba dispatchers
that gained a signature during it (compiled, or loaded from the cache). Cache states: ``cold``
(an empty ``TRAWMEM_NUMBA_CACHE``, as after any edit of ``select/``: the cache is keyed by its
sources) and ``warm`` (the same folder again, filled by the cold run). Rounds interleave the trees.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def _dispatchers():
    from numba.core.registry import CPUDispatcher

    out = {}
    for name, m in list(sys.modules.items()):
        if name.startswith("trawmem_gpu"):
            for v in list(vars(m).values()):
                if isinstance(v, CPUDispatcher):
                    out[f"{v.py_func.__module__}.{v.py_func.__qualname__}"] = len(v.signatures)
    return out


def child(units: int, queries: int) -> dict:
    from benchmarks import harness
    from benchmarks.synthetic_banks import make_banks, make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine, lexical_dense

    dense = [0]
    plain = lexical_dense.dense_scores

    def counted(*a):
        dense[0] += 1
        return plain(*a)

    lexical_dense.dense_scores = counted  # lexical_shortlist reads it as lexical_dense.dense_scores
    rec: dict = {}
    with harness.pin_threads(1):
        banks = make_banks(1, units=units, d=384, seed=7)
        t = time.perf_counter()
        eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1)
        rec["engine_s"] = time.perf_counter() - t
        t = time.perf_counter()
        rec["warm_up_s"] = (eng.warm_up(), time.perf_counter() - t)[1] if hasattr(eng, "warm_up") else None
        ids, qs, Z = make_queries(banks, 192, seed=8)
        rows = []
        for n, j in enumerate([0, 1] + list(range(queries))):
            before, d0 = _dispatchers(), dense[0]
            c = time.thread_time()
            eng.select_units(ids[j:j + 1], qs[j:j + 1], Z[j:j + 1])
            c = time.thread_time() - c
            after = _dispatchers()
            rows.append({"call": n, "query": j, "warm_up_query": n < 2, "cpu_ms": round(1e3 * c, 2),
                         "dense": dense[0] > d0, "new_signatures": sorted(k for k, v in after.items() if before.get(k, 0) != v)})
    rec["calls"] = rows
    timed = [r["cpu_ms"] for r in rows if not r["warm_up_query"]]
    rec["timed_max_ms"] = max(timed)
    rec["timed_median_ms"] = sorted(timed)[len(timed) // 2]
    rec["timed_argmax_query"] = rows[2 + timed.index(max(timed))]["query"]
    first_dense = next((r for r in rows if r["dense"]), None)
    rec["first_dense"] = first_dense
    return rec


def run(tree: str, cache: str, units: int, queries: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, TRAWMEM_NUMBA_CACHE=cache, HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    t = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, "--child", str(units), str(queries)], env=env, cwd=tree,
                       capture_output=True, text=True, timeout=1800)
    if r.returncode:
        return {"error": r.stderr[-2000:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.perf_counter() - t
    return out


def main() -> None:
    if sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]), int(sys.argv[3]))))
        return
    out, trees = sys.argv[1], sys.argv[2:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    units = int(sys.argv[5]) if len(sys.argv) > 5 else 100_000
    queries = int(sys.argv[6]) if len(sys.argv) > 6 else 12
    rec = {"command": " ".join(["python", *sys.argv]), "units": units, "d": 384, "topics": 6, "queries": queries,
           "runs": []}
    for r in range(rounds):
        for tree in (trees if r % 2 == 0 else trees[::-1]):
            cache = tempfile.mkdtemp(prefix="numba_", dir=os.environ.get("SCRATCH", "/tmp"))
            for state in ("cold", "warm"):
                got = run(tree, cache, units, queries)
                got.update(round=r, tree=tree, cache=state)
                rec["runs"].append(got)
                print(r, tree, state, {k: got.get(k) for k in ("engine_s", "warm_up_s", "timed_max_ms",
                                                                "timed_median_ms", "timed_argmax_query")},
                      "first dense:", {k: (got.get("first_dense") or {}).get(k) for k in ("call", "query", "cpu_ms")},
                      file=sys.stderr, flush=True)
                with open(out, "w") as f:
                    json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
