"""Query-side scaling curves of the selection engine, with a model of where the time goes.

Three curves, each point measured in a fresh child process (its own peak RSS, no allocator
history from the point before) on synthetic banks (``benchmarks/synthetic_banks.py``: threads of
about 8 units, topic structure, BM25 overlap, kNN head edges), the default method
(``SelectConfig()``) and the default query (``QueryParams()``: B = 16, H = 1), the engine pinned
to ``threads`` CPU threads:

* **bank size**: one bank of ``N`` units, ``N`` from 10^3 to 10^6; per-query latency (a batch of
  one, median, p90 and p99 over ``rounds`` queries; the first query's wall seconds apart, as it
  compiles what numba's cache lacks), the wall seconds of ``SelectionEngine.warm_up`` before it
  (``warm_up_s``: an approximate bank's index, built by its first query otherwise; the compiled
  pass only some approximate queries take is compiled at engine build, ``engine_s``), the engine's per-step seconds of those queries
  (``SelectionEngine.last_timings``), throughput (a batch of ``batch`` queries), build seconds, the
  engine's bytes, the process's resident memory (now, peak, anonymous: ``_rss``) and, past the
  approximate threshold, the unit index's time per append of 1 and 8 units (``ann.append_update_ms``).

Time is the engine thread's CPU time (``time.thread_time``; the engine is pinned to one thread):
on the shared 2-core machine wall time holds however long the process waited for a core (a load
of 10-18 while these ran), which no code change moves. ``latency_ms`` and ``qps`` are CPU figures;
``wall_ms`` keeps the wall time beside them; a step's time is its share of the query's wall time
(``last_timings``) times the query's CPU time. Two series: ``d = 384`` (MiniLM's width) up to 10^5 units, and ``d = 64`` up
  to 10^6 (at ``d = 384`` a million float64 unit vectors alone take 2.9 GiB, past what this shared
  24 GiB machine lends one process; the step model below says what ``d`` changes);
* **number of banks**: ``B`` banks of ``units`` units (``d = 64``), B from 10 to 10^5, queries
  spread over the banks at random;
* **batch size**: one collection (``batch_banks`` banks), batches of 1 to 1,024 queries.

The model: per step, a least-squares fit ``t(N) = a + b N`` (milliseconds) over the bank-size
points of a series, so ``b`` is the step's cost per unit of the bank and ``a`` its fixed cost per
query; the record keeps each step's share of the latency at each size, and the log-log slope of
the total between the last two sizes (1 = linear).

Entry points: :func:`run_query_curves` (the scale runner calls it; returns the record and writes
nothing), :func:`figure` (the PNG), and ``python -m benchmarks run scale-query`` (saves both).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .. import harness

SIZES = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
SIZES_WIDE = (1_000, 3_000, 10_000, 30_000, 100_000)
"""Bank sizes of the ``d = 64`` series and of the ``d = 384`` one."""
BANKS = (10, 100, 1_000, 10_000, 100_000)
BATCHES = (1, 4, 16, 64, 256, 1_024)
ANN_SIZES = ((100_000, 64), (300_000, 64), (1_000_000, 64), (100_000, 384))
"""``(units, d)`` of the banks searched both exactly and approximately (``ann.py``)."""
QUICK = dict(sizes=(300, 1_000), sizes_wide=(300,), banks=(10, 30), batches=(1, 8), rounds=5, batch=16,
             units=20, batch_banks=20, ann_sizes=((1_500, 32),))


# ----------------------------------------------------------------------------------------------
# one point, in a child process
# ----------------------------------------------------------------------------------------------
def _rss() -> dict:
    """The process's resident memory now (``vmrss_mib``), its peak (``vmhwm_mib``) and the anonymous
    part of the resident set (``rssanon_mib``: heap and arrays, no mapped files or shared libraries)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon"):
            out[k.lower() + "_mib"] = int(v.split()[0]) / 1024.0
    return out


