"""Appends as segments (issue 33.3): each append writes what it adds beside the bank's files, the
bank loads as a full build of the same turns would, compaction merges the segments while appends
go on, a format-2 bank still opens, and a ``kill -9`` anywhere in an append or a compaction
leaves a bank that loads with every acknowledged turn.

No model: the word encoder of ``tests/support`` (texts sharing words are near) keeps each append
to milliseconds, and what is checked (the store, the segmentation rule, the graph) does not depend
on the encoder.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bank_compare import assert_banks_equal
from pause_kill import kill_when_paused
from word_encoder import WordEncoder

from trawmem_gpu.data import load_conversations, sample_path
from trawmem_gpu.data.types import Conversation
from trawmem_gpu.ingest import build_banks, update_bank
from trawmem_gpu.store import Collection, load_bank
from trawmem_gpu.store.segments import CompactionPolicy

ROOT = Path(__file__).resolve().parents[2]
ENC = WordEncoder()


def _turns(copies: int = 2):
    """The sample's turns ``copies`` times over, under new ids and later sessions."""
    from dataclasses import replace

    base = load_conversations(sample_path())[0].turns
    out = []
    for c in range(copies):
        last = base[-1].session
        out += [replace(t, turn_id=f"c{c}:{t.turn_id}", session=t.session + c * last) for t in base]
    return out


def _full(turns):
    (b,), _ = build_banks([Conversation("b", list(turns))], encoder=ENC, progress=False)
    return b


def _same(a, b) -> None:
    assert_banks_equal(a, b, exact=False)
    np.testing.assert_array_equal(a.knn_ids, b.knn_ids)
    np.testing.assert_array_equal(a.knn_sims, b.knn_sims)


def _append_all(coll, turns, start: int, step: int) -> list:
    held = []
    for i in range(start, len(turns), step):
        held.append(coll.update("b", lambda old, i=i: update_bank(old, turns[i:i + step], encoder=ENC)[0]))
    return held


def test_appends_are_segments_and_load_as_a_full_build(tmp_path):
    turns = _turns()
    coll = Collection(tmp_path / "c", create=True)
    coll.put(_full(turns[:9]))
    d = coll.bank_path("b")
    base = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in d.iterdir() if p.name != "meta.json"}
    held = _append_all(coll, turns, 9, 3)
    segs = coll.segments("b")
    assert len(segs) == len(held) == -(-(len(turns) - 9) // 3)
    assert sum(s["n_units"] for s in segs) == len(turns) - 9
    # the base's files were not rewritten: each append wrote its own segment's two files
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in d.iterdir() if p.name in base} == base
    assert sorted(p.name for p in d.glob("seg-*")) == sorted(f"{s['name']}.{x}" for s in segs
                                                              for x in ("json", "safetensors"))
    full = _full(turns)
    _same(held[-1], full)  # what the append returns (the registry serves it) ...
    _same(Collection(tmp_path / "c").load("b"), full)  # ... is what a fresh process loads
    _same(load_bank(d, mmap=True), full)
    # compaction: one new base generation, the segments and the old base gone, the same bank
    assert coll.compact("b") and not coll.compact("b")
    assert sorted(p.name for p in d.iterdir()) == ["meta.json", "tensors-1.safetensors", "threads-1.json",
                                                   "units-1.json"]
    _same(Collection(tmp_path / "c").load("b"), full)


def test_appends_to_a_new_session_keep_every_earlier_thread(tmp_path):
    """An append opening a session re-segments nothing: the segment holds the new thread(s) only,
    and the nearest-head rows it stores are those of the new threads and the rows they enter."""
    turns = _turns()
    n = next(i for i, t in enumerate(turns) if t.session == turns[-1].session)  # the last session's start
    coll = Collection(tmp_path / "c", create=True)
    coll.put(_full(turns[:n]))
    old = coll.load("b")
    new = coll.update("b", lambda b: update_bank(b, turns[n:n + 2], encoder=ENC)[0])
    seg = coll.segments("b")[0]
    assert seg["keep_threads"] == old.n_threads and seg["n_threads"] == new.n_threads - old.n_threads
    changed = [j for j in range(old.n_threads) if not np.array_equal(old.knn_ids[j], new.knn_ids[j])]
    assert seg["knn_rows"] == len(changed) + seg["n_threads"] < new.n_threads
    _same(new, _full(turns[:n + 2]))


