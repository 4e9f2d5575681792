"""Adds answered per item (issue 35 items 5 and 6): every valid turn of a batch is stored and every
item answered (stored, already stored, refused with its field and reason, skipped); ``atomic=True``
refuses the whole batch; OpenAI-style chat messages in (ids and times assigned, speakers, roles,
content parts); a ``kill -9`` mid-batch loses no acknowledged item."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from trawmem_gpu.errors import DuplicateTurns, InputError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def _t(tid, ts="2031-03-02T10:00:00", text=None, **kw):
    return {"turn_id": tid, "speaker": "Ana", "text": f"Note {tid} about the garden." if text is None else text, "timestamp": ts, **kw}


@pytest.fixture
def mem(tmp_path):
    from trawmem_gpu import Memory

    m = Memory(tmp_path / "c")
    m.add("b", [_t("t1")])
    return m


def test_a_batch_stores_every_valid_turn_and_answers_each(mem):
    res = mem.add("b", [_t("t2"), _t("t3", text=""), _t("t4", ts="garbage"), _t("t2"), _t("t1", text="Other words."),
                        _t("t1"), _t("t5", ts="2031-03-01"), 7, _t("t6", sesion=1), _t("t7")])
    got = [(x["status"], x.get("field")) for x in res["items"]]
    assert got == [("stored", None), ("refused", "turns[1].text"), ("refused", "turns[2].timestamp"),
                   ("refused", "turns[3].turn_id"), ("refused", "turns[4].turn_id"), ("already_stored", None),
                   ("stored", None), ("refused", "turns[7]"), ("refused", "turns[8].sesion"),
                   ("stored", None)]  # t5, dated before t1, is stored at its place in time (issue 45)
    assert res["stored"] == ["t2", "t5", "t7"] and res["already_stored"] == ["t1"] and res["appended"] == 3
    assert [x["index"] for x in res["refused"]] == [1, 2, 3, 4, 7, 8]
    reasons = {x["index"]: x["reason"] for x in res["refused"]}
    assert "empty 'text'" in reasons[1] and "unparseable date" in reasons[2] and "in this request" in reasons[3]
    assert "with other content" in reasons[4] and "nothing was stored" not in reasons[4]
    assert [t.turn_id for t in mem.turns("b")] == ["t5", "t1", "t2", "t7"]
    assert "t7" in mem.select("b", "garden", budget=8).unit_ids  # the engine sees what was stored


def test_atomic_refuses_the_whole_batch(mem):
    with pytest.raises(InputError, match=r"turns\[1\]: field 'timestamp'"):
        mem.add("b", [_t("t2"), _t("t3", ts="garbage")], atomic=True)
    with pytest.raises(DuplicateTurns, match=r"already holds turn ids \['t1'\] with other content"):
        mem.add("b", [_t("t2"), _t("t1", text="Other words.")], atomic=True)
    assert [t.turn_id for t in mem.turns("b")] == ["t1"]
    assert mem.add("b", [_t("t2"), _t("t1")], atomic=True)["stored"] == ["t2"]  # a retried turn is no refusal


def test_sessions_on_every_turn_or_none_is_kept_per_item(mem):
    res = mem.add("b", [_t("t2", session=4), _t("t3"), _t("t4", session=5)])
    assert [x["status"] for x in res["items"]] == ["stored", "refused", "stored"]
    assert res["refused"][0]["field"] == "turns[1].session"
    assert [t.session for t in mem.turns("b")] == [1, 4, 5]


def test_a_first_add_with_every_turn_refused_makes_no_bank(mem):
    res = mem.add("new", [_t("n1", ts="garbage")])
    assert res["created"] is False and res["n_units"] == 0 and res["refused"][0]["field"] == "turns[0].timestamp"
    assert "new" not in mem and [b["bank_id"] for b in mem.banks()] == ["b"]
    with pytest.raises(InputError, match="turns: give at least one turn"):
        mem.add("b", [])


def test_chat_messages_in(mem):
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "I moved to Lyon last month."},
            {"role": "assistant", "content": [{"type": "text", "text": "Lyon!"}, {"type": "text", "text": "How is it?"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            {"role": "user", "name": "Ben", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]},
            {"role": "user", "name": "Ben", "content": "Say hi to Ana.", "id": "ben-1", "timestamp": "2031-04-01"},
            {"role": "user", "contnet": "typo"}]
    now = datetime(2031, 3, 20, 9, 30)
    res = mem.add("b", messages=msgs, speakers={"user": "Ana", "assistant": "Bot"}, now=now)
    st = [(x["status"], x["turn_id"], x.get("field")) for x in res["items"]]
    assert st == [("skipped", None, "messages[0].role"), ("stored", "msg-2", None), ("stored", "msg-3", None),
                  ("skipped", None, "messages[3].content"), ("skipped", None, "messages[4].role"),
                  ("refused", None, "messages[5].content[0].type"), ("stored", "ben-1", None),
                  ("refused", None, "messages[7].contnet")]
    assert "image_url" in res["items"][5]["reason"] and "contnet" in res["items"][7]["reason"]
    turns = {t.turn_id: t for t in mem.turns("b")}
    assert (turns["msg-2"].speaker, turns["msg-2"].text, turns["msg-2"].timestamp) == \
        ("Ana", "I moved to Lyon last month.", "2031-03-20T09:30:00")
    assert (turns["msg-3"].speaker, turns["msg-3"].text) == ("Bot", "Lyon!\nHow is it?")
    assert turns["ben-1"].speaker == "Ben"
    # asked for: system and tool messages are stored too, the role is the speaker without a map
    res = mem.add("b", messages=msgs[:1] + msgs[4:5], roles=["system", "tool", "user"], now=now.replace(day=5, month=4))
    assert [(x["status"], x["turn_id"]) for x in res["items"]] == [("stored", "msg-5"), ("stored", "msg-6")]
    assert [t.speaker for t in mem.turns("b")[-2:]] == ["system", "tool"]


def test_assigned_ids_are_deterministic_and_never_a_stored_id(tmp_path):
    from trawmem_gpu import Memory

    msgs = [{"role": "user", "content": "First."}, {"role": "assistant", "content": "Second."}]
    runs = []
    for k in range(2):
        m = Memory(tmp_path / f"c{k}")
        m.add("b", [_t("msg-2", ts="2031-01-01")])  # a stored id the numbering would give
        got = m.add("b", messages=msgs + [{"role": "user", "content": "Third.", "id": "msg-4"}],
                    now=datetime(2031, 1, 2))
        runs.append([(x["turn_id"], x["status"]) for x in got["items"]])
        assert len({t.turn_id for t in m.turns("b")}) == 4
    assert runs[0] == runs[1] == [("msg-3", "stored"), ("msg-5", "stored"), ("msg-4", "stored")]
    # an add whose "now" is before the bank's last turn is dated with that turn's time (never back in time)
    m = Memory(tmp_path / "c0")
    got = m.add("b", messages=[{"role": "user", "content": "Later."}], now=datetime(2020, 1, 1))
    assert got["stored"] and m.turns("b")[-1].timestamp == "2031-01-02T00:00:00"


def test_message_arguments_are_checked(mem):
    for kw, msg in [({"messages": "hi"}, "^messages: expected a list"),
                    ({"messages": [], "turns": [_t("x")]}, "not both"),
                    ({"messages": [{"role": "user", "content": "x"}], "roles": ["robot"]}, "^roles: unknown role 'robot'"),
                    ({"messages": [{"role": "user", "content": "x"}], "speakers": {"user": 5}}, r"^speakers\.user"),
                    ({"turns": [_t("x")], "speakers": {"user": "A"}}, "apply to chat messages")]:
        with pytest.raises(InputError, match=msg):
            mem.add("b", **kw)


_WRITER = """
import json, sys
from trawmem_gpu import Memory
mem = Memory(sys.argv[1])
for b in range(200):
    turns = [{"turn_id": f"b{b}-{i}", "speaker": "Ana", "text": f"Batch {b}, note {i}: the garden needs water.",
              "timestamp": f"2031-01-{1 + b // 8:02d}T{b % 8 + 10}:00:00"} for i in range(4)]
    res = mem.add("k", turns + [{"turn_id": f"bad{b}", "speaker": "Ana", "text": "", "timestamp": "2031-01-01"}])
    print(json.dumps(res["stored"]), flush=True)