def _latency(eng, ids, qs, Z, rounds: int) -> tuple[list, list, dict, float]:
    """Wall and thread-CPU seconds of ``rounds`` single-query selects (after 2 warm-up ones), per
    step the median of its share of the wall time times the query's CPU time (ms), and the first
    warm-up's wall seconds (what numba's cache lacks is compiled then; an approximate bank's index
    is built before, by ``SelectionEngine.warm_up``)."""
    import numpy as np

    first = time.perf_counter()
    for i in range(min(2, len(ids))):
        eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
        if i == 0:
            first = time.perf_counter() - first
    ts, cpu, steps = [], [], {}
    for i in range(rounds):
        j = i % len(ids)
        t, c = time.perf_counter(), time.thread_time()
        eng.select_units(ids[j:j + 1], qs[j:j + 1], Z[j:j + 1])
        c, t = time.thread_time() - c, time.perf_counter() - t
        ts.append(t)
        cpu.append(c)
        tot = max(sum(eng.last_timings.values()), 1e-12)
        for k, v in eng.last_timings.items():
            steps.setdefault(k, []).append(v / tot * c)
    return ts, cpu, {k: 1e3 * float(np.median(v)) for k, v in steps.items()}, float(first)


def _throughput(eng, ids, qs, Z, batch: int, repeat: int = 3) -> float:
    """Queries per CPU second (the thread's; the engine runs on one) of batches of ``batch``
    queries (best of ``repeat``)."""
    best = float("inf")
    for r in range(repeat):
        s = (r * batch) % max(1, len(ids) - batch + 1)
        t = time.thread_time()
        eng.select_units(ids[s:s + batch], qs[s:s + batch], Z[s:s + batch])
        best = min(best, time.thread_time() - t)
    return batch / max(best, 1e-9)


def _plan(eng, banks) -> dict:
    """The engine's plan for the point: backend, front, tables, its ``ann_min_units`` threshold and
    whether the largest bank is searched approximately (at or past it)."""
    thr = eng.plan.ann_min_units
    return {"backend": eng.plan.backend, "front": eng.plan.front, "tables": bool(eng.plan.tables),
            "ann_min_units": thr, "approximate": thr is not None and max(b.n_units for b in banks) >= thr}


def point(spec: dict) -> dict:
    """Measure one point (``spec``: ``kind`` ``size`` / ``banks`` / ``batch`` / ``ann`` and its sizes)."""
    from benchmarks.synthetic_banks import make_banks, make_queries

    if spec["kind"] == "ann":
        from .ann import recall_point

        return dict(recall_point(spec), **_rss())
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    threads = int(spec.get("threads", 1))
    with harness.pin_threads(threads):
        t0 = time.perf_counter()
        banks = make_banks(int(spec["n_banks"]), units=int(spec["units"]), d=int(spec["dim"]), seed=int(spec["seed"]))
        t_banks = time.perf_counter() - t0
        t0 = time.perf_counter()
        eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=threads, **spec.get("engine", {}))
        t_engine = time.perf_counter() - t0
        t0 = time.perf_counter()
        warmed = eng.warm_up()  # the approximate banks' indexes (and the rare compiled pass: at build) before any query
        t_warm = time.perf_counter() - t0
        n_q = max(int(spec["rounds"]), max(spec.get("batches", [spec["batch"]])) * 3)
        ids, qs, Z = make_queries(banks, n_q, seed=int(spec["seed"]) + 1)
        out = {"spec": spec, "banks_s": t_banks, "engine_s": t_engine, "warm_up_s": t_warm, "warmed_banks": len(warmed),
               "engine_mib": eng.nbytes() / 2 ** 20,
               "table_mib": eng.table_nbytes() / 2 ** 20, "units": sum(b.n_units for b in banks),
               "threads_mean": sum(b.n_threads for b in banks) / len(banks),
               "plan": _plan(eng, banks)}
        ts, cpu, steps, out["first_query_s"] = _latency(eng, ids, qs, Z, int(spec["rounds"]))
        out.update(latency_ms={f"p{q}": 1e3 * harness.pct(cpu, q) for q in (50, 90, 99)},
                   wall_ms={f"p{q}": 1e3 * harness.pct(ts, q) for q in (50, 90, 99)}, steps_ms=steps,
                   cpu_ms=[round(1e3 * c, 3) for c in cpu])
        out["qps"] = {str(b): _throughput(eng, ids, qs, Z, int(b)) for b in spec.get("batches", [spec["batch"]])}
        out.update(_rss())
        from .ann import append_update_ms

        out["index_append_ms"] = append_update_ms(eng)  # last: it grows the index ({} when none was built)
    return out