def test_compaction_keeps_the_segments_appended_while_it_wrote(tmp_path, monkeypatch):
    from trawmem_gpu.store import writes

    turns = _turns()
    coll = Collection(tmp_path / "c", create=True)
    coll.put(_full(turns[:20]))
    held = _append_all(coll, turns[:32], 20, 4)
    later = []

    def append_meanwhile(stage):  # another writer appends while the new base is being written
        if stage == "compact-written" and not later:
            later.append(coll.update("b", lambda old: update_bank(old, turns[32:40], encoder=ENC)[0]))

    monkeypatch.setattr(writes, "pause_point", append_meanwhile)
    assert coll.compact("b")
    assert len(later) == 1 and [s["n_units"] for s in coll.segments("b")] == [8]
    _same(Collection(tmp_path / "c").load("b"), _full(turns[:40]))
    assert held  # the banks the appends returned stay alive: the next append needs no reload
    assert coll.compact("b")
    _same(Collection(tmp_path / "c").load("b"), _full(turns[:40]))


def test_a_rewrite_wins_over_a_compaction_under_way(tmp_path, monkeypatch):
    """A whole-bank write (a forget, a put) that lands while a compaction writes: the compaction
    gives up, its copy of the old bank is removed with the old bank, and the rewrite stays."""
    from trawmem_gpu.store import writes

    turns = _turns()
    coll = Collection(tmp_path / "c", create=True)
    coll.put(_full(turns[:20]))
    _append_all(coll, turns[:28], 20, 4)
    copies = []

    def rewrite_meanwhile(stage):
        if stage == "compact-written":
            copies.extend(coll.path.glob("banks/.b.compact-*"))
            coll.put(_full(turns[:10]))

    monkeypatch.setattr(writes, "pause_point", rewrite_meanwhile)
    assert not coll.compact("b")
    assert copies and not any(p.exists() for p in copies)
    _same(Collection(tmp_path / "c").load("b"), _full(turns[:10]))


def test_background_compaction_under_a_policy(tmp_path):
    turns = _turns()
    coll = Collection(tmp_path / "c", create=True)
    coll.compaction = CompactionPolicy(max_segments=3, max_fraction=10.0)
    coll.put(_full(turns[:10]))
    held = _append_all(coll, turns[:22], 10, 2)
    coll.compactor().wait()
    assert coll.compactor().done >= 1 and len(coll.segments("b")) < 3
    _same(Collection(tmp_path / "c").load("b"), _full(turns[:22]))
    assert held


def test_an_idle_compactor_holds_no_thread_and_no_collection(tmp_path):
    """The compactor's thread ends once its queue is empty (the next submit starts another), so a
    dropped collection, and the banks it caches, is freed: a thread per collection used to wait
    on its queue for good, holding the collection."""
    import gc
    import weakref

    turns = _turns()
    coll = Collection(tmp_path / "c", create=True)
    coll.compaction = CompactionPolicy(max_segments=3, max_fraction=10.0)
    coll.put(_full(turns[:10]))
    _append_all(coll, turns[:22], 10, 2)
    comp = coll.compactor()
    comp.wait()
    first = comp._thread
    if first is not None:
        first.join(60.0)  # it returns once it finds the queue empty
        assert not first.is_alive()
    assert comp.done >= 1 and comp._thread is None
    _append_all(coll, turns[:30], 22, 2)  # more appends: a new thread, and it ends too
    comp.wait()
    if comp._thread is not None:
        comp._thread.join(60.0)
    assert comp._thread is None and comp.done >= 2
    _same(Collection(tmp_path / "c").load("b"), _full(turns[:30]))
    ref = weakref.ref(coll)
    del coll, comp, first
    gc.collect()
    assert ref() is None


