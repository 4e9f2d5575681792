"""The markdown tables and figures of ``bench_select.py``."""
from __future__ import annotations

from .. import harness


def fmt_table(rows, cols, heads) -> str:
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(c(r) for c in cols) + " |")
    return "\n".join(lines)


def report(results) -> str:
    out = []
    f0 = lambda x: f"{x:,.0f}" if isinstance(x, (int, float)) and x == x else "-"
    f2 = lambda x: f"{x:,.2f}" if isinstance(x, (int, float)) and x == x else "-"
    for label, t in results.get("target", {}).items():
        out.append(f"\n### Target point, interleaved ({label}): Q={t['Q']}, U~{t['U_mean']:.0f}, B={t['B']}, H={t['H']}, "
                   f"{t['threads']} thread(s), {t['rounds']} rounds\n")
        names = list(t["qps_median"])
        out.append(fmt_table(names, [lambda k: k, lambda k: f0(t["qps_median"][k]),
                                     lambda k: (f"{t['speedup_median_of_rounds'][k]:.1f}x" if k != "reference" else "1.0x"),
                                     lambda k: ("{:.1f}-{:.1f}x".format(*t["speedup_min_max"][k]) if k != "reference"
                                                else "-"),
                                     lambda k: (f"{t['agreement_sets'][k]:.3f}" if k != "reference" else "-")],
                             ["implementation", "median queries/s", "speedup (median of rounds)", "range", "agree"]))
    for label, rows in results.get("sweeps", {}).items():
        tgt = [r for r in rows if r["sweep"] == "Q" and r["value"] == 1024]
        if tgt:
            r = tgt[0]
            out.append(f"\n### Target point ({label}): Q=1024, U~{r.get('U_mean', 0):.0f}, B=16, H=1\n")
            body = []
            for name, m in r["impls"].items():
                if "qps" not in m:
                    body.append((name, m))
                    continue
                body.append((name, m))
            out.append(fmt_table(body, [lambda x: x[0], lambda x: f0(x[1].get("qps")), lambda x: f2(x[1].get("p50_ms")),
                                        lambda x: f2(x[1].get("p99_ms")), lambda x: x[1].get("latency_unit", "-"),
                                        lambda x: (f"{x[1]['speedup_vs_reference']:.1f}x"
                                                   if "speedup_vs_reference" in x[1] else "1.0x" if x[0] == "reference"
                                                   else "-")],
                                 ["implementation", "queries/s", "p50 ms", "p99 ms", "latency per", "vs reference"]))
            out.append("cuda_torch / cuda_triton: skipped (no CUDA device on this machine)" if not results["machine"]
                       ["cuda"] else "")
        out.append(f"\n### Sweeps ({label}): queries/s (batched_cpu / batched_torch / reference / apricot greedy-only)\n")
        out.append(fmt_table(rows, [lambda r: f"{r['sweep']}={r['value']}", lambda r: str(r["Q"]),
                                    lambda r: f"{r.get('U_mean', float('nan')):.0f}", lambda r: str(r["B"]),
                                    lambda r: str(r["H"]),
                                    lambda r: f0(r["impls"].get("batched_cpu", {}).get("qps")),
                                    lambda r: f0(r["impls"].get("batched_torch", {}).get("qps")),
                                    lambda r: f0(r["impls"].get("reference", {}).get("qps")),
                                    lambda r: f0(r["impls"].get("apricot_greedy", {}).get("qps")),
                                    lambda r: (f"{r['impls']['batched_cpu']['speedup_vs_reference']:.1f}x"
                                               if "speedup_vs_reference" in r["impls"].get("batched_cpu", {}) else "-"),
                                    lambda r: f2(r["impls"].get("batched_cpu", {}).get("p50_ms")),
                                    lambda r: f2(r["impls"].get("batched_cpu", {}).get("p99_ms")),
                                    lambda r: f"{r.get('agreement_sets', float('nan')):.3f}",
                                    lambda r: f0(r["impls"].get("batched_cpu", {}).get("bytes_per_unit", {})
                                                 .get("engine_total"))],
                                 ["point", "Q", "U", "B", "H", "batched", "torch", "reference", "apricot", "speedup",
                                  "p50 ms/batch", "p99 ms/batch", "agree", "B/unit"]))
    sc = results.get("scaling", {}).get("rows")
    if sc:
        out.append("\n### Scaling (synthetic, 100 units/bank, Q=1024, default config)\n")
        out.append(fmt_table(sc, [lambda r: f0(r["banks"]), lambda r: f0(r["units"]), lambda r: f0(r["batched_qps"]),
                                  lambda r: f0(r["reference_qps"]), lambda r: f"{r['speedup']:.1f}x",
                                  lambda r: f2(r["batched_p50_ms"]), lambda r: f0(r["engine_tensor_bytes"] / 2**20),
                                  lambda r: f0(r["engine_bytes_per_unit"]), lambda r: f2(r["rss_bytes"]["after_run"] / 2**30),
                                  lambda r: f2(r["engine_build_s"]), lambda r: f"{r['agreement_sets']:.3f}"],
                               ["banks", "units", "batched q/s", "reference q/s", "speedup", "p50 ms/batch",
                                "engine MiB", "engine B/unit", "RSS GiB", "engine build s", "agree"]))
    ss = results.get("seed_search", {}).get("cases")
    if ss:
        out.append("\n### Seed search (exact per-bank top-24 heads, Q=1024, d=384)\n")
        out.append(fmt_table(ss, [lambda r: f0(r["banks"]), lambda r: f0(r["heads_per_bank"]),
                                  lambda r: f0(r["distinct_banks_in_batch"]), lambda r: f2(r.get("torch_ms")),
                                  lambda r: f2(r.get("faiss_ms")) if "faiss_ms" in r else str(r.get("faiss", "-")),
                                  lambda r: str(r.get("faster", "-")), lambda r: r["auto_picks"],
                                  lambda r: str(r.get("same_ids", "-"))],
                               ["banks", "heads/bank", "banks in batch", "torch ms", "faiss ms", "faster", "auto",
                                "same ids"]))
    return "\n".join(out)