def _child(spec: dict, timeout: float, module: str = __name__) -> dict:
    """:func:`point` in a child process (``python -m benchmarks.scale_bench.query --point JSON``;
    ``module``: another module's ``--point``, which prints its point's JSON last)."""
    env = dict(os.environ, **{k: str(spec.get("threads", 1)) for k in harness.THREAD_VARS})
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", module, "--point", json.dumps(spec)],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=harness.ROOT)
    if r.returncode != 0:
        return {"spec": spec, "error": "\n".join(r.stderr.strip().splitlines()[-6:])}
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    rec["wall_s"] = time.perf_counter() - t
    return rec


# ----------------------------------------------------------------------------------------------
# the curves and the model
# ----------------------------------------------------------------------------------------------
def step_model(points: list[dict]) -> dict:
    """Per step, ``t(N) = a + b N`` (ms) fitted over ``points`` (one bank of ``units`` units each),
    each step's share of the latency per size, and the log-log slope of the latency over the last
    two sizes."""
    import numpy as np

    pts = [p for p in points if "error" not in p]
    if len(pts) < 2:
        return {}
    N = np.array([p["units"] for p in pts], dtype=float)
    steps = sorted({k for p in pts for k in p["steps_ms"]})
    A = np.stack([np.ones_like(N), N], axis=1) / N[:, None]  # relative errors: every size counts alike
    fit = {}
    for s in steps:
        t = np.array([p["steps_ms"].get(s, 0.0) for p in pts])
        (a, b), *_ = np.linalg.lstsq(A, t / N, rcond=None)
        fit[s] = {"fixed_ms": float(a), "per_unit_us": float(b) * 1e3}
    total = np.array([sum(p["steps_ms"].values()) for p in pts])
    share = {str(int(n)): {s: p["steps_ms"].get(s, 0.0) / max(tt, 1e-12) for s in steps}
             for n, p, tt in zip(N, pts, total)}
    lat = np.array([p["latency_ms"]["p50"] for p in pts])
    slope = float(np.log(lat[-1] / lat[-2]) / np.log(N[-1] / N[-2])) if lat[-2] > 0 else float("nan")
    return {"fit": fit, "share": share, "loglog_slope_last": slope,
            "dominant_at_largest": max(steps, key=lambda s: pts[-1]["steps_ms"].get(s, 0.0))}


def switch_model(points: list[dict]) -> dict:
    """The cost fits behind ``ann_min_units="auto"`` (``engine/plan.py``: ``EXACT_MS``,
    ``APPROX_MS``, ``ann_threshold``) from approximate points, each of which times both searches
    on one bank: per search, ``t = a + N (b + c d)`` ms by least squares over the points' p50s
    with relative errors (every point counts alike), and the threshold those fits give per width
    the points hold. Empty unless the points span two sizes and two widths (three unknowns)."""
    import numpy as np

    from trawmem_gpu.select.engine.plan import ann_threshold

    pts = [p for p in points if "error" not in p and p.get("exact_ms") and p.get("approx_ms")]
    N = np.array([float(p["units"]) for p in pts])
    d = np.array([float(p["spec"]["dim"]) for p in pts])
    if len(set(N)) < 2 or len(set(d)) < 2:
        return {}
    fits = {}
    for name in ("exact_ms", "approx_ms"):
        t = np.array([float(p[name]) for p in pts])
        A = np.stack([np.ones_like(N), N, N * d], axis=1) / t[:, None]
        coef, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
        fits[name] = [float(x) for x in coef]
        fits[name + "_residual"] = [round(float(r), 4) for r in (A @ coef - 1.0)]  # relative, per point
    fits["points"] = [[int(n), int(w)] for n, w in zip(N, d)]
    fits["threshold"] = {str(int(w)): ann_threshold(int(w), fits["exact_ms"], fits["approx_ms"])
                         for w in sorted(set(d.tolist()) | {64.0, 384.0})}
    return fits


