"""Compact vectors (issue 46 item 2): resident memory of a large bank's approximate index for each
``vectors`` choice (``store/vectors.py``), its build and append time, and what the codes cost in
agreement with the float32 index, measured side by side on one synthetic bank per size.

Each point is a child process (a clean resident-set reading): the bank's float32 vectors (unit
norm, in threads of about 8 units around topic centres, as ``synthetic_banks``) are written to a
``.npy`` file and memory-mapped, as a collection's ``tensors.safetensors`` is; the child builds
``steps.ann.VectorIndex`` over them with the choice (the compact codes re-rank from the mapped
float32 file) and reads its anonymous resident memory before and after (``RssAnon``: the index,
not the mapped file), then times ``ann_shortlist`` = 1,024 searches at the engine's defaults and an
append of 1,000 units (``VectorIndex.grown``). Agreement per query is ``|A & F| / |F|`` of the
compact index's proposals ``A`` against the float32 index's ``F``; recall the same against exact
search. The engine's own tables (its float64 ``unit_vecs`` and the rest) are not changed by the
choice and are not part of these figures (``docs/scaling.md``, compact vectors).

    python -m benchmarks run compact-memory                           # 3e4 and 1e5 units, d = 384
    python -m benchmarks run compact-memory --sizes 100000,300000     # larger, slower
    python -m benchmarks run compact-memory --kind ivf --name compact_memory_ivf   # IVF (SQ) lists
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # `python benchmarks/bench_compact_memory.py`
    import importlib.util as _u
    _s = _u.spec_from_file_location("benchmarks._boot", Path(__file__).resolve().parent / "_boot.py")
    _b = _u.module_from_spec(_s)
    _s.loader.exec_module(_b)
    _b.run_file(__file__)
    raise SystemExit(0)

import numpy as np  # noqa: E402

from . import harness  # noqa: E402

CHOICES = ("float32", "float16", "int8")
GIB = float(1 << 30)
TARGET_UNITS = 1_000_000


def _vectors(n: int, d: int, seed: int) -> np.ndarray:
    """``n`` unit vectors in threads around topic centres (``synthetic_banks``' structure)."""
    from .synthetic_banks import _unit, thread_lengths

    rng = np.random.default_rng(seed)
    lens = thread_lengths(rng, n, 8.0)
    centres = _unit(rng.standard_normal((64, d), dtype=np.float32))
    own = _unit(rng.standard_normal((len(lens), d), dtype=np.float32))
    base = np.repeat(centres[rng.integers(0, 64, size=len(lens))] + 0.7 * own, lens, axis=0)
    return _unit(base + 0.8 * rng.standard_normal((n, d), dtype=np.float32) / np.float32(np.sqrt(d)))


def _anon_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def point(path: str, vectors: str, queries: int, shortlist: int, kind: str = "hnsw") -> dict:
    """One child's figures (see the module docstring); ``path``: the bank's ``.npy`` vectors."""
    from trawmem_gpu.select.config import EngineConfig
    from trawmem_gpu.select.steps.ann import AnnParams, VectorIndex

    x = np.load(path, mmap_mode="r")
    n, d = x.shape
    rng = np.random.default_rng(3)
    rows = np.sort(rng.choice(n, size=queries, replace=False))
    Z = np.asarray(x[rows], dtype=np.float32) + 0.5 * rng.standard_normal((queries, d), dtype=np.float32) / np.sqrt(d)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    extra = np.load(path.replace(".npy", "-append.npy"))
    before = _anon_mib()
    t = time.perf_counter()
    index = VectorIndex(x, kind, vectors=vectors, rerank=x)
    build_s = time.perf_counter() - t
    resident = _anon_mib() - before
    ec = EngineConfig()
    params = AnnParams(ec.ann_nprobe, ec.ann_ef_search)
    lat, ids = [], []
    for q in range(queries):
        t = time.perf_counter()
        _, I = index.search(Z[q:q + 1], shortlist, params)
        lat.append(time.perf_counter() - t)
        ids.append(I[0][I[0] >= 0])
    t = time.perf_counter()
    index.grown(extra, n, np.concatenate([x, extra]) if vectors != "float32" else None)
    append_s = time.perf_counter() - t
    return dict(units=n, dim=d, vectors=vectors, kind=index.kind, index_resident_mib=resident,
                index_nbytes=index.nbytes(),
                build_s=build_s, append_1000_s=append_s, search_p50_ms=1e3 * float(np.median(lat)),
                proposals=[a.tolist() for a in ids])


def _child(args) -> int:
    rec = point(args.child, args.vectors, args.queries, args.shortlist, args.kind)
    Path(args.child_out).write_text(json.dumps(rec))
    return 0


def _exact_top(x: np.ndarray, Z: np.ndarray, k: int) -> list[np.ndarray]:
    out = []
    for z in Z:
        s = np.asarray(x @ z)
        out.append(np.argpartition(-s, k - 1)[:k])
    return out


def run(args) -> dict:
    rec: dict = {"queries": args.queries, "shortlist": args.shortlist, "kind": args.kind, "points": [],
                 "target_units": TARGET_UNITS, "goal_gib": 1.0}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            path = str(Path(tmp) / f"v{n}.npy")
            x = _vectors(n + 1000, args.dim, seed=n)
            np.save(path, x[:n])
            np.save(path.replace(".npy", "-append.npy"), x[n:])
            del x
            got = {}
            for v in CHOICES:
                out = Path(tmp) / f"p{n}{v}.json"
                cmd = [sys.executable, "-m", "benchmarks.bench_compact_memory", "--child", path, "--vectors", v,
                       "--queries", str(args.queries), "--shortlist", str(args.shortlist), "--child-out", str(out),
                       "--kind", args.kind]
                subprocess.run(cmd, check=True)
                got[v] = json.loads(out.read_text())
                print(f"{n} {v}: {got[v]['index_resident_mib']:.0f} MiB, build {got[v]['build_s']:.1f} s", flush=True)
            xm = np.load(path, mmap_mode="r")
            rng = np.random.default_rng(3)  # the children's queries, drawn the same way
            rows = np.sort(rng.choice(n, size=args.queries, replace=False))
            Z = np.asarray(xm[rows], dtype=np.float32) + 0.5 * rng.standard_normal(
                (args.queries, args.dim), dtype=np.float32) / np.sqrt(args.dim)
            Z /= np.linalg.norm(Z, axis=1, keepdims=True)
            exact = _exact_top(xm, Z, args.shortlist)
            flat = got["float32"]["proposals"]
            for v in CHOICES:
                p = got[v].pop("proposals")
                agree = [len(np.intersect1d(a, f)) / len(f) for a, f in zip(p, flat)]
                recall = [len(np.intersect1d(a, e)) / len(e) for a, e in zip(p, exact)]
                got[v].update(agreement_with_float32=float(np.mean(agreement := agree)),
                              agreement_p5=float(np.percentile(agreement, 5)), recall=float(np.mean(recall)),
                              engine_unit_vecs_bytes=8 * n * args.dim)
                rec["points"].append(got[v])
    rec["extrapolated"] = _extrapolate(rec["points"])
    return rec


def _extrapolate(points: list[dict]) -> dict:
    """Per choice: a line through the measured (units, resident MiB) points, at 10^6 units."""
    out = {}
    for v in CHOICES:
        pts = sorted((p["units"], p["index_resident_mib"], p["index_nbytes"]) for p in points if p["vectors"] == v)
        if len(pts) < 2:
            continue
        (n0, r0, b0), (n1, r1, b1) = pts[0], pts[-1]
        slope = (r1 - r0) / (n1 - n0)
        out[v] = dict(index_resident_mib_at_1e6=r1 + slope * (TARGET_UNITS - n1),
                      index_nbytes_at_1e6=b1 / n1 * TARGET_UNITS, mib_per_1000_units=1000 * slope)
    return out


def plot(rec: dict):
    fig, ax = harness.figure(1, 2, figsize=(11, 4))
    for v in CHOICES:
        pts = sorted((p["units"], p["index_resident_mib"]) for p in rec["points"] if p["vectors"] == v)
        xs, ys = [a for a, _ in pts], [b for _, b in pts]
        e = rec["extrapolated"].get(v)
        line, = ax[0].plot(xs, ys, "o-", label=v)
        if e:
            ax[0].plot([xs[-1], TARGET_UNITS], [ys[-1], e["index_resident_mib_at_1e6"]], "--", color=line.get_color())
        mine = sorted((p for p in rec["points"] if p["vectors"] == v), key=lambda p: p["units"])
        ax[1].plot(xs, [p["recall"] for p in mine], "o-", color=line.get_color(), label=f"{v}: recall vs exact")
        if v != "float32":
            ax[1].plot(xs, [p["agreement_with_float32"] for p in mine], "s:", color=line.get_color(),
                       label=f"{v}: agreement with float32")
    ax[0].axhline(1024, color="grey", lw=0.8)
    ax[0].set(xscale="log", xlabel="units (d = 384)", ylabel="index resident MiB (dashed: extrapolated)",
              title="approximate index, resident memory")
    ax[1].set(xscale="log", xlabel="units", ylabel="mean per query",
              title=f"the index's {rec['shortlist']} proposals")
    for a in ax:
        a.legend()
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=lambda s: tuple(int(float(x)) for x in s.split(",")), default=(30_000, 100_000))
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--shortlist", type=int, default=1024)
    ap.add_argument("--kind", default="hnsw", help="the index: hnsw, ivf or auto (steps/ann.py: by size)")
    ap.add_argument("--name", default="compact_memory")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--replot", action="store_true", help="redraw NAME.png from NAME.json (nothing measured)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--vectors", default="float32", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args)
    rec = harness.load(args.name, args.out_dir) if args.replot else run(args)
    print(harness.save(args.name, rec, plot(rec), args.out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
