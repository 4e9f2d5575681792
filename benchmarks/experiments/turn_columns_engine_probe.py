"""Probe (issue 46 item 2): RssAnon (MiB) of one process that loads a cached int8 collection's bank
(as columns, or as a list: the loader patched to hand back ``list(turns)``) and builds a one-thread
CPU ``SelectionEngine`` over it; then after ``malloc_trim(0)``, then after clearing the two caches
keyed by a ``Turn`` (``workspace.unit_line``, ``date_label``).

    python -m benchmarks.experiments.turn_columns_engine_probe columns|list [--collection DIR]

Prints one ``RESULT {json}`` line (run it once per mode, alternating; the lines of a run are
saved as ``benchmarks/results/archive/turn_columns_engine_probe_1e5.json``). The collection is
``engine_resident``'s cached 10^5-unit int8 one by default (a scratch folder, never committed)."""
from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

DEFAULT = Path("/work/scratch/resident/coll_100000_t100_int8")


def rss_anon() -> float:
    """This process's anonymous resident memory in MiB (``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return round(int(line.split(":")[1].split()[0]) / 1024, 1)
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def probe(mode: str, collection: Path) -> dict:
    """The RssAnon readings of one mode (``columns``: as loaded; ``list``: the turns as a list)."""
    from benchmarks import harness
    from trawmem_gpu.select import workspace
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.heap import TRIM_MIN_UNITS, trim_heap
    from trawmem_gpu.store import Collection, files

    if mode == "list":
        real = files._read_turns

        def as_list(fp):
            turns, digest = real(fp)
            return list(turns), digest

        files._read_turns = as_list
    r = {"mode": mode, "start": rss_anon()}
    c = Collection(collection)
    bank = c.load(c.bank_ids[0], mmap=True)
    r["loaded"] = rss_anon()
    with harness.pin_threads(1):
        SelectionEngine([bank], SelectConfig(), device="cpu", threads=1, vectors=c.vectors)
    r["engine"] = rss_anon()
    r["unit_line_entries"] = workspace.unit_line.cache_info().currsize
    r["date_label_entries"] = workspace.date_label.cache_info().currsize
    gc.collect()
    trim_heap(TRIM_MIN_UNITS)
    r["engine_trimmed"] = rss_anon()
    workspace.unit_line.cache_clear()
    workspace.date_label.cache_clear()
    gc.collect()
    trim_heap(TRIM_MIN_UNITS)
    r["turn_caches_cleared_trimmed"] = rss_anon()
    return r


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("columns", "list"))
    ap.add_argument("--collection", type=Path, default=DEFAULT, help="a collection engine_resident cached")
    args = ap.parse_args(argv)
    if not args.collection.is_dir():
        raise SystemExit(f"no collection at {args.collection}: run benchmarks.experiments.engine_resident "
                         f"--units 100000 --vectors int8 first, or pass --collection")
    print("RESULT", json.dumps(probe(args.mode, args.collection)))


if __name__ == "__main__":
    main()
