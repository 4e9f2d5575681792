"""``kill -9`` in the middle of an import's bank write leaves no torn bank (issue 45 item 2)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

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
