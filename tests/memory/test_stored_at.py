"""``stored_at`` (issue 45 item 1): each turn keeps the time it was said (``timestamp``) and the
time the bank stored it (``Turn.stored_at``), set by the store's doors, never by a caller; kept
through late inserts, segments, compaction, forgets of other turns and export / import; shown by
the history; gone with a forgotten turn; None for a turn stored before it existed.

No model: the word encoder of ``tests/support`` keeps every write to milliseconds."""
from __future__ import annotations

import io
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from word_encoder import WordEncoder

from trawmem_gpu import Memory
from trawmem_gpu.errors import InputError
from trawmem_gpu.store import Collection


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def _turn(i: int, day: int, minute: int = 0) -> dict:
    return {"turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben", "text": f"Turn {i}: the garden, detail {i}.",
            "timestamp": f"2031-03-{day:02d}T10:{minute:02d}:00"}


def _now() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat()


def _stored(coll_path, bank="b") -> dict:
    return {t.turn_id: t.stored_at for t in Collection(coll_path).load(bank).turns}


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_stored_at_is_set_per_add_and_kept_by_late_inserts_segments_compaction_and_forgets(tmp_path):
    d = tmp_path / "c"
    m = Memory(d, encoder=WordEncoder())
    before = _now()
    m.add("b", [_turn(i, 1 + i // 4, i) for i in range(0, 12)])  # the base
    first = _stored(d)
    assert len(set(first.values())) == 1 and before <= next(iter(first.values())) <= _now()
    m.add("b", [_turn(12, 4), _turn(13, 4, 1)])  # an append at the end: a segment
    assert Collection(d).segments("b")
    m.add("b", [_turn(14, 2, 30)])  # a late turn: the bank rebuilt in time order
    got = _stored(d)
    assert [t.turn_id for t in Collection(d).load("b").turns].index("t14") < 12
    assert {k: got[k] for k in first} == first  # every earlier turn keeps its own
    assert got["t12"] == got["t13"] != got["t14"] and len({got["t0"], got["t12"], got["t14"]}) == 3
    assert all(v > first["t0"] for k, v in got.items() if k not in first)
    m.add("b", [_turn(15, 5)])
    Collection(d).compact("b")
    assert _stored(d) == {**got, "t15": _stored(d)["t15"]}
    m.forget("b", ["t3"])  # a forget of another turn rewrites the bank: the others keep theirs
    after = _stored(d)
    assert "t3" not in after and after == {k: v for k, v in {**got, "t15": after["t15"]}.items() if k != "t3"}
    assert {t.turn_id: t.stored_at for t in Memory(d, encoder=WordEncoder()).turns("b")} == after  # reopened


def test_a_forgotten_turn_leaves_no_trace_of_its_stored_at(tmp_path):
    d = tmp_path / "c"
    m = Memory(d, encoder=WordEncoder())
    m.add("b", [_turn(i, 1, i) for i in range(6)])
    m.add("b", [_turn(6, 2)])  # its own add: a stored_at no other turn has
    gone = _stored(d)["t6"]
    assert gone.encode() in _all_bytes(d)
    m.forget("b", ["t6"])
    assert gone.encode() not in _all_bytes(d)
    assert "stored_at" not in json.dumps(m.history("b", "t6"))  # its history says when, not its stored_at


def test_a_caller_cannot_set_stored_at(tmp_path):
    m = Memory(tmp_path / "c", encoder=WordEncoder())
    with pytest.raises(InputError, match=r"turns\[0\]: field 'stored_at'"):
        m.add("b", [{**_turn(0, 1), "stored_at": "2000-01-01T00:00:00"}], atomic=True)
    res = m.add("b", [{**_turn(0, 1), "stored_at": "2000-01-01T00:00:00"}, _turn(1, 1, 1)])
    assert res["refused"][0]["field"] == "turns[0].stored_at" and res["stored"] == ["t1"]
    from dataclasses import replace

    from trawmem_gpu.data.types import Turn

    t = Turn("t2", "Ana", "From an object.", 1, "2031-03-01T11:00:00", stored_at="2000-01-01T00:00:00")
    assert m.add("b", [replace(t)])["stored"] == ["t2"]  # a Turn's stored_at is not read
    assert _stored(tmp_path / "c")["t2"] != "2000-01-01T00:00:00"


def test_turns_written_without_stored_at_load_as_none(tmp_path):
    from trawmem_gpu.data.types import Conversation
    from trawmem_gpu.ingest import build_banks

    turns = Memory(tmp_path / "tmp", encoder=WordEncoder())
    turns.add("b", [_turn(i, 1, i) for i in range(4)])
    old = [t.__class__(t.turn_id, t.speaker, t.text, t.session, t.timestamp, t.time) for t in turns.turns("b")]
    (bank,), _ = build_banks([Conversation("b", old)], encoder=WordEncoder(), progress=False)
    coll = Collection(tmp_path / "c", create=True)
    coll.put(bank)  # as a release before stored_at wrote it: no such key in the files
    assert b"stored_at" not in _all_bytes(tmp_path / "c")
    m = Memory(tmp_path / "c", encoder=WordEncoder())
    assert all(t.stored_at is None for t in m.turns("b"))
    hist = m.history("b", "t1")
    assert hist[0]["event"] == "added" and hist[0]["stored_at"] is None
    assert hist[0]["event_time"] == "2031-03-01T10:01:00"
    m.add("b", [_turn(9, 2)])  # a later add stamps only its own turn
    got = _stored(tmp_path / "c")
    assert got["t9"] is not None and all(got[f"t{i}"] is None for i in range(4))


def test_history_shows_event_time_and_stored_at(tmp_path):
    m = Memory(tmp_path / "c", encoder=WordEncoder())
    m.add("b", [_turn(0, 3)])
    m.add("b", [_turn(1, 1)])  # late: said before t0, stored after it
    h0, h1 = m.history("b", "t0")[-1], m.history("b", "t1")[-1]
    assert h1["event"] == "added" and h1["event_time"] == "2031-03-01T10:00:00"
    assert h0["event_time"] == "2031-03-03T10:00:00"
    assert h1["stored_at"] > h0["stored_at"] and h1["event_time"] < h0["event_time"]
    assert h1["stored_at"] == _stored(tmp_path / "c")["t1"]


def test_export_and_import_keep_stored_at_and_an_older_export_imports_it_as_unknown(tmp_path):
    a = Memory(tmp_path / "a", encoder=WordEncoder())
    a.add("b", [_turn(i, 1, i) for i in range(4)])
    a.add("b", [_turn(4, 2)])
    buf = io.StringIO()
    a.export(buf)
    lines = buf.getvalue().splitlines(keepends=True)
    turns = [json.loads(x) for x in lines if json.loads(x).get("type") == "turn"]
    assert {t["id"]: t["stored_at"] for t in turns} == _stored(tmp_path / "a")
    b = Memory(tmp_path / "b", encoder=WordEncoder())
    b.import_(lines)
    assert _stored(tmp_path / "b") == _stored(tmp_path / "a")

    older = [json.dumps({k: v for k, v in json.loads(x).items() if k != "stored_at"}) + "\n" for x in lines]
    c = Memory(tmp_path / "c", encoder=WordEncoder())
    c.import_(older)  # no stored_at: unknown, as a bank written before it (an exact round trip)
    assert set(_stored(tmp_path / "c").values()) == {None}
    again = io.StringIO()
    c.export(again)
    assert [json.loads(x) for x in again.getvalue().splitlines() if '"type":"turn"' in x] == \
        [{**json.loads(x), "stored_at": None} for x in older if '"type": "turn"' in x]
    c.add("b", [_turn(9, 3)])  # a later add stamps its own
    assert _stored(tmp_path / "c")["t9"] is not None

    bad = [x if json.loads(x).get("id") != "t2" else json.dumps({**json.loads(x), "stored_at": "yesterday"}) + "\n"
           for x in lines]
    n = next(i for i, x in enumerate(bad, 1) if '"yesterday"' in x)
    with pytest.raises(InputError, match=rf"line {n}: field 'stored_at'"):
        Memory(tmp_path / "d", encoder=WordEncoder()).import_(bad)
    assert not (tmp_path / "d" / "banks").exists() or not any((tmp_path / "d" / "banks").iterdir())
