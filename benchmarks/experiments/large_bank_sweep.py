"""One large synthetic bank searched exactly and approximately at several shortlist settings, in one
process (the bank and its engine built once; at 10^6 units that alone takes 10-25 minutes on the
shared 2-core machine), for issue 46 item 1.

    python benchmarks/experiments/large_bank_sweep.py N D M:EF:NPROBE [...]

Environment: ``TOPICS`` (topic centres of ``synthetic_banks.make_banks``, default 6), ``KIND``
(``hnsw`` / ``ivf``), ``NQ`` (queries, default 30), ``RELOAD`` (comma-separated modules reloaded
before the engine's own on each ``CMDS`` batch), ``CACHE`` (a folder for the pickled bank and
the faiss index, reused by later runs), ``CMDS`` (a file of ``M:EF:NPROBE`` lines read as they are
appended, the engine modules reloaded before each: settings and code tried on the built bank; a
line ``quit`` ends it), ``OUT`` (JSON lines appended per setting), ``PROF`` (cProfile of 10
queries). Per setting: CPU p50 / p99 of a batch of one (``time.thread_time``), the candidate
pool's and the picks' recall against exact (``|A & E| / |E|`` per query, mean) and the share of
identical picks; exact search's figures first.
"""
import sys, time, pickle, os, copy, json
from dataclasses import replace
import numpy as np
sys.path.insert(0, os.environ.get("TREE", os.getcwd()))  # run as a script from the repository root

from benchmarks import harness  # noqa: E402
from benchmarks.synthetic_banks import make_banks, make_queries  # noqa: E402
from trawmem_gpu.select.config import SelectConfig  # noqa: E402
from trawmem_gpu.select.engine import SelectionEngine  # noqa: E402


