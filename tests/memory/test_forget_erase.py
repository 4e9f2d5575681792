"""Forgetting, finer points of the erasure (``memory.erase``, ``memory.banks``): quoted texts in
score outputs and LLM replies, and an unfinished forget finished by a forget of other turns."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.data import load_conversations, sample_path


def test_a_score_record_quoting_a_forgotten_text_with_quotes_or_a_newline_goes(tmp_path):
    from trawmem_gpu.memory.erase import Erasure, scrub_outputs

    said = 'Ben said "meet me at the pier"\nat noon'  # JSON escapes both the quotes and the newline
    out = tmp_path / "o.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "q0", "bank_id": "other", "units": [], "answer": f"He wrote: {said}"},
        {"id": "q1", "bank_id": "other", "units": [], "answer": "nothing of it"},
        {"id": "q2", "bank_id": "other", "units": [], "raw": json.dumps({"answer": said})}]))  # a raw JSON reply
    e = Erasure("ana-ben", ["S9:1"], False, texts=[said])
    assert scrub_outputs([out], e) == 2
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["q1"]


@pytest.mark.parametrize("whole", [False, True])
def test_the_next_forget_of_other_turns_finishes_a_journaled_one(tmp_path, monkeypatch, whole):
    """A forget killed after its journal, before the bank changed (stage ``journaled``), is finished
    by the next forget of the bank even when that one names other turns: the journaled turns (or
    the whole bank) leave the bank too, not only the caches."""
    from trawmem_gpu import Memory
    from trawmem_gpu.memory.erase import Erasure, write_journal
    from trawmem_gpu.store import Collection

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    conv = load_conversations(sample_path())[0]
    mem = Memory(tmp_path / "m")
    mem.add("ana-ben", list(conv.turns))
    old = Collection(tmp_path / "m").load("ana-ben")
    first, other = old.turns[3].turn_id, old.turns[7].turn_id
    write_journal(tmp_path / "m", Erasure.of(old, None if whole else old, [] if whole else [first]))
    res = mem.forget("ana-ben", [other])
    assert not list((tmp_path / "m" / ".forget").glob("*"))
    if whole:
        assert res["deleted"] and "ana-ben" not in Collection(tmp_path / "m") and "ana-ben" not in mem
    else:
        assert res["forgotten"] == [first, other] and res["missing"] == []
        for ids in ([t.turn_id for t in Collection(tmp_path / "m").load("ana-ben").turns],
                    [t.turn_id for t in mem.turns("ana-ben")]):
            assert first not in ids and other not in ids and len(ids) == len(old.turns) - 2


def test_an_llm_response_quoting_a_forgotten_text_inside_json_goes(tmp_path):
    """A JSON reply (a head, a segmentation) quotes a turn with its quotes and newlines escaped."""
    import sqlite3

    from trawmem_gpu.memory.erase import Erasure, scrub_llm

    said = 'Ben said "meet me at the pier"\nat noon'
    db = sqlite3.connect(tmp_path / "llm.sqlite")
    db.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, model TEXT, text TEXT, prompt_tokens INTEGER,"
               " completion_tokens INTEGER, created REAL)")
    for k, reply in (("a", json.dumps({"head": said})), ("b", json.dumps({"head": "the hike"}))):
        db.execute("INSERT INTO responses VALUES (?, 'm', ?, 0, 0, 0)", (k, reply))
    db.commit()
    db.close()
    assert scrub_llm(tmp_path / "llm.sqlite", Erasure("ana-ben", ["S9:1"], False, texts=[said])) == 1
    db = sqlite3.connect(tmp_path / "llm.sqlite")
    assert [r[0] for r in db.execute("SELECT key FROM responses")] == ["b"]
    db.close()


def test_a_turn_forgotten_from_a_segment_leaves_no_trace(tmp_path, monkeypatch):
    """Appends are segments beside the bank's files (``store.segments``) and a compaction may be
    copying the bank when a forget comes: the forget rewrites the bank whole, so neither a segment
    nor a compaction's copy keeps the forgotten turn's text or vector."""
    import shutil

    import numpy as np
    from forget_traces import _traces
    from word_encoder import WordEncoder

    from trawmem_gpu import Memory

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    marker = "zqxv-segment-marker-51d0"
    turns = [{"turn_id": t.turn_id, "speaker": t.speaker, "text": t.text, "timestamp": t.timestamp}
             for t in load_conversations(sample_path())[0].turns]
    mem = Memory(tmp_path / "c", encoder=WordEncoder())
    mem._core.registry.coll.compaction = None  # keep the segments: this test forgets from one
    mem.add("b", turns[:20])
    mem.add("b", [{**turns[20], "turn_id": "M", "text": f"the code is {marker}"}])
    for i in range(21, 26):
        mem.add("b", turns[i:i + 1])
    coll = mem._core.registry.coll
    live = coll.bank_path("b")
    assert len(coll.segments("b")) == 6
    shutil.copytree(live, live.with_name(".b.compact-underway"))  # a compaction's copy, mid-way
    vec = next(v for t, v in zip(mem._core.registry.get("b").turns, mem._core.registry.get("b").unit_vecs)
               if t.turn_id == "M")
    needles = {"text": marker.encode(), "vector": np.asarray(vec, np.float32).tobytes()}
    before = _traces([tmp_path / "c"], needles)
    assert any("seg-" in x for x in before) and any(".compact-" in x for x in before), before
    assert mem.forget("b", ["M"])["forgotten"] == ["M"]
    assert _traces([tmp_path / "c"], needles, mem) == []
    assert coll.segments("b") == [] and not list(live.parent.glob(".b.*"))
