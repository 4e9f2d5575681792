"""The candidate pool's recall against exact search on large banks (``EngineConfig.ann_min_units``,
``trawmem_gpu/select/engine/shortlist.py``), at the default settings and beside other ones.

**Recall** (one home: :func:`recall`). For a query ``q`` the exact path (every unit scored) and the
approximate path (the working set around the faiss index's shortlist) each yield a set; the
approximate path's recall of the exact one is

    r_q = |A_q ∩ E_q| / |E_q|        (1 when E_q is empty: nothing to miss)

the share of what exact search found that the approximate search holds too, taken per query and
averaged over the queries (:func:`summary` adds the 5th percentile, the minimum and the share of
queries at 1). Three sets, one formula (:func:`recalls`):

* **units**: ``U_q``, the candidate units of steps 1-3 (``SelectionEngine.candidate_sets``): the
  pool the greedy step selects from. **This is the recall the defaults are held to: its mean over
  the queries at or above** :data:`TARGET` **(issue 33).**
* **threads**: the threads holding a unit of ``U_q`` (a unit missed whose thread is held is a
  nearer miss than a thread missed);
* **picks**: ``S_q``, the units the query selects (``select_units``): what the user sees.

And one of the index alone, **search@M**: the share of the ``M`` = ``ann_shortlist`` units of
largest exact cosine that the index proposes (what ``efSearch`` / ``nprobe`` buy).

:func:`measure_bank` measures one bank at several settings (``{"ann_shortlist": .., "ann_ef_search":
..}``; the first is the default), the exact and the approximate engine sharing one copy of the
bank's tables, with per-query CPU time (``time.thread_time``, the engine pinned to one thread: the
shared machine's load leaves it alone) of exact and approximate taken side by side, query by query,
in one loop: the latency ratio is the median of the per-query ratios. :func:`point` runs it on a
synthetic bank (``benchmarks/synthetic_banks.py``) in a child process (its own peak RSS).
"""
from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import Sequence

from .. import harness

TARGET = 0.99
"""The mean candidate-unit recall (``units``) the default settings must reach on a large bank."""
SETTINGS = ({}, {"ann_ef_search": 64}, {"ann_shortlist": 1024}, {"ann_shortlist": 256})
"""The settings measured on each synthetic bank: the defaults first, then one knob moved each
(``ann_ef_search`` 64 was the default before these measurements)."""


def recall(approx: Sequence, exact: Sequence):
    """``[Q]`` float64: ``r_q = |A_q ∩ E_q| / |E_q|`` (1 where ``E_q`` is empty), per query, of
    the approximate path's sets ``approx`` against the exact path's sets ``exact`` (any integer ids)."""
    import numpy as np

    if len(approx) != len(exact):
        raise ValueError(f"{len(approx)} approximate sets against {len(exact)} exact ones")
    out = np.ones(len(exact))
    for q, (a, e) in enumerate(zip(approx, exact)):
        e = np.unique(np.asarray(e, dtype=np.int64))
        if len(e):
            out[q] = len(np.intersect1d(np.asarray(a, dtype=np.int64), e, assume_unique=False)) / len(e)
    return out


def summary(r) -> dict:
    """``mean``, ``p5``, ``min`` and ``all`` (the share of queries at 1) of per-query recalls ``r``."""
    import numpy as np

    r = np.asarray(r, dtype=np.float64)
    if not len(r):
        return {"n": 0}
    return {"mean": float(r.mean()), "p5": float(np.percentile(r, 5)), "min": float(r.min()),
            "all": float((r == 1.0).mean()), "n": int(len(r))}


def thread_sets(units: Sequence, thread_offsets) -> list:
    """The threads (bank-local) holding each set's units; ``thread_offsets`` is the bank's
    (``Bank.thread_offsets``: thread ``j`` holds units ``[off[j], off[j+1])``)."""
    import numpy as np

    off = np.asarray(thread_offsets, dtype=np.int64)
    return [np.unique(np.searchsorted(off, np.asarray(u, dtype=np.int64), side="right") - 1) for u in units]


def recalls(approx_cands, exact_cands, approx_picks, exact_picks, thread_offsets) -> dict:
    """The three recalls of the module docstring (``units``, ``threads``, ``picks``), summarized.
    ``thread_offsets``: one per query (its bank's), or one array for all."""
    offs = thread_offsets if isinstance(thread_offsets, (list, tuple)) else [thread_offsets] * len(exact_cands)
    th = lambda sets: [thread_sets([s], o)[0] for s, o in zip(sets, offs)]  # noqa: E731
    return {"units": summary(recall(approx_cands, exact_cands)),
            "threads": summary(recall(th(approx_cands), th(exact_cands))),
            "picks": summary(recall(approx_picks, exact_picks)),
            "same_picks": float(sum(list(a) == list(b) for a, b in zip(approx_picks, exact_picks))
                                / max(1, len(exact_picks)))}


