"""A history per memory unit (issue 35.3): ``Memory.history`` and ``GET /v1/banks/{id}/units/{uid}/history``
list each event with its time and cause (added, superseded, re-embedded, forgotten), stored with the
bank and appended under its lock; a forget leaves an event with no content."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from trawmem_gpu.errors import UnknownBank, UnknownUnit


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


SECRET = "qqzv-history-secret-71"


def _t(tid, day=1, text=None):
    return {"turn_id": tid, "speaker": "Ana", "text": text or f"Turn {tid}: we fixed the bike.",
            "timestamp": f"2031-05-{day:02d}T10:00:00"}


def test_add_and_forget_leave_events_without_content(tmp_path):
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "c")
    mem.add("b", [_t("t1"), _t("t2", text=f"The alarm code is {SECRET}.")])
    mem.add("b", [_t("t3", day=2)])
    h = mem.history("b", "t2")
    assert [(e["event"], e["cause"]) for e in h] == [("added", "add")] and h[0]["time"].startswith("20")
    mem.forget("b", ["t2"])
    assert [e["event"] for e in mem.history("b", "t2")] == ["added", "forgotten"]
    assert mem.history("b", "t3")[0]["event"] == "added"
    files = list((tmp_path / "c" / ".history").glob("*.jsonl"))
    assert len(files) == 1 and SECRET.encode() not in files[0].read_bytes()
    assert all(b"Turn t" not in f.read_bytes() for f in files)  # no text of any unit
    with pytest.raises(UnknownUnit, match="holds no unit 'nope'"):
        mem.history("b", "nope")
    with pytest.raises(UnknownBank):
        mem.history("never", "t1")
    again = Memory(tmp_path / "c")  # durable: another Memory reads the same events
    assert [e["event"] for e in again.history("b", "t2")] == ["added", "forgotten"]
    mem.forget("b")  # a whole bank: its history goes with it (issue 42.4)
    with pytest.raises(UnknownBank):
        Memory(tmp_path / "c").history("b", "t1")
    assert not list((tmp_path / "c" / ".history").glob("*.jsonl"))


MAIL, PHONE, BANK = "ana.secret-7f3a@example.org", "+41 79 555 01 23", "carol.bank-9d2e@example.org"


def test_a_forgotten_ids_history_keeps_no_id_in_clear(tmp_path):
    """Issue 42.4: an id can be the secret. After a forget no history file names a forgotten
    turn, nor the facts that went with it (as ``unit`` or as ``by``); the caller who knows the
    id still reads its events."""
    from trawmem_gpu import Memory
    from trawmem_gpu.memory.history import FORGOTTEN

    mem = Memory(tmp_path / "c")
    mem.add(BANK, [_t("t1"), _t(MAIL), _t(PHONE, day=2), _t("t4", day=3)])
    mem.add_facts(BANK, [{"text": "Ana lives in Lyon.", "source_turns": ["t1"], "id": "F:lyon",
                          "subject": "Ana", "attribute": "lives in", "valid_from": "2031-05-01"},
                         {"text": "Ana moved to Porto.", "source_turns": [MAIL], "id": f"F:{PHONE}",
                          "subject": "Ana", "attribute": "lives in", "valid_from": "2031-05-02"}])
    hist = tmp_path / "c" / ".history"
    assert PHONE.encode() in b"".join(f.read_bytes() for f in hist.glob("*.jsonl"))  # the search can fail
    mem.forget(BANK, [MAIL, PHONE])
    data = b"".join(f.read_bytes() for f in hist.rglob("*") if f.is_file())
    for secret in (MAIL, PHONE, f"F:{PHONE}"):
        assert secret.encode() not in data and json.dumps(secret).encode() not in data
    again = Memory(tmp_path / "c")
    assert [(e["event"], e["cause"]) for e in again.history(BANK, MAIL)] == [("added", "add"), ("forgotten", "forget")]
    assert [e["event"] for e in again.history(BANK, f"F:{PHONE}")] == ["added", "forgotten"]
    assert again.history(BANK, f"F:{PHONE}")[0]["supersedes"] == "F:lyon"
    # the fact it superseded holds again, and its history says so (issue 42.6), naming no forgotten id
    assert [(e["event"], e.get("by")) for e in again.history(BANK, "F:lyon")] == \
        [("added", None), ("superseded", FORGOTTEN), ("reinstated", None)]
    assert again._core.registry.get(BANK).facts[0].current
    assert [e["event"] for e in again.history(BANK, "t1")] == ["added"]
    with pytest.raises(UnknownUnit):
        again.history(BANK, "never-there")


def test_a_bank_made_under_a_forgotten_id_starts_with_no_history(tmp_path):
    """Issue 42.4: a bank forgotten whole (or down to its last turn) takes its history along."""
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "c")
    mem.add(BANK, [_t("t1"), _t("t2")])
    mem.add("keep", [_t("k1")])
    mem.forget(BANK)
    mem.add("last", [_t("l1")])
    mem.forget("last", ["l1"])  # its last turn: the bank is gone
    data = b"".join(f.read_bytes() for f in (tmp_path / "c" / ".history").rglob("*") if f.is_file())
    assert BANK.encode() not in data and b'"last"' not in data and b'"keep"' in data
    mem.add(BANK, [_t("t3", day=4)])
    assert mem.history(BANK, "t3")[0]["event"] == "added"
    with pytest.raises(UnknownUnit):
        mem.history(BANK, "t1")  # the old bank's turn: nothing of it
    mem.add("last", [_t("l1", day=5)])
    assert [e["event"] for e in mem.history("last", "l1")] == ["added"]


def test_a_torn_write_is_skipped_and_fenced_off(tmp_path):
    from trawmem_gpu.memory.history import HistoryStore, event

    h = HistoryStore(tmp_path)
    h.append("b", [event("u1", "added", "add")])
    with open(h.path("b"), "ab") as f:
        f.write(b'{"bank_id": "b", "unit": "u1", "ev')  # a crash in the middle of a write
    assert [e["event"] for e in h.events("b", "u1")] == ["added"]
    h.append("b", [event("u1", "forgotten", "forget")])
    assert [e["event"] for e in h.events("b", "u1")] == ["added", "forgotten"]
    with pytest.raises(ValueError):
        event("u1", "renamed", "x")


def test_layer_events_added_re_embedded_and_dropped():
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.data import load_conversations, sample_path
    from trawmem_gpu.memory.history import forget_events, write_events
    from trawmem_gpu.store.facts import Fact, ProfileLine, ProfileSection

    (b,), _ = build_banks(load_conversations(sample_path())[:1], progress=False)
    d = b.unit_vecs.shape[1]
    f = (Fact("F:1:1", "Ana runs.", ("S1:1",)), Fact("F:1:2", "Ben swims.", ("S1:2",)))
    p = (ProfileSection("Ana", "interests", (ProfileLine("running", ("F:1:1",)),)),)
    one = replace(b, facts=f, fact_vecs=np.eye(2, d, dtype=np.float32), profiles=p,
                  profile_vecs=np.eye(1, d, dtype=np.float32))
    two = replace(one, profile_vecs=np.eye(1, d, k=1, dtype=np.float32))  # the section rewritten
    evs = {(e["unit"], e["event"]) for e in write_events(one, two, "build --update")}
    assert evs == {("P:Ana:interests", "re-embedded")}
    assert {(e["unit"], e["event"]) for e in write_events(b, one, "x")} == \
        {("F:1:1", "added"), ("F:1:2", "added"), ("P:Ana:interests", "added")}
    gone = replace(one, facts=f[1:], fact_vecs=one.fact_vecs[1:], profiles=(), profile_vecs=None)
    evs = [(e["unit"], e["event"], e["cause"]) for e in forget_events(one, gone, ["S1:1"])]
    assert evs == [("S1:1", "forgotten", "forget"), ("F:1:1", "forgotten", "cites a forgotten turn"),
                   ("P:Ana:interests", "forgotten", "cites a forgotten turn")]


def test_history_over_http_and_the_client(tmp_path):
    from serve_util import running

    from trawmem_gpu.client import BankNotFound, Client, UnitNotFound
    from trawmem_gpu.errors import UnknownUnit
    from trawmem_gpu.serve.config import ServeConfig

    with running(ServeConfig(collection=str(tmp_path / "c"), max_wait_ms=1)) as (url, service, _):
        with Client(url, deadline=120) as c:
            c.append("b", [_t("t1"), _t("a/b")])
            h = c.history("b", "a/b")
            assert (h.bank_id, h.unit_id, [e.event for e in h.events]) == ("b", "a/b", ["added"])
            c.forget("b", ["t1"])
            assert [(e.event, e.cause) for e in c.history("b", "t1").events] == [("added", "add"),
                                                                                ("forgotten", "forget")]
            with pytest.raises(UnitNotFound) as e:  # a unit, not the bank, is missing: as Memory.history says
                c.history("b", "nope")
            assert isinstance(e.value, UnknownUnit) and not isinstance(e.value, BankNotFound)
            with pytest.raises(BankNotFound):
                c.history("zzz", "t1")
