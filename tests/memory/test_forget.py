"""Forgetting (issue 22.2): the bank rebuilt without the turns as an append rebuilds it, and no
trace of a forgotten turn left in the collection, the caches, the score outputs or the process's
engine, also after a ``kill -9`` in the middle of a forget."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from pause_kill import kill_when_paused

from trawmem_gpu.cli import main
from trawmem_gpu.data import load_conversations, sample_path
from forget_traces import _history, _KILLED, _needles, _traces, MARKER_ID, QUESTION, ROOT


# -- the rebuild ---------------------------------------------------------------------------------
@pytest.mark.parametrize("drop", [["S2:3"], ["S1:1", "S3:10"], [f"S2:{i}" for i in range(1, 12)]])
def test_the_bank_less_the_turns_equals_a_full_build_of_the_rest(drop):
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.ingest.forget import without_turns
    from trawmem_gpu.data.types import Conversation
    from trawmem_gpu.encode import get_encoder

    conv = load_conversations(sample_path())[0]
    enc = get_encoder(cache=False)
    (bank,), _ = build_banks([conv], encoder=enc, progress=False)
    got, st = without_turns(bank, drop + ["never-there"], enc)
    rest = [t for t in conv.turns if t.turn_id not in drop]
    (want,), _ = build_banks([Conversation(conv.bank_id, rest)], encoder=enc, progress=False)
    assert st["forgotten"] == len(drop) and st["missing"] == ["never-there"]
    assert [t.turn_id for t in got.turns] == [t.turn_id for t in rest]
    assert np.array_equal(got.thread_offsets, want.thread_offsets) and got.heads == want.heads
    assert np.allclose(got.unit_vecs, want.unit_vecs, atol=1e-6) and np.allclose(got.head_vecs, want.head_vecs,
                                                                                 atol=1e-6)
    assert np.array_equal(got.edge_src, want.edge_src) and np.array_equal(got.edge_dst, want.edge_dst)
    assert got.build_config == bank.build_config
    assert st["kept_threads"] > 0 or len(drop) > 5
    assert without_turns(bank, ["never-there"], enc)[0] is bank  # nothing to forget: the bank as it was
    assert without_turns(bank, [t.turn_id for t in conv.turns], enc)[0] is None


def test_an_llm_built_bank_forgets_without_an_llm(tmp_path, monkeypatch, server):
    from trawmem_gpu.ingest.forget import without_turns
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.store import Collection

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    assert main(["build", "--input", str(sample_path()), "--out", str(tmp_path / "c"), "--heads", "llm",
                 "--segmentation", "llm", "--llm", server.base_url, "--quiet"]) == 0
    bank = Collection(tmp_path / "c").load("ana-ben")
    got, st = without_turns(bank, ["S2:3"], get_encoder(cache=False))
    assert st["llm_fallback"] == ["heads", "segmentation"] and got.build_config == bank.build_config
    s2 = [j for j in range(got.n_threads) if got.turns[int(got.thread_offsets[j])].session == 2]
    assert {got.head_kind[j] for j in s2} == {"extractive"}  # the touched session fell back
    assert {got.head_kind[j] for j in range(got.n_threads) if j not in s2} == {"llm"}  # the others are kept
    # a Memory with the LLM appends to (and forgets from) such a bank as `build --update` would
    from trawmem_gpu import Memory
    from trawmem_gpu.errors import NoLLMConfigured
    from trawmem_gpu.llm.factory import llm_from_args

    new = [{"turn_id": "S9:1", "speaker": "Ana", "text": "Back from Lisbon!", "timestamp": "2031-10-20T10:00:00"}]
    with pytest.raises(NoLLMConfigured):
        Memory(tmp_path / "c").add("ana-ben", new)
    llm = llm_from_args(server.base_url)
    try:
        mem = Memory(tmp_path / "c", llm=llm)
        assert mem.add("ana-ben", new)["appended"] == 1
        assert mem.forget("ana-ben", ["S2:3"])["forgotten"] == ["S2:3"]
    finally:
        llm.close()
    stored = Collection(tmp_path / "c").load("ana-ben")
    assert set(stored.head_kind) == {"llm"} and "S2:3" not in stored.index_of()  # the LLM wrote every head


def test_facts_and_profiles_citing_a_forgotten_turn_go_with_it():
    """Layers beside the turns (issue 21's facts and profiles): what cites a forgotten turn is
    dropped, with its vector, and erased; the rest is kept as it was. Runs once the layered bank
    (``trawmem_gpu.ingest.layers``) is in the tree."""
    schema = pytest.importorskip("trawmem_gpu.store.facts")
    from dataclasses import replace

    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.ingest.forget import without_turns
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.memory.erase import Erasure, vector_digest

    enc = get_encoder(cache=False)
    (b,), _ = build_banks(load_conversations(sample_path()), encoder=enc, progress=False)
    facts = (schema.Fact("F:1:1", "Clara moved to Rotterdam", ("S1:8",)),
             schema.Fact("F:1:2", "Ana runs a half marathon", ("S1:1", "S1:3")))
    prof = (schema.ProfileSection("Ana", "interests", (schema.ProfileLine("running", ("F:1:2",)),)),
            schema.ProfileSection("Ben", "relationships", (schema.ProfileLine("sister in Rotterdam", ("F:1:1",)),)))
    b = replace(b, facts=facts, fact_vecs=enc.encode([f.text for f in facts]), profiles=prof,
                profile_vecs=enc.encode([p.text() for p in prof]), layer_sources={"facts": "locomo"})
    got, _ = without_turns(b, ["S1:8"], enc)
    got.validate()
    assert [f.fact_id for f in got.facts] == ["F:1:2"] and [p.person for p in got.profiles] == ["Ana"]
    assert np.array_equal(got.fact_vecs, b.fact_vecs[1:]) and np.array_equal(got.profile_vecs, b.profile_vecs[:1])
    assert got.layer_sources == {"facts": "locomo"}
    e = Erasure.of(b, got, ["S1:8"])
    assert {"Clara moved to Rotterdam", "sister in Rotterdam"} <= set(e.texts)
    assert {vector_digest(b.fact_vecs[0]), vector_digest(b.profile_vecs[1])} <= set(e.vectors)


def test_a_delete_killed_after_its_index_write_is_finished(tmp_path):
    import shutil

    from trawmem_gpu.store import Collection
    from serve_util import build_sample_collection

    d = build_sample_collection(tmp_path / "c", extra_ids=("b2",))
    coll = Collection(d)
    name = coll.banks["b2"]
    saved = tmp_path / "saved"
    shutil.copytree(d / "banks" / name, saved)
    assert coll.delete("b2") and not (d / "banks" / name).exists()
    shutil.copytree(saved, d / "banks" / name)  # the state of a kill between the index write and the removal
    assert "b2" not in Collection(d) and not Collection(d).delete("b2")
    assert (d / "banks" / name).exists()  # no dirname given: an unknown directory is not touched
    Collection(d).delete("b2", name)
    assert not (d / "banks" / name).exists() and Collection(d).bank_ids == ["ana-ben"]


def test_engine_purge_drops_the_dead_rows_and_picks_as_a_fresh_engine():
    from dataclasses import replace

    import torch

    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.ingest.forget import without_turns
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.select.engine import SelectionEngine

    conv = load_conversations(sample_path())[0]
    enc = get_encoder(cache=False)
    (a,), _ = build_banks([conv], encoder=enc, progress=False)
    b = replace(a, bank_id="b")
    eng = SelectionEngine([a, b], device="cpu")
    gone = a.unit_vecs[a.index_of()["S1:8"]].astype(np.float32).tobytes()  # the unit table's dtype over float32 banks
    small, _ = without_turns(a, ["S1:8"], enc)
    eng.replace_bank(small)
    blob = lambda: b"".join(s.buf.contiguous().view(-1).view(torch.uint8).numpy().tobytes()  # noqa: E731
                            for s in eng._store._segments.values())
    assert blob().count(gone) == 2  # bank b's copy, and the replaced bank's dead rows
    old = [s.buf for s in eng._store._segments.values()]
    eng.purge()
    assert blob().count(gone) == 1  # only bank b's own
    assert all(not o.any() or o.eq(o.flatten()[0]).all() for o in old)  # the old buffers overwritten
    z = enc.encode(["Where does Clara live?"], is_query=True)
    fresh = SelectionEngine([small, b], device="cpu")
    for bid in (a.bank_id, "b"):
        assert eng.select_units([bid], ["Where does Clara live?"], z) == \
            fresh.select_units([bid], ["Where does Clara live?"], z)


def test_forgetting_the_last_bank_overwrites_the_engine_tables():
    """The engine is dropped with its last bank: its buffers are overwritten first, not freed
    with the rows in them."""
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.memory.engines import ServedEngine
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    conv = load_conversations(sample_path())[0]
    (a,), _ = build_banks([conv], encoder=get_encoder(cache=False), progress=False)
    served = ServedEngine({a.bank_id: a}, SelectConfig(), lambda banks, cfg: SelectionEngine(banks, cfg, device="cpu"))
    bufs = [s.buf for s in served.engine._store._segments.values()]
    assert any(b.ne(s.fill).any() for b, s in zip(bufs, served.engine._store._segments.values()))
    fills = [s.fill for s in served.engine._store._segments.values()]
    served.forget(a.bank_id, None)
    assert not served.banks
    assert all(b.eq(f).all() for b, f in zip(bufs, fills))


# -- no trace ------------------------------------------------------------------------------------


def _llm_keys(coll_dir, endpoint) -> list[str]:
    """The LLM cache keys of the segmentation and head requests of the marker's session / thread."""
    from trawmem_gpu.ingest.llm_threads import build_requests
    from trawmem_gpu.llm.cache import cache_key
    from trawmem_gpu.store import Collection

    bank = Collection(coll_dir).load("ana-ben")
    i = next(k for k, t in enumerate(bank.turns) if t.turn_id == MARKER_ID)
    j = int(bank.unit_thread[i])
    session = [t for t in bank.turns if t.session == bank.turns[i].session]
    thread = [bank.turns[k] for k in bank.thread_units(j)]
    return [cache_key("test-model-a", m, mt, 0.0, True, endpoint, schema)
            for m, mt, schema in build_requests([session], [thread])]


@pytest.fixture
def built(tmp_path, monkeypatch, server):
    """A collection built with LLM segmentation and heads (LLM and embedding caches filled), and
    a score run with an answer model over it (its output and the LLM cache quote the marker)."""
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = tmp_path / "coll"
    url = server.base_url + "@test-model-a"
    assert main(["build", "--input", str(_history(tmp_path)), "--out", str(coll), "--segmentation", "llm",
                 "--heads", "llm", "--llm", url, "--quiet"]) == 0
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"id": f"q{k}", "bank_id": b, "question": text}) + "\n" for k, (b, text) in
                         enumerate([("ana-ben", QUESTION), ("ana-ben", "Where does Clara live?"),
                                    ("other", "What did Zed buy?")])))
    out = tmp_path / "scores" / "o.jsonl"
    assert main(["score", "--questions", str(q), "--banks", str(coll), "--out", str(out), "--answer-llm", url,
                 "--budget", "8", "--quiet"]) == 0
    return coll, out


