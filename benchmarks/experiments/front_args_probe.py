"""A front round's arguments, compiled (``engine/assembly.py``) against the plain ``thread_space`` +
``compact`` (``shortlist.ASSEMBLY``), timed on the very rounds a few queries ran: the cached
10^5-unit synthetic bank (``large_bank_sweep.py``'s ``CACHE``: ``bank_100000_384_t100.pkl``), the
engine on one thread, ``shortlist.front_args``'s arguments captured during 6 queries, then each
setting replayed over them ``REPS`` times, alternately (CPU ms per call, ``time.thread_time``; the
working sets ranked before, so the first round's ranks are not in it), and the sizes of the
working sets and thread spaces.

    CACHE=/work/scratch python benchmarks/experiments/front_args_probe.py
"""
import json, os, pickle, sys, time

import numpy as np

sys.path.insert(0, os.getcwd())
from benchmarks import harness  # noqa: E402
from benchmarks.synthetic_banks import make_queries  # noqa: E402
from trawmem_gpu.select.config import SelectConfig  # noqa: E402
from trawmem_gpu.select.engine import SelectionEngine, shortlist  # noqa: E402


def main() -> None:
    banks = pickle.load(open(os.path.join(os.environ.get("CACHE", "/tmp"), "bank_100000_384_t100.pkl"), "rb"))
    ids, qs, Z = make_queries(banks, 12, seed=8)
    cap, plain = [], shortlist.front_args

    def spy(*a):
        cap.append((*a[:3], list(a[3]), *a[4:]))  # the round's working sets (the engine's list is grown after)
        return plain(*a)
    shortlist.front_args = spy
    reps = int(os.environ.get("REPS", 20))
    with harness.pin_threads(1):
        eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1, ann_index="ivf")
        for i in range(2, 8):
            eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])
        for a in cap:  # ranked once here: the replays time the arguments, not the first round's ranks
            a[3][:] = [shortlist.ranked(sh, int(a[0].off.nu[b])) for sh, b in zip(a[3], a[2].tolist())]
        out = {"calls": len(cap), "ms_per_call": {"plain": [], "compiled": []}}
        for _ in range(3):
            for name, flag in (("plain", False), ("compiled", True)):
                shortlist.ASSEMBLY = flag
                c = time.thread_time()
                for _ in range(reps):
                    for a in cap:
                        plain(*a)
                out["ms_per_call"][name].append(round(1e3 * (time.thread_time() - c) / (reps * len(cap)), 4))
        shortlist.ASSEMBLY = True
        sizes = [(len(a[3][0].units), len(plain(*a)[0][0].ids)) for a in cap]
        out["working_set_units"] = [s[0] for s in sizes]
        out["thread_space_threads"] = [s[1] for s in sizes]
        out["median_ms_per_call"] = {k: float(np.median(v)) for k, v in out["ms_per_call"].items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
