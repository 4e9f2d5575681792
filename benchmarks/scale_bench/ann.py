"""What the approximate search of large banks costs (``EngineConfig.ann_min_units``,
``trawmem_gpu/select/engine/shortlist.py``), measured two ways:

* :func:`recall_point`: one synthetic bank of ``N`` units searched exactly and approximately (the
  threshold forced to 1, the other ``ann_*`` settings as given, default otherwise), the same
  queries: the candidate pool's recall against the exact one (``|U_approx & U_exact| / |U_exact|``
  per query: mean, 5th percentile, min), the share of queries whose picks are identical, the
  per-query CPU time of both (a batch of one, median; ``query.py`` says why CPU time) and the
  first approximate query's wall seconds (the index is built then);
* :func:`dev_quality`: the dev sets (LoCoMo, LongMemEval-S) at equal tokens, TrawMem with the
  shipped method exact and with the threshold forced low (every dev bank is below the default
  threshold, so at the defaults nothing changes), at the default shortlist and, when asked, at
  smaller ones (a dev bank of ~600 units is mostly inside a 512-unit shortlist's threads: the
  smaller ones make the approximation bite), each against exact: macro evidence recall, the paired
  difference with its bootstrap intervals, the recalls of ``ann_recall`` (candidate units, threads,
  picks). ``python -m benchmarks run ann-recall`` runs it with the synthetic banks (``ann_recall.py``).
"""
from __future__ import annotations

import copy
import time
from dataclasses import replace

from .. import harness


def _lat(eng, ids, qs, Z, dates=None, passes: int = 1) -> tuple[list, float, float, list]:
    """Picks of a batch of one per query (the first pass's), the median and 99th percentile seconds
    per query over every pass's timings, and each pass's median: the same queries ``passes`` times
    in a row (the first pass reads what the ones after find in the caches; a serving engine is in
    the later passes' state)."""
    import numpy as np

    out, ts, per = [], [], []
    for k in range(max(1, int(passes))):
        run = []
        for i in range(len(ids)):
            t = time.thread_time()  # CPU time: the shared machine's load leaves it alone (query.py)
            got = eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1], None if dates is None else dates[i:i + 1])[0]
            run.append(time.thread_time() - t)
            if k == 0:
                out.append(got)
        ts += run
        per.append(float(np.median(run)) if run else 0.0)
    return out, float(np.median(ts)), float(np.percentile(ts, 99)), per


def _qps(eng, ids, qs, Z, batch: int) -> float:
    """Queries per CPU second of one batch of the first ``batch`` queries (CPU time: ``_lat``)."""
    b = max(1, min(int(batch), len(ids)))
    t = time.thread_time()
    eng.select_units(ids[:b], qs[:b], Z[:b])
    return b / max(time.thread_time() - t, 1e-9)


def append_update_ms(eng, sizes=(1, 8), repeats: int = 5, seed: int = 0) -> dict:
    """Milliseconds to keep ``eng``'s approximate unit index current through an append of ``m``
    units, per ``m`` in ``sizes`` (one turn; one thread of ~8): the median of ``repeats``
    ``VectorIndex.grown`` calls (what ``bank_tables.grown_indexes`` runs on every append: faiss
    adds the vectors, no rebuild), each on the index the one before grew, with random unit
    vectors. Run after the measurements: the faiss index gains the vectors (the engine's own
    index object still answers for its bank). Empty when no index was built yet."""
    import numpy as np

    info = eng.snapshot.infos[0]
    got = [v for k, v in info.cache.items() if isinstance(k, tuple) and k and k[0] == "unit_index"]
    if not got:
        return {}
    index, rng, bank_vecs = got[0][0], np.random.default_rng(seed), info.bank.unit_vecs
    out = {}
    for m in sizes:
        ts = []
        for _ in range(repeats):
            x = rng.standard_normal((m, index.d)).astype(np.float32)
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            # a compact index re-ranks against the float vectors of every unit it holds: the ones the
            # index before this one held (the bank's, then those earlier repeats added) and x
            rerank = None if index.rerank is None else np.concatenate([index.rerank[:index.n], x], dtype=bank_vecs.dtype)
            t = time.perf_counter()
            index = index.grown(x, index.n, rerank)
            ts.append(time.perf_counter() - t)
        out[str(m)] = 1e3 * float(np.median(ts))
    return out