"""


def test_a_kill_mid_batch_loses_no_acknowledged_item(tmp_path):
    """A writer acknowledges batch after batch (printing what ``add`` answered stored) and is
    killed with SIGKILL while it writes the next one: every acknowledged turn is in the bank, the
    bank loads, and resending every batch stores each turn once."""
    from trawmem_gpu import Memory

    coll = tmp_path / "c"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", _WRITER, str(coll)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    acked: list[str] = []
    try:
        for _ in range(3):
            line = p.stdout.readline()
            assert line, p.stderr.read()[-2000:]
            acked += json.loads(line)
        os.kill(p.pid, signal.SIGKILL)  # the writer is inside its fourth add
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert len(acked) == 12
    mem = Memory(coll)
    held = [t.turn_id for t in mem.turns("k")]
    assert set(acked) <= set(held) and len(held) in (12, 16)  # the batch in flight: all of it or none
    again = []
    for b in range(4):
        turns = [{"turn_id": f"b{b}-{i}", "speaker": "Ana", "text": f"Batch {b}, note {i}: the garden needs water.",
                  "timestamp": f"2031-01-01T{b + 10}:00:00"} for i in range(4)]
        again.append(mem.add("k", turns))
    assert all(set(r["already_stored"]) >= set(acked[4 * b:4 * b + 4]) for b, r in enumerate(again[:3]))
    assert sorted(t.turn_id for t in mem.turns("k")) == sorted(f"b{b}-{i}" for b in range(4) for i in range(4))


def test_dates_ids_and_now_out_of_range_are_clear_errors(mem):
    """Issue 42 item 7: an ``as_of`` or date over 64 characters is refused before it is parsed; an
    aware ``now`` whose UTC leaves datetime's years, and an integer id of 5,000 digits, are
    ``InputError`` (the id refused per item), not a builtin ``ValueError``; nothing is stored."""
    from datetime import timedelta, timezone

    for call in (lambda: mem.select("b", "garden", as_of="1" * 5000),
                 lambda: mem.select_many([("b", "garden")], dates=["2" * 5000])):
        with pytest.raises(InputError, match=r"date is 5000 characters; the limit is 64"):
            call()
    msgs = [{"role": "user", "content": "Hi there"}]
    for now in (datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
                datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))):
        with pytest.raises(InputError, match=r"^now: date .* is out of range once converted to UTC"):
            mem.add("b", messages=msgs, now=now)
    res = mem.add("b", [_t(10 ** 5000, text="Note big."), _t("t2")])
    assert [(x["status"], x.get("field")) for x in res["items"]] == [("refused", "turns[0].turn_id"), ("stored", None)]
    assert "integer of 16610 bits" in res["items"][0]["reason"] and res["items"][0]["turn_id"] is None
    res = mem.add("b", messages=[{"role": "user", "content": "Hi", "id": 10 ** 5000}])
    assert [(x["status"], x.get("field")) for x in res["items"]] == [("refused", "messages[0].turn_id")]
    with pytest.raises(InputError, match=r"turns\[0\]: field 'turn_id' is an integer of 16610 bits"):
        mem.add("b", [_t(10 ** 5000, text="Note big.")], atomic=True)
    assert [t.turn_id for t in mem.turns("b")] == ["t1", "t2"]


def test_a_closed_async_memory_says_so(mem):
    import asyncio

    from trawmem_gpu import AsyncMemory
    from trawmem_gpu.errors import Closed

    async def go():
        am = AsyncMemory.of(mem)
        assert (await am.select("b", "garden", budget=8)).unit_ids
        await am.aclose()
        with pytest.raises(Closed, match=r"this AsyncMemory is closed \(aclose\(\) was called\).*select was not run"):
            await am.select("b", "garden")
        with pytest.raises(RuntimeError):  # a Closed is a RuntimeError, as the pool's was
            await am.add("b", [_t("t9")])

    asyncio.run(go())
    assert [t.turn_id for t in mem.turns("b")] == ["t1"] and mem.select("b", "garden", budget=8).unit_ids


def test_a_message_sent_again_without_a_timestamp_is_a_retry_whenever_it_comes(tmp_path):
    """A chat message with an id and no timestamp gets the time of its add; sent again later (a
    framework retrying a run: the LangChain middleware's ``lc-<id>`` turns), it is already stored,
    not "held with other content" for the new time it would have got. One sent with its own,
    different timestamp still conflicts."""
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "m")
    msgs = [{"role": "user", "content": "Is Pixel grey?", "id": "r1"}, {"role": "assistant", "content": "Yes.", "id": "r2"}]
    first = mem.add("b", messages=msgs, speakers={"user": "Ana", "assistant": "Bot"}, now=datetime(2031, 1, 2, 9, 0, 0),
                    atomic=True)
    assert first["stored"] == ["r1", "r2"]
    again = mem.add("b", messages=msgs, speakers={"user": "Ana", "assistant": "Bot"}, now=datetime(2031, 1, 2, 9, 0, 7),
                    atomic=True)
    assert again["already_stored"] == ["r1", "r2"] and again["stored"] == [] and not again["refused"]
    assert [t.timestamp for t in mem.turns("b")] == ["2031-01-02T09:00:00"] * 2
    with pytest.raises(DuplicateTurns, match="r1"):
        mem.add("b", messages=[{**msgs[0], "timestamp": "2031-01-02T09:30:00"}], speakers={"user": "Ana"}, atomic=True)