def run_query_curves(out_dir=None, sizes=SIZES, sizes_wide=SIZES_WIDE, banks=BANKS, batches=BATCHES,
                     quick: bool = False, ann_sizes=ANN_SIZES, **kw) -> dict:
    """The three curves (see the module docstring) and the exact-against-approximate points
    (``ann_sizes``, ``ann.recall_point``) as one record; ``quick`` runs the smallest sizes
    (``QUICK``) for tests. ``kw``: ``rounds`` (20), ``batch`` (64), ``units`` per bank of the
    banks curve (20), ``batch_banks`` (1,000), ``threads`` (1), ``timeout`` per point (1,800 s),
    ``engine`` (EngineConfig options for every point), ``progress`` (print a line per point),
    ``inline`` (measure every point in this process instead of a child: the tests' cheap run),
    ``bank_cache`` (a folder of pickled banks the approximate points read when theirs is there:
    ``ann.cached_bank``), ``passes`` (times an approximate point's queries are timed in a row, 1)
    and ``processes`` (fresh processes per approximate point, 1: :func:`over_processes`).
    ``out_dir`` is accepted for the scale runner's call and unused: the caller saves."""
    o = dict(rounds=20, batch=64, units=20, batch_banks=1_000, threads=1, timeout=1_800.0, engine={}, progress=True,
             inline=False)
    if quick:
        o.update(QUICK)
        sizes, sizes_wide, banks, batches, ann_sizes = (QUICK[k] for k in ("sizes", "sizes_wide", "banks", "batches",
                                                                          "ann_sizes"))
    o.update(kw)
    base = dict(rounds=o["rounds"], batch=o["batch"], threads=o["threads"], seed=7, engine=o["engine"])

    def run(spec):
        rec = point(dict(base, **spec)) if o["inline"] else _child(dict(base, **spec), o["timeout"])
        if o["progress"] and spec["kind"] == "ann":
            print(f"  {spec}: exact {rec.get('exact_ms', float('nan')):.1f} / {rec.get('exact_p99_ms', float('nan')):.1f} ms,"
                  f" approximate {rec.get('approx_ms', float('nan')):.1f} / {rec.get('approx_p99_ms', float('nan')):.1f} ms"
                  f" (p50 / p99), candidate recall {rec.get('candidate_recall')}, picks {rec.get('pick_recall')},"
                  f" q/s {rec.get('qps')}, index append {rec.get('index_append_ms')} ms, peak {rec.get('vmhwm_mib', 0):.0f} MiB"
                  + (f" ERROR {rec['error']}" if "error" in rec else ""), file=sys.stderr, flush=True)
        elif o["progress"]:
            lat = rec.get("latency_ms", {}).get("p50", float("nan"))
            print(f"  {spec}: p50 {lat:.2f} ms, {rec.get('qps', {})} q/s, peak {rec.get('vmhwm_mib', 0):.0f} MiB"
                  + (f" ERROR {rec['error']}" if "error" in rec else ""), file=sys.stderr, flush=True)
        return rec

    rec = {"threads": o["threads"], "rounds": o["rounds"], "batch": o["batch"], "quick": quick, "engine": o["engine"],
           "size": {}, "banks": [], "batch_size": {}}
    for dim, ns in ((384, sizes_wide), (64, sizes)):
        pts = [run(dict(kind="size", n_banks=1, units=n, dim=dim)) for n in ns]
        rec["size"][f"d{dim}"] = {"points": pts, "model": step_model(pts)}
    rec["banks"] = [run(dict(kind="banks", n_banks=b, units=o["units"], dim=64)) for b in banks]
    rec["batch_size"] = run(dict(kind="batch", n_banks=o["batch_banks"], units=o["units"], dim=64,
                                 batches=list(batches), batch=max(batches))) if batches else {}
    rec["ann"] = [over_processes([run(dict(kind="ann", n_banks=1, units=p[0], dim=p[1], ann=o.get("ann", {}),
                                           passes=int(o.get("passes", 1)), **({"topics": p[2]} if len(p) > 2 else {}),
                                           **({"bank_cache": str(o["bank_cache"])} if o.get("bank_cache") else {})))
                                   for _ in range(max(1, int(o.get("processes", 1))))]) for p in ann_sizes]
    rec["switch"] = switch_model(rec["ann"])
    return rec