def topics_for(spec: dict) -> int:
    """Topic centres of a point's synthetic bank: ``spec["topics"]``, or ``"scaled"`` (the
    default): one per 1,000 units and at least 6, as a long-lived bank gathers subjects while it
    grows (``synthetic_banks``' fixed 6 puts 166,000 units of a 10^6 bank around each centre, all
    within noise of each other: the hardest case for any index, kept with ``topics: 6``)."""
    t = spec.get("topics", "scaled")
    return max(6, int(spec["units"]) // 1000) if t == "scaled" else int(t)


def cache_path(spec: dict):
    """Where ``large_bank_sweep.py`` (``CACHE=DIR``) pickles this point's bank:
    ``spec["bank_cache"]/bank_UNITS_DIM[_tTOPICS].pkl`` (no ``_t`` part for 6 topics); None without
    ``bank_cache``."""
    from pathlib import Path

    if not spec.get("bank_cache"):
        return None
    top = topics_for(spec)
    return Path(spec["bank_cache"]) / (f"bank_{int(spec['units'])}_{int(spec['dim'])}" + ("" if top == 6 else f"_t{top}")
                                       + ".pkl")


def cached_bank(spec: dict):
    """The point's synthetic bank read from :func:`cache_path` (only read, never written: a 10^6-unit
    bank takes 7 minutes to generate here and 20 s to load), or None when there is no such file.
    The file must hold ``make_banks(1, units, d, seed, topics)``'s list, seed 7 (what the sweep
    writes); anything else (another seed, size or width) is refused with ValueError."""
    import pickle

    path = cache_path(spec)
    if path is None or not path.exists():
        return None
    if int(spec["seed"]) != 7:
        raise ValueError(f"{path} holds the seed-7 bank; this point asks for seed {spec['seed']}")
    with open(path, "rb") as f:
        banks = pickle.load(f)
    if (len(banks) != 1 or banks[0].n_units != int(spec["units"])
            or banks[0].unit_vecs.shape[1] != int(spec["dim"])):
        raise ValueError(f"{path} does not hold one bank of {spec['units']} units of d = {spec['dim']}")
    return banks


def candidate_recall(approx: list, exact: list) -> dict:
    """Recall of the approximate candidate pools against the exact ones, per query, summarized
    (``ann_recall.recall``, ``ann_recall.summary``)."""
    from .ann_recall import recall, summary

    return summary(recall(approx, exact))


def recall_point(spec: dict) -> dict:
    """One bank of ``spec["units"]`` units (``dim``, ``seed``, ``rounds`` queries, ``ann``: the
    ``ann_*`` overrides), exact against approximate (see the module docstring)."""
    from benchmarks.synthetic_banks import make_banks, make_queries
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    import numpy as np

    with harness.pin_threads(int(spec.get("threads", 1))):
        t = time.perf_counter()
        banks = cached_bank(spec)
        if banks is None:
            banks = make_banks(1, units=int(spec["units"]), d=int(spec["dim"]), seed=int(spec["seed"]),
                               topics=topics_for(spec))
        t_banks, t = time.perf_counter() - t, time.perf_counter()
        ids, qs, Z = make_queries(banks, int(spec["rounds"]) + 2, seed=int(spec["seed"]) + 1)
        ap = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, **dict(spec.get("ann", {}),
                                                                                     ann_min_units=1))
        t_engine = time.perf_counter() - t
        rec, _ = exact_beside(ap, ids, qs, Z, int(spec.get("batch", 64)), int(spec.get("passes", 1)))
    return {"spec": spec, "units": int(spec["units"]), "topics": topics_for(spec),
            "bank_from_cache": cache_path(spec) is not None and cache_path(spec).exists(), "banks_s": t_banks, "engine_s": t_engine, **rec}


