"""Workspace assembly per query (group, render, exact token count), with the per-turn line cache
against without it, in interleaved rounds of one run (LoCoMo dev banks, 17-unit random sets, the
default date headings).

    python -m benchmarks run assembly [--data PATH] [--rounds 9] [--out benchmarks/results/assembly.json]

"Without" swaps ``select.workspace.unit_line`` and ``select.workspace.date_label`` for their uncached
functions (``__wrapped__``); the token count is ``tokens.count_tokens_cached`` in both.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from . import harness


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", type=Path, help="result file (default: assembly.json in the results folder)")
    a = ap.parse_args()
    harness.require_data(a.data)
    out_path = harness.out_file(a.out, "assembly.json")
    import trawmem_gpu.select.workspace as W
    from trawmem_gpu.eval.retrieval import banks_for

    _, banks, _ = banks_for(a.data, progress=False)
    rng = np.random.default_rng(0)
    sets = [(b, [int(u) for u in rng.choice(b.n_units, 17, replace=False)]) for b in banks for _ in range(300)]
    cached = (W.unit_line, W.date_label)
    plain = (W.unit_line.__wrapped__, W.date_label.__wrapped__)
    us = {"cached": [], "uncached": []}
    texts = {}
    for _ in range(a.rounds):
        for name, (ul, dl) in (("uncached", plain), ("cached", cached)):
            W.unit_line, W.date_label = ul, dl
            t0 = time.perf_counter()
            out = [(ws := W.assemble(b, "q", s)).render() + str(ws.n_tokens) for b, s in sets]
            us[name].append((time.perf_counter() - t0) / len(sets) * 1e6)
            texts[name] = out
    W.unit_line, W.date_label = cached
    assert texts["cached"] == texts["uncached"], "the cache changed a workspace"
    ratio = [u / c for u, c in zip(us["uncached"], us["cached"])]
    res = {"workspaces_per_round": len(sets), "rounds": a.rounds, "units_per_workspace": 17,
           "us_per_workspace_median": {k: float(np.median(v)) for k, v in us.items()},
           "speedup_median": float(np.median(ratio)), "speedup_range": [float(min(ratio)), float(max(ratio))],
           "identical_workspaces": True}
    print(json.dumps(res, indent=1))
    print(f"-> {harness.save(out_path.stem, res, out_dir=out_path.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
