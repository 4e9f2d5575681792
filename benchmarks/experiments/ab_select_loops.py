"""The compiled loops of this tree against another tree's, on the same recorded arguments (issue
46 item 3): did a change keep every output bit, and what did it save in place?

Records the arguments of one batch call's ``front_loop`` / ``stage_loop`` (the CPU default engine
on the LoCoMo dev banks at the target point, Q = 1,024; ``select_bench.paired.target_setup``),
then compiles the other tree's source of each loop (and of ``relevance.learned_row``, which
``front_loop`` calls) in this tree's module namespace and runs both on the recorded arguments:
the outputs' SHA-256 (the candidates' live entries; the picks and their counts) must match, and
the loops are timed by process CPU time in interleaved rounds (order flipped every round; ratio
= other / this within a round)::

    python benchmarks/experiments/ab_select_loops.py --base /work/wt/OTHER [--rounds 15] [--out FILE.json]

Only the loops' own source comes from the other tree: a change elsewhere (a step's compiled
helper) is on both sides, so time it with ``python -m benchmarks run select --versus``.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/experiments/NAME.py: run as a module of benchmarks
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.experiments"

import argparse
import ast
import hashlib
import json
import time
import types
from pathlib import Path

from .. import harness
from .profile_select_loops import record_loop_calls

LOOPS = "trawmem_gpu/select/engine/compiled_loops.py"
RELEVANCE = "trawmem_gpu/select/steps/relevance.py"


def other_fn(base: Path, rel: str, name: str, module, extra: dict | None = None):
    """``name`` from ``base / rel``'s source, compiled (uncached) in a copy of ``module``'s namespace."""
    src = (base / rel).read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name)
    code = "\n".join(src.splitlines()[node.lineno - 1 - len(node.decorator_list):node.end_lineno])
    code = code.replace("cache=True, ", "").replace("(cache=True)", "()")
    ns = dict(vars(module)) | (extra or {})
    exec(compile(code, f"<{base} {name}>", "exec"), ns)
    return ns[name]


def out_digest(name: str, a: tuple) -> bytes:
    """SHA-256 of what a loop call wrote: ``stage_loop``'s ``sel`` and ``n_sel``; ``front_loop``'s
    candidates, their local threads and alpha, the neighbourhood threads and their scores (the
    live entries only: the buffers' padding is never written)."""
    import numpy as np

    h = hashlib.sha256()
    if name == "stage_loop":
        h.update(a[-2].tobytes())
        h.update(a[-1].tobytes())
        return h.digest()
    c = a[-1]
    for q in range(len(c.n_cand)):
        n, nh = int(c.n_cand[q]), int(c.n_h[q])
        for arr in (c.cand[q, :n], c.lt[q, :n], c.alpha[q, :n], c.hthread[q, :nh], c.rvec[q, :nh]):
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.digest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other tree (a checkout of this repository)")
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    harness.require_data(args.data)
    import numpy as np

    base = Path(args.base).resolve()
    with harness.pin_threads(1):
        from trawmem_gpu.select.engine import compiled_loops
        from trawmem_gpu.select.steps import relevance

        loops, calls, _ = record_loop_calls(args)
        rel = types.ModuleType("relevance_of_other")
        rel.__dict__.update(vars(relevance))
        rel.learned_row = other_fn(base, RELEVANCE, "learned_row", relevance)
        res = {}
        for k, this in loops.items():
            other = other_fn(base, LOOPS, k, compiled_loops, {"step3r": rel} if k == "front_loop" else None)
            same = []
            for a in calls[k]:
                other(*a)
                d0 = out_digest(k, a)
                this(*a)
                same.append(d0 == out_digest(k, a))
            ms = {"this": [], "other": []}
            for r in range(args.rounds):
                for side in (("this", "other") if r % 2 == 0 else ("other", "this")):
                    fn = this if side == "this" else other
                    t = time.process_time()
                    for a in calls[k]:
                        fn(*a)
                    ms[side].append(1e3 * (time.process_time() - t))
            ratio = np.array(ms["other"]) / np.array(ms["this"])
            res[k] = {"same_outputs": all(same), "calls": len(same),
                      "batch_cpu_ms_median": {s: float(np.median(v)) for s, v in ms.items()},
                      "ratio_median": float(np.median(ratio)),
                      "ratio_iqr": [float(np.percentile(ratio, 25)), float(np.percentile(ratio, 75))],
                      "ratios": ratio.tolist(), "ms": ms}
            print(f"{k}: same outputs {all(same)}; CPU ms per batch this {res[k]['batch_cpu_ms_median']['this']:.2f}"
                  f" other {res[k]['batch_cpu_ms_median']['other']:.2f}; other / this median {res[k]['ratio_median']:.3f}"
                  f" (IQR {res[k]['ratio_iqr'][0]:.3f}-{res[k]['ratio_iqr'][1]:.3f})", flush=True)
    out = {"machine": harness.machine(threads=1), "base": str(base), "rounds": args.rounds, "loops": res}
    with open("/proc/loadavg") as fh:
        out["loadavg"] = fh.read().strip()
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0 if all(v["same_outputs"] for v in res.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