def exact_beside(ap, ids, qs, Z, batch: int, passes: int = 1) -> tuple[dict, tuple]:
    """The approximate engine ``ap`` against its own tables searched exactly (a shallow copy
    whose plan has no threshold: one copy of a large bank in memory), on the queries ``ids / qs /
    Z`` (the first two warm both up; the first approximate query's time, the index's build, is
    ``first_approx_query_s``): latencies (the approximate ones over ``passes`` passes of the
    queries, each pass's median in ``approx_pass_ms``; the exact ones over one), throughput in
    batches of ``batch``, the candidate pool's and the picks' agreement ``|A & E| / |E|``, the
    index's time per append, the settings; and
    ``(approx picks, exact picks, approx candidates, exact candidates)``."""
    import numpy as np

    ex = copy.copy(ap)
    ex.plan = replace(ap.plan, ann_min_units=None)
    ex.select_units(ids[:2], qs[:2], Z[:2])
    t = time.perf_counter()
    ap.select_units(ids[:1], qs[:1], Z[:1])
    first = time.perf_counter() - t
    ids, qs, Z = ids[2:], qs[2:], Z[2:]
    pe, te, te99, _ = _lat(ex, ids, qs, Z)
    pa, ta, ta99, tpass = _lat(ap, ids, qs, Z, passes=passes)
    ca, ce = ap.candidate_sets(ids, qs, Z), ex.candidate_sets(ids, qs, Z)
    qps = {"exact": _qps(ex, ids, qs, Z, batch), "approx": _qps(ap, ids, qs, Z, batch)}
    picks = [len(set(a) & set(e)) / len(e) for a, e in zip(pa, pe) if e]
    plan = ap.plan
    rec = {"exact_ms": 1e3 * te, "approx_ms": 1e3 * ta, "exact_p99_ms": 1e3 * te99, "approx_p99_ms": 1e3 * ta99,
           "approx_pass_ms": [1e3 * t for t in tpass],
           "first_approx_query_s": first, "candidate_recall": candidate_recall(ca, ce),
           "pick_recall": {"mean": float(np.mean(picks)) if picks else 1.0,
                           "p5": float(np.percentile(picks, 5)) if picks else 1.0,
                           "min": float(np.min(picks)) if picks else 1.0},
           "same_picks": sum(a == b for a, b in zip(pa, pe)) / max(1, len(pe)),
           "qps": qps, "qps_batch": min(batch, len(ids)), "index_append_ms": append_update_ms(ap),
           "settings": {"shortlist": plan.ann_shortlist, "nprobe": plan.ann_nprobe, "ef_search": plan.ann_ef_search,
                        "index": plan.ann_kind}}
    return rec, (pa, pe, ca, ce)


