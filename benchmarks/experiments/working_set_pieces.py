"""The pieces of ``shortlist.working_sets`` timed in place, query after query (as a served bank
reads them: each piece's rows as cold as the query before left them), on ``large_bank_sweep.py``'s
cached bank and IVF index (``CACHE``), the engine on one thread.

    CACHE=/work/scratch TOPICS=1000 NQ=40 ROUNDS=3 python -m benchmarks.experiments.working_set_pieces 1000000 384

``working_sets`` is replaced by :func:`timed_working_sets`, the same steps with a CPU clock
(``time.thread_time``) read between them: the IVF search split into its coarse quantizer and its
lists' scan (``search_preassigned`` with the quantizer's lists: the same proposals as
``index.search``), the proposals' exact cosines and order (``working_set.head_order``), the
rank sample's dots and sort, BM25 (``lexical``), the threads' units with their context
(``working_set.assemble``), ``W``'s cosines, its BM25 (``scores_at``) and the rest. Each query's
:class:`Shortlist` is checked equal to the real ``working_sets``' on the first round. ``ARMS``
(default ``compiled``; ``compiled,plain`` alternates them in each round): ``working_set.COMPILED``
on or off; ``alt``: compiled, with an IVF index of ``ALT_ROOT`` lists per square root of the
bank's units (``steps.ann.LISTS_PER_ROOT``, built in the run) probed at ``ALT_NPROBE``. Each arm's
pool and picks are compared with exact search's (round 0). Output: one JSON object, per arm and piece the median CPU ms per query over the rounds'
medians (and the rounds), with the load average; ``OUT`` appends it to a JSON-lines file.
"""
from __future__ import annotations

import copy
import json
import os
import pickle
import sys
import threading
import time
from dataclasses import replace

import numpy as np

PIECES = ("unit_index", "quantizer", "lists_scan", "head_dots", "head_order", "sample_dots", "sample_sort",
          "lexical", "assemble", "W_dots", "edge", "scores_at")


def timed_working_sets(snap, plan, Z, bidx, tok, context, masks=None, into=None):
    """``shortlist.working_sets`` for unmasked queries on one bank, its pieces' CPU seconds added to
    ``into`` (the same steps in the same order: see that function)."""
    from trawmem_gpu.select.engine import shortlist as sl, working_set
    from trawmem_gpu.select.engine.tables import unit_block

    if masks is not None and any(m is not None for m in masks):
        raise ValueError("the probe times unmasked queries only")
    clock = [time.thread_time()]

    def tick(name):
        t = time.thread_time()
        into[name] = into.get(name, 0.0) + t - clock[0]
        clock[0] = t

    M = int(plan.ann_shortlist)
    nprobe = int(plan.ann_nprobe)
    near, heads, sample = [None] * len(bidx), [None] * len(bidx), [None] * len(bidx)
    for bank in np.unique(bidx).tolist():
        rows = np.flatnonzero(bidx == bank)
        index, rsample = sl.unit_index(snap, bank, plan.ann_kind, False, plan.ann_vectors)
        vecs, base = unit_block(snap, bank)
        tick("unit_index")
        z32 = np.ascontiguousarray(Z[rows], dtype=np.float32)
        ivf, nprobe = index.index, min(nprobe, index.nlist)
        Dq, Iq = ivf.quantizer.search(z32, nprobe)
        tick("quantizer")
        ivf.nprobe = nprobe  # the probe's own setting (the engine passes its nprobe per call)
        _, ids = ivf.search_preassigned(z32, max(M, sl.RANK_DEPTH), Iq, Dq)
        tick("lists_scan")
        for r, i in zip(rows.tolist(), ids):
            i = i[i >= 0]
            c = np.empty(len(i))
            sl._gather_dots(vecs, base + i, np.full(len(i), r), Z, c, sl.PREFETCH_ROWS)
            tick("head_dots")
            near[r], heads[r] = working_set.head_order(c, i, M)
            tick("head_order")
        for r in rows.tolist():
            dots = sl.sample_dots(rsample, Z[r])
            tick("sample_dots")
            dots.sort()
            sample[r] = (dots, rsample.units)
            tick("sample_sort")
    ptr, ids = tok
    out = []
    for q, bank in enumerate(bidx.tolist()):
        uo = int(snap.off.uo[bank])
        cols = np.asarray(ids[ptr[q]:ptr[q + 1]], dtype=np.int64)
        tick("edge")
        lex = sl.lexical(snap, bank, cols, M, sample[q][1], None)
        tick("lexical")
        ult = snap.np["unit_thread"][uo + np.concatenate([near[q], lex.top]).astype(np.int64)]
        W = working_set.assemble(snap.infos[bank].bank.thread_offsets, ult, snap.np["rel_idx"], uo, context)
        tick("assemble")
        cos = np.empty(len(W))
        vecs, base = unit_block(snap, bank)
        sl._gather_dots(vecs, base + W, np.full(len(W), q), Z, cos, sl.PREFETCH_ROWS)
        tick("W_dots")
        edge = heads[q][0, -1:]
        tick("edge")
        bm = sl.scores_at(snap, bank, cols, W)
        tick("scores_at")
        out.append(sl.Shortlist(W, float(edge.min()) if len(edge) else np.inf, heads[q], sample[q][0], lex, cos,
                                bm, cols))
        tick("edge")
    return out


