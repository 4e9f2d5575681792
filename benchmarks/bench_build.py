"""Stage-1 build cost per conversation: encode (units + heads), segment, heads, graph; bank size.

Builds each dev conversation on its own (one ``build_banks`` call each, so every figure is per
conversation), with a cold embedding cache in a temporary directory unless ``--warm`` (then
the user's cache, ``TRAWMEM_CACHE`` or ~/.cache/trawmem_gpu, is reused). Each bank is saved
with ``save_bank`` and its directory measured on disk.

    python -m benchmarks run build [PATH] [--warm] [--segmentation embedding|fixed]

Writes ``benchmarks/results/build.json`` and ``benchmarks/results/build.png`` (with ``--tag``,
``build-TAG.*``).
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from . import harness

STAGES = ("encode_units_s", "encode_heads_s", "segment_s", "heads_s", "graph_s")


def _dir_sizes(d: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(d.iterdir()) if p.is_file()}


def _totals(rows: list[dict]) -> dict:
    """The per-conversation rows summed: stage seconds, units, threads, bytes on disk (per file too)."""
    tot_units = sum(r["units"] for r in rows)
    tot_bytes = sum(r["disk_bytes"] for r in rows)
    totals = {k: round(sum(r[k] for r in rows), 3) for k in (*STAGES, "encode_s", "total_s", "other_s")}
    totals.update(units=tot_units, threads=sum(r["threads"] for r in rows), disk_bytes=tot_bytes,
                  kb_per_1000_units=round(tot_bytes / tot_units * 1000 / 1024, 1),
                  units_per_s=round(tot_units / totals["total_s"], 1))
    by_file: dict[str, int] = {}
    for r in rows:
        for k, v in r["disk_bytes_by_file"].items():
            by_file[k] = by_file.get(k, 0) + v
    totals["kb_per_1000_units_by_file"] = {k: round(v / tot_units * 1000 / 1024, 1) for k, v in by_file.items()}
    return totals


def run(args) -> dict:
    import numpy as np

    import trawmem_gpu
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.data import load_conversations
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.store import save_bank

    path = Path(args.path)
    convs = load_conversations(path, args.format)
    if args.limit:
        convs = convs[: args.limit]
    cfg = BuildConfig(segmentation=args.segmentation)
    work = Path(tempfile.mkdtemp(prefix="trawmem-bench-build-"))
    cache = True if args.warm else str(work / "embeddings.sqlite")

    t0 = time.perf_counter()
    enc = get_encoder(cfg.encoder, cache=cache)
    load_s = time.perf_counter() - t0
    # One-time costs kept out of the per-conversation figures: the first forward pass (uncached,
    # a text no conversation holds) and faiss's first search (import, thread pool).
    t0 = time.perf_counter()
    getattr(enc, "inner", enc).encode(["warm-up pass of the benchmark"])
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    from trawmem_gpu.store.graph import build_edges

    v = np.random.default_rng(0).standard_normal((64, enc.dim)).astype(np.float32)  # > 20 queries: BLAS path
    build_edges(v / np.linalg.norm(v, axis=1, keepdims=True), knn=cfg.knn, threshold=cfg.knn_threshold)
    faiss_import_s = time.perf_counter() - t0

    load_before = os.getloadavg()
    rows = []
    for c in convs:
        t0 = time.perf_counter()
        (bank,), st = build_banks([c], cfg, enc, progress=False)
        wall = time.perf_counter() - t0
        d = save_bank(bank, work / "banks" / c.bank_id)
        sizes = _dir_sizes(d)
        total_b = sum(sizes.values())
        lens = np.diff(bank.thread_offsets)
        r = {
            "bank_id": c.bank_id, "units": bank.n_units, "sessions": len(c.sessions), "threads": bank.n_threads,
            "mean_thread_len": round(float(lens.mean()), 2),
            "edges_adjacent": int((bank.edge_kind == 0).sum() // 2),
            "edges_semantic": int((bank.edge_kind == 1).sum() // 2),
            **{k: round(float(st.get(k, 0.0)), 4) for k in STAGES},
            "encode_s": round(float(st["encode_units_s"] + st["encode_heads_s"]), 4),
            "total_s": round(wall, 4),
            "disk_bytes": total_b, "disk_bytes_by_file": sizes,
            "kb_per_1000_units": round(total_b / bank.n_units * 1000 / 1024, 1),
        }
        r["other_s"] = round(wall - sum(r[k] for k in STAGES), 4)
        rows.append(r)
        print(f"  {c.bank_id}: {r['units']} units, {r['total_s']:.2f}s", file=sys.stderr)

    totals = _totals(rows)

    result = {
        "benchmark": "build",
        "command": harness.command(),
        "dataset": str(path), "dataset_sha256": file_sha256(path), "conversations": len(rows),
        "cache": "warm (user cache)" if args.warm else "cold (fresh temporary cache)",
        "cache_hits": getattr(enc, "hits", None), "cache_misses": getattr(enc, "misses", None),
        "encoder": enc.id, "encoder_load_s": round(load_s, 3),
        "first_forward_s": round(warmup_s, 3), "faiss_first_search_s": round(faiss_import_s, 3), "build_config": cfg.to_dict(),
        "package_version": getattr(trawmem_gpu, "__version__", None),
        "machine": harness.machine(loadavg_1m_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)]),
        "rows": rows, "totals": totals,
    }
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    else:
        result["work_dir"] = str(work)
    return result


def print_table(res: dict) -> None:
    cols = [("bank", "bank_id", "{}"), ("units", "units", "{}"), ("thr", "threads", "{}"),
            ("enc_u", "encode_units_s", "{:.2f}"), ("enc_h", "encode_heads_s", "{:.2f}"),
            ("encode", "encode_s", "{:.2f}"), ("segment", "segment_s", "{:.3f}"), ("heads", "heads_s", "{:.3f}"),
            ("graph", "graph_s", "{:.3f}"), ("total", "total_s", "{:.2f}"), ("KB/1k units", "kb_per_1000_units", "{}")]
    print(f"build benchmark: {res['conversations']} conversations, encoder {res['encoder']} "
          f"({res['machine']['device']}, {res['machine']['torch_threads']} torch threads), cache {res['cache']}; "
          f"one-time, not in the table: encoder load {res['encoder_load_s']:.2f}s, first forward "
          f"{res['first_forward_s']:.2f}s, faiss first search {res['faiss_first_search_s']:.2f}s")
    la = res["machine"]["loadavg_1m_before_after"]
    print(f"seconds per stage; encode = enc_u (units) + enc_h (heads); 1-min load average {la[0]} before, "
          f"{la[1]} after ({res['machine']['cpu_count']} CPUs)")
    widths = [max(len(h), 9) for h, _, _ in cols]
    widths[0] = max(widths[0], max(len(r["bank_id"]) for r in res["rows"]), 5)
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(cols, widths)))
    for r in res["rows"] + [dict(res["totals"], bank_id="TOTAL")]:
        print("  ".join(f.format(r[k]).rjust(w) for (_, k, f), w in zip(cols, widths)))
    t = res["totals"]
    print(f"{t['units_per_s']} units/s end to end; bank size {t['kb_per_1000_units']} KB per 1,000 units "
          f"({', '.join(f'{k} {v}' for k, v in t['kb_per_1000_units_by_file'].items())})")


def plot(res: dict):
    """The figure: build seconds per stage and bank size on disk, per conversation."""
    rows = res["rows"]
    names = [r["bank_id"] for r in rows]
    fig, (ax1, ax2) = harness.figure(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    bottom = [0.0] * len(rows)
    for key, label in (("encode_units_s", "encode units"), ("encode_heads_s", "encode heads"),
                       ("segment_s", "segment"), ("heads_s", "heads (extractive)"), ("graph_s", "graph"),
                       ("other_s", "other")):
        vals = [max(r[key], 0.0) for r in rows]
        ax1.bar(names, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):
        ax1.text(i, bottom[i], f"{r['units']}u", ha="center", va="bottom", fontsize=8)
    ax1.set_ylabel("seconds")
    ax1.set_title(f"build time per conversation ({res['cache'].split()[0]} embedding cache, {res['machine']['device']})", fontsize=10)
    ax1.legend(fontsize=8)
    ax1.tick_params(axis="x", rotation=30)
    files = sorted({k for r in rows for k in r["disk_bytes_by_file"]})
    bottom = [0.0] * len(rows)
    for f in files:
        vals = [r["disk_bytes_by_file"].get(f, 0) / r["units"] * 1000 / 1024 for r in rows]
        ax2.bar(names, vals, bottom=bottom, label=f)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_ylabel("KB per 1,000 units")
    ax2.set_title(f"bank size on disk (mean {res['totals']['kb_per_1000_units']} KB / 1k units)", fontsize=10)
    ax2.legend(fontsize=8, loc="lower right")
    ax2.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", nargs="?", default=str(harness.dev_data("locomo")),
                   help="LoCoMo JSON or JSONL (default: the dev split)")
    p.add_argument("--format", choices=["auto", "locomo", "jsonl"], default="auto")
    p.add_argument("--warm", action="store_true", help="reuse the user's embedding cache instead of a cold one")
    p.add_argument("--segmentation", choices=["embedding", "fixed"], default="embedding")
    p.add_argument("--limit", type=int, default=0, help="only the first N conversations")
    p.add_argument("--out-dir", help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    p.add_argument("--tag", default="", help="suffix for the result files: build-TAG.json")
    p.add_argument("--keep", action="store_true", help="keep the temporary banks and cache")
    args = p.parse_args(argv)
    harness.require_data(args.path, flag="PATH")
    res = run(args)
    stem = "build" + (f"-{args.tag}" if args.tag else "")
    path = harness.save(stem, res, plot(res), out_dir=args.out_dir)
    print_table(res)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
