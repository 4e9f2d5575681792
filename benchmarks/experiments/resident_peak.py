"""Peak bytes the lazy banks of a Memory hold while calls are in flight (issue 42 item 8).

16 banks of 40 turns (the test suite's ``WordEncoder``, so no model loads) under a resident budget
of 3.5 banks; four threads select and two append at once. The bytes held (every bank object the
registry or the engine holds, plus the engine's tables) are sampled at each bank load and engine
refresh and every half millisecond. The bound ``memory.core.MemoryCore.admit`` keeps is the
budget plus one bank's size. Saves ``resident_peak.json`` / ``.png`` (under the archive, as every
experiment; ``--out-dir`` elsewhere).

    python -m benchmarks.experiments.resident_peak [--rounds 3] [--out-dir DIR]
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
from pathlib import Path

from .. import harness

TOPICS = ("hiking trail mountain boots", "piano lesson music sheet", "garden tomato soil seeds",
          "kayak river paddle lake", "bread oven flour bake")
N_BANKS = 16


def _turns(b: int, n: int = 40, start: int = 0) -> list[dict]:
    w = TOPICS[b % len(TOPICS)]
    return [{"turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben", "text": f"{w} note {b} {i} day {i % 3} " * 3,
             "timestamp": f"2031-03-{1 + i // 30:02d}T{10 + i % 10:02d}:{i % 60:02d}:00"}
            for i in range(start, start + n)]


class _Peak:
    """The most bytes held by ``core``'s banks and tables at any sample."""

    def __init__(self, core):
        from trawmem_gpu.memory.resident import bank_nbytes

        self.core, self.nbytes, self.peak, self._lock = core, bank_nbytes, 0, threading.Lock()

    def held(self) -> int:
        core = self.core
        objs = {id(b): b for b in [*core.registry.banks().values(), *core.engines.banks.values()]}
        return sum(self.nbytes(b) for b in objs.values()) + sum(core.engines.table_bytes.values())

    def sample(self) -> None:
        try:
            v = self.held()
        except RuntimeError:  # a dict changed size under the sampler: the next sample counts
            return
        with self._lock:
            self.peak = max(self.peak, v)

    def after(self, obj, name: str) -> None:
        """Sample after every call of ``obj.name``."""
        f = getattr(obj, name)

        def hooked(*a, **k):
            out = f(*a, **k)
            self.sample()
            return out

        setattr(obj, name, hooked)


def one_round(d: Path, budget: int, encoder) -> int:
    """The peak bytes held over one run of the four select and two append threads."""
    from trawmem_gpu import Memory

    mem = Memory(d, encoder=encoder, max_resident_bytes=budget)
    peak = _Peak(mem._core)
    peak.after(mem._core.registry.coll, "load")
    peak.after(mem._core.engines, "refresh")
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            peak.sample()
            stop.wait(0.0005)

    def sel(k):
        for i in range(40):
            mem.select(f"b{(k * 5 + i * 3) % N_BANKS:02d}", "note day", budget=4)

    def app(k):
        for i in range(6):
            b = (k * 7 + i * 5) % N_BANKS
            mem.add(f"b{b:02d}", _turns(b, 1, 1000 + k * 100 + i))

    threads = [threading.Thread(target=sel, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=app, args=(k,)) for k in range(2)]
    s = threading.Thread(target=sampler)
    s.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    s.join()
    return peak.peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    from trawmem_gpu import Memory

    encoder = harness.tests_module("word_encoder").WordEncoder()
    root = Path(tempfile.mkdtemp())
    peaks = []
    try:
        for r in range(args.rounds):
            d = root / f"c{r}"
            m = Memory(d, encoder=encoder)
            for b in range(N_BANKS):
                m.add(f"b{b:02d}", _turns(b))
            probe = Memory(d, encoder=encoder, max_resident_bytes=10 ** 12)
            for b in range(N_BANKS):
                probe.select(f"b{b:02d}", "hiking", budget=4)
            one = max(probe._core.resident._sizes.values())
            budget = int(3.5 * one)
            peaks.append({"round": r, "one_bank_bytes": one, "budget_bytes": budget,
                          "peak_bytes": one_round(d, budget, encoder)})
            p = peaks[-1]
            print(f"round {r}: peak {p['peak_bytes'] / budget:.2f}x the budget "
                  f"(bound, budget + one bank: {(budget + one) / budget:.2f}x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = [p["peak_bytes"] / p["budget_bytes"] for p in peaks]
    bounds = [(p["budget_bytes"] + p["one_bank_bytes"]) / p["budget_bytes"] for p in peaks]
    fig, ax = harness.figure(figsize=(5, 3.2))
    ax.bar(range(len(ratios)), ratios, label="peak held / budget")
    ax.plot(range(len(ratios)), bounds, "k--", marker="o", label="budget + one bank")
    ax.set_xlabel("round")
    ax.set_ylabel("bytes / budget")
    ax.set_title("lazy banks in flight: 4 select + 2 append threads")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = harness.save("resident_peak", {"banks": N_BANKS, "budget_banks": 3.5, "select_threads": 4,
                                          "append_threads": 2, "rounds": peaks, "peak_over_budget": ratios,
                                          "bound_over_budget": bounds,
                                          "within_bound": all(r <= b for r, b in zip(ratios, bounds))},
                        fig, out_dir=args.out_dir or harness.results_dir(default=harness.ARCHIVE))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