def test_forget_leaves_no_trace(built, server, tmp_path, capsys):
    from trawmem_gpu import Memory
    from trawmem_gpu.select.workspace import unit_line

    coll, out = built
    needles = _needles(coll, _llm_keys(coll, server.base_url))
    mem = Memory(coll)
    ws = mem.select("ana-ben", QUESTION, budget=40)
    assert MARKER_ID in ws.unit_ids and mem.select("other", "kayak").unit_ids == ["o1"]
    marker_turn = next(t for t in mem.turns("ana-ben") if t.turn_id == MARKER_ID)
    import shutil

    live = coll / "banks" / "ana-ben"  # leftovers of earlier writes killed mid-way: copies of the bank
    for leftover in (".ana-ben.tmp-k1ll3d", ".ana-ben.old-k1ll3d"):
        shutil.copytree(live, live.with_name(leftover))
    dirs = [coll, tmp_path / "cache", out.parent]
    before = _traces(dirs, needles, mem)
    # the search finds every kind of copy before the forget, so it could fail after it
    for what in ("text in coll/banks/.ana-ben.tmp-", "vector in coll/banks/.ana-ben.old-", "text in coll", "id in coll",
                 "embedding key in cache", "vector in cache", "vector in coll", "text in scores", "text in cache", "llm key 0 in cache", "llm key 1 in cache", "vector in the engine's arrays",
                 "unit32 in the engine's arrays",  # the marker's unit: a burst with the turn after it
                 "text in the engine's Python objects"):
        assert any(x.startswith(what) for x in before), (what, before)
    n_before = len(mem.turns("ana-ben"))
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    kept = [r["id"] for r in recs if MARKER_ID not in r["units"]]
    assert len(kept) == 2
    res = mem.forget("ana-ben", [MARKER_ID], outputs=[out])
    assert res["forgotten"] == [MARKER_ID] and res["n_units"] == n_before - 1 and res["cache_rows"] >= 4
    assert res["output_records"] == len(recs) - len(kept)
    after = _traces(dirs, needles, mem)
    print("forget test search, before:", *before, "after:", *(after or ["nothing found"]), sep="\n  ",
          file=sys.__stdout__)
    assert after == []
    # the unit's history keeps one event, with no content, and the search above read its file too
    assert [(e["event"], e["cause"]) for e in mem.history("ana-ben", MARKER_ID)] == [("forgotten", "forget")]
    assert list((coll / ".history").glob("*.jsonl"))
    hits = unit_line.cache_info().hits
    unit_line(marker_turn, True)
    assert unit_line.cache_info().hits == hits  # the rendered line was not cached any more
    # the bank answers without the turn; the other records and banks are kept
    assert MARKER_ID not in mem.select("ana-ben", QUESTION, budget=40).unit_ids
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == kept
    assert Memory(coll).select("ana-ben", QUESTION, budget=40).unit_ids == \
        mem.select("ana-ben", QUESTION, budget=40).unit_ids
    # forgetting again is not an error; the whole bank, then, leaves no trace of it either
    assert mem.forget("ana-ben", [MARKER_ID])["missing"] == [MARKER_ID]
    bank_text = {"t": "Clara".encode(), "bank id": b'"ana-ben"', "turn id": b'"S1:7"'}  # ids too (issue 42.4)
    assert len(_traces([coll], bank_text)) >= 3
    assert main(["forget", "--collection", str(coll), "--bank", "ana-ben", "--outputs", str(out)]) == 0
    assert "forgot the whole bank of 'ana-ben' (the bank is gone)" in capsys.readouterr().out
    assert _traces([coll, out.parent], bank_text) == []
    assert [b["bank_id"] for b in Memory(coll).banks()] == ["other"]
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["q2"]
    assert main(["forget", "--collection", str(coll), "--bank", "ana-ben"]) == 2
    assert "unknown bank id 'ana-ben'" in capsys.readouterr().err