def timed_picks(eng, ids, qs, Z) -> tuple[np.ndarray, list]:
    """``(CPU ms per query, picks)`` of queries ``2..`` one at a time (``time.thread_time``)."""
    ts, picks = [], []
    for i in range(2, len(ids)):
        c = time.thread_time()
        picks.append(eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])[0])
        ts.append(time.thread_time() - c)
    return 1e3 * np.array(ts), picks


def exact_reference(eng, ids, qs, Z) -> tuple[list, list]:
    """``(picks, candidate pools)`` of queries ``2..`` searched exactly (``eng`` with no threshold)."""
    ex = copy.copy(eng)
    ex.plan = replace(eng.plan, ann_min_units=None)
    return ([ex.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])[0] for i in range(2, len(ids))],
            ex.candidate_sets(ids[2:], qs[2:], Z[2:]))


def agreement(eng, ids, qs, Z, picks, exact) -> dict:
    """Pool and picks of queries ``2..`` against :func:`exact_reference`'s ``exact``: ``|A & E| /
    |E|`` per query, mean; and the share of identical picks."""
    pe, ce = exact
    ca = eng.candidate_sets(ids[2:], qs[2:], Z[2:])
    return dict(pool=round(float(np.mean([len(np.intersect1d(a, b)) / max(1, len(b)) for a, b in zip(ca, ce)])), 4),
                picks=round(float(np.mean([len(set(a) & set(b)) / max(1, len(b)) for a, b in zip(picks, pe)])), 4),
                same=float(np.mean([a == b for a, b in zip(picks, pe)])))


def emit(out: dict) -> None:
    """Print one run's JSON object and, with ``OUT``, append it to that JSON-lines file."""
    print(json.dumps(out), flush=True)
    if os.environ.get("OUT"):
        with open(os.environ["OUT"], "a") as f:
            f.write(json.dumps(out) + "\n")


def _same(a, b) -> bool:
    """Two shortlists with equal arrays (the BM25 reading compared by its top and units)."""
    arrs = ("units", "head", "sample", "cos", "bm", "cols")
    return (all(np.array_equal(getattr(a, k), getattr(b, k)) for k in arrs) and a.edge == b.edge
            and np.array_equal(a.lex.top, b.lex.top))


