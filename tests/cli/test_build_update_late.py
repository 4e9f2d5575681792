"""``trawmem build --update`` with turns dated before the bank's last turn (issue 45 item 1): they
are stored at their place in time by the code of ``Memory.add`` (``ingest.late``), so a bank
updated with files in any interleaving equals the build of all its turns in time order; every
turn keeps when it was stored (``stored_at``). Through the real command line entry point."""
from __future__ import annotations

import json
import random
from datetime import datetime, timedelta

import numpy as np
import pytest

TOPICS = ["the garden and tomatoes", "a trip to Lisbon by train", "the new job at the bakery", "learning the violin"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def _turns(seed: int, n: int = 24) -> list[dict]:
    rng = random.Random(seed)
    t, out = datetime(2031, 3, 1, 9), []
    for i in range(n):
        t = t + timedelta(minutes=rng.choice([0, 1, 5, 30, 60 * 20]))
        out.append({"bank_id": "b", "turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben",
                    "text": f"Turn {i}: about {TOPICS[(i // 6 + seed) % len(TOPICS)]}, detail {rng.randint(0, 99)}.",
                    "timestamp": t.isoformat()})
    return out


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _build(*argv) -> int:
    from trawmem_gpu.cli import main

    return main(["build", "--quiet", *map(str, argv)])


def test_update_with_late_turns_equals_the_in_order_build(tmp_path, capsys):
    from trawmem_gpu.store import Collection

    turns = _turns(3)
    rng = random.Random(7)
    first = sorted(rng.sample(turns, 10), key=lambda r: r["timestamp"])
    rest = [r for r in turns if r not in first]
    rng.shuffle(rest)  # the update files come in any order, each unordered inside
    out = tmp_path / "late"
    assert _build("--input", _write(tmp_path / "a.jsonl", first), "--out", out) == 0
    stamps = {t.turn_id: t.stored_at for t in Collection(out).load("b").turns}
    for k, lo in enumerate(range(0, len(rest), 5)):
        assert _build("--input", _write(tmp_path / f"u{k}.jsonl", rest[lo:lo + 5]), "--out", out, "--update") == 0
    ref = tmp_path / "ordered"
    arrived = first + rest  # time order, equal times in order of arrival (a stable sort)
    assert _build("--input", _write(tmp_path / "all.jsonl", sorted(arrived, key=lambda r: r["timestamp"])),
                  "--out", ref) == 0
    assert "Traceback" not in capsys.readouterr().err
    got, want = Collection(out).load("b"), Collection(ref).load("b")
    assert [t.turn_id for t in got.turns] == [t.turn_id for t in want.turns]
    assert [t.session for t in got.turns] == [t.session for t in want.turns]
    assert np.array_equal(got.thread_offsets, want.thread_offsets) and got.heads == want.heads
    assert np.allclose(got.unit_vecs, want.unit_vecs, atol=1e-5)
    assert np.array_equal(got.edge_src, want.edge_src) and np.array_equal(got.edge_dst, want.edge_dst)
    assert all(t.stored_at for t in got.turns)
    assert {t.turn_id: t.stored_at for t in got.turns if t.turn_id in stamps} == stamps  # kept by the updates
    assert len({t.stored_at for t in got.turns}) == 1 + len(range(0, len(rest), 5))  # one per build / update


def test_the_history_command_shows_when_a_turn_was_said_and_stored(tmp_path, capsys):
    from trawmem_gpu.cli import main
    from trawmem_gpu.store import Collection

    turns = _turns(5, 4)
    out = tmp_path / "c"
    assert _build("--input", _write(tmp_path / "a.jsonl", turns), "--out", out) == 0
    stored = {t.turn_id: t.stored_at for t in Collection(out).load("b").turns}
    capsys.readouterr()
    assert main(["history", "--collection", str(out), "--bank", "b", "--unit", "t1", "--json"]) == 0
    (added,) = json.loads(capsys.readouterr().out)
    assert added == {"event": "added", "time": None, "cause": "build", "event_time": turns[1]["timestamp"],
                     "stored_at": stored["t1"]}
    assert main(["history", "--collection", str(out), "--bank", "b", "--unit", "t1"]) == 0
    assert capsys.readouterr().out == f"-  added (build): said {turns[1]['timestamp']}, stored {stored['t1']}\n"
    assert main(["history", "--collection", str(out), "--bank", "b", "--unit", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trawmem history: error:") and "nope" in err and "Traceback" not in err
