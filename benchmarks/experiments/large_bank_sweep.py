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
queries), ``STAGES`` (CPU time per query of the approximate front's stages, :data:`STAGED`, in the
row). A ``CMDS`` line may set engine module constants for its row after the reload:
``128:128:64 shortlist.ASSEMBLY=False``. Per setting: CPU p50 / p99 of a batch of one (``time.thread_time``), the candidate
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
    stage = {}  # STAGES=1: CPU seconds per wrapped function during the current query (stage_timer)
    def lat(eng):
        eng.select_units(ids[:2], qs[:2], Z[:2])
        ts, steps, picks, per = [], {}, [], {}
        for i in range(2, nq + 2):
            stage.clear()
            c = time.thread_time()
            picks.append(eng.select_units(ids[i:i+1], qs[i:i+1], Z[i:i+1])[0])
            ts.append(time.thread_time() - c)
            for k, v in eng.last_timings.items(): steps.setdefault(k, []).append(v)
            for k, v in stage.items(): per.setdefault(k, []).append(v)
        ts = 1e3 * np.array(ts)
        out = dict(p50=round(float(np.median(ts)), 2), p99=round(float(np.percentile(ts, 99)), 2),
                   steps={k: round(1e3 * float(np.median(v)), 2) for k, v in steps.items()})
        if per:  # per query: the median CPU ms of each stage (inclusive: a stage's callees are in it too) and its calls
            out["stages"] = {k: dict(ms=round(1e3 * float(np.median([x[0] for x in v])), 3),
                                     calls=float(np.mean([x[1] for x in v]))) for k, v in per.items()}
        return picks, out
    with harness.pin_threads(1):
        t = time.time()
        ap = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index=os.environ.get("KIND", "hnsw"))
        print("engine", round(time.time() - t, 1), flush=True)
        import faiss
        from benchmarks.experiments.working_set_pieces import index_file, plant_index
        from trawmem_gpu.select.engine import shortlist as _sl
        KIND = os.environ.get("KIND", "hnsw")
        ipath = index_file(os.environ.get("CACHE", "/tmp"), N, d, TOP, KIND)  # the engine's own codes: their own file
        snap = ap.snapshot
        if os.path.exists(ipath):
            print("mapped", bool(snap.mapped[0]), flush=True)
            ent = plant_index(ap, ipath, KIND, int(os.environ.get("RS", _sl.RANK_SAMPLE)))
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
                    if os.environ.get("STAGES"):
                        stage_timer(stage)
                    return [(c, {}) for c in combos]
                return None
            while True:
                lines = [l.strip() for l in open(cmdf) if l.strip()] if os.path.exists(cmdf) else []
                if done < 0 or (lines[done:done + 1] == ["quit"]):
                    return None
                if len(lines) > done:
                    new = lines[done:]; done = len(lines)
                    if "quit" in new:  # the settings before it run, then the sweep ends
                        new, done = new[:new.index("quit")], -1
                    for name in filter(None, os.environ.get("RELOAD", "").split(",")):  # modules added since
                        try:
                            importlib.reload(importlib.import_module(name))
                        except ImportError:
                            pass
                    for m in (_lx, _sl, _cp):
                        importlib.reload(m)
                    snap.infos[0].cache[("unit_index", ap.plan.ann_kind)] = ent
                    if os.environ.get("STAGES"):
                        stage_timer(stage)
                    return [_row(a) for a in new]
                time.sleep(5)
        while (todo := next_combos()) is not None:
          for (M, ef, *npb), sets in todo:
              for name, val in sets.items():  # "module.NAME=value" of the row (engine modules, after the reload)
                  mod, attr = name.rsplit(".", 1)
                  setattr(importlib.import_module("trawmem_gpu.select.engine." + mod), attr, eval(val))
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
              row = dict(M=M, ef=ef, nprobe=ap.plan.ann_nprobe, **({"set": sets} if sets else {}), **la, cand_recall=round(float(rc), 4), pick_recall=round(float(rp), 4), same=float(same))
              print(json.dumps(row), flush=True)
              if OUT:
                  with open(OUT, "a") as f:
                      f.write(json.dumps(dict(units=N, dim=d, topics=TOP, index=KIND, run="approx", load=os.getloadavg()[0], **row)) + "\n")


def _row(line: str):
    """``(M, ef, nprobe), {module.NAME: value}`` of a CMDS line ``M:EF:NPROBE [module.NAME=value ...]``."""
    head, *rest = line.split()
    return tuple(int(x) for x in head.split(":")), dict(r.split("=", 1) for r in rest)


STAGED = (("shortlist", "working_sets"), ("shortlist", "lexical"), ("shortlist", "ranked"), ("shortlist", "front_args"),
          ("shortlist", "grown"), ("compiled", "front_loop"), ("seeded_front", "run"), ("compiled", "_front_shortlist"),
          ("lexical_dense", "rank_table"), ("lexical_dense", "dense_scores"),
          ("lexical_merge", "dense_scores"), ("lexical_merge", "score_table"), ("shortlist", "scores_of"),
          ("pool", "query_tables"), ("shortlist", "_gather_dots"))


def stage_timer(into: dict) -> None:
    """Wrap the approximate front's stages (:data:`STAGED`, looked up as module attributes by their
    callers) so each call adds its CPU time and a call count to ``into[name]`` (``time.thread_time``)."""
    import importlib
    for mod, name in STAGED:
        m = importlib.import_module("trawmem_gpu.select.engine." + mod)
        fn = getattr(m, name)
        fn = getattr(fn, "__wrapped_stage__", fn)

        def timed(*a, _fn=fn, _k=f"{mod}.{name}", **k):
            c = time.thread_time()
            try:
                return _fn(*a, **k)
            finally:
                t, n = into.get(_k, (0.0, 0))
                into[_k] = (t + time.thread_time() - c, n + 1)
        timed.__wrapped_stage__ = fn
        setattr(m, name, timed)


if __name__ == "__main__":
    main()
