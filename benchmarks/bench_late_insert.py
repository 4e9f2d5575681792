"""The cost of a late insert (a turn dated before the bank's last turn, ``ingest.late``) against
an append at the end (``ingest.update_bank``), on one bank of N synthetic turns, side by side.

    python -m benchmarks.bench_late_insert [--sizes 1000 10000 100000] [--rounds 3]

Writes ``benchmarks/results/late_insert.json`` and ``late_insert.png``: per N, the median seconds
of each over ``--rounds`` (one new turn each time) and their ratio, saved after each N (a run
stopped at a large N keeps the sizes before it).
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import json
import statistics
import time
from datetime import datetime, timedelta
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
WORDS = "garden violin train bakery bicycle dog lisbon tomato job wheel vet lesson".split()


def _turns(n: int):
    from trawmem_gpu.data.types import Turn

    t0, out = datetime(2030, 1, 1, 9), []
    for i in range(n):
        t = t0 + timedelta(minutes=7 * i)
        out.append(Turn(turn_id=f"t{i}", speaker="Ana" if i % 2 else "Ben", session=i // 40,
                        text=f"Turn {i} on the {WORDS[i % len(WORDS)]} and the {WORDS[(i // 5) % len(WORDS)]}.",
                        timestamp=t.isoformat(), time=t))
    return out


def run(sizes, rounds: int, save=None) -> dict:
    from dataclasses import replace

    from trawmem_gpu.data.types import Conversation
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.ingest import build_banks, update_bank
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.ingest.late import insert_bank, place

    enc, cfg, rows = get_encoder(cache=False), BuildConfig(), []
    for n in sizes:
        turns = _turns(n)
        (bank,), _ = build_banks([Conversation("b", turns)], cfg, enc, progress=False)
        app, late = [], []
        for r in range(rounds):
            last = turns[-1].time + timedelta(minutes=1)
            new = replace(turns[-1], turn_id=f"new{r}", text=f"A new note {r}.", timestamp=last.isoformat(), time=last)
            t0 = time.perf_counter()
            update_bank(bank, [new], cfg, enc)
            app.append(time.perf_counter() - t0)
            mid = turns[n // 2]
            old = replace(mid, turn_id=f"late{r}", text=f"A late note {r}.")
            t0 = time.perf_counter()
            insert_bank(bank, place(bank.turns, [old], {old.turn_id}, False), cfg, enc)
            late.append(time.perf_counter() - t0)
        a, b = statistics.median(app), statistics.median(late)
        rows.append({"n_turns": n, "rounds": rounds, "append_s": a, "late_insert_s": b, "ratio": b / a})
        print(rows[-1], flush=True)
        if save is not None:
            save({"encoder": enc.id, "rows": rows})
    return {"encoder": enc.id, "rows": rows}


def save(out: dict) -> None:
    """``late_insert.json`` and ``late_insert.png`` of ``out`` (the sizes measured so far)."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "late_insert.json").write_text(json.dumps(out, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n_turns"] for r in out["rows"]]
    plt.figure()
    plt.loglog(ns, [r["append_s"] for r in out["rows"]], "o-", label="append at the end")
    plt.loglog(ns, [r["late_insert_s"] for r in out["rows"]], "o-", label="late insert")
    plt.xlabel("turns in the bank")
    plt.ylabel("seconds (median)")
    plt.legend()
    plt.savefig(RESULTS / "late_insert.png", dpi=100)
    plt.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    run(a.sizes, a.rounds, save)


if __name__ == "__main__":
    main()
