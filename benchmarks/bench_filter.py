"""The cost of a filter (``where=``) inside the engine against no filter, paired in one run.

Banks: the LoCoMo dev banks (``--data``), each turn given the metadata a shared memory carries:
``user_id`` by session (two users take turns by session, so a user filter keeps or drops whole
threads), ``importance`` 0..3 and ``topic`` t0..t9 per turn (from a hash of its id, so a range or
a topic cuts threads: the bridge feature is then taken from the candidates, not the table), and
``at``, the turn's date (ISO). Queries: the select benchmark's target point (Q = 1024 LoCoMo dev
questions, B = 16, H = 1, U ~ 145 through the neighbourhood cap), the CPU default engine
(``--backend``), every pool pinned to ``--threads``.

Scenarios, each one batched ``select_units`` call over the same 1024 queries:

==============  ==============================================================  =============
``none``        no filter                                                        the baseline
``all_pass``    ``{"user_id": {"exists": true}}``: every unit passes (no mask   parse and
                is kept, so the selection is the unfiltered one)                 evaluate only
``user``        ``{"user_id": "u1"}``                                            whole threads
``importance``  ``{"importance": {"gte": 2}}``                                   threads cut
``compound``    ``{"and": [user in (u1, u2), {"or": [topic in 3, importance      threads cut
                == 3]}]}``
``recent``      ``{"at": {"gte": D}}`` with D the bank's median date            whole threads
``selective``   ``{"topic": "t0"}``: about a tenth of the units                  threads cut
==============  ==============================================================  =============

Each round runs every scenario once, in an order rotated from round to round; a scenario's ratio
to ``none`` is taken within the round (the machine's speed drifts between rounds), its median
over rounds reported with the range. Per scenario also: median seconds per call and queries/s,
the mask's own cost per call (``masks_of``: parsing, the bank's columns kept across calls, the
vectorized evaluation), the stage split of the engine call (``last_timings``), the share of units
that pass, picks per query, and agreement with the reference (``select_reference(..., keep=)``)
on ``--check`` queries; and, beside the picks per query, how many of the unfiltered selection's
picks pass (what filtering after retrieval would leave). Writes ``filter.json`` and ``filter.png``
under ``benchmarks/results/``.

    python -m benchmarks run filter [--rounds 15] [--threads 1] [--backend compiled|tensor] [--check 48]
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import time
import zlib

from . import harness

TARGET = dict(budget=16, hops=1, n_seeds=8)
SCENARIOS = ("none", "all_pass", "user", "importance", "compound", "recent", "selective")


def tag_banks(banks):
    """The banks with every turn's metadata set (module docstring)."""
    from dataclasses import replace

    out = []
    for b in banks:
        sessions = sorted({t.session for t in b.turns})
        user = {s: f"u{1 + i % 2}" for i, s in enumerate(sessions)}
        turns = []
        for t in b.turns:
            h = zlib.crc32(f"{b.bank_id}/{t.turn_id}".encode())
            meta = {"user_id": user[t.session], "importance": h % 4, "topic": f"t{(h >> 4) % 10}"}
            if t.time is not None:
                meta["at"] = t.time.isoformat()
            turns.append(replace(t, metadata=meta))
        out.append(replace(b, turns=turns))
    return out


FILTERS = {"none": None, "all_pass": {"user_id": {"exists": True}}, "user": {"user_id": "u1"},
           "importance": {"importance": {"gte": 2}},
           "compound": {"and": [{"user_id": {"in": ["u1", "u2"]}},
                                {"or": [{"topic": {"in": ["t1", "t2", "t3"]}}, {"importance": 3}]}]},
           "recent": {"at": {"gte": "<the bank's median date>"}}, "selective": {"topic": "t0"}}
"""Each scenario's filter (``recent``'s date is its bank's: :func:`scenario_wheres`)."""