def test_a_format_2_bank_opens_and_takes_appends(tmp_path):
    """A collection written by the previous release (format 2: heads in meta.json, no nearest-head
    table; turn metadata in units.json) opens; its first append rewrites it in format 3, and the
    result is a full build's, metadata and all."""
    from dataclasses import replace

    from safetensors.numpy import save_file

    from trawmem_gpu.data.metadata import Metadata
    from trawmem_gpu.data.types import turns_digest
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.store.files import meta_digest, turn_record

    turns = [t if i % 3 else replace(t, metadata=Metadata({"user_id": f"u{i % 2}", "n": i}))
             for i, t in enumerate(_turns())]
    b = _full(turns[:20])
    d = tmp_path / "c" / "banks" / "b"
    d.mkdir(parents=True)
    save_file({k: getattr(b, k) for k in ("unit_vecs", "head_vecs", "thread_offsets", "edge_src", "edge_dst",
                                          "edge_w", "edge_kind")}, str(d / "tensors.safetensors"))
    (d / "units.json").write_text(json.dumps([turn_record(t) for t in b.turns]))
    meta = {"format_version": 2, "bank_id": "b", "encoder_id": b.encoder_id, "dim": 32, "n_units": b.n_units,
            "n_threads": b.n_threads, "n_edges": len(b.edge_src), "heads": b.heads, "head_kind": b.head_kind,
            "build_config": b.build_config, "turns_sha256": turns_digest(b.turns), "stats": {},
            "checksums": {n: file_sha256(d / n) for n in ("tensors.safetensors", "units.json")}}
    meta["meta_sha256"] = meta_digest(meta)
    (d / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "c" / "collection.json").write_text(json.dumps({"format_version": 2, "encoder_id": b.encoder_id,
                                                                "banks": {"b": "b"}}))
    coll = Collection(tmp_path / "c")
    old = coll.load("b")
    assert old.knn_ids is None and old.heads == b.heads
    assert_banks_equal(old, b, exact=True)  # the turns' metadata too
    assert sum(t.metadata is not None for t in old.turns) == 7
    coll.update("b", lambda x: update_bank(x, turns[20:23], encoder=ENC)[0])
    assert json.loads((d / "meta.json").read_text())["format_version"] == 3
    _same(Collection(tmp_path / "c").load("b"), _full(turns[:23]))


_CHILD = """
import sys
from trawmem_gpu.data.types import Conversation
from trawmem_gpu.ingest import update_bank
from trawmem_gpu.store import Collection
sys.path.insert(0, sys.argv[3])
from word_encoder import WordEncoder
from test_segments import _turns
enc, turns = WordEncoder(), _turns()
coll = Collection(sys.argv[1])
n = coll.load("b").n_units
held = []
for i in range(n, n + 6, 2):
    held.append(coll.update("b", lambda old, i=i: update_bank(old, turns[i:i + 2], encoder=enc)[0]))
    print(i + 2, flush=True)  # acknowledged: the bank holds turns[:i + 2]
if sys.argv[2] == "compact":
    coll.compact("b")
"""


@pytest.mark.parametrize("stage", ["segment-written", "compact-written", "compact-moved", "compact-committed"])
def test_a_kill_anywhere_leaves_a_bank_that_loads_with_every_acknowledged_turn(tmp_path, stage):
    turns = _turns()
    coll = Collection(tmp_path / "c", create=True)
    coll.put(_full(turns[:12]))
    _append_all(coll, turns[:16], 12, 2)
    flag = tmp_path / "paused"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "support")]),
           "TRAWMEM_STORE_PAUSE": f"{stage}:{flag}"}
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path / "c"),
                          "append" if stage.startswith("segment") else "compact", str(Path(__file__).parent)],
                         env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kill_when_paused(p, flag, limit_s=300)
    acked = [int(x) for x in p.stdout.read().split()]
    loaded = Collection(tmp_path / "c").load("b")
    n = loaded.n_units
    assert n >= (acked[-1] if acked else 16)
    _same(loaded, _full(turns[:n]))
    # the next writer cleans up and carries on: appends, compacts, no leftover file
    again = Collection(tmp_path / "c")
    keep = [again.load("b")]
    keep.append(again.update("b", lambda old: update_bank(old, turns[n:n + 2], encoder=ENC)[0]))
    assert again.compact("b")
    d = again.bank_path("b")
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(("tensors", "units", "threads"))) == \
        ["meta.json"]
    again.put(keep[-1])  # a whole write sweeps the banks/ directory: no compaction copy left
    assert not list(d.parent.glob(".*"))
    _same(Collection(tmp_path / "c").load("b"), _full(turns[:n + 2]))
