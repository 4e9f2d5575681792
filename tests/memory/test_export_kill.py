"""``kill -9`` in the middle of an import's bank write leaves no torn bank (issue 45 item 2)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from trawmem_gpu.store.writes import PAUSE_ENV


def _turn(bank, i, text):
    return {"type": "turn", "bank_id": bank, "id": f"S1:{i}", "speaker": "Ana", "text": text, "date": "2024-05-01",
            "session": 1, "caption": None, "metadata": None}


def test_kill_mid_import_leaves_banks_whole(tmp_path, monkeypatch):
    from trawmem_gpu import Memory

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = tmp_path / "c"
    Memory(coll).add("b2", [{"turn_id": "S1:1", "speaker": "Ana", "text": "I keep bees.", "timestamp": "2024-05-01"}])
    lines = [{"format": "trawmem-export", "version": 1, "encoder": "x", "created": None},
             {"type": "bank", "bank_id": "b2", "n_turns": 2}, _turn("b2", 1, "I keep bees."),
             _turn("b2", 2, "They made honey in June.")]
    f = tmp_path / "x.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    mark = tmp_path / "paused"
    env = {**os.environ, PAUSE_ENV: f"segment-written:{mark}", "HF_HUB_OFFLINE": "1",
           "TRAWMEM_CACHE": str(tmp_path / "cache")}
    p = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "import", "--collection", str(coll), "--input", str(f)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(6000):  # hang guard only: wait until the write reaches its pause point
            if mark.exists() or p.poll() is not None:
                break
            time.sleep(0.1)
        assert mark.exists(), "the import never reached the store's write"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    mem = Memory(coll)
    assert [t.turn_id for t in mem.turns("b2")] == ["S1:1"]  # as before the import: nothing torn
    res = mem.import_(f)  # a rerun completes it
    assert res["banks"][0]["stored"] == 1 and [t.turn_id for t in mem.turns("b2")] == ["S1:1", "S1:2"]


_CHILD = """
import sys
sys.path.insert(0, sys.argv[3])
from word_encoder import WordEncoder
from trawmem_gpu import Memory
Memory(sys.argv[1], encoder=WordEncoder()).import_(sys.argv[2])
"""


def _facts_file(tmp_path):
    """An export of bank ``old`` (one turn more than the collection holds, a fact citing it) and of a
    new bank ``new`` (two turns, a fact)."""
    def fact(bank, fid, src):
        return {"type": "fact", "bank_id": bank, "id": fid, "text": f"A fact of {src}.", "source_turns": [src]}

    lines = [{"format": "trawmem-export", "version": 1, "encoder": "test-words-32", "created": None},
             {"type": "bank", "bank_id": "old", "n_turns": 2}, _turn("old", 1, "I keep bees."),
             _turn("old", 2, "They made honey in June."), fact("old", "F:old", "S1:2"),
             {"type": "bank", "bank_id": "new", "n_turns": 2}, _turn("new", 1, "I sail on Sundays."),
             _turn("new", 2, "The boat is blue."), fact("new", "F:new", "S1:1")]
    f = tmp_path / "x.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return f


def _state(mem, bank):
    """(turn ids, fact ids) of ``bank``, or None when the collection has no such bank."""
    b = mem._core.registry.get(bank)
    return None if b is None else ([t.turn_id for t in b.turns], sorted(f.fact_id for f in b.facts))


@pytest.mark.parametrize("stage", ["bank-files-written", "bank-saved", "import-committed"])
def test_kill_at_any_stage_leaves_turns_with_their_facts(tmp_path, monkeypatch, stage):
    """A ``kill -9`` at each write stage of an import leaves each bank as it was or whole with its
    facts (the turns and facts of a bank are one commit), and a rerun completes it."""
    from pathlib import Path

    from trawmem_gpu import Memory
    from pause_kill import kill_when_paused
    from word_encoder import WordEncoder

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = tmp_path / "c"
    Memory(coll, encoder=WordEncoder()).add("old", [{"turn_id": "S1:1", "speaker": "Ana", "text": "I keep bees.",
                                                     "timestamp": "2024-05-01"}])
    f = _facts_file(tmp_path)
    flag = tmp_path / "paused"
    support = Path(__file__).resolve().parents[1] / "support"
    env = {**os.environ, PAUSE_ENV: f"{stage}:{flag}", "HF_HUB_OFFLINE": "1", "TRAWMEM_CACHE": str(tmp_path / "cache")}
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(coll), str(f), str(support)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kill_when_paused(p, flag, limit_s=300)
    mem = Memory(coll, encoder=WordEncoder())
    before, whole = (["S1:1"], []), (["S1:1", "S1:2"], ["F:old"])
    assert _state(mem, "old") in (before, whole)  # never the turns without their fact
    assert _state(mem, "new") in (None, (["S1:1", "S1:2"], ["F:new"]))
    if stage == "import-committed":  # paused after the first bank's commit
        assert _state(mem, "old") == whole
    mem.import_(f)  # a rerun completes it
    assert _state(mem, "old") == whole and _state(mem, "new") == (["S1:1", "S1:2"], ["F:new"])