@pytest.mark.parametrize("stage,whole", [("journaled", False), ("stored", False), ("stored", True)])
def test_a_forget_killed_midway_leaves_old_or_new_and_a_rerun_finishes_it(built, server, tmp_path, stage, whole):
    from trawmem_gpu import Memory
    from trawmem_gpu.store import Collection

    coll, out = built
    needles = _needles(coll, _llm_keys(coll, server.base_url))
    n_old = len(Collection(coll).load("ana-ben").turns)
    flag = tmp_path / "paused"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAWMEM_FORGET_PAUSE": f"{stage}:{flag}"}
    p = subprocess.Popen([sys.executable, "-c", _KILLED, str(coll), "-" if whole else MARKER_ID, str(out)], env=env,
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    kill_when_paused(p, flag)
    # the bank is the old one or the new one, and loads
    c = Collection(coll)
    if whole:
        assert ("ana-ben" in c) == (stage == "journaled")
    else:
        n = len(c.load("ana-ben").turns)
        assert n == (n_old if stage == "journaled" else n_old - 1)
    assert _traces([coll, tmp_path / "cache", out.parent], needles)  # traces are left: the forget did not finish
    # a rerun of the same forget finishes the erasure
    mem = Memory(coll)
    res = mem.forget("ana-ben", None if whole else [MARKER_ID], outputs=[out])
    assert res["deleted"] == whole
    assert _traces([coll, tmp_path / "cache", out.parent], needles, mem) == []
    assert not list((coll / ".forget").glob("*"))


def test_forget_while_other_threads_select_and_add(tmp_path, monkeypatch):
    """Selections on three threads and adds to another bank while turns are forgotten one by one:
    nothing fails, and once a forget returns no selection shows that turn."""
    import threading

    from trawmem_gpu import Memory

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    conv = load_conversations(sample_path())[0]
    mem = Memory(tmp_path / "m")
    mem.add("ana-ben", list(conv.turns))
    gone: list[str] = []
    errors, stop = [], threading.Event()

    def reader():
        try:
            while not stop.is_set():
                done = list(gone)  # forgotten before this selection started
                ws = mem.select("ana-ben", "Where does Clara live?", budget=33)
                assert not set(done) & set(ws.unit_ids), (done, ws.unit_ids)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def adder():
        try:
            for i in range(3):
                mem.add("side", [{"turn_id": f"s{i}", "speaker": "Zed", "text": f"note {i}",
                                  "timestamp": "2031-05-01"}])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(3)] + [threading.Thread(target=adder)]
    for t in threads:
        t.start()
    try:
        for tid in ("S1:8", "S2:4", "S3:1", "S3:6"):
            assert mem.forget("ana-ben", [tid])["forgotten"] == [tid]
            gone.append(tid)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=600)
    assert not errors, errors
    assert len(mem.turns("ana-ben")) == len(conv.turns) - 4 and len(mem.turns("side")) == 3


