"""Open time and resident memory against the collection's size, eager and lazy.

A collection of ``B`` synthetic banks of 100 units is written once per size; then one child process
per (size, mode) opens it as a ``Memory`` and reports the seconds to open and its resident memory
(``VmRSS``; ``RssFile`` is the memory-mapped vectors' share; the process's one-time costs, imports
and the engine's first compile, are paid on a one-bank collection first and its memory then is
``rss_before_open_mb``), then selects from ``--probe`` banks
it has not touched (cold: each opens its bank first) and again (warm), and reports both latencies
and the memory after:

* ``eager``: every bank loaded at open (``max_resident_bytes=None``, the default);
* ``lazy``: none at open, each on first use, the least recently used let go past the budget.

``python -m benchmarks.scale_bench.opening PATH MODE BUDGET PROBE`` measures one point (JSON).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _one_time_costs() -> None:
    """Imports, the encoder stand-in and the engine's first build and selection (numba compiles),
    paid on a one-bank collection before anything is timed: they do not grow with the collection."""
    import shutil
    import tempfile

    from trawmem_gpu import Memory

    from .synthetic import make_collection, query_set, stand_in_encoder

    tmp = Path(tempfile.mkdtemp(prefix="trawmem-bench-open-"))
    try:
        make_collection(tmp / "one", 2)
        m = Memory(tmp / "one", encoder=stand_in_encoder())
        b = m._core.registry.ids()[0]
        qs, Z = query_set(tmp / "one", [b])
        m.select(b, qs[0], vector=Z[0], budget=8)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def point(path: Path, mode: str, budget: int, probe: int) -> dict:
    import gc

    import numpy as np

    from trawmem_gpu import Memory

    from .synthetic import query_set, rss_mb, stand_in_encoder

    _one_time_costs()
    gc.collect()
    before = rss_mb()
    t0 = time.perf_counter()
    mem = Memory(path, encoder=stand_in_encoder(), max_resident_bytes=budget if mode == "lazy" else None)
    open_s = time.perf_counter() - t0
    after_open = rss_mb()
    ids = mem._core.registry.ids()
    rng = np.random.default_rng(7)
    pick = [ids[i] for i in rng.choice(len(ids), size=min(probe, len(ids)), replace=False)]
    qs, Z = query_set(path, pick)
    lat = {"cold": [], "warm": []}
    for kind in ("cold", "warm"):
        for b, q, z in zip(pick, qs, Z):
            t0 = time.perf_counter()
            mem.select(b, q, vector=z, budget=8)
            lat[kind].append(time.perf_counter() - t0)
    pct = lambda xs, p: round(float(np.percentile(xs, p)) * 1e3, 2)  # noqa: E731
    return {"banks": len(ids), "mode": mode, "budget_bytes": budget if mode == "lazy" else None,
            "open_s": round(open_s, 3), "rss_before_open_mb": before, "rss_after_open_mb": after_open, "rss_after_probe_mb": rss_mb(),
            "resident_banks": len(mem._core.resident), "resident_bytes": mem._core.resident.total,
            "select_ms": {k: {"p50": pct(v, 50), "p99": pct(v, 99), "n": len(v)} for k, v in lat.items()}}


def run(points: list[tuple[Path, str]], budget: int, probe: int, timeout_s: float, log=print) -> list[dict]:
    out = []
    for path, mode in points:
        t0 = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, "-m", "benchmarks.scale_bench.opening", str(path), mode, str(budget),
                                str(probe)], capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ),
                               cwd=Path(__file__).resolve().parents[2])
            rec = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else \
                {"mode": mode, "error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
        except subprocess.TimeoutExpired:
            rec = {"mode": mode, "error": f"over the {timeout_s:g} s limit"}
        rec.setdefault("path", path.name)
        rec["wall_s"] = round(time.perf_counter() - t0, 1)
        log(f"  open {path.name} {mode}: " + (rec.get("error") or f"{rec['open_s']:.2f} s, RSS "
            f"{rec['rss_after_open_mb'].get('VmRSS')} MB after open, {rec['rss_after_probe_mb'].get('VmRSS')} MB "
            f"after {probe} banks; cold select p50 {rec['select_ms']['cold']['p50']} ms"))
        out.append(rec)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(json.dumps(point(Path(argv[0]), argv[1], int(argv[2]), int(argv[3]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
