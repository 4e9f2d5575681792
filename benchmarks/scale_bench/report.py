"""``bench_scale``'s printed summary and figure (``scale.png``)."""
from __future__ import annotations


def summary(rec: dict) -> str:
    lines = [f"scale benchmark ({'quick' if rec.get('quick') else 'full'}), {rec.get('total_s')} s"]
    w = rec.get("writes")
    if w:
        lines.append("writes (medians; store: Collection.update; memory: Memory.add with the engine refresh):")
        for r in w["rows"]:
            if "error" in r:
                lines.append(f"  {r['n_units']:>7} units: {r['error']}")
                continue
            mem = r.get("append_memory")
            lines.append(f"  {r['n_units']:>7} units: append store {r['append_store']['total_s'] * 1e3:8.1f} ms"
                         + (f", memory {mem['total_s'] * 1e3:8.1f} ms (engine {mem['engine_s'] * 1e3:.1f})" if mem else "")
                         + f"; forget {r['forget_store']['total_s']:.2f} s; compact {r['compact_s']:.2f} s;"
                         f" peak {r.get('peak_rss_mb') or 0:.0f} MB")
        for sec, t in w["targets"].items():
            for n, v in t.items():
                lines.append(f"  target {sec}({n}) / base: {v['ratio']} (bound {v['bound']}: {'met' if v['met'] else 'NOT met'})")
        m = w["model"]["append_store"]
        for part, f in m.items():
            if part != "share_at_largest" and f.get("b_ms_per_1k_units") is not None:
                lines.append(f"  model append store {part}: {f['a_ms']:.2f} ms + {f['b_ms_per_1k_units']:.3f} ms per 1k units")
    for r in rec.get("opening") or ():
        if "error" in r:
            lines.append(f"  open {r.get('path')} {r['mode']}: {r['error']}")
            continue
        lines.append(f"  open {r['banks']:>6} banks {r['mode']:<5}: {r['open_s']:.2f} s, RSS "
                     f"{r['rss_after_open_mb'].get('VmRSS')} -> {r['rss_after_probe_mb'].get('VmRSS')} MB, select cold "
                     f"p50 {r['select_ms']['cold']['p50']} ms, warm p50 {r['select_ms']['warm']['p50']} ms")
    m = rec.get("many")
    if m and "error" not in m:
        lines.append(f"  many: {m['banks']} banks, {m['hot']} hot: hot p99 lazy {m['hot_ms']['lazy']['p99']} ms vs resident "
                     f"{m['hot_ms']['resident']['p99']} ms (ratio {m['hot_p99_ratio']}, target <= 1.5), cold p50 "
                     f"{m['cold_ms']['p50']} ms p99 {m['cold_ms']['p99']} ms; RSS {m['rss_mb'].get('VmRSS')} MB")
    elif m:
        lines.append(f"  many: {m['error']}")
    r = rec.get("ray")
    if r and "settings" in r:
        lines.append(f"  ray ({r['cpu_count']} cores, {r['questions']} LongMemEval-S questions): " + ", ".join(
            f"{k} {v['median_qps']} q/s" for k, v in r["settings"].items()))
    elif r:
        lines.append(f"  ray: {r.get('why')}")
    q = rec.get("query")
    if q is not None and not q.get("available"):
        lines.append(f"  query curves: {q['why']}")
    return "\n".join(lines)


def figure(rec: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(2, 3, figsize=(17, 8.5))
    ax = [axs[0][:2], axs[1][:2]]
    w = rec.get("writes")
    a = ax[0][0]
    if w:
        ok = [r for r in w["rows"] if "append_store" in r]
        xs = [r["n_units"] for r in ok]
        a.plot(xs, [r["append_store"]["total_s"] * 1e3 for r in ok], "o-", label="append, store")
        for part in ("encode_units_s", "encode_heads_s", "graph_s", "write_and_checks_s"):
            a.plot(xs, [r["append_store"][part] * 1e3 for r in ok], ".:", label=part[:-2])
        mem = [r for r in ok if "append_memory" in r]
        if mem:
            a.plot([r["n_units"] for r in mem], [r["append_memory"]["total_s"] * 1e3 for r in mem], "s-",
                   label="append, Memory.add")
            a.plot([r["n_units"] for r in mem], [r["append_memory"]["engine_s"] * 1e3 for r in mem], "s:",
                   label="  of it, engine refresh")
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("units in the bank")
        a.set_ylabel("ms (median)")
        a.set_title("appending one turn")
        a.legend(fontsize=7)
        b = ax[0][1]
        b.plot(xs, [r["forget_store"]["total_s"] for r in ok], "o-", label="forget one turn (rewrite)")
        b.plot(xs, [r["compact_s"] for r in ok], "s-", label="compact the segments")
        b.plot(xs, [r["build_s"] for r in ok], "^:", label="build (embedding cache warm)")
        b.set_xscale("log")
        b.set_yscale("log")
        b.set_xlabel("units in the bank")
        b.set_ylabel("s")
        b.set_title("forgetting and compacting")
        b.legend(fontsize=7)
    c = ax[1][0]
    for mode, mk in (("eager", "o-"), ("lazy", "s-")):
        rows = [r for r in rec.get("opening") or () if r.get("mode") == mode and "error" not in r]
        if rows:
            c.plot([r["banks"] for r in rows], [r["open_s"] for r in rows], mk, label=f"open s, {mode}")
            c.plot([r["banks"] for r in rows], [r["rss_after_probe_mb"].get("VmRSS", 0) / 1024 for r in rows],
                   mk.replace("-", ":"), label=f"RSS GiB, {mode}")
    c.set_xscale("log")
    c.set_yscale("log")
    c.set_xlabel("banks of 100 units")
    c.set_title("opening a collection")
    c.legend(fontsize=7)
    d = ax[1][1]
    m = rec.get("many")
    if m and "error" not in m:
        labels = ["hot, all resident", "hot, lazy", "cold open"]
        vals = [m["hot_ms"]["resident"], m["hot_ms"]["lazy"], m["cold_ms"]]
        for k, key in enumerate(("p50", "p90", "p99")):
            d.bar([i + 0.27 * (k - 1) for i in range(3)], [v[key] or 0 for v in vals], width=0.27, label=key)
        d.set_xticks(range(3), labels)
        d.set_yscale("log")
        d.set_ylabel("ms per query")
        d.set_title(f"{m['banks']} banks, {m['hot']} hot, budget {m['budget_bytes'] / 2 ** 20:.0f} MB")
        d.legend(fontsize=7)
    e = axs[0][2]
    r = rec.get("ray")
    if r and "settings" in r:
        names = list(r["settings"])
        e.bar(names, [r["settings"][k]["median_qps"] for k in names])
        e.set_ylabel("questions / s (median, whole job)")
        e.set_title(f"score on Ray Data, {r['cpu_count']} cores")
    f = axs[1][2]
    q = rec.get("query")
    if q and q.get("available"):
        try:
            import importlib

            from . import QUERY_MODULE

            importlib.import_module(QUERY_MODULE).plot([f], q)
        except Exception as ex:  # noqa: BLE001 - the figure keeps the other panels
            f.set_title(f"query curves: {type(ex).__name__}")
    else:
        f.text(0.5, 0.5, "query-side curves: scale_bench.query\n(not in this tree)", ha="center", va="center")
        f.set_axis_off()
    fig.tight_layout()
    return fig
