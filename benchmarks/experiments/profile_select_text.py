"""The compiled engine's question text work at the target point (issue 46 item 3): the CPU time of
``engine.compiled._texts`` (BM25 columns, demand features, the learned affinity's cues) for the
1,024 LoCoMo dev queries of ``select_bench.paired.target_setup``, one thread, the demand-feature
cache cleared before each call, and the SHA-256 of its output arrays (equal across trees that
compute the same arrays)::

    python benchmarks/experiments/profile_select_text.py [--reps 21] [--out FILE.json]

Run it with each tree on PYTHONPATH to compare two trees (the script imports ``trawmem_gpu`` from
the path it is given).
"""
from __future__ import annotations

if not __package__:  # python benchmarks/experiments/NAME.py: run as a module of benchmarks
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.experiments"

import argparse
import hashlib
import json
import time

from .. import harness
from ..select_bench.paired import clear_text_cache, select_units, target_setup


def digest(texts) -> str:
    """SHA-256 over every array of ``_texts``' chunks (rows, BM25 columns, demand, learned cues)."""
    import numpy as np

    h = hashlib.sha256()
    for rows, cols, dem, lq in texts:
        for a in (rows, *cols, *dem, *lq):
            a = np.ascontiguousarray(np.asarray(a))
            h.update(str(a.dtype).encode())
            h.update(a.tobytes())
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    harness.require_data(args.data)
    import numpy as np

    with harness.pin_threads(1):
        from trawmem_gpu.select.engine import SelectionEngine, compiled

        args.threads = 1
        _d, cfg, params, (ids, qs, Z) = target_setup(args)
        eng = SelectionEngine(_d.banks, cfg, device="cpu", threads=1)
        seen = {}
        real = compiled._texts

        def spy(snap, plan, cfg_, head, batch):
            seen.update(snap=snap, plan=plan, cfg=cfg_, head=head, batch=batch)
            return real(snap, plan, cfg_, head, batch)

        compiled._texts = spy
        try:
            select_units(eng, ids, qs, Z, params)  # warm, and the call's arguments
        finally:
            compiled._texts = real
        call = [seen[k] for k in ("snap", "plan", "cfg", "head", "batch")]
        clear_text_cache()
        dig = digest(real(*call))
        cpu = []
        for _ in range(args.reps):
            clear_text_cache()
            t = time.process_time()
            real(*call)
            cpu.append(time.process_time() - t)
    with open("/proc/loadavg") as fh:
        load = fh.read().strip()
    res = {"machine": harness.machine(threads=1), "Q": len(ids), "reps": args.reps, "cpu_ms": [1e3 * c for c in cpu],
           "cpu_ms_median": 1e3 * float(np.median(cpu)), "cpu_ms_min": 1e3 * float(min(cpu)), "sha256": dig,
           "loadavg": load}
    print(f"_texts CPU ms per batch of {len(ids)}: median {res['cpu_ms_median']:.2f}, min {res['cpu_ms_min']:.2f} "
          f"({args.reps} reps); sha256 {dig}; loadavg {load}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
