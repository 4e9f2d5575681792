"""What a loaded bank's turns hold, as a list of ``Turn`` objects and as compact columns
(``store.turn_columns``), side by side in one process (issue 46 item 2).

The bank of ``engine_resident.py``'s cached collection is loaded twice per round, alternating: as
columns (``load_bank`` as it is) and as a list (its loader patched to hand back ``list(turns)``,
what it did before). Per load: the Python bytes it keeps (``tracemalloc``, the bank's turns and
their id map after ``turn_map()``), the load's seconds, one full iteration's and one
``embed_texts`` pass's seconds. For the list: the bytes each field's objects take (``sys.getsizeof``
over distinct objects: the ``Turn`` objects with their ``__dict__``, ids, speakers, texts,
timestamps, times, captions, metadata, ``stored_at``). For the columns: their arrays' bytes.

    python -m benchmarks.experiments.turn_columns_memory --coll /work/scratch/resident/coll_100000_t100_int8
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc

from .. import harness

MIB = float(1 << 20)


def _fields(turns) -> dict:
    """Bytes of the distinct objects of each field of a list of turns (``sys.getsizeof``)."""
    out, seen = {}, set()
    for name in ("turn_id", "speaker", "text", "timestamp", "time", "caption", "metadata", "stored_at"):
        n = 0
        for t in turns:
            v = getattr(t, name)
            if v is not None and id(v) not in seen:
                seen.add(id(v))
                n += sys.getsizeof(v)
        out[name] = round(n / MIB, 2)
    out["Turn objects + __dict__"] = round(sum(sys.getsizeof(t) + sys.getsizeof(t.__dict__) for t in turns) / MIB, 2)
    out["session ints (small ints shared)"] = 0
    return out


def _load(coll_path: str, as_list: bool) -> dict:
    from trawmem_gpu.store import Collection, files
    from trawmem_gpu.store.turn_columns import embed_texts

    real = files._read_turns
    if as_list:
        files._read_turns = lambda fp: (lambda t, d: (list(t), d))(*real(fp))
    try:
        gc.collect()
        tracemalloc.start()
        t0 = time.perf_counter()
        coll = Collection(coll_path)
        bank = coll.load(coll.bank_ids[0], mmap=True)
        load_s = time.perf_counter() - t0
        bank.turn_map()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    finally:
        files._read_turns = real
    t0 = time.perf_counter()
    n = sum(1 for _ in bank.turns)
    iter_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    embed_texts(bank.turns)
    embed_s = time.perf_counter() - t0
    rec = {"turns": n, "type": type(bank.turns).__name__, "held_mib": round(held / MIB, 1),
           "bytes_per_turn": round(held / n, 1), "load_s": round(load_s, 2), "iterate_s": round(iter_s, 2),
           "embed_texts_s": round(embed_s, 2)}
    if as_list:
        rec["fields_mib"] = _fields(bank.turns)
    else:
        c = bank.turns.cols
        rec["columns_mib"] = {"texts": round(c.texts.nbytes() / MIB, 2), "ids": round(c.ids.nbytes() / MIB, 2),
                              "speaker, session, timestamp, time, stored_at codes": round(
                                  sum(getattr(c, k).nbytes for k in ("speaker", "session", "stamp", "time", "stored"))
                                  / MIB, 2), "id hash index": round(sum(a.nbytes for a in c.hashes()) / MIB, 2)}
    del bank
    gc.collect()
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coll", default="/work/scratch/resident/coll_100000_t100_int8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--name", default="turn_columns_memory_1e5")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    rec = {"collection": a.coll, "rounds": []}
    for r in range(a.rounds):
        row = {}
        for mode in ("columns", "list") if r % 2 == 0 else ("list", "columns"):
            row[mode] = _load(a.coll, mode == "list")
            print(r, mode, row[mode], flush=True)
        rec["rounds"].append(row)
    harness.save(a.name, rec, out_dir=a.out_dir or harness.results_dir(default=harness.ARCHIVE))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