def load(N: int, d: int):
    """``(banks, engine, queries)`` on one thread with ``large_bank_sweep.py``'s cached bank and IVF
    index planted as the engine's (no index build)."""
    from benchmarks.synthetic_banks import make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine, shortlist as sl

    banks, index_path = cached(N, d)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index="ivf")
    ent = plant_index(eng, index_path, "ivf", sl.RANK_SAMPLE)
    return banks, eng, make_queries(banks, int(os.environ.get("NQ", 40)) + 2, seed=8), ent


def cached(N: int, d: int) -> tuple[list, str]:
    """``(banks, index path)``: ``large_bank_sweep.py``'s cached bank of ``N`` units of width ``d``
    (``CACHE``, ``TOPICS``) read, and the path of its cached IVF index (both must exist)."""
    cache, top = os.environ.get("CACHE", "/tmp"), int(os.environ.get("TOPICS", 1000))
    bank_path, index_path = os.path.join(cache, f"bank_{N}_{d}_t{top}.pkl"), index_file(cache, N, d, top)
    for p in (bank_path, index_path):
        if not os.path.exists(p):
            raise SystemExit(f"no cached {p}: run large_bank_sweep.py {N} {d} with CACHE and KIND=ivf first")
    with open(bank_path, "rb") as f:
        return pickle.load(f), index_path


def index_file(cache: str, N: int, d: int, top: int, kind: str = "ivf") -> str:
    """``large_bank_sweep.py``'s cached faiss file of the index the engine builds now: its kind, and
    for IVF its codes and centroids (``steps.ann.IVF_FLOAT32_CODES`` / ``IVF_QUANTIZER16``) name it
    (``ivf``, ``ivf16``, ``ivf16q``, ``hnsw``)."""
    from trawmem_gpu.select.steps import ann

    f16 = kind == "ivf" and ann.IVF_FLOAT32_CODES == "float16"
    tag = kind + ("16" if f16 else "") + ("q" if f16 and ann.IVF_QUANTIZER16 else "")
    return os.path.join(cache, f"{tag}_{N}_{d}_t{top}.faiss")


def plant_index(eng, path: str, kind: str, sample_size: int):
    """The faiss index at ``path`` (over bank 0's units, as :func:`index_file` names it) planted as
    the engine's unit index of bank 0 with a rank sample of ``sample_size`` units, as
    ``shortlist.unit_index`` would keep them (no build): ``(VectorIndex, RankSample)``."""
    import faiss

    from trawmem_gpu.select.engine import shortlist as sl
    from trawmem_gpu.select.engine.tables import unit_block
    from trawmem_gpu.select.steps import ann

    snap = eng.snapshot
    N = int(snap.off.nu[0])
    vi = object.__new__(ann.VectorIndex)  # the attributes VectorIndex.__init__ sets, the index read
    vi.index = faiss.read_index(path)
    vi.kind, vi.gpu, vi.n, vi.d, vi.lock = kind, False, N, int(vi.index.d), threading.Lock()
    vi.nlist = getattr(vi.index, "nlist", 0)
    vi.vectors, vi.rerank, vi.labels, vi._live, vi._tail = "float32", None, None, None, None
    vi.codes = ann.IVF_FLOAT32_CODES if kind == "ivf" else "float32"
    vi.code_size = ann.BYTES_PER_DIM[vi.codes] * vi.d
    vi.quantizer16 = vi.codes == "float16" and ann.IVF_QUANTIZER16
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(N, sample_size, replace=False)) if sample_size < N else np.arange(N)
    vecs, base = unit_block(snap, 0)  # a mapped bank's table rows are a hole: its own vectors
    ent = (vi, sl.rank_sample(sample, vecs[base + sample]))
    snap.infos[0].cache[("unit_index", eng.plan.ann_kind)] = ent
    return ent