def search_recall(eng, Z, M: int):
    """``[Q]`` search@M of the module docstring, on bank 0 of ``eng`` at its plan's settings."""
    import numpy as np

    from trawmem_gpu.select.engine.shortlist import unit_index
    from trawmem_gpu.select.steps.ann import AnnParams

    snap, plan = eng.snapshot, eng.plan
    index = unit_index(snap, 0, plan.ann_kind, plan.device.type == "cuda")[0]
    a, n = int(snap.off.uo[0]), int(snap.off.nu[0])
    V = snap.np["unit_vecs"][a:a + n]
    M = min(int(M), n)
    _, got = index.search(Z, M, AnnParams(plan.ann_nprobe, plan.ann_ef_search))
    want = []
    for z in np.asarray(Z, dtype=np.float64):
        c = V @ z
        want.append(np.argpartition(-c, M - 1)[:M] if M < n else np.arange(n))
    return recall([g[g >= 0] for g in got], want)


def _timed(eng, ids, qs, Z, i):
    t = time.thread_time()
    out = eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])[0]
    return out, time.thread_time() - t


def measure_bank(banks, ids, qs, Z, settings=SETTINGS, progress=None) -> dict:
    """One bank (``banks[0]``; the queries ``ids, qs, Z`` on it), exact against approximate at
    each of ``settings`` (see the module docstring). ``progress``: a tqdm bar, advanced per query."""
    import numpy as np

    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    ap = SelectionEngine(banks[:1], SelectConfig(), device="cpu", threads=1, ann_min_units=1)
    ex = copy.copy(ap)  # the same tables (one copy of a large bank in memory), searched exactly
    ex.plan = replace(ap.plan, ann_min_units=None)
    default_plan = ap.plan
    t = time.perf_counter()
    ap.select_units(ids[:1], qs[:1], Z[:1])  # builds the bank's index
    first = time.perf_counter() - t
    ex.select_units(ids[:1], qs[:1], Z[:1])
    ex_c = ex.candidate_sets(ids, qs, Z)
    off = banks[0].thread_offsets
    rows = []
    ex_p = None
    for s in settings:
        ap.plan = replace(default_plan, **s)
        pe, pa, te, ta = [], [], [], []
        for i in range(len(ids)):  # side by side, query by query
            p, dt = _timed(ex, ids, qs, Z, i)
            pe.append(p)
            te.append(dt)
            p, dt = _timed(ap, ids, qs, Z, i)
            pa.append(p)
            ta.append(dt)
            if progress is not None:
                progress.update(1)
        if ex_p is None:
            ex_p = pe
        assert pe == ex_p, "exact picks changed between runs"
        te, ta = np.array(te), np.array(ta)
        plan = ap.plan
        rows.append({"settings": {"ann_shortlist": plan.ann_shortlist, "ann_ef_search": plan.ann_ef_search,
                                  "ann_nprobe": plan.ann_nprobe, "ann_index": plan.ann_kind},
                     "default": not s,
                     "recall": recalls(ap.candidate_sets(ids, qs, Z), ex_c, pa, pe, off),
                     "search_at_M": summary(search_recall(ap, Z, plan.ann_shortlist)),
                     "exact_ms": 1e3 * float(np.median(te)), "approx_ms": 1e3 * float(np.median(ta)),
                     "latency_ratio": float(np.median(ta / np.maximum(te, 1e-9)))})
    ap.plan = default_plan
    d = rows[0]["recall"]["units"]["mean"]
    return {"first_approx_query_s": first, "index": default_plan.ann_kind, "rows": rows,
            "gate": {"metric": "mean candidate-unit recall at the default settings", "target": TARGET,
                     "value": d, "met": bool(d >= TARGET)}}


def point(spec: dict) -> dict:
    """One synthetic bank of ``spec["units"]`` units (``dim``, ``seed``, ``queries``), measured by
    :func:`measure_bank` at ``spec["settings"]`` (default :data:`SETTINGS`)."""
    from benchmarks.synthetic_banks import make_banks, make_queries

    from .query import _rss

    with harness.pin_threads(1):
        t = time.perf_counter()
        banks = make_banks(1, units=int(spec["units"]), d=int(spec["dim"]), seed=int(spec["seed"]))
        ids, qs, Z = make_queries(banks, int(spec["queries"]), seed=int(spec["seed"]) + 1)
        built = time.perf_counter() - t
        rec = measure_bank(banks, ids, qs, Z, [dict(s) for s in spec.get("settings", SETTINGS)])
    return dict(rec, spec=spec, units=int(spec["units"]), threads=int(banks[0].n_threads), bank_s=built, **_rss())


def child(spec: dict, timeout: float = 3_600.0) -> dict:
    """:func:`point` in a child process (``python -m benchmarks.scale_bench.ann_recall --point JSON``),
    its BLAS and torch pools at one thread (``query._child``)."""
    from .query import _child

    return _child(dict(spec, threads=1), timeout, module=__name__)


if __name__ == "__main__":  # a child process: one point
    from .query import child_main

    child_main(point, "benchmarks.scale_bench.ann_recall", "ann-recall")
