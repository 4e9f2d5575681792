"""The approximate search of large banks against exact search (issue 33, large banks): the
candidate pool's recall at the default settings (and beside other ones) on synthetic banks at and
above ``EngineConfig.ann_min_units``, with the per-query latency of both side by side, and the
selection quality at equal tokens on the dev sets with the approximate path forced on. What each
figure means: ``benchmarks/scale_bench/ann_recall.py`` (the recalls, the synthetic points) and
``benchmarks/scale_bench/ann.py`` (``dev_quality``).

    python -m benchmarks run ann-recall                       # ann_recall.json / .png under results/
    python -m benchmarks run ann-recall --quick               # a 3,000-unit bank, no dev sets (a smoke run)
    python -m benchmarks run ann-recall --sizes 200000x64 --queries 100 --parts synthetic
    python -m benchmarks run ann-recall --parts dev --dev-shortlists 512,128,32

A run of some ``--parts`` keeps the other parts' figures of the existing results file (and says so,
``kept_from_before``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # `python benchmarks/bench_ann_recall.py`
    import importlib.util as _u
    _s = _u.spec_from_file_location("benchmarks._boot", Path(__file__).resolve().parent / "_boot.py")
    _b = _u.module_from_spec(_s)
    _s.loader.exec_module(_b)
    _b.run_file(__file__)
    raise SystemExit(0)

from . import harness  # noqa: E402

SIZES = ((200_000, 64), (500_000, 64), (200_000, 384))
"""``(units, d)`` of the synthetic banks (the threshold is 200,000 units; d = 384 is MiniLM's width)."""


def _sizes(s: str) -> tuple:
    return tuple(tuple(int(float(y)) for y in x.split("x")) for x in s.split(",") if x.strip())


def run(args) -> dict:
    """Both parts as one record (``synthetic``: a point per size; ``dev``: ``ann.dev_quality``)."""
    from tqdm import tqdm

    from .scale_bench import ann_recall

    rec: dict = {"target": ann_recall.TARGET, "queries": args.queries, "synthetic": [], "dev": None}
    sizes = ((3_000, 32),) if args.quick else args.sizes
    if "synthetic" in args.parts:
        for n, d in tqdm(sizes, desc="synthetic banks"):
            spec = dict(units=n, dim=d, seed=7, queries=10 if args.quick else args.queries)
            p = ann_recall.point(spec) if args.quick else ann_recall.child(spec, args.timeout)
            rec["synthetic"].append(p)
            if "error" in p:
                tqdm.write(f"  {n}x{d}: ERROR {p['error']}")
                continue
            for r in p["rows"]:
                rr = r["recall"]
                tqdm.write(f"  {n}x{d} {r['settings']}: units {rr['units']['mean']:.4f} threads "
                           f"{rr['threads']['mean']:.4f} picks {rr['picks']['mean']:.4f} search@M "
                           f"{r['search_at_M']['mean']:.4f}, approx/exact latency {r['latency_ratio']:.2f} "
                           f"({r['approx_ms']:.1f} / {r['exact_ms']:.1f} ms), peak {p.get('vmhwm_mib', 0):.0f} MiB")
    if "dev" in args.parts and not args.quick:
        from .scale_bench.ann import dev_quality

        rec["dev"] = dev_quality(Ts=args.T, shortlists=args.dev_shortlists, vectors=args.vectors)
    return rec


def figure(rec: dict):
    """Recall (units, threads, picks) per bank and setting; latency ratio; the dev sets' paired
    differences with their intervals."""
    fig, ax = harness.figure(1, 3, figsize=(17, 4.8))
    pts = [p for p in rec["synthetic"] if "error" not in p]
    labels, xs = [], 0
    for p in pts:
        for r in p["rows"]:
            s = r["settings"]
            lab = f"{p['spec']['units'] // 1000}k d{p['spec']['dim']}\nM{s['ann_shortlist']} ef{s['ann_ef_search']}"
            for k, (kind, mk) in enumerate((("units", "o"), ("threads", "s"), ("picks", "^"))):
                ax[0].plot(xs, r["recall"][kind]["mean"], mk, color=f"C{k}", label=kind if xs == 0 else None)
            ax[1].bar(xs, r["latency_ratio"], color="C0" if r["default"] else "C7")
            labels.append(lab)
            xs += 1
    for a in ax[:2]:
        a.set_xticks(range(len(labels)), labels, fontsize=6, rotation=60)
    ax[0].axhline(rec["target"], color="k", ls="--", lw=1, label=f"target {rec['target']}")
    ax[0].set(ylabel="mean recall against exact", title="synthetic banks: candidate pool and picks")
    ax[0].legend(fontsize=8)
    ax[1].axhline(1.0, color="k", lw=1)
    ax[1].set(ylabel="median per-query CPU time, approximate / exact", title="latency (default settings dark)")
    dev = [r for r in (rec.get("dev") or {}).get("rows", []) if r["run"] != "exact"]
    for i, r in enumerate(dev):
        lo, hi = r["ci95_points"]
        ax[2].errorbar(i, r["diff_points"], yerr=[[r["diff_points"] - lo], [hi - r["diff_points"]]], fmt="o",
                       color="C0", capsize=3)
    ax[2].set_xticks(range(len(dev)), [f"{r['data']}\nT{r['T']} {r['run']}" for r in dev], fontsize=6, rotation=60)
    for y in (-0.2, 0.2):
        ax[2].axhline(y, color="k", ls="--", lw=1)
    ax[2].axhline(0.0, color="k", lw=0.5)
    ax[2].set(ylabel="macro evidence recall, approximate - exact (points)",
              title="dev sets at equal tokens, approximate forced on")
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one 3,000-unit bank, 10 queries, no dev sets (seconds)")
    ap.add_argument("--sizes", type=_sizes, default=SIZES, help="UNITSxDIM of the synthetic banks (200000x64,...)")
    ap.add_argument("--queries", type=int, default=100, help="queries per synthetic bank")
    ap.add_argument("--parts", type=lambda s: tuple(s.split(",")), default=("synthetic", "dev"),
                    help="synthetic,dev")
    ap.add_argument("--T", type=lambda s: tuple(int(x) for x in s.split(",")), default=(400, 800),
                    help="token budgets of the dev sets")
    ap.add_argument("--dev-shortlists", type=lambda s: tuple(int(x) for x in s.split(",")), default=None,
                    help="shortlists run on the dev sets (default: EngineConfig.ann_shortlist alone)")
    ap.add_argument("--vectors", type=lambda s: tuple(s.split(",")), default=("float32",),
                    help="vector storage choices run on the dev sets (float32,float16,int8; store/vectors.py)")
    ap.add_argument("--timeout", type=float, default=3_600.0, help="seconds per synthetic bank")
    ap.add_argument("--name", default="ann_recall", help="results file name")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    rec = run(args)
    rec["machine"] = harness.machine(threads=1)
    with harness.locked(args.name, args.out_dir) as old:  # a part not run keeps its last figures
        for part in ("synthetic", "dev"):
            if part not in args.parts and old.get(part):
                rec[part] = old[part]
                rec.setdefault("kept_from_before", []).append({"part": part, "command": old.get("command")})
        print(harness.save(args.name, rec, figure(rec), out_dir=args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
