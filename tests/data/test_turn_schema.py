"""One turn schema at every door: the bounds of ``data.types`` and the rules of ``data.fields``,
checked for every turn of a file or request before anything is stored (JSONL and LoCoMo files,
``build --input`` / ``--update``, ``Memory.add``, ``POST /v1/banks/{id}/turns``).

The values are the ones that used to be stored and then break every later call on the bank or the
collection: a ``session`` beyond int64 or negative, a counted session past the bound, a timestamp
with an offset, and turns dated before the bank's last turn.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from cli_inputs import _jsonl as write_jsonl, cache  # noqa: F401 - cache: the fixture

from trawmem_gpu.data import load_conversations
from trawmem_gpu.data.jsonl import turn_from_record
from trawmem_gpu.data.types import (MAX_CAPTION_CHARS, MAX_DATE_CHARS, MAX_ID_CHARS, MAX_SESSION, MAX_SPEAKER_CHARS,
                                    MAX_TEXT_CHARS, Turn)
from trawmem_gpu.errors import InputError

BASE = {"bank_id": "b", "turn_id": "t1", "speaker": "Ana", "text": "I love pottery.", "timestamp": "2024-03-02T10:00:00"}
BIG_SESSIONS = [10**30, 2**63, 2**63 - 1, -1, MAX_SESSION + 1]


pytestmark = pytest.mark.usefixtures("cache")  # each test's own embedding cache


def _jsonl(path: Path, *records) -> Path:
    return write_jsonl(path, records)


def _refused(path: Path, *needles: str) -> str:
    with pytest.raises(InputError) as e:
        load_conversations(path)
    msg = str(e.value)
    for n in needles:
        assert n in msg, msg
    return msg


# ----------------------------------------------------------------------------------------------
# the rules, on a file
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("session", BIG_SESSIONS)
def test_session_out_of_range_is_refused_naming_the_field(tmp_path, session):
    p = _jsonl(tmp_path / "t.jsonl", {**BASE, "session": session})
    msg = _refused(p, "t.jsonl:1", "'session'", f"0..{MAX_SESSION}")
    assert len(msg) < 300  # a huge integer is described, not printed


@pytest.mark.parametrize("session", [True, 2.0, "3"])
def test_session_must_be_an_integer(tmp_path, session):
    _refused(_jsonl(tmp_path / "t.jsonl", {**BASE, "session": session}), "'session'", "integer")


def test_session_bounds_are_inclusive(tmp_path):
    p = _jsonl(tmp_path / "t.jsonl", {**BASE, "session": 0}, {**BASE, "turn_id": "t2", "session": MAX_SESSION})
    assert [t.session for t in load_conversations(p)[0].turns] == [0, MAX_SESSION]


def test_a_counted_session_past_the_bound_is_refused():
    last = Turn("t0", "Ana", "x", MAX_SESSION, "2024-03-01", datetime(2024, 3, 1))
    _, same_day = turn_from_record({**BASE, "timestamp": "2024-03-01T23:00"}, "turns[0]", prev=last)
    assert same_day.session == MAX_SESSION
    with pytest.raises(InputError, match=r"turns\[0\]: field 'session'.*MAX_SESSION"):
        turn_from_record(BASE, "turns[0]", prev=last)  # the next day opens session MAX_SESSION + 1


def test_an_aware_timestamp_is_read_as_naive_utc(tmp_path):
    p = _jsonl(tmp_path / "t.jsonl", {**BASE, "timestamp": "2024-03-03T10:00:00+05:00"},
               {**BASE, "turn_id": "t2", "timestamp": "2024-03-03T06:00:00"},
               {**BASE, "turn_id": "t3", "timestamp": "2024-03-03T07:00:00Z"})
    turns = load_conversations(p)[0].turns
    assert [t.time for t in turns] == [datetime(2024, 3, 3, 5), datetime(2024, 3, 3, 6), datetime(2024, 3, 3, 7)]
    assert turns[0].timestamp == "2024-03-03T10:00:00+05:00"  # the source's text, kept verbatim
    _refused(_jsonl(tmp_path / "u.jsonl", {**BASE, "timestamp": "0001-01-01T00:00:00+05:00"}),
             "'timestamp'", "out of range")


@pytest.mark.parametrize("field,limit", [("turn_id", MAX_ID_CHARS), ("bank_id", MAX_ID_CHARS),
                                         ("speaker", MAX_SPEAKER_CHARS), ("text", MAX_TEXT_CHARS),
                                         ("caption", MAX_CAPTION_CHARS)])
def test_every_string_field_has_the_servers_bound(tmp_path, field, limit):
    ok = _jsonl(tmp_path / "ok.jsonl", {**BASE, field: "x" * limit})
    assert load_conversations(ok)
    bad = _jsonl(tmp_path / "bad.jsonl", {**BASE, field: "x" * (limit + 1)})
    msg = _refused(bad, f"'{field}'", f"the limit is {limit}")
    assert "xxxx" not in msg  # never echoed


def test_timestamp_and_integer_ids_are_bounded(tmp_path):
    _refused(_jsonl(tmp_path / "a.jsonl", {**BASE, "timestamp": "2024-03-02" + " " * MAX_DATE_CHARS}),
             "'timestamp'", f"the limit is {MAX_DATE_CHARS}")
    _refused(_jsonl(tmp_path / "b.jsonl", {**BASE, "turn_id": 10**300}), "'turn_id'", f"the limit is {MAX_ID_CHARS}")


def test_unknown_fields_are_refused_naming_the_field(tmp_path):
    msg = _refused(_jsonl(tmp_path / "t.jsonl", BASE, {**BASE, "turn_id": "t2", "sesion": 4}),
                   "t.jsonl:2", "unknown field 'sesion'")
    assert "session" in msg.split("'sesion'", 1)[1]  # the fields a turn has


def test_locomo_session_numbers_are_bounded(tmp_path):
    sample = {"sample_id": "s", "conversation": {"speaker_a": "A", "speaker_b": "B",
                                                 f"session_{2**63}": [{"speaker": "A", "dia_id": "X1:1", "text": "hi"}],
                                                 f"session_{2**63}_date_time": "9:15 am on 3 March, 2031"}}  # made up
    p = tmp_path / "l.json"
    p.write_text(json.dumps([sample]))
    _refused(p, "'session'", f"0..{MAX_SESSION}")


def test_a_json_array_of_turns_gets_the_jsonl_hint(tmp_path):
    rows = [BASE, {**BASE, "turn_id": "t2"}]
    p = tmp_path / "turns.json"
    p.write_text(json.dumps(rows))
    msg = _refused(p, "JSON Lines", "one JSON object per line")
    assert "sample_id" not in msg
    p.write_text(json.dumps(BASE))  # one turn alone
    _refused(p, "JSON Lines")
    q = tmp_path / "turns.jsonl"
    q.write_text(json.dumps(rows))  # the array on one line of a .jsonl file
    _refused(q, "JSON Lines")
    q.write_text(json.dumps(rows, indent=1))  # spread over lines
    _refused(q, "JSON Lines")


def test_the_http_model_carries_the_data_bounds():
    """``TurnIn`` imports the bounds (never restates them): its JSON schema shows the same numbers."""
    from trawmem_gpu.serve.models import TurnIn

    props = TurnIn.model_json_schema()["properties"]
    lengths = {k: [s.get("maxLength") for s in v.get("anyOf", [v]) if "maxLength" in s] for k, v in props.items()}
    assert lengths["turn_id"] == [MAX_ID_CHARS] and lengths["speaker"] == [MAX_SPEAKER_CHARS]
    assert lengths["text"] == [MAX_TEXT_CHARS] and lengths["caption"] == [MAX_CAPTION_CHARS]
    assert lengths["timestamp"] == [MAX_DATE_CHARS]
    sess = next(s for s in props["session"]["anyOf"] if s.get("type") == "integer")
    assert (sess["minimum"], sess["maximum"]) == (0, MAX_SESSION)


# ----------------------------------------------------------------------------------------------
# build --input and --update
# ----------------------------------------------------------------------------------------------
def _build(*argv) -> int:
    from trawmem_gpu.cli import main

    return main(["build", "--quiet", *map(str, argv)])


def test_build_refuses_a_session_beyond_the_bound(tmp_path, capsys):
    p = _jsonl(tmp_path / "t.jsonl", {**BASE, "session": 2**63 - 1})
    assert _build("--input", p, "--out", tmp_path / "c") == 2
    err = capsys.readouterr().err
    assert "'session'" in err and "Traceback" not in err
    assert not (tmp_path / "c" / "banks").exists() or not any((tmp_path / "c" / "banks").iterdir())


def test_build_of_a_json_array_of_turns_says_jsonl(tmp_path, capsys):
    p = tmp_path / "turns.json"
    p.write_text(json.dumps([BASE]))
    assert _build("--input", p, "--out", tmp_path / "c") == 2
    err = capsys.readouterr().err
    assert "JSON Lines" in err and "sample_id" not in err


def test_update_stores_turns_dated_before_the_bank_at_their_place(tmp_path, capsys):
    from trawmem_gpu.store import Collection

    out = tmp_path / "c"
    assert _build("--input", _jsonl(tmp_path / "a.jsonl", BASE), "--out", out) == 0
    late = _jsonl(tmp_path / "b.jsonl", {**BASE, "turn_id": "t2", "timestamp": "2024-01-01T09:00:00"})
    assert _build("--input", late, "--out", out, "--update") == 0  # issue 45: stored at its place, not refused
    assert [(t.turn_id, t.session) for t in Collection(out).load("b").turns] == [("t2", 1), ("t1", 2)]
    ok = _jsonl(tmp_path / "c.jsonl", {**BASE, "turn_id": "t3", "timestamp": "2024-03-02T10:00:00+01:00"})
    assert _build("--input", ok, "--out", out, "--update") == 0  # 09:00 UTC: before t1's 10:00, same day
    later = _jsonl(tmp_path / "d.jsonl", {**BASE, "turn_id": "t4", "timestamp": "2024-03-02T10:00:00"})
    assert _build("--input", later, "--out", out, "--update") == 0  # the same time is at the end
    assert [(t.turn_id, t.session) for t in Collection(out).load("b").turns] == [("t2", 1), ("t3", 2), ("t1", 2),
                                                                                  ("t4", 2)]
    assert "Traceback" not in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# Memory.add (and so MCP add_turns)
# ----------------------------------------------------------------------------------------------
def _turn(tid: str, ts: str = "2024-03-02T10:00:00", **kw) -> dict:
    return {"turn_id": tid, "speaker": "Ana", "text": f"I love pottery ({tid}).", "timestamp": ts, **kw}


@pytest.fixture
def mem(tmp_path):
    from trawmem_gpu import Memory

    m = Memory(tmp_path / "c")
    m.add("b", [_turn("t1")])
    m.add("other", [_turn("o1")])
    return m


def _still_whole(m, n_units: int = 1) -> None:
    """The bank holds ``n_units``, every call on it and the collection works, and it reopens."""
    from trawmem_gpu import Memory

    assert len(m.turns("b")) == n_units
    assert {b["bank_id"] for b in m.banks()} == {"b", "other"}
    assert m.select("b", "pottery").units
    again = Memory(m.path)
    assert len(again.turns("b")) == n_units and len(again.turns("other")) == 1


@pytest.mark.parametrize("session", BIG_SESSIONS)
def test_memory_add_refuses_a_bad_session_and_stores_nothing(mem, session):
    with pytest.raises(InputError, match=r"turns\[1\]: field 'session'"):
        mem.add("b", [_turn("t2", session=5), _turn("t3", session=session)], atomic=True)
    _still_whole(mem)


def test_memory_add_refuses_a_counted_session_past_the_bound(mem):
    mem.add("b", [_turn("t2", "2024-03-03", session=MAX_SESSION)])
    with pytest.raises(InputError, match=r"turns\[0\]: field 'session'.*MAX_SESSION"):
        mem.add("b", [_turn("t3", "2024-03-04")], atomic=True)  # no session, the next day: MAX_SESSION + 1
    _still_whole(mem, 2)
    mem.add("b", [_turn("t3", "2024-03-03T12:00")])  # the same day stays in MAX_SESSION
    assert mem.turns("b")[-1].session == MAX_SESSION


def test_memory_add_of_an_aware_timestamp_keeps_the_bank_usable(mem):
    got = mem.add("b", [_turn("t2", "2024-03-03T10:00:00+05:00")])
    assert got["last_date"] == "2024-03-03T05:00:00"
    mem.add("b", [_turn("t3", "2024-03-03T06:00:00")])  # a naive one after it compares
    again = mem.add("b", [_turn("t2", "2024-03-03T10:00:00+05:00")])  # a retry is still a retry
    assert again["already_stored"] == ["t2"] and again["appended"] == 0
    _still_whole(mem, 3)


def test_memory_add_stores_turns_dated_before_the_bank_in_time_order(mem):
    mem.add("b", [_turn("t2", "2024-03-05")])
    assert mem.add("b", [_turn("t3", "2024-03-04")], atomic=True)["stored"] == ["t3"]  # late: not refused
    got = mem.add("b", [_turn("t4", "2024-03-07"), _turn("t5", "2024-03-06")], atomic=True)  # within one add too
    assert got["stored"] == ["t4", "t5"]
    _still_whole(mem, 5)
    # a retry of stored turns (dated before the last) with new ones after them is not refused
    got = mem.add("b", [_turn("t1"), _turn("t2", "2024-03-05"), _turn("t6", "2024-03-05")])
    assert got["already_stored"] == ["t1", "t2"] and got["stored"] == ["t6"]


def test_memory_add_refuses_unknown_fields_and_oversized_ones(mem):
    with pytest.raises(InputError, match=r"turns\[0\]: unknown field 'sesion'"):
        mem.add("b", [_turn("t2", sesion=2)], atomic=True)
    with pytest.raises(InputError, match=r"turns\[0\]: field 'caption' is \d+ characters"):
        mem.add("b", [_turn("t2", caption="x" * (MAX_CAPTION_CHARS + 1))], atomic=True)
    _still_whole(mem)


@pytest.mark.parametrize("call,arg", [
    (lambda m: m.add(5, [_turn("t2")]), "bank_id"),
    (lambda m: m.forget(5), "bank_id"),
    (lambda m: m.forget("b", 5), "turn_ids"),
    (lambda m: m.add("b", None), "turns"),
    (lambda m: m.add("b", "t2"), "turns"),
    (lambda m: m.select_many(None), "queries"),
    (lambda m: m.select_many([("b", "q"), None]), r"queries\[1\]"),
    (lambda m: m.select_many([(5, "q")]), r"queries\[0\]"),
    (lambda m: m.select(None, "q"), r"queries\[0\]"),
])
def test_bad_arguments_raise_input_error_naming_them(mem, call, arg):
    with pytest.raises(InputError, match=rf"^{arg}: "):
        call(mem)


def test_select_many_never_reshapes_vectors(mem):
    import numpy as np

    dim = mem._core.dim
    total = 2 * dim
    with pytest.raises(InputError, match=r"vectors: expected 2 finite vectors of \d+ numbers.*got 3 of"):
        mem.select_many([("b", "q"), ("other", "q")], vectors=np.ones((3, total // 3), dtype=np.float32))
    with pytest.raises(InputError, match="vectors: expected 2"):
        mem.select_many([("b", "q"), ("other", "q")], vectors=np.ones(total, dtype=np.float32))
    v = np.ones((2, dim), dtype=np.float32) / np.sqrt(dim)
    assert len(mem.select_many([("b", "q"), ("other", "q")], vectors=v)) == 2


# ----------------------------------------------------------------------------------------------
# POST /v1/banks/{id}/turns
# ----------------------------------------------------------------------------------------------
def test_http_append_checks_the_schema_before_it_stores(tmp_path):
    import httpx

    from serve_util import running
    from trawmem_gpu.serve.config import ServeConfig

    with running(ServeConfig(collection=str(tmp_path / "c"), max_wait_ms=1)) as (url, service, _):
        c = httpx.Client(base_url=url, timeout=120)
        post = lambda turns: c.post("/v1/banks/b/turns", json={"turns": turns, "atomic": True})  # noqa: E731
        assert post([_turn("t1")]).status_code == 200
        for bad, field in [({"session": 2**63}, "turns[1].session"), ({"session": -1}, "turns[1].session"),
                           ({"session": 10**30}, "turns[1].session"), ({"session": True}, "turns[1].session"),
                           ({"sesion": 1}, "turns[1].sesion"), ({"caption": "x" * (MAX_CAPTION_CHARS + 1)},
                                                                 "turns[1].caption")]:
            r = post([_turn("t2", "2024-03-04", **({"session": 1} if "session" in bad else {})),
                      {**_turn("t3"), **bad}])
            assert r.status_code == 422 and field in r.json()["detail"], (bad, r.text)
        assert [t.turn_id for t in service.registry.get("b").turns] == ["t1"]
        aware = [_turn("t2", "2024-03-03T10:00:00+05:00")]
        r = post(aware)
        assert r.status_code == 200 and r.json()["last_date"] == "2024-03-03T05:00:00", r.text
        r = post(aware)  # sent twice: a retry, neither a 500 nor a 409
        assert r.status_code == 200 and r.json()["already_stored"] == ["t2"], r.text
        assert c.get("/v1/banks/b").status_code == 200
        r = c.post("/v1/select", json={"bank_id": "b", "question": "pottery", "budget": 8})
        assert r.status_code == 200 and {u["id"] for u in r.json()["units"]} == {"t1", "t2"}
        c.close()
