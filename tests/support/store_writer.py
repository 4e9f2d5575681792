"""A writer process for the concurrency tests: puts (and appends to) tiny synthetic banks.

``python tests/support/store_writer.py DIR WRITER N_BANKS N_TURNS START_AT [APPEND_TO APPENDS [REPEAT]]``
waits until the wall clock reaches START_AT (so all writers start together), then writes
banks ``w{WRITER}-b{i}`` with N_TURNS turns each through ``Collection.put`` (each REPEAT
times, with 1..N_TURNS turns), interleaved with APPENDS read-modify-write appends of one turn
each to the shared bank APPEND_TO through ``Collection.update``. No encoder: vectors are
random, one thread per session of 2 turns.
"""
from __future__ import annotations

import sys
import time
from datetime import datetime

import numpy as np

from trawmem_gpu.data.types import Turn
from trawmem_gpu.store import Bank, Collection


def tiny_bank(bank_id: str, turns: list[Turn], seed: int = 0) -> Bank:
    rng = np.random.default_rng(seed)
    n = len(turns)
    starts = [i for i in range(n) if i == 0 or turns[i].session != turns[i - 1].session]
    J = len(starts)
    v = rng.standard_normal((n, 8)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    h = rng.standard_normal((J, 8)).astype(np.float32)
    h /= np.linalg.norm(h, axis=1, keepdims=True)
    src = np.array([j for j in range(J - 1)] + [j + 1 for j in range(J - 1)], dtype=np.int64)
    dst = np.array([j + 1 for j in range(J - 1)] + [j for j in range(J - 1)], dtype=np.int64)
    order = np.lexsort((dst, src))
    return Bank(bank_id, list(turns), np.array(starts + [n], dtype=np.int64), [f"head {j}" for j in range(J)],
                ["extractive"] * J, v, h, src[order], dst[order], np.ones(len(src), np.float32),
                np.zeros(len(src), np.int8), "test-encoder")


def turn(tid: str, session: int) -> Turn:
    return Turn(tid, "Ana", f"turn {tid}", session, "2024-01-01", datetime(2024, 1, session % 28 + 1))


def main(argv: list[str]) -> None:
    root, w, n_banks, n_turns, start_at = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), float(argv[4])
    append_to, appends = (argv[5], int(argv[6])) if len(argv) > 6 else (None, 0)
    repeat = int(argv[7]) if len(argv) > 7 else 1
    coll = Collection(root, create=True)
    while time.time() < start_at:
        time.sleep(0.002)
    for i in range(max(n_banks, appends)):
        for r in range(repeat) if i < n_banks else ():
            bid = f"w{w}-b{i}"
            n = n_turns if r == repeat - 1 else 1 + r % n_turns
            coll.put(tiny_bank(bid, [turn(f"{bid}-t{k}", 1 + k // 2) for k in range(n)], seed=w * 1000 + i))
        if i < appends:
            def add(old, tid=f"w{w}-a{i}"):
                prev = old.turns if old is not None else []
                return tiny_bank(append_to, prev + [turn(tid, 1 + len(prev) // 2)])
            coll.update(append_to, add)


if __name__ == "__main__":
    main(sys.argv[1:])