def dev_quality(Ts=(400, 800), shortlists=None, locomo=None, lme=None, progress: bool = True,
                vectors=("float32",)) -> dict:
    """The dev sets at equal tokens, exact against approximate search (see the module docstring):
    per data set, ``T`` and shortlist (None: the default ``EngineConfig.ann_shortlist`` alone), the
    macro evidence recall, its paired difference from exact with two bootstrap intervals (by
    category, as the macro weighs them: ``margin_bootstrap``; by conversation, the questions of
    one bank resampled together: ``trawmem_gpu.eval.analyses.cluster_bootstrap``), and the recalls
    of ``ann_recall.recalls`` (candidate units, threads, picks). ``vectors``: the collections'
    vector storage choices run per shortlist (``store/vectors.py``; a compact one's run is
    ``approx-M-CHOICE``, the float32 one's ``approx-M``)."""
    import numpy as np
    from tqdm import tqdm

    from benchmarks.equal_tokens_bench.data import Dataset, trawmem_setting
    from benchmarks.equal_tokens_bench.stats import margin_bootstrap, records, summary
    from trawmem_gpu.eval.analyses import cluster_bootstrap
    from trawmem_gpu.head.relevance import cross_validate
    from trawmem_gpu.select import SelectionEngine
    from trawmem_gpu.select.config import EngineConfig
    from trawmem_gpu.select.workspace import headings_for

    from .ann_recall import recalls

    shortlists = tuple(shortlists or (EngineConfig().ann_shortlist,))
    data = {"locomo": Dataset("locomo", locomo or harness.dev_data("locomo")),
            "longmemeval": Dataset("longmemeval", lme or harness.dev_data("longmemeval"))}
    W = cross_validate([q for d in data.values() for q in d.questions])
    chosen = dict(headings="date", knapsack="gain", w_aff=16.0)  # bench_equal_tokens' defaults
    out: dict = {"T": list(Ts), "shortlists": list(shortlists), "forced": {"ann_min_units": 1}, "rows": []}
    runs = {"exact": dict(ann_min_units=None)}
    runs.update({f"approx-{m}" + ("" if v == "float32" else f"-{v}"): dict(ann_min_units=1, ann_shortlist=m, vectors=v)
                 for m in shortlists for v in vectors})
    bar = tqdm(total=len(data) * len(Ts) * len(runs), desc="dev sets (data, T, run)", disable=not progress)
    for name, ds in data.items():
        by_group: dict = {}
        for i, q in enumerate(ds.questions):
            by_group.setdefault(q.group, []).append(i)
        offs = [ds.ctxs[q.bank_id].bank.thread_offsets for q in ds.questions]
        for T in Ts:
            setting = trawmem_setting(W, T=T, **chosen)
            picks, cands = {}, {}
            for label, ekw in runs.items():
                sel, cand = [None] * len(ds.questions), [None] * len(ds.questions)
                for g, rows in by_group.items():
                    cfg, params = setting(g)
                    eng = SelectionEngine(ds.banks, cfg, **ekw)
                    qs = [ds.questions[i] for i in rows]
                    args = ([q.bank_id for q in qs], [q.extra["question"] for q in qs],
                            np.stack([q.extra["z"] for q in qs]))
                    for i, p, c in zip(rows, eng.select_units(*args, dates=[q.extra["date"] for q in qs],
                                                              params=params),
                                       eng.candidate_sets(*args, params=params)):
                        sel[i], cand[i] = p, c
                picks[label], cands[label] = (sel, headings_for("trawmem", setting(ds.groups[0])[0])), cand
                bar.update(1)
            base = records(ds, picks["exact"])
            for label in runs:
                recs = records(ds, picks[label])
                row = {"data": name, "T": T, "run": label, "macro": summary(ds, recs)["macro"]}
                if label != "exact":
                    m = margin_bootstrap(ds, recs, base)
                    diffs = [a["recall"] - b["recall"] for a, b in zip(recs, base)]
                    est, lo, hi = cluster_bootstrap(diffs, [q.bank_id for q in ds.questions])
                    row.update(diff_points=100 * m["margin"], ci95_points=[100 * x for x in m["ci95"]],
                               questions_better_worse_equal=m["questions_better_worse_equal"],
                               micro_diff_points=100 * est, micro_ci95_points_by_conversation=[100 * lo, 100 * hi],
                               recall=recalls(cands[label], cands["exact"], picks[label][0], picks["exact"][0], offs))
                out["rows"].append(row)
                bar.write(f"{name} T={T} {label}: macro recall {row['macro']['recall']:.4f}"
                          + (f", {row['diff_points']:+.2f} points vs exact [{row['ci95_points'][0]:+.2f}, "
                             f"{row['ci95_points'][1]:+.2f}], candidate recall {row['recall']['units']['mean']:.4f}, "
                             f"picks {row['recall']['picks']['mean']:.4f}" if label != "exact" else ""))
    bar.close()
    return out