def plot_sweeps(results):
    """The figure of the sweeps: queries/s against Q, U, B and H per implementation (None without
    sweeps)."""
    sweeps = results.get("sweeps", {})
    if not sweeps:
        return None
    fig, axes = harness.figure(1, 4, figsize=(18, 4.2))
    colors = {"batched_cpu": "C0", "batched_torch": "C1", "reference": "C3", "apricot_greedy": "C2"}
    for ax, var in zip(axes, ("Q", "U", "B", "H")):
        for label, rows in sweeps.items():
            ls = "-" if label == "locomo_dev" else "--"
            rs = [r for r in rows if r["sweep"] == var or (r["sweep"] == "Q" and r["value"] == 1024 and var != "Q")]
            xs_key = (lambda r: r["Q"]) if var == "Q" else (lambda r: r.get("U_mean", r["U_target"])) if var == "U" \
                else (lambda r: r["B"]) if var == "B" else (lambda r: r["H"])
            rs = sorted(rs, key=xs_key)
            for impl, c in colors.items():
                pts = [(xs_key(r), r["impls"][impl]["qps"]) for r in rs if "qps" in r["impls"].get(impl, {})]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=c, marker="o", ms=3,
                            label=f"{impl} ({label})")
        ax.set_xlabel({"Q": "batch size Q", "U": "mean candidates |U_q|", "B": "budget B", "H": "hops H"}[var])
        ax.set_yscale("log")
        if var == "Q":
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("queries / s (1 thread)")
    axes[-1].legend(fontsize=6)
    fig.suptitle("TrawMem selection throughput (solid: LoCoMo dev banks, dashed: synthetic)")
    fig.tight_layout()
    return fig


def plot_scaling(sc: dict):
    """The figure of the scaling run: queries/s and memory against collection size (None without
    rows)."""
    rows = sc.get("rows")
    if not rows:
        return None
    fig, (a1, a2) = harness.figure(1, 2, figsize=(10, 4))
    x = [r["units"] for r in rows]
    a1.plot(x, [r["batched_qps"] for r in rows], "o-", label="batched_cpu")
    a1.plot(x, [r["reference_qps"] for r in rows], "o-", color="C3", label="reference")
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("units in the collection")
    a1.set_ylabel("queries / s (Q=1024, 1 thread)")
    a1.legend()
    a1.grid(alpha=0.3)
    a2.plot(x, [r["engine_tensor_bytes"] / 2**20 for r in rows], "o-", label="engine tensors")
    a2.plot(x, [r["rss_bytes"]["after_run"] / 2**20 for r in rows], "o-", label="process RSS")
    a2.set_xscale("log")
    a2.set_yscale("log")
    a2.set_xlabel("units in the collection")
    a2.set_ylabel("MiB")
    a2.legend()
    a2.grid(alpha=0.3)
    fig.suptitle("Scaling: 10 -> 10,000 synthetic banks of 100 units")
    fig.tight_layout()
    return fig
