"""The selection path's speed, one tree against another, side by side (issue 43 item 5).

Each round runs, for each tree (``--tree`` a checkout root, first the old one), a fresh
interpreter with that tree first on ``sys.path`` that times, on the bundled sample collection:

* ``Memory.select``: ``--n`` single selections (vectors given, so the encoder is not timed), with
  and without a ``where`` filter;
* a 256-query serve batch: ``SelectionService.process_batch`` of 256 items (vectors given) on its
  batch worker's path, the workspaces assembled (the pool's futures waited for).

The trees alternate round by round; per figure the median over rounds and the new/old ratio
are printed (and written as JSON with ``--out``). ::

    python benchmarks/experiments/select_path_speed.py --tree /work/main --tree . --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r'''
import json, sys, time
root, coll, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, root)
import numpy as np
import trawmem_gpu
assert trawmem_gpu.__file__.startswith(root), trawmem_gpu.__file__
from trawmem_gpu import Memory

qs = ["Where does Ben's sister live?", "What did Ana buy?", "When did they go hiking?", "What is Ana's job?",
      "What did Ben say about the cat?", "Which book did Ana read?", "Where did they meet?", "What happened first?"]
mem = Memory(coll, create=False)
Z = mem._core.encoder.encode(qs, is_query=True)
out = {}
for name, where in (("memory_select", None), ("memory_select_where", {"speaker": "Ana"})):
    for i in range(8):  # warm
        mem.select("ana-ben", qs[i % 8], vector=Z[i % 8], where=where, budget=8)
    t0 = time.perf_counter()
    for i in range(n):
        mem.select("ana-ben", qs[i % 8], vector=Z[i % 8], where=where, budget=8)
    out[name + "_ms"] = (time.perf_counter() - t0) / n * 1e3
del mem

from trawmem_gpu.serve.config import ServeConfig
from trawmem_gpu.serve.service import SelectItem, SelectionService
from trawmem_gpu.select.params import QueryParams
svc = SelectionService(ServeConfig(collection=coll, warmup=False))
def batch():
    items = [SelectItem("ana-ben", qs[i % 8], Z[i % 8], QueryParams(budget=8)) for i in range(256)]
    res = svc.process_batch(items)
    for r in res:
        body = r.future.result()[r.index] if hasattr(r, "future") else r
        assert isinstance(body, dict), body
for _ in range(2):
    batch()
ts = []
for _ in range(5):
    t0 = time.perf_counter()
    batch()
    ts.append(time.perf_counter() - t0)
out["serve_batch256_ms"] = sorted(ts)[len(ts) // 2] * 1e3
svc.worker.shutdown(); svc.appender.shutdown(); svc.loader.shutdown(); svc.assembler.shutdown()
print(json.dumps(out))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="a checkout root (give two: old, then new)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=200, help="Memory.select calls per figure and round")
    ap.add_argument("--out", help="write the result JSON here")
    a = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in a.tree]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": ""}
    with tempfile.TemporaryDirectory() as d:
        env["TRAWMEM_CACHE"] = str(Path(d) / "cache")
        coll = Path(d) / "coll"
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
        subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
                        "from serve_util import build_sample_collection as b; b(__import__('pathlib').Path(sys.argv[3]))",
                        trees[-1], str(Path(trees[-1]) / "tests" / "support"), str(coll)], check=True, env=env)
        runs: dict = {t: [] for t in trees}
        for r in range(a.rounds):
            for t in (trees if r % 2 == 0 else trees[::-1]):
                p = subprocess.run([sys.executable, "-c", CHILD, t, str(coll), str(a.n)], env=env,
                                   capture_output=True, text=True)
                if p.returncode:
                    sys.exit(p.stderr[-3000:])
                runs[t].append(json.loads(p.stdout.strip().splitlines()[-1]))
    med = {t: {k: statistics.median(x[k] for x in runs[t]) for k in runs[t][0]} for t in trees}
    old, new = trees[0], trees[-1]
    res = {"trees": trees, "rounds": a.rounds, "n": a.n, "median": med, "runs": runs,
           "ratio_new_over_old": {k: med[new][k] / med[old][k] for k in med[old]}}
    for k in med[old]:
        print(f"{k:24s} old {med[old][k]:9.3f}  new {med[new][k]:9.3f}  new/old {res['ratio_new_over_old'][k]:.3f}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