def alt_index(eng, ent, root: float):
    """``ent`` with an IVF index built over the bank with ``steps.ann.LISTS_PER_ROOT = root``."""
    from trawmem_gpu.select.engine.tables import unit_block
    from trawmem_gpu.select.steps import ann

    vecs, base = unit_block(eng.snapshot, 0)
    keep, ann.LISTS_PER_ROOT = ann.LISTS_PER_ROOT, root
    try:
        return (ann.VectorIndex(vecs[base:base + int(eng.snapshot.off.nu[0])], "ivf"),) + ent[1:]
    finally:
        ann.LISTS_PER_ROOT = keep


def main() -> None:
    from benchmarks import harness
    from trawmem_gpu.select.engine import shortlist as sl, working_set

    N, d = int(sys.argv[1]), int(sys.argv[2])
    rounds = int(os.environ.get("ROUNDS", 3))
    arms = os.environ.get("ARMS", "compiled").split(",")
    orig = sl.working_sets
    per_round: dict = {a: [] for a in arms}
    whole: dict = {a: [] for a in arms}
    checked: list = []
    agree: dict = {}
    with harness.pin_threads(1):
        t = time.time()
        _, eng, (ids, qs, Z), ent = load(N, d)
        print("loaded", round(time.time() - t, 1), flush=True)
        eng.select_units(ids[:2], qs[:2], Z[:2])
        key, plan = ("unit_index", eng.plan.ann_kind), eng.plan
        ents = {"compiled": (ent, plan.ann_nprobe), "plain": (ent, plan.ann_nprobe)}
        if "alt" in arms:  # ALT_ROOT lists per sqrt(n), ALT_NPROBE probed
            t = time.time()
            ents["alt"] = (alt_index(eng, ent, float(os.environ["ALT_ROOT"])), int(os.environ["ALT_NPROBE"]))
            print("alt index", ents["alt"][0][0].nlist, "lists", round(time.time() - t, 1), "s", flush=True)
        exact = exact_reference(eng, ids, qs, Z)
        for rnd in range(rounds):
            for arm in arms:
                working_set.COMPILED = arm != "plain"
                eng.snapshot.infos[0].cache[key] = ents[arm][0]
                eng.plan = replace(plan, ann_nprobe=ents[arm][1])
                acc: list[dict] = []

                def spy(*a, _first=rnd == 0, _acc=acc, **k):
                    into: dict = {}
                    got = timed_working_sets(*a, into=into, **k)
                    if _first:  # the real call, after the timed one: the same shortlists
                        checked.append(all(_same(x, y) for x, y in zip(got, orig(*a, **k))))
                    _acc.append(into)
                    return got

                sl.working_sets = spy
                t_q, pa = timed_picks(eng, ids, qs, Z)
                sl.working_sets = orig
                if rnd == 0:  # agreement with exact: |A & E| / |E| per query, mean (pool and picks)
                    agree[arm] = agreement(eng, ids, qs, Z, pa, exact)
                per_round[arm].append({k: 1e3 * float(np.median([a.get(k, 0.0) for a in acc])) for k in PIECES}
                                      | {"sum": 1e3 * float(np.median([sum(a.values()) for a in acc]))})
                whole[arm].append(float(np.median(t_q)))
                print(arm, json.dumps({k: round(v, 3) for k, v in per_round[arm][-1].items()}), flush=True)
    working_set.COMPILED = True
    eng.plan = plan
    out = dict(units=N, dim=d, queries=len(ids) - 2, rounds=rounds,
               identical_to_working_sets=bool(all(checked)) and len(checked) > 0,
               note="the select's p50 of round 0 includes the real working_sets call beside the timed one",
               arms={a: dict(ms={k: round(float(np.median([r[k] for r in per_round[a]])), 3) for k in per_round[a][0]},
                             ms_rounds={k: [round(r[k], 3) for r in per_round[a]] for k in per_round[a][0]},
                             select_p50_rounds=[round(w, 2) for w in whole[a]], nprobe=int(ents[a][1]),
                             nlist=int(ents[a][0][0].nlist), **agree[a]) for a in arms},
               load=os.getloadavg()[0])
    emit(out)


if __name__ == "__main__":
    main()