def over_processes(recs: list[dict]) -> dict:
    """One approximate point measured in ``len(recs)`` fresh processes: the first one's record,
    with, past one, ``processes`` (each one's latencies and agreement) and ``approx_ms_processes``
    (the median, least and most of their p50s). Whole processes differ here by 0.5-1 ms at 10^6
    units (where the tables and the index land in memory; docs/scaling.md), more than a row of 40
    queries shows: their median is the reading of a point. (``inline``: the same process each time,
    which tests the plumbing only.)"""
    import numpy as np

    good = [r for r in recs if "error" not in r]
    if len(recs) < 2 or not good:
        return recs[0]
    keys = ("approx_ms", "approx_p99_ms", "approx_pass_ms", "exact_ms", "same_picks", "vmhwm_mib", "first_approx_query_s")
    each = [{k: r.get(k) for k in keys} | {"candidate_recall": r["candidate_recall"]["mean"],
                                           "pick_recall": r["pick_recall"]["mean"]} for r in good]
    p50 = [r["approx_ms"] for r in good]
    return dict(good[0], processes=each, errors=[r["error"] for r in recs if "error" in r],
                approx_ms_processes={"median": float(np.median(p50)), "min": min(p50), "max": max(p50), "n": len(p50),
                                     "p99_median": float(np.median([r["approx_p99_ms"] for r in good]))})


def run(args) -> dict:
    """The scale runner's entry (``bench_scale.py --parts query``): :func:`run_query_curves` with
    its ``--quick``, ``--threads`` and ``--timeout``."""
    return run_query_curves(quick=bool(args.quick), threads=int(args.threads), timeout=float(args.timeout))


def plot(axes, rec: dict) -> None:
    """The scale runner's panel: latency against one bank's size on ``axes[0]``."""
    _plot_size(axes[0], rec)


def _plot_size(ax, rec: dict) -> None:
    """p50 latency against one bank's size (total and, for d64, per step; approximate search beside)."""
    for name, series in rec["size"].items():
        pts = [p for p in series["points"] if "error" not in p]
        if not pts:
            continue
        N = [p["units"] for p in pts]
        ax.plot(N, [p["latency_ms"]["p50"] for p in pts], "o-", lw=2, label=f"p50 latency, {name}")
        if name == "d64":
            for s in sorted({k for p in pts for k in p["steps_ms"]}):
                ax.plot(N, [max(p["steps_ms"].get(s, 0.0), 1e-4) for p in pts], "--", lw=1, label=f"  {s}")
    for dim, color in ((64, "k"), (384, "C7")):
        ann = sorted((p for p in rec.get("ann", []) if "error" not in p and p["spec"]["dim"] == dim),
                     key=lambda p: p["units"])
        if ann:
            N = [p["units"] for p in ann]
            ax.plot(N, [p["approx_ms"] for p in ann], "D-", color=color, lw=2, label=f"approximate p50, d{dim}")
            ax.plot(N, [p["exact_ms"] for p in ann], "x:", color=color, lw=1, label=f"exact p50 (same banks), d{dim}")
    ax.set(xscale="log", yscale="log", xlabel="units in the bank", ylabel="ms per query (batch of 1)",
           title="one bank's size")
    ax.legend(fontsize=7)