def scenario_wheres(banks, ids: list[str]) -> dict:
    """``{scenario: where}`` for the queries of banks ``ids`` (``recent``: one filter per query)."""
    median = {}
    for b in banks:
        times = sorted(t.time for t in b.turns if t.time is not None)
        median[b.bank_id] = times[len(times) // 2].isoformat() if times else "1970-01-01"
    out = dict(FILTERS)
    out["recent"] = [{"at": {"gte": median[b]}} for b in ids]
    return out


def run(args) -> dict:
    import numpy as np

    from trawmem_gpu.select import clear_query_caches
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.select.reference import select_reference

    from .select_bench.data import RealData

    d = RealData(harness.require_data(args.data))
    banks = tag_banks(d.banks)
    cfg, qp = SelectConfig(), QueryParams(**TARGET, neighborhood_cap=d.config_for_U(145))
    ids, qs, Z = d.queries(args.queries)
    wheres = scenario_wheres(banks, ids)
    eng = SelectionEngine(banks, cfg, device="cpu", threads=args.threads, **({} if args.backend == "auto" else
                                                                            {"backend": args.backend}))
    picks, share, after = {}, {}, {}
    for s in SCENARIOS:  # warm (numba, columns) and the picks
        picks[s] = eng.select_units(ids, qs, Z, params=qp, where=wheres[s])
        m = eng.masks_of(ids, wheres[s]) or [None] * len(ids)
        share[s] = float(np.mean([1.0 if x is None else x.mean() for x in m]))
        # what a filter after retrieval keeps: the unfiltered picks that pass
        after[s] = float(np.mean([len(p) if x is None else int(x[p].sum()) for p, x in zip(picks["none"], m)]))
    times = {s: [] for s in SCENARIOS}
    mask_s = {s: [] for s in SCENARIOS}
    stages = {s: {} for s in SCENARIOS}
    for r in range(args.rounds):
        order = SCENARIOS[r % len(SCENARIOS):] + SCENARIOS[:r % len(SCENARIOS)]
        for s in order:
            clear_query_caches()
            t0 = time.perf_counter()
            eng.select_units(ids, qs, Z, params=qp, where=wheres[s])
            times[s].append(time.perf_counter() - t0)
            for k, v in eng.last_timings.items():
                stages[s].setdefault(k, []).append(v)
            t0 = time.perf_counter()
            eng.masks_of(ids, wheres[s])
            mask_s[s].append(time.perf_counter() - t0)
    ratio = {s: [t / b for t, b in zip(times[s], times["none"])] for s in SCENARIOS}
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    check = list(range(0, len(ids), max(1, len(ids) // args.check)))[:args.check]
    agree = {}
    for s in SCENARIOS:
        masks = eng.masks_of(ids, wheres[s]) or [None] * len(ids)
        agree[s] = float(np.mean([select_reference(ctx[ids[i]], qs[i], Z[i], cfg, qp, keep=masks[i]).units
                                  == picks[s][i] for i in check]))
    med = lambda xs: float(np.median(xs))  # noqa: E731
    rows = {s: {"median_s": med(times[s]), "queries_per_s": len(ids) / med(times[s]),
                "ratio_to_none_median": med(ratio[s]), "ratio_min_max": [min(ratio[s]), max(ratio[s])],
                "mask_s_median": med(mask_s[s]), "stages_median_s": {k: med(v) for k, v in stages[s].items()},
                "units_passing": share[s], "picks_per_query": float(np.mean([len(p) for p in picks[s]])),
                "post_filter_picks_per_query": after[s],
                "agreement_with_reference": agree[s], "where": FILTERS[s]}
            for s in SCENARIOS}
    return {"Q": len(ids), "B": qp.budget, "H": qp.hops, "neighborhood_cap": qp.neighborhood_cap,
            "threads": args.threads, "rounds": args.rounds, "backend": eng.plan.backend, "front": eng.plan.front,
            "checked_queries": len(check), "scenarios": rows}


def figure(rec):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rec["scenarios"])
    rows = [rec["scenarios"][n] for n in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    med = [r["ratio_to_none_median"] for r in rows]
    lo = [m - r["ratio_min_max"][0] for m, r in zip(med, rows)]
    hi = [r["ratio_min_max"][1] - m for m, r in zip(med, rows)]
    a.bar(names, med, yerr=[lo, hi], capsize=3, color=["#888"] + ["#4a7"] * (len(names) - 1))
    a.axhline(1.0, color="k", lw=0.8)
    a.set_ylabel("time / time without a filter (median of rounds)")
    a.set_title(f"filter cost, Q={rec['Q']}, B={rec['B']}, {rec['threads']} thread(s)")
    a.tick_params(axis="x", rotation=30)
    keys = sorted({k for r in rows for k in r["stages_median_s"]})
    bottom = [0.0] * len(names)
    for k in keys:
        vals = [r["stages_median_s"].get(k, 0.0) for r in rows]
        b.bar(names, vals, bottom=bottom, label=k)
        bottom = [x + y for x, y in zip(bottom, vals)]
    b.plot(names, [r["mask_s_median"] for r in rows], "k.", label="mask (masks_of)")
    b.set_ylabel("seconds per call (median)")
    b.set_title("stage split of the engine call")
    b.legend(fontsize=7)
    b.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(harness.dev_data("locomo")), help="LoCoMo dev file")
    p.add_argument("--rounds", type=int, default=15, help="rounds of every scenario (default: 15)")
    p.add_argument("--queries", type=int, default=1024, help="queries per call (default: 1024)")
    p.add_argument("--threads", type=int, default=1, help="threads every pool is pinned to (default: 1)")
    p.add_argument("--backend", choices=["auto", "compiled", "tensor"], default="auto",
                   help="the engine's backend (default: auto, the CPU default)")
    p.add_argument("--check", type=int, default=48, help="queries checked against the reference (default: 48)")
    p.add_argument("--out-dir", help="where filter.json / filter.png go (default: benchmarks/results)")
    args = p.parse_args()
    with harness.pin_threads(args.threads):
        rec = run(args)
    path = harness.save("filter", rec, figure(rec), args.out_dir)
    for n, r in rec["scenarios"].items():
        print(f"{n:<11} {r['median_s']:.3f} s/call  x{r['ratio_to_none_median']:.3f} "
              f"({r['ratio_min_max'][0]:.3f}-{r['ratio_min_max'][1]:.3f})  mask {r['mask_s_median'] * 1e3:.1f} ms  "
              f"pass {r['units_passing']:.2f}  picks {r['picks_per_query']:.1f} (after: "
              f"{r['post_filter_picks_per_query']:.1f})  agree {r['agreement_with_reference']:.3f}")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
