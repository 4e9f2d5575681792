"""Medians over rounds, the headline targets, the table and the figure of the load test."""
from __future__ import annotations

import numpy as np

from .. import harness


def median_cells(cells: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["server"], c["conc"], c["route"], c["queries_per_call"], c.get("vectors", False)),
                          []).append(c)
    out = []
    for key, cs in groups.items():
        m = dict(cs[0])
        for k in ("throughput_qps", "p50_ms", "p95_ms", "p99_ms", "mean_batch", "worker_busy", "server_cpu_cores",
                  "inproc_qps", "served_over_inproc"):
            vals = [c[k] for c in cs if c.get(k) is not None and not np.isnan(c[k])]
            m[k] = float(np.median(vals)) if vals else None
        m["failed"] = sum(c["failed"] for c in cs)
        m["rounds"] = len(cs)
        m["served_over_inproc_rounds"] = [c.get("served_over_inproc") for c in cs]
        out.append(m)
    return out


def table(rows: list[dict]) -> str:
    head = ("| server | clients | queries/s | p50 ms | p95 ms | p99 ms | p99/p50 | mean batch | in-process q/s "
            "(same batch) | served / in-process | worker busy | failed |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['server']} | {r['conc']} | {r['throughput_qps']:.1f} | {r['p50_ms']:.0f} | "
                     f"{r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {r['p99_ms'] / r['p50_ms']:.2f} | "
                     f"{r['mean_batch']:.1f} | {(r.get('inproc_qps') or float('nan')):.1f} | "
                     f"{(r.get('served_over_inproc') or float('nan')):.2f} | {r['worker_busy']:.2f} | {r['failed']} |")
    return "\n".join(lines)


def plot(rows: list[dict]):
    """The figure: p50 and p99 latency against throughput per server, labelled by clients."""
    fig, ax = harness.figure(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(r["server"] for r in rows):
        rs = sorted((r for r in rows if r["server"] == name), key=lambda r: r["conc"])
        x = [r["throughput_qps"] for r in rs]
        for a, k in zip(ax, ("p50_ms", "p99_ms")):
            a.plot(x, [r[k] for r in rs], marker="o", label=name)
            for r in rs:
                a.annotate(str(r["conc"]), (r["throughput_qps"], r[k]), fontsize=7, textcoords="offset points",
                           xytext=(3, 3))
    for a, k in zip(ax, ("p50", "p99")):
        a.set_xlabel("throughput (queries/s)")
        a.set_ylabel(f"{k} latency (ms)")
        a.set_yscale("log")
        a.grid(alpha=0.3)
        a.set_title(f"{k} latency vs throughput (labels: concurrent clients)")
    ax[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def targets(cells: list[dict], where: list[dict], rows: list[dict], ref: str, base: str | None, fronts: list[str],
            concs: list[int], rounds: int, appended: dict, api_stored: dict, disk_stored: dict) -> dict:
    """The load test's headline figures: ratios taken within each round (dynamic batching over
    batch-size-1, this version over ``base``'s server, HTTP front processes over the reference
    server), their medians, failures, and turns appended against stored. ``ref``: the reference
    server's name; ``rows``: :func:`median_cells` of the text cells."""
    dyn = {r["conc"]: r for r in rows if r["server"] == ref}
    failed = sum(c["failed"] for c in cells + where) + sum(c["append_failures"] for c in cells + where)
    # dynamic batching over batch-size-1 serving: the two cells of one round ran back to back
    by = {(c["server"], c["conc"], c["round"]): c["throughput_qps"] for c in cells}
    speedup = {c: [by[(ref, c, r)] / by[("batch1", c, r)] for r in range(rounds)
                   if (ref, c, r) in by and ("batch1", c, r) in by] for c in concs}
    # client-supplied vectors: this version over the baseline tree's, per round (cells back to back)
    vby = {(c["server"], c["route"], c["round"]): c["throughput_qps"] for c in where}
    after_over_before = {} if base is None else {
        route: [vby[(ref, route, r)] / vby[(base, route, r)] for r in range(rounds)]
        for route in ("/v1/select", "/v1/select/batch")}
    vspeed = [vby[(ref, "/v1/select", r)] / vby[("batch1", "/v1/select", r)] for r in range(rounds)
              if (ref, "/v1/select", r) in vby and ("batch1", "/v1/select", r) in vby]
    fronts_ratio = {f: {route: [vby[(f, route, r)] / vby[(ref, route, r)] for r in range(rounds)
                                if (f, route, r) in vby and (ref, route, r) in vby]
                        for route in ("/v1/select", "/v1/select/batch")} for f in fronts}
    fronts_b1 = {f: [vby[(f, "/v1/select", r)] / vby[("batch1", "/v1/select", r)] for r in range(rounds)
                     if (f, "/v1/select", r) in vby and ("batch1", "/v1/select", r) in vby] for f in fronts}
    return {
        "reference_server": ref,
        "vectors_fronts_over_reference": {f: {k: float(np.median(v)) for k, v in d.items() if v}
                                          for f, d in fronts_ratio.items()},
        "vectors_fronts_over_reference_rounds": fronts_ratio,
        "vectors_fronts_over_batch1": {f: float(np.median(v)) for f, v in fronts_b1.items() if v},
        "vectors_fronts_over_batch1_rounds": fronts_b1,
        "vectors_dynamic_over_batch1": float(np.median(vspeed)) if vspeed else None,
        "vectors_dynamic_over_batch1_rounds": vspeed,
        "vectors_after_over_before": {k: float(np.median(v)) for k, v in after_over_before.items()},
        "vectors_after_over_before_rounds": after_over_before,
        "served_over_inproc_at_64": dyn.get(64, {}).get("served_over_inproc"),
        "served_over_inproc_at_64_rounds": dyn.get(64, {}).get("served_over_inproc_rounds"),
        "dynamic_over_batch1": {c: float(np.median(v)) for c, v in speedup.items() if v},
        "dynamic_over_batch1_rounds": speedup,
        "worst_p99_over_p50": max((r["p99_ms"] / r["p50_ms"] for r in rows), default=None),
        "failed": failed,
        "turns_appended": appended, "turns_stored_api": api_stored, "turns_stored_disk": disk_stored,
        "turns_match": appended == api_stored == disk_stored,
    }