def merge(parts: list[dict]) -> dict:
    """One record of several runs' records (a curve run in pieces): the first part's settings, the
    size series' points of every part by width (sorted by size, the step model refitted), the
    approximate points of every part (sorted by width and size, the switch model refitted), the
    banks and batch curves of the first part that has them, and each part's command and machine
    under ``parts``."""
    if not parts:
        raise ValueError("merge needs at least one record")
    out = {k: v for k, v in parts[0].items() if k not in ("size", "ann", "banks", "batch_size", "machine", "command", "commit")}
    series: dict = {}
    for r in parts:
        for name, s in r.get("size", {}).items():
            series.setdefault(name, []).extend(s["points"])
    out["size"] = {}
    for name, pts in series.items():
        pts = sorted(pts, key=lambda p: p.get("units", p["spec"]["units"]))
        out["size"][name] = {"points": pts, "model": step_model(pts)}
    out["ann"] = sorted((p for r in parts for p in r.get("ann", [])), key=lambda p: (p["spec"]["dim"], p["spec"]["units"]))
    out["switch"] = switch_model(out["ann"])
    out["banks"] = next((r["banks"] for r in parts if r.get("banks")), [])
    out["batch_size"] = next((r["batch_size"] for r in parts if r.get("batch_size")), {})
    out["parts"] = [{"command": r.get("command"), "machine": r.get("machine"), "commit": r.get("commit")} for r in parts]
    return out


def figure(rec: dict):
    """Three panels: latency against one bank's size (total and per step), throughput against the
    number of banks, throughput and latency against the batch size; the first alone when the
    record has neither of the other two curves (``--banks '' --batches ''``)."""
    if not rec.get("banks") and not rec.get("batch_size"):
        fig, ax = harness.figure(1, 1, figsize=(8, 5))
        _plot_size(ax, rec)
        fig.tight_layout()
        return fig
    fig, ax = harness.figure(1, 3, figsize=(16, 4.6))
    _plot_size(ax[0], rec)
    pts = [p for p in rec["banks"] if "error" not in p]
    if pts:
        B = [p["spec"]["n_banks"] for p in pts]
        ax[1].plot(B, [p["qps"][str(p["spec"]["batch"])] for p in pts], "o-", label=f"q/s, batches of {rec['batch']}")
        ax1b = ax[1].twinx()
        ax1b.plot(B, [p["latency_ms"]["p50"] for p in pts], "s--", color="C3", label="p50 ms, batch of 1")
        ax1b.set_ylabel("ms per query (batch of 1)")
        ax[1].set(xscale="log", xlabel="banks (20 units each)", ylabel="queries / s", title="number of banks")
        ax[1].legend(loc="lower left", fontsize=8)
        ax1b.legend(loc="upper right", fontsize=8)
    p = rec["batch_size"]
    if "qps" in p:
        bs = sorted(int(b) for b in p["qps"])
        ax[2].plot(bs, [p["qps"][str(b)] for b in bs], "o-", label="queries / s")
        ax2b = ax[2].twinx()
        ax2b.plot(bs, [1e3 * b / p["qps"][str(b)] for b in bs], "s--", color="C3", label="ms per batch")
        ax2b.set(yscale="log", ylabel="ms per batch")
        ax[2].set(xscale="log", xlabel="queries per batch", ylabel="queries / s",
                  title=f"batch size ({p['spec']['n_banks']} banks)")
        ax[2].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def commit() -> str | None:
    """The checkout's ``git rev-parse HEAD`` (with ``+dirty`` when tracked files differ from it),
    or None outside a git checkout: which code a curve measured."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=harness.ROOT,
                              timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=harness.ROOT, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def child_main(point_of, module: str, run: str) -> None:
    """The ``__main__`` of a module whose points run in a child process (:func:`_child`): ``--point
    JSON`` prints ``point_of(spec)`` as JSON and exits 0; anything else exits with the usage
    (``run``: the benchmark that runs the whole thing)."""
    if len(sys.argv) == 3 and sys.argv[1] == "--point":
        print(json.dumps(point_of(json.loads(sys.argv[2])), default=float))
        sys.exit(0)
    sys.exit(f"usage: python -m {module} --point JSON (the whole run: python -m benchmarks run {run})")


if __name__ == "__main__":  # a child process: one point
    child_main(point, "benchmarks.scale_bench.query", "scale-query")
