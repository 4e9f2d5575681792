"""The cost of a late insert (a turn dated before the bank's last turn, ``ingest.late``) against
an append at the end (``ingest.update_bank``), on one bank of N synthetic turns, side by side.

    python -m benchmarks.bench_late_insert [--sizes 1000 10000 100000] [--rounds 3] [--out late_insert]

Per N, the median seconds over ``--rounds`` (one new turn each time) of: an append at the end; a
late insert dated at the bank's middle; the same with every session segmented again (``full``:
the late insert before it kept the sessions ahead of the late turn, ``ingest.late._kept_prefix``
made to keep none); a late insert dated just before the last turn (a clock a few minutes
behind: ``recent``). Compute only (``update_bank`` / ``insert_bank``), not the write. Writes
``benchmarks/results/<out>.json`` and ``.png``, saved after each N (a run stopped at a large N
keeps the sizes before it).
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
    from trawmem_gpu.ingest import late as late_mod
    from trawmem_gpu.ingest.config import BuildConfig

    kept_prefix = late_mod._kept_prefix

    def late_insert(bank, t, full=False):
        late_mod._kept_prefix = (lambda *a: (0, 0)) if full else kept_prefix
        try:
            t0 = time.perf_counter()
            late_mod.insert_bank(bank, late_mod.place(bank.turns, [t], {t.turn_id}, False), cfg, enc)
            return time.perf_counter() - t0
        finally:
            late_mod._kept_prefix = kept_prefix

    enc, cfg, rows = get_encoder(cache=False), BuildConfig(), []
    for n in sizes:
        turns = _turns(n)
        (bank,), _ = build_banks([Conversation("b", turns)], cfg, enc, progress=False)
        got: dict = {"append_s": [], "late_insert_s": [], "late_full_s": [], "late_recent_s": []}
        for r in range(rounds):
            last = turns[-1].time + timedelta(minutes=1)
            new = replace(turns[-1], turn_id=f"new{r}", text=f"A new note {r}.", timestamp=last.isoformat(), time=last)
            t0 = time.perf_counter()
            update_bank(bank, [new], cfg, enc)
            got["append_s"].append(time.perf_counter() - t0)
            mid = replace(turns[n // 2], turn_id=f"late{r}", text=f"A late note {r}.")
            got["late_insert_s"].append(late_insert(bank, mid))
            got["late_full_s"].append(late_insert(bank, mid, full=True))
            near = turns[-1].time - timedelta(minutes=3)
            recent = replace(turns[-1], turn_id=f"recent{r}", text=f"A recent note {r}.", timestamp=near.isoformat(),
                             time=near)
            got["late_recent_s"].append(late_insert(bank, recent))
        row = {"n_turns": n, "rounds": rounds, **{k: statistics.median(v) for k, v in got.items()}}
        a = row["append_s"]
        row.update(ratio=row["late_insert_s"] / a, ratio_full=row["late_full_s"] / a,
                   ratio_recent=row["late_recent_s"] / a)
        rows.append(row)
        print(rows[-1], flush=True)
        if save is not None:
            save({"encoder": enc.id, "rows": rows})
    return {"encoder": enc.id, "rows": rows}


def save(out: dict, name: str = "late_insert") -> None:
    """``<name>.json`` and ``<name>.png`` of ``out`` (the sizes measured so far)."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n_turns"] for r in out["rows"]]
    plt.figure()
    for key, label in (("append_s", "append at the end"), ("late_insert_s", "late insert (middle)"),
                       ("late_full_s", "late insert, every session re-segmented"),
                       ("late_recent_s", "late insert (3 min before the last turn)")):
        if all(key in r for r in out["rows"]):
            plt.loglog(ns, [r[key] for r in out["rows"]], "o-", label=label)
    plt.xlabel("turns in the bank")
    plt.ylabel("seconds (median)")
    plt.legend()
    plt.savefig(RESULTS / f"{name}.png", dpi=100)
    plt.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="late_insert", help="name of the JSON and PNG under benchmarks/results/")
    a = ap.parse_args(argv)
    run(a.sizes, a.rounds, lambda out: save(out, a.out))


if __name__ == "__main__":
    main()
