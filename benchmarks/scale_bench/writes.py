"""What a write costs against the bank's size: appending one turn, forgetting one, compacting.

One process per bank size (its peak resident memory is that size's alone): the real-text bank
(``realtext``) is built (through the on-disk embedding cache: each text is encoded once, ever)
and stored in a temporary collection, then, medians of ``--repeats``:

* **append, store**: ``Collection.update`` with ``ingest.update_bank`` of one new turn: what
  ``trawmem build --update`` and every front's append cost without the engine. Its parts, from
  ``update_bank``'s stats: encoding the turn, re-segmenting the session it joins, writing and
  encoding the new heads, updating the nearest-head graph; the rest is the write (the segment's
  files and ``meta.json``, fsynced) and validation. The appended texts are new and encoded without
  the cache, as a live append's are.
* **append, Memory** (sizes up to ``--engine-max-units``): ``Memory.add`` of one turn, which
  also builds the bank's engine tables and publishes them (a select sees the turn when it
  returns); the engine's share is timed apart (``prepare`` + publish); then the first select after
  it (the engine's, the question encoded before the clock: what a snapshot builds on first use),
  and both together (``add_and_select_s``).
* **forget, store**: ``Collection.update`` with ``ingest.forget.without_turns`` of one turn in the
  middle of the bank: a rewrite of the whole bank (erasure needs it).
* **compact**: merging the appends' segments into a new base.

``python -m benchmarks.scale_bench.writes N`` measures one size and prints its JSON record.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTS = ("encode_units_s", "segment_s", "heads_s", "encode_heads_s", "graph_s")


def _vm_hwm_mb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _median(rows: list[dict]) -> dict:
    keys = rows[0].keys()
    return {k: round(statistics.median(r[k] for r in rows), 4) for k in keys}


def point(n: int, data: Path, repeats: int = 3, engine_max: int = 0, work: Path | None = None) -> dict:
    """Measure one bank size ``n`` in this process (see the module docstring)."""
    from trawmem_gpu.data.types import Conversation
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.ingest import build_banks, update_bank
    from trawmem_gpu.ingest.forget import without_turns
    from trawmem_gpu.store import Collection

    from .realtext import append_record, append_turn, real_turns

    work = Path(work or tempfile.mkdtemp(prefix="trawmem-bench-scale-"))
    turns = real_turns(n, data)
    cached, fresh = get_encoder(cache=True), get_encoder(cache=False)
    t0 = time.perf_counter()
    (bank,), _ = build_banks([Conversation("big", turns)], encoder=cached, progress=False)
    build_s = time.perf_counter() - t0
    coll = Collection(work / "c", create=True)
    coll.put(bank)
    coll = Collection(work / "c")
    held = [coll.load("big")]
    fresh.encode(["warm-up of the encoder's first call"])
    appends = []
    for i in range(repeats):
        st: dict = {}

        def add(old, i=i):
            new, s = update_bank(old, [append_turn(old.turns[-1], i)], encoder=fresh)
            st.update(s)
            return new

        t0 = time.perf_counter()
        held.append(coll.update("big", add))
        total = time.perf_counter() - t0
        row = {"total_s": total, **{k: float(st.get(k, 0.0)) for k in PARTS}}
        row["write_and_checks_s"] = total - sum(row[k] for k in PARTS)
        row["encoded_heads"] = float(st.get("encoded_heads", 0))
        row["knn_rows"] = float(st.get("knn_rows", 0))
        appends.append(row)
    seg = coll.segments("big")
    t0 = time.perf_counter()
    coll.compact("big")
    compact_s = time.perf_counter() - t0
    forgets = []
    for i in range(repeats):
        victim = held[-1].turns[len(held[-1].turns) // 2 + i].turn_id
        t0 = time.perf_counter()
        held.append(coll.update("big", lambda old: without_turns(old, [victim], fresh)[0]))
        forgets.append({"total_s": time.perf_counter() - t0})
    rec = {"n_units": n, "n_threads": bank.n_threads, "build_s": round(build_s, 2),
           "append_store": _median(appends), "append_store_runs": [round(r["total_s"], 4) for r in appends],
           "segment_units": [s["n_units"] for s in seg], "segment_knn_rows": [s["knn_rows"] for s in seg],
           "compact_s": round(compact_s, 4), "forget_store": _median(forgets),
           "forget_store_runs": [round(r["total_s"], 4) for r in forgets]}
    if n <= engine_max:
        rec.update(_memory_appends(work / "c", held[-1], repeats))
    rec["peak_rss_mb"] = _vm_hwm_mb()
    return rec


def _memory_appends(path: Path, last_bank, repeats: int) -> dict:
    """``Memory.add`` of one turn, ``repeats`` times: total and the engine's share."""
    from trawmem_gpu import Memory

    from .realtext import append_record

    mem = Memory(path)
    core = mem._core
    last = last_bank.turns[-1]
    q = "Where did I book the trail cabin?"
    z = core.encoder.encode([q], is_query=True)
    core.engines.engine.select_units(["big"], [q], z)  # the engine's first select (compiles) before the clock
    rows = []
    for i in range(repeats):
        rec = append_record(last, 100 + i)
        t0 = time.perf_counter()
        res = core.append("big", [rec])
        t1 = time.perf_counter()
        prepared = core.engines.prepare(res.bank)
        core.sync_engine("big", prepared)
        t2 = time.perf_counter()
        core.engines.engine.select_units(["big"], [q], z)
        t3 = time.perf_counter()
        rows.append({"total_s": t2 - t0, "store_s": t1 - t0, "engine_s": t2 - t1, "first_select_s": t3 - t2,
                     "add_and_select_s": t3 - t0})
        last = res.bank.turns[-1]
    ws = mem.select("big", q, budget=8)
    return {"append_memory": _median(rows), "append_memory_runs": [round(r["total_s"], 4) for r in rows],
            "add_and_select_runs": [round(r["add_and_select_s"], 4) for r in rows],
            "select_sees_append": any(u.startswith("new-") for u in ws.unit_ids)}


def run(sizes: list[int], data: Path, repeats: int, engine_max: int, timeout_s: float, log=print) -> list[dict]:
    """One child process per size (the sizes in order); a size that fails or runs out of time is
    recorded with its error, and the rest go on."""
    out = []
    for n in sizes:
        env = dict(os.environ)
        t0 = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, "-m", "benchmarks.scale_bench.writes", str(n), str(data), str(repeats),
                                str(engine_max)], capture_output=True, text=True, timeout=timeout_s, env=env,
                               cwd=Path(__file__).resolve().parents[2])
            if r.returncode != 0:
                rec = {"n_units": n, "error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
            else:
                rec = json.loads(r.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            rec = {"n_units": n, "error": f"over the {timeout_s:g} s limit"}
        rec["wall_s"] = round(time.perf_counter() - t0, 1)
        log(f"  writes at {n} units: " + (rec.get("error") or
            f"append {rec['append_store']['total_s'] * 1e3:.0f} ms, forget {rec['forget_store']['total_s']:.2f} s, "
            f"compact {rec['compact_s']:.2f} s, peak {rec['peak_rss_mb']:.0f} MB"))
        out.append(rec)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n, data, repeats, engine_max = int(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3])
    import shutil

    work = Path(tempfile.mkdtemp(prefix="trawmem-bench-scale-"))
    try:
        rec = point(n, data, repeats, engine_max, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
