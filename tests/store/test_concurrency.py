"""Concurrent writers on one collection: nothing lost, nothing half-written, leftovers cleaned.

The writers are separate processes (``tests/support/store_writer.py``) started together; banks are tiny
and synthetic (no encoder), so the whole file takes a few seconds.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trawmem_gpu.errors import BankError
from trawmem_gpu.store import Collection, load_bank

from store_writer import tiny_bank, turn  # noqa: E402

WRITER = Path(__file__).resolve().parents[1] / "support" / "store_writer.py"
ROOT = Path(__file__).resolve().parents[2]


def _spawn(args: list) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(WRITER), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_while(coll_dir: Path, procs: list) -> int:
    """Load every indexed bank over and over while the writers run; every load must succeed."""
    reads = 0
    while any(p.poll() is None for p in procs):
        if not (coll_dir / "collection.json").exists():
            time.sleep(0.01)
            continue
        coll = Collection(coll_dir)
        for b in coll.bank_ids:
            coll.load(b)  # raises BankError on a half-written or missing bank
            reads += 1
    return reads


def test_four_writers_lose_nothing(tmp_path):
    """4 processes write 6 banks each into one collection at once and append 5 turns each to one
    shared bank, while this process keeps reading: every bank and every turn is there."""
    d = tmp_path / "coll"
    W, N_BANKS, N_TURNS, APPENDS = 4, 6, 5, 5
    start = time.time() + 1.0  # after every interpreter has started (~0.5 s each, 2 cores)
    procs = [_spawn([d, w, N_BANKS, N_TURNS, start, "shared", APPENDS]) for w in range(W)]
    reads = _read_while(d, procs)
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    coll = Collection(d)
    want = {f"w{w}-b{i}" for w in range(W) for i in range(N_BANKS)} | {"shared"}
    assert set(coll.bank_ids) == want
    for bid in want - {"shared"}:
        b = coll.load(bid)
        assert [t.turn_id for t in b.turns] == [f"{bid}-t{k}" for k in range(N_TURNS)]
    shared = coll.load("shared")
    assert sorted(t.turn_id for t in shared.turns) == sorted(f"w{w}-a{i}" for w in range(W) for i in range(APPENDS))
    assert sorted(p.name for p in (d / "banks").iterdir()) == sorted(coll.banks.values())  # no leftovers
    assert reads > 0


def test_threads_of_one_process(tmp_path):
    """The same guarantees among threads: 4 threads, each with its own Collection object."""
    d = tmp_path / "coll"
    errors = []

    def work(w):
        try:
            coll = Collection(d, create=True)
            for i in range(4):
                bid = f"t{w}-{i}"
                coll.put(tiny_bank(bid, [turn(f"{bid}-x{k}", 1) for k in range(3)]))
                coll.update("shared", lambda old, tid=f"{w}-{i}": tiny_bank(
                    "shared", (old.turns if old else []) + [turn(tid, 1)]))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors, errors
    coll = Collection(d)
    assert len(coll) == 17
    assert len(coll.load("shared").turns) == 16


def test_stale_temp_dirs_are_cleaned_and_aside_bank_restored(tmp_path):
    d = tmp_path / "coll"
    coll = Collection(d, create=True)
    coll.put(tiny_bank("a", [turn("a1", 1)]))
    coll.put(tiny_bank("b", [turn("b1", 1)]))
    banks = d / "banks"
    # a writer killed while writing a bank, one killed between the two renames of bank b,
    # and one killed while writing the index
    (banks / ".a.tmp-dead1").mkdir()
    (banks / ".a.tmp-dead1" / "units.json").write_text("[")
    (banks / "b").rename(banks / ".b.old-dead2")
    (d / ".collection.json.tmp-dead3").write_text("{")
    with pytest.raises(BankError, match="rename it back"):
        load_bank(banks / "b")  # the bank directory alone says where its bank went
    assert Collection(d).load("b").turns[0].turn_id == "b1"  # a read through the collection puts it back
    (banks / "b").rename(banks / ".b.old-dead2")
    coll.put(tiny_bank("c", [turn("c1", 1)]))  # the next write cleans up
    assert sorted(p.name for p in banks.iterdir()) == ["a", "b", "c"]
    assert not list(d.glob(".collection.json.tmp-*"))
    assert Collection(d).load("b").turns[0].turn_id == "b1"


def test_update_is_one_read_modify_write(tmp_path):
    coll = Collection(tmp_path / "coll", create=True)
    assert coll.update("x", lambda old: None) is None and "x" not in coll
    coll.update("x", lambda old: tiny_bank("x", [turn("x1", 1)]))
    coll.update("x", lambda old: tiny_bank("x", old.turns + [turn("x2", 1)]))
    assert [t.turn_id for t in Collection(tmp_path / "coll").load("x").turns] == ["x1", "x2"]
    with pytest.raises(BankError, match="returned bank 'y'"):
        coll.update("x", lambda old: tiny_bank("y", old.turns))


def test_update_reruns_when_a_put_lands_meanwhile(tmp_path):
    """A plain put of the bank lands while fn runs: the update is applied to the new bank, not
    to the one fn first saw, so the put is not lost."""
    d = tmp_path / "coll"
    Collection(d, create=True).put(tiny_bank("x", [turn("x1", 1)]))
    seen = []

    def append(old):
        seen.append([t.turn_id for t in old.turns])
        if len(seen) == 1:  # another writer replaces the bank while we compute
            Collection(d).put(tiny_bank("x", [turn("x1", 1), turn("p1", 1)]))
        return tiny_bank("x", old.turns + [turn("u1", 1)])

    Collection(d).update("x", append)
    assert seen == [["x1"], ["x1", "p1"]]
    assert [t.turn_id for t in Collection(d).load("x").turns] == ["x1", "p1", "u1"]


def test_reader_of_a_replaced_bank_never_fails(tmp_path):
    """Another process replaces one bank 60 times while this one loads it in a loop: every load
    sees a whole bank (1 to 6 turns), never an error."""
    d = tmp_path / "coll"
    Collection(d, create=True).put(tiny_bank("w0-b0", [turn("w0-b0-t0", 1)]))
    proc = _spawn([d, 0, 1, 6, 0, "-", 0, 60])
    coll = Collection(d)
    seen = set()
    while proc.poll() is None:
        seen.add(len(coll.load("w0-b0").turns))
    assert proc.returncode == 0, proc.stderr.read()
    assert len(load_bank(d / "banks" / "w0-b0").turns) == 6 and seen <= set(range(1, 7))
