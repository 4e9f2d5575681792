"""The compiled loops of this tree against another commit's whole package, on the same recorded
arguments (issue 46 item 3): did a change keep every output bit, and what did it save in place?

``ab_select_loops.py`` compiles only the other tree's loop source in this tree's namespace, so a
change in a step's compiled helper (a sort, the greedy, a NamedTuple's fields) is on both sides
or does not compile. This one extracts the other commit's ``trawmem_gpu`` (``git archive``) into a
temporary folder as the package ``trawmem_gpu_base`` (its imports are relative), records one batch
call's ``front_loop`` / ``stage_loop`` arguments at the target point with this tree, hands the
same arrays to both packages' loops (the NamedTuples rebuilt as the other package's classes),
compares the SHA-256 of what each wrote (``ab_select_loops.out_digest``) and times both by process
CPU time in interleaved rounds (order flipped every round; ratio = other / this within a round)::

    python benchmarks/experiments/ab_select_package.py --base-tree /work/main [--commit HEAD] [--rounds 15] [--out FILE.json]
"""
from __future__ import annotations

if not __package__:  # python benchmarks/experiments/NAME.py: run as a module of benchmarks
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.experiments"

import argparse
import importlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .. import harness
from .ab_select_loops import out_digest
from .profile_select_loops import record_loop_calls


def base_package(tree: str, commit: str, into: Path):
    """``tree``'s ``trawmem_gpu`` at ``commit`` as the importable package ``trawmem_gpu_base``."""
    tar = subprocess.run(["git", "-C", tree, "archive", commit, "trawmem_gpu"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(into, filter="data")
    (into / "trawmem_gpu").rename(into / "trawmem_gpu_base")
    sys.path.insert(0, str(into))
    return importlib.import_module("trawmem_gpu_base.select.engine.compiled_loops")


def as_base(x):
    """``x`` with every NamedTuple of ``trawmem_gpu`` rebuilt as ``trawmem_gpu_base``'s class."""
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        mod = importlib.import_module(type(x).__module__.replace("trawmem_gpu", "trawmem_gpu_base", 1))
        return getattr(mod, type(x).__qualname__)(*[as_base(f) for f in x])
    return type(x)(as_base(f) for f in x) if isinstance(x, (list, tuple)) else x


def fresh(name: str, a: tuple) -> list:
    """The call's arguments with new output buffers (the same arrays otherwise)."""
    import numpy as np

    a = list(a)
    if name == "stage_loop":
        a[-2], a[-1] = np.full_like(a[-2], -7), np.zeros_like(a[-1])
    else:
        a[-1] = type(a[-1])(*[np.full_like(f, 7) for f in a[-1]])
    return a


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-tree", required=True, help="a checkout of this repository")
    ap.add_argument("--commit", default="HEAD", help="the other side's commit in --base-tree")
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    harness.require_data(args.data)
    import numpy as np

    commit = subprocess.run(["git", "-C", args.base_tree, "rev-parse", args.commit], capture_output=True, text=True,
                            check=True).stdout.strip()
    res = {}
    with tempfile.TemporaryDirectory() as tmp, harness.pin_threads(1):
        other_mod = base_package(args.base_tree, commit, Path(tmp))
        loops, calls, _ = record_loop_calls(args)
        for k, this in loops.items():
            other = getattr(other_mod, k)
            A = [fresh(k, a) for a in calls[k]]
            B = [fresh(k, as_base(tuple(a))) for a in calls[k]]
            for fn, X in ((this, A), (other, B)):
                for a in X:
                    fn(*a)
            same = all(out_digest(k, a) == out_digest(k, b) for a, b in zip(A, B))
            ms = {"this": [], "other": []}
            for r in range(args.rounds):
                for side in (("this", "other") if r % 2 == 0 else ("other", "this")):
                    fn, X = (this, A) if side == "this" else (other, B)
                    t = time.process_time()
                    for a in X:
                        fn(*a)
                    ms[side].append(1e3 * (time.process_time() - t))
            ratio = np.array(ms["other"]) / np.array(ms["this"])
            res[k] = {"same_outputs": same, "batch_cpu_ms_median": {s: float(np.median(v)) for s, v in ms.items()},
                      "ratio_median": float(np.median(ratio)),
                      "ratio_iqr": [float(np.percentile(ratio, 25)), float(np.percentile(ratio, 75))], "ms": ms}
            print(f"{k}: same outputs {same}; CPU ms per batch this {res[k]['batch_cpu_ms_median']['this']:.2f} other "
                  f"{res[k]['batch_cpu_ms_median']['other']:.2f}; other / this median {res[k]['ratio_median']:.3f} "
                  f"(IQR {res[k]['ratio_iqr'][0]:.3f}-{res[k]['ratio_iqr'][1]:.3f})", flush=True)
    out = {"machine": harness.machine(threads=1), "base_tree": args.base_tree, "base_commit": commit,
           "rounds": args.rounds, "loops": res}
    with open("/proc/loadavg") as fh:
        out["loadavg"] = fh.read().strip()
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0 if all(v["same_outputs"] for v in res.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