def test_a_forget_waits_for_workspaces_of_the_old_bank_before_dropping_the_render_caches(tmp_path, monkeypatch):
    """A selection picked from the old bank renders it after the forget has swapped the bank; the
    forget drops the rendering caches only after that rendering (else it would re-fill them with
    the forgotten turn)."""
    import threading

    from trawmem_gpu import Memory
    from trawmem_gpu.memory import api, result

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    conv = load_conversations(sample_path())[0]
    mem = Memory(tmp_path / "m")
    mem.add("ana-ben", list(conv.turns))
    order, release, inside = [], threading.Event(), threading.Event()
    real_of = result.SelectedWorkspace.of

    def slow_of(*a, **k):
        inside.set()
        release.wait(600)
        order.append("rendered")
        return real_of(*a, **k)

    real_erase = mem._core.erase_copies
    monkeypatch.setattr(mem._core, "erase_copies", lambda *a, **k: order.append("erased") or real_erase(*a, **k))
    monkeypatch.setattr(api.SelectedWorkspace, "of", slow_of)
    sel = threading.Thread(target=mem.select, args=("ana-ben", "Where does Clara live?"))
    sel.start()
    assert inside.wait(600)
    fg = threading.Thread(target=mem.forget, args=("ana-ben", ["S1:8"]))
    fg.start()
    for _ in range(60000):  # until the forget waits for the rendering (bounded)
        if mem._assembled._waiters:
            break
        fg.join(0.01)
    release.set()
    sel.join(600)
    fg.join(600)
    assert order == ["rendered", "erased"]