def main() -> None:
    N, d = int(sys.argv[1]), int(sys.argv[2])
    combos = [tuple(int(x) for x in a.split(":")) for a in sys.argv[3:]]  # M:ef or M:ef:nprobe
    nq = int(os.environ.get("NQ", 30))
    TOP = int(os.environ.get("TOPICS", 6)); cache = os.path.join(os.environ.get("CACHE", "/tmp"), f"bank_{N}_{d}") + ("" if TOP == 6 else f"_t{TOP}") + ".pkl"
    t = time.time()
    if os.path.exists(cache):
        banks = pickle.load(open(cache, "rb"))
    else:
        banks = make_banks(1, units=N, d=d, seed=7, topics=TOP)
        pickle.dump(banks, open(cache, "wb"), protocol=5)
    print("banks", round(time.time() - t, 1), flush=True)
    ids, qs, Z = make_queries(banks, nq + 2, seed=8)
    def lat(eng):
        eng.select_units(ids[:2], qs[:2], Z[:2])
        ts, steps, picks = [], {}, []
        for i in range(2, nq + 2):
            c = time.thread_time()
            picks.append(eng.select_units(ids[i:i+1], qs[i:i+1], Z[i:i+1])[0])
            ts.append(time.thread_time() - c)
            for k, v in eng.last_timings.items(): steps.setdefault(k, []).append(v)
        ts = 1e3 * np.array(ts)
        return picks, dict(p50=round(float(np.median(ts)), 2), p99=round(float(np.percentile(ts, 99)), 2),
                           steps={k: round(1e3 * float(np.median(v)), 2) for k, v in steps.items()})
    with harness.pin_threads(1):
        t = time.time()
        ap = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index=os.environ.get("KIND", "hnsw"))
        print("engine", round(time.time() - t, 1), flush=True)
        import faiss, threading
        from trawmem_gpu.select.steps.ann import VectorIndex
        from trawmem_gpu.select.engine import shortlist as _sl
        KIND = os.environ.get("KIND", "hnsw"); ipath = os.path.join(os.environ.get("CACHE", "/tmp"), f"{KIND}_{N}_{d}_t{TOP}.faiss")
        snap = ap.snapshot
        if os.path.exists(ipath):
            vi = object.__new__(VectorIndex); vi.index = faiss.read_index(ipath); vi.kind = KIND; vi.gpu = False
            vi.n, vi.d, vi.lock = N, d, threading.Lock(); vi.nlist = getattr(vi.index, "nlist", 0)
            vi.vectors, vi.rerank, vi.labels, vi._live = "float32", None, None, None  # as VectorIndex.__init__ sets them
            rng = np.random.default_rng(0)
            RS = int(os.environ.get("RS", _sl.RANK_SAMPLE))
            sample = np.sort(rng.choice(N, RS, replace=False)) if RS < N else np.arange(N)
            ent = (vi, sample, np.ascontiguousarray(snap.np["unit_vecs"][sample], dtype=np.float32))
            snap.infos[0].cache[("unit_index", ap.plan.ann_kind)] = ent
        else:
            t = time.time(); ap.select_units(ids[:1], qs[:1], Z[:1]); print("index build", round(time.time() - t, 1), flush=True)
            faiss.write_index(snap.infos[0].cache[("unit_index", ap.plan.ann_kind)][0].index, ipath)
            ent = snap.infos[0].cache[("unit_index", ap.plan.ann_kind)]
        ex = copy.copy(ap); ex.plan = replace(ap.plan, ann_min_units=None)
        pe, le = lat(ex)
        ce = ex.candidate_sets(ids[2:], qs[2:], Z[2:])
        print("exact", le, flush=True)
        OUT = os.environ.get("OUT")
        if OUT:
            with open(OUT, "a") as f:
                f.write(json.dumps(dict(units=N, dim=d, topics=TOP, index=KIND, run="exact", **le)) + "\n")
        import importlib
        from trawmem_gpu.select.engine import lexical_shortlist as _lx, compiled as _cp
        cmdf = os.environ.get("CMDS")
        done = 0
        first = [True]

        def next_combos():
            nonlocal done
            if not cmdf:
                if first[0]:
                    first[0] = False
                    return combos
                return None
            while True:
                lines = [l.strip() for l in open(cmdf) if l.strip()] if os.path.exists(cmdf) else []
                if "quit" in lines[done:]:
                    return None
                if len(lines) > done:
                    new = lines[done:]; done = len(lines)
                    for name in filter(None, os.environ.get("RELOAD", "").split(",")):  # modules added since
                        try:
                            importlib.reload(importlib.import_module(name))
                        except ImportError:
                            pass
                    for m in (_lx, _sl, _cp):
                        importlib.reload(m)
                    snap.infos[0].cache[("unit_index", ap.plan.ann_kind)] = ent
                    return [tuple(int(x) for x in a.split(":")) for a in new]
                time.sleep(5)
        while (todo := next_combos()) is not None:
          for M, ef, *npb in todo:
              ap.plan = replace(ap.plan, ann_shortlist=M, ann_ef_search=ef, ann_nprobe=(npb or [ap.plan.ann_nprobe])[0])
              pa, la = lat(ap)
              ca = ap.candidate_sets(ids[2:], qs[2:], Z[2:])
              rc = np.mean([len(np.intersect1d(a, b)) / max(1, len(b)) for a, b in zip(ca, ce)])
              rp = np.mean([len(set(a) & set(b)) / max(1, len(b)) for a, b in zip(pa, pe)])
              same = np.mean([a == b for a, b in zip(pa, pe)])
              if os.environ.get("PROF"):
                  import cProfile, pstats
                  pr = cProfile.Profile(); pr.enable()
                  for i in range(2, 12): ap.select_units(ids[i:i+1], qs[i:i+1], Z[i:i+1])
                  pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
              row = dict(M=M, ef=ef, nprobe=ap.plan.ann_nprobe, **la, cand_recall=round(float(rc), 4), pick_recall=round(float(rp), 4), same=float(same))
              print(json.dumps(row), flush=True)
              if OUT:
                  with open(OUT, "a") as f:
                      f.write(json.dumps(dict(units=N, dim=d, topics=TOP, index=KIND, run="approx", load=os.getloadavg()[0], **row)) + "\n")


if __name__ == "__main__":
    main()
