"""Time of one append to a large bank's approximate index (``VectorIndex.grown``), this tree's
against another revision's ``select/steps/ann.py`` (issue 46 items 2 and 4: index update time
per append).

Builds the same IVF index over ``N`` random unit vectors once per side, appends ``--m`` vectors
``--appends`` times to each in interleaved rounds (order flipped every round) and reports the
median wall time of one append. The first append of each side (which copies the labels once) is
not timed::

    python -m benchmarks.experiments.ann_grown_append --units 1000000 --base REV [--d 16] [--m 100]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

from .. import harness

ROOT = Path(__file__).resolve().parents[2]


def _module_at(rev: str):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:trawmem_gpu/select/steps/ann.py"],
                         capture_output=True, text=True, check=True).stdout
    mod = types.ModuleType("trawmem_gpu.select.steps._ann_base")
    mod.__package__ = "trawmem_gpu.select.steps"
    sys.modules[mod.__name__] = mod
    exec(compile(src, f"{rev}:ann.py", "exec"), mod.__dict__)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--base", required=True, help="the revision to compare with (git rev)")
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--appends", type=int, default=40)
    ap.add_argument("--name", default="ann_grown_append")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    harness.pin_threads(1)
    from trawmem_gpu.select.steps import ann

    sides = {"base": _module_at(a.base), "this": ann}
    N, m = a.units, a.m
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N + 1 + a.appends * m, a.d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cur = {k: mod.VectorIndex(x[:N], "ivf").grown(x[N:N + 1], N) for k, mod in sides.items()}
    times: dict = {k: [] for k in sides}
    n = N + 1
    for r in range(a.appends):
        for k in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            t = time.perf_counter()
            cur[k] = cur[k].grown(x[n:n + m], n)
            times[k].append(time.perf_counter() - t)
        n += m
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    rec = {"units": N, "d": a.d, "m": m, "appends": a.appends, "base": a.base,
           "median_ms_per_append": med, "ratio_base_over_this": med["base"] / med["this"],
           "ms_per_append": {k: [round(t * 1e3, 3) for t in v] for k, v in times.items()}}
    harness.save(a.name, rec, out_dir=a.out_dir or harness.results_dir(default=harness.ARCHIVE))
    print(f"{N:,} vectors, append of {m}: base {med['base']:.2f} ms, this {med['this']:.2f} ms per append")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
