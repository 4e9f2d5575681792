"""Resident memory of the whole process that answers one large bank (issue 46 item 2), per
``vectors`` choice: the engine's own tables, the approximate index and the bank, as a user opens
them (a collection written with the choice, loaded memory-mapped in a fresh child process, a
``SelectionEngine`` over it with the collection's choice, queries on the approximate path).

The synthetic bank (``synthetic_banks.make_banks``, one bank of ``N`` units at d = 384, seed 7)
is built once and pickled under ``--cache`` (a scratch folder, never committed); each choice's
collection is written once under it too. Per choice, a child records ``RssAnon``, ``RssFile``,
``VmHWM`` after loading the bank, after building the engine and after the queries, the engine's
tables' bytes by name (``Snapshot.t``) and the bank's arrays' bytes by name, and the p50 of a
batch of one.

    python -m benchmarks.experiments.engine_resident --units 100000 [--vectors int8,float16,float32,pq] [--versus-exact]
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

from .. import harness

MIB = float(1 << 20)


def _status() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
            k, v = line.split(":")
            out[k] = round(int(v.split()[0]) / 1024, 1)
    return out


def _bank(units: int, topics: int, cache: Path):
    from ..synthetic_banks import make_banks

    path = cache / f"bank_{units}_384_t{topics}.pkl"
    if path.exists():
        with open(path, "rb") as f:
            return pickle.load(f)[0]
    banks = make_banks(1, units=units, d=384, seed=7, topics=topics)
    with open(path, "wb") as f:
        pickle.dump(banks, f, protocol=5)
    return banks[0]


def _collection(units: int, topics: int, vectors: str, cache: Path) -> Path:
    from trawmem_gpu.store import Collection

    path = cache / f"coll_{units}_t{topics}_{vectors}"
    if not (path / "collection.json").exists():
        Collection(path, create=True, vectors=vectors).put(_bank(units, topics, cache))
    return path


def _sites(snap, before=None, top: int = 15) -> list:
    """The ``top`` allocation sites (file:line) by traced MiB (``tracemalloc``), or by growth since
    ``before``."""
    stats = snap.compare_to(before, "lineno") if before is not None else snap.statistics("lineno")
    key = (lambda s: s.size_diff) if before is not None else (lambda s: s.size)
    return [[round(key(s) / MIB, 1), str(s.traceback)] for s in sorted(stats, key=key, reverse=True)[:top]]


def _caches() -> dict:
    """Entries of the process-wide text caches an engine build fills (bounded lru caches)."""
    from trawmem_gpu import tokens
    from trawmem_gpu.select import lexical, text_features, workspace

    return {"lexical._unit_tokens": lexical._unit_tokens.cache_info().currsize,
            "text_features._temporal": text_features._temporal.cache_info().currsize,
            "workspace.unit_line": workspace.unit_line.cache_info().currsize,
            "tokens._piece_counts": len(tokens._piece_counts)}


def _same_picks(eng, bank, coll, opts: dict, ids, qs, Z) -> dict:
    """After the figures: the picks and candidate pools of ``eng`` against an engine over the same
    vectors held as float64 (whose table holds them: no bank mapped, ``BankInfo.mapped``), same
    settings; float32 -> float64 is exact, so they must be identical."""
    from dataclasses import replace

    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    b64 = replace(bank, unit_vecs=np.asarray(bank.unit_vecs, dtype=np.float64))
    ref = SelectionEngine([b64], SelectConfig(), device="cpu", threads=1, vectors=eng.engine_config.vectors, **opts)
    got, want = eng.select_units(ids, qs, Z), ref.select_units(ids, qs, Z)
    cg, cw = eng.candidate_sets(ids, qs, Z), ref.candidate_sets(ids, qs, Z)
    return {"queries": len(ids), "mapped": bool(eng.snapshot.mapped[0]), "reference_mapped": bool(ref.snapshot.mapped[0]),
            "identical_picks": sum(list(a) == list(b) for a, b in zip(got, want)),
            "identical_pools": sum(bool(np.array_equal(a, b)) for a, b in zip(cg, cw))}


def _versus_exact(eng, bank, coll, ids, qs, Z) -> dict:
    """After the figures: the candidate pool's and the picks' agreement with exact search's
    (``|A & E| / |E|`` per query: mean and min), an engine with ``ann_min_units`` None over the
    same bank answering the same queries."""
    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    ref = SelectionEngine([bank], SelectConfig(), device="cpu", threads=1, vectors=coll.vectors, ann_min_units=None)
    agree = lambda got, want: [len(np.intersect1d(np.asarray(a), np.asarray(e))) / max(len(e), 1)
                               for a, e in zip(got, want)]
    pool = agree(eng.candidate_sets(ids, qs, Z), ref.candidate_sets(ids, qs, Z))
    picks = agree(eng.select_units(ids, qs, Z), ref.select_units(ids, qs, Z))
    return {"queries": len(ids), "pool_mean": round(float(np.mean(pool)), 4), "pool_min": round(float(np.min(pool)), 4),
            "picks_mean": round(float(np.mean(picks)), 4), "picks_min": round(float(np.min(picks)), 4)}


def child(path: str, queries: int, ann_min_units, trace: bool = False, compare: bool = False,
          exact: bool = False, engine_vectors: str | None = None) -> dict:
    """One choice's figures, in this (fresh) process (``trace``: Python allocations by site per
    phase, ``tracemalloc``, which costs memory itself: its RSS figures are not the plain run's;
    ``compare``: then :func:`_same_picks` over the queries; ``exact``: then :func:`_versus_exact`;
    ``engine_vectors``: the engine's index codes instead of the collection's choice, e.g. ``pq`` over
    an ``int8`` collection: the same files, so no second collection need be written)."""
    import tracemalloc

    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.store import Collection

    from ..synthetic_banks import make_queries

    out = {"start": _status()}
    if trace:
        tracemalloc.start()
    coll = Collection(path)
    bank = coll.load(coll.bank_ids[0], mmap=True)
    if trace:
        s_loaded = tracemalloc.take_snapshot()
        out["traced_loaded_mib"] = round(tracemalloc.get_traced_memory()[0] / MIB, 1)
        out["sites_loaded"] = _sites(s_loaded)
    out["bank_arrays_mib"] = {k: round(v.nbytes / MIB, 1) for k, v in vars(bank).items()
                              if isinstance(v, np.ndarray) and v.nbytes > (1 << 20)}
    out["loaded"] = _status()
    t = time.perf_counter()
    opts = {} if ann_min_units is None else {"ann_min_units": ann_min_units}
    with harness.pin_threads(1):
        eng = SelectionEngine([bank], SelectConfig(), device="cpu", threads=1, vectors=engine_vectors or coll.vectors,
                              **opts)
        out["engine_s"] = round(time.perf_counter() - t, 1)
        out["engine"] = _status()
        out["engine_trimmed"] = _trimmed()
        out["caches"] = _caches()
        if trace:
            out["traced_engine_mib"] = round(tracemalloc.get_traced_memory()[0] / MIB, 1)
            out["sites_engine"] = _sites(tracemalloc.take_snapshot(), s_loaded)
            tracemalloc.stop()
        snap = eng.snapshot
        out["tables_mib"] = {k: round(b.element_size() * b.nelement() / MIB, 1) for k, b in snap.t.items()
                             if b.element_size() * b.nelement() > (1 << 20)}
        out["tables_total_mib"] = round(snap.nbytes() / MIB, 1)
        held = eng._store.held_nbytes()  # a mapped bank's unit_vecs rows are a hole: not held
        out["tables_held_mib"] = {k: round(v / MIB, 1) for k, v in held.items() if v > (1 << 20)}
        out["tables_held_total_mib"] = round(sum(held.values()) / MIB, 1)
        out["mapped"] = snap.mapped.tolist() if hasattr(snap, "mapped") else None
        ids, qs, Z = make_queries([bank], queries + 1, seed=8)
        t = time.perf_counter()
        eng.select_units(ids[:1], qs[:1], Z[:1])
        out["first_query_s"] = round(time.perf_counter() - t, 1)
        out["index"] = [{"key": str(k), "codes": getattr(v[0], "codes", None), "mib": round(v[0].nbytes() / MIB, 1)}
                        for k, v in snap.infos[0].cache.items() if isinstance(k, tuple) and k[0] == "unit_index"]
        ts = []
        for i in range(1, queries + 1):
            c = time.thread_time()
            eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
            ts.append(1e3 * (time.thread_time() - c))
        out["p50_ms"] = round(float(np.median(ts)), 2)
        out["approximate"] = any(k[0] == "unit_index" for k in snap.infos[0].cache if isinstance(k, tuple))
    out["queried"] = _status()
    out["queried_trimmed"] = _trimmed()
    if compare:
        with harness.pin_threads(1):
            out["compare"] = _same_picks(eng, bank, coll, opts, ids, qs, Z)
    if exact:
        with harness.pin_threads(1):
            out["versus_exact"] = _versus_exact(eng, bank, coll, ids, qs, Z)
    return out


def _trimmed() -> dict:
    """``_status()`` after glibc's ``malloc_trim(0)`` hands the heap's free pages back (what the
    allocator keeps of freed build-time temporaries is the difference; ``select.heap``); {} off glibc."""
    import gc

    from trawmem_gpu.select.heap import TRIM_MIN_UNITS, trim_heap

    gc.collect()
    return _status() if trim_heap(TRIM_MIN_UNITS) else {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=100_000)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--vectors", default="int8,float16,float32")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--ann-min-units", type=int, default=None)
    ap.add_argument("--cache", default="/work/scratch/resident")
    ap.add_argument("--name", default=None)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--child", default=None)
    ap.add_argument("--trace", action="store_true", help="tracemalloc: Python allocations by site per phase")
    ap.add_argument("--compare", action="store_true",
                    help="after the figures, the picks against an engine over float64 vectors (none mapped)")
    ap.add_argument("--engine-vectors", default=None,
                    help="the engine's index codes (EngineConfig.vectors) instead of the collection's choice")
    ap.add_argument("--pq-fetch", type=int, default=None,
                    help="steps.ann.PQ_RERANK_FETCH for this run (the proposals a pq index re-ranks, times k)")
    ap.add_argument("--versus-exact", action="store_true",
                    help="after the figures, the pool's and picks' agreement with exact search's")
    a = ap.parse_args(argv)
    if a.pq_fetch is not None:
        from trawmem_gpu.select.steps import ann

        ann.PQ_RERANK_FETCH = a.pq_fetch
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.queries, a.ann_min_units, a.trace, a.compare, a.versus_exact,
                                           a.engine_vectors)),
              flush=True)
        return 0
    cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rec = {"units": a.units, "d": 384, "topics": a.topics, "queries": a.queries, "trace": a.trace,
           "ann_min_units": a.ann_min_units, "compare": a.compare, "versus_exact": a.versus_exact,
           "pq_fetch": a.pq_fetch, "engine_vectors": a.engine_vectors, "points": {}}
    for v in a.vectors.split(","):
        path = _collection(a.units, a.topics, v, cache)
        cmd = [sys.executable, "-m", "benchmarks.experiments.engine_resident", "--child", str(path),
               "--queries", str(a.queries)] + ([] if a.ann_min_units is None else ["--ann-min-units", str(a.ann_min_units)]) \
            + (["--trace"] if a.trace else []) + (["--compare"] if a.compare else []) \
            + (["--versus-exact"] if a.versus_exact else []) \
            + ([] if a.pq_fetch is None else ["--pq-fetch", str(a.pq_fetch)]) \
            + ([] if a.engine_vectors is None else ["--engine-vectors", a.engine_vectors])
        p = subprocess.run(cmd, capture_output=True, text=True)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        rec["points"][v] = json.loads(line[-1][7:]) if line else {"error": p.stderr[-2000:]}
        print(v, json.dumps(rec["points"][v]), flush=True)
    harness.save(a.name or f"engine_resident_{a.units}", rec,
                 out_dir=a.out_dir or harness.results_dir(default=harness.ARCHIVE))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
