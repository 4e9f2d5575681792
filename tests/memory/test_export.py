"""Export / import round trip, forgotten turns and bad input (issue 45 items 2 and 4)."""
from __future__ import annotations

import io
import json

import pytest

from trawmem_gpu.errors import InputError
from trawmem_gpu.memory.export import export, import_


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


TURNS = [
    {"turn_id": "S1:1", "speaker": "Ana", "text": "I moved to Lyon last spring.", "timestamp": "2023-06-01",
     "session": 1, "metadata": {"user_id": "ana"}},
    {"turn_id": "S1:2", "speaker": "Ben", "text": "Lyon is lovely; my sister plays the cello there.",
     "timestamp": "2023-06-01", "session": 1, "metadata": {"user_id": "ben"}},
    {"turn_id": "S2:1", "speaker": "Ana", "text": "Now I live in Rotterdam, near the harbour.",
     "timestamp": "2024-02-01", "session": 2, "metadata": {"user_id": "ana"}},
    {"turn_id": "S2:2", "speaker": "Ben", "text": "I adopted a grey cat called Miso.", "timestamp": "2024-02-01",
     "session": 2},
]
LIVES = {"subject": "Ana", "attribute": "lives in"}


@pytest.fixture
def mem(tmp_path):
    from trawmem_gpu import Memory

    m = Memory(tmp_path / "src")
    m.add("ana-ben", TURNS)
    m.add_facts("ana-ben", [{"text": "Ana lives in Lyon.", "source_turns": ["S1:1"], "valid_from": "2023-06-01",
                             "id": "F:lyon", **LIVES}])
    m.add_facts("ana-ben", [{"text": "Ana lives in Rotterdam.", "source_turns": ["S2:1"], "id": "F:rdam",
                             "valid_from": "2024-02-01", **LIVES}])
    return m


def _dump(mem, **kw) -> str:
    buf = io.StringIO()
    export(mem, buf, **kw)
    return buf.getvalue()


def test_round_trip_is_exact(mem, tmp_path):
    from trawmem_gpu import Memory

    text = _dump(mem)
    lines = [json.loads(x) for x in text.splitlines()]
    assert lines[0]["format"] == "trawmem-export" and lines[0]["version"] == 1
    assert [x["type"] for x in lines[1:3]] == ["bank", "turn"]
    dst = Memory(tmp_path / "dst")
    res = import_(dst, io.StringIO(text))
    assert res["banks"][0]["stored"] == 4 and res["banks"][0]["refused"] == []
    assert dst.turns("ana-ben") == mem.turns("ana-ben")
    a = {f.fact_id: f for f in mem._core.registry.get("ana-ben").facts}
    b = {f.fact_id: f for f in dst._core.registry.get("ana-ben").facts}
    assert a == b and a["F:lyon"].superseded_by == "F:rdam"
    for q in ("Where does Ana live?", "What is the cat called?", "Who plays the cello?"):
        assert dst.select("ana-ben", q).units == mem.select("ana-ben", q).units
    assert _dump(dst).splitlines()[1:5] == text.splitlines()[1:5]  # bank and turn lines alike


def test_export_where_keeps_only_passing_turns(mem):
    lines = [json.loads(x) for x in _dump(mem, where={"user_id": "ana"}).splitlines()]
    assert {x["id"] for x in lines if x.get("type") == "turn"} == {"S1:1", "S2:1"}


def test_forgotten_turn_is_never_exported_nor_reimported(mem):
    before = _dump(mem)
    mem.forget("ana-ben", ["S2:2"])
    assert '"S2:2"' not in _dump(mem)
    res = import_(mem, io.StringIO(before))
    assert res["banks"][0]["refused"] == [{"id": "S2:2", "reason": "forgotten by this collection"}]
    assert "S2:2" not in {t.turn_id for t in mem.turns("ana-ben")}


@pytest.mark.parametrize("edit, message", [
    (lambda ls: ['{"format":"trawmem-export","version":2}'] + ls[1:], "line 1: field 'version'"),
    (lambda ls: ls[:3] + [ls[2]] + ls[3:], "line 4: field 'id': duplicate"),
    (lambda ls: ls[:2] + [ls[2].replace('"bank_id":"ana-ben"', '"bank_id":"other"')] + ls[3:],
     "line 3: field 'bank_id'"),
    (lambda ls: ls[:4], "field 'n_turns'"),
    (lambda ls: ls[:3] + [ls[3][:20]], "line 4: truncated"),
])
def test_bad_input_names_line_and_field(mem, tmp_path, edit, message):
    from trawmem_gpu import Memory

    ls = _dump(mem).splitlines()
    text = "\n".join(edit(ls))
    text = text if message.endswith("truncated") else text + "\n"
    dst = Memory(tmp_path / "bad")
    with pytest.raises(InputError, match=message.replace("(", r"\(")) as e:
        import_(dst, io.StringIO(text))
    assert "ana-ben" not in dst and dst.banks() == []
    assert "\n" not in str(e.value) and str(e.value).startswith("line ")  # one line, naming the line


def test_history_is_imported_with_the_units(mem, tmp_path):
    """The importing collection's history of every imported unit is the exported one (times, causes,
    supersession), not the import's own adds; a ``by`` naming a unit the bank does not hold is keyed."""
    from trawmem_gpu import Memory

    text = _dump(mem)
    dst = Memory(tmp_path / "dst")
    import_(dst, io.StringIO(text))
    units = ["S1:1", "S1:2", "S2:1", "S2:2", "F:lyon", "F:rdam"]
    want = {u: mem.history("ana-ben", u) for u in units}
    assert want["F:lyon"][-1]["event"] == "superseded" and want["F:lyon"][-1]["by"] == "F:rdam"
    assert {u: dst.history("ana-ben", u) for u in units} == want
    # an export whose event names a fact this bank never gets: stored keyed, read as "(forgotten)"
    lines = text.splitlines()
    ev = next(i for i, x in enumerate(lines) if '"unit":"F:lyon"' in x and '"superseded"' in x)
    lines[ev] = lines[ev].replace('"by":"F:rdam"', '"by":"F:gone"')
    other = Memory(tmp_path / "other")
    import_(other, io.StringIO("\n".join(lines) + "\n"))
    assert other.history("ana-ben", "F:lyon")[-1]["by"] == "(forgotten)"
    raw = b"".join(p.read_bytes() for p in (tmp_path / "other" / ".history").glob("*.jsonl"))
    assert b"F:gone" not in raw


def test_a_bad_event_line_names_its_field(mem, tmp_path):
    from trawmem_gpu import Memory

    lines = _dump(mem).splitlines()
    ev = next(i for i, x in enumerate(lines) if '"type":"event"' in x)
    lines[ev] = lines[ev].replace('"event":"added"', '"event":"exploded"')
    with pytest.raises(InputError, match=f"line {ev + 1}: field 'event'"):
        import_(Memory(tmp_path / "bad"), io.StringIO("\n".join(lines) + "\n"))
