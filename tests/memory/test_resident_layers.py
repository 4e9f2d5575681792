"""What the agent-memory side keeps on the scale side's banks (issues 33 and 35 together): turn
metadata survives an append written as a segment, a compaction and a lazy reopen (a ``where=``
filter reads it each time); facts with supersession and the history per unit work on banks opened
lazily under a resident budget, which ``add_facts`` and ``history`` keep to as ``add`` does.

No model: the word encoder of ``tests/support`` keeps every write to milliseconds."""
from __future__ import annotations

import json

import pytest
from word_encoder import WordEncoder

from trawmem_gpu import Memory
from trawmem_gpu.store import Collection


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


TOPICS = ("the pottery class", "the harbour job", "a grey cat", "the marathon")


def _turns(tag: str = "") -> list[dict]:
    """One day per topic, two users in each (metadata ``user_id`` and ``day``)."""
    return [{"turn_id": f"{tag}D{d}:{i}", "speaker": "Ana" if i % 2 else "Ben",
             "text": f"{'Ana' if i % 2 else 'Ben'} on {topic}: detail {i} of it.",
             "timestamp": f"2024-03-{d + 1:02d}T10:{i:02d}:00",
             "metadata": {"user_id": "u1" if i % 2 else "u2", "day": d}}
            for d, topic in enumerate(TOPICS) for i in range(6)]


def _meta_of(turns) -> dict:
    return {t["turn_id"]: t["metadata"] for t in turns}


def _check(mem: Memory, turns) -> None:
    """The bank's turns carry their metadata, and a filter on it picks from the right ones."""
    assert {t.turn_id: dict(t.metadata) for t in mem.turns("b")} == _meta_of(turns)
    ws = mem.select("b", "What happened at the marathon?", budget=6, where={"day": 3})
    assert ws.units and all(u.metadata["day"] == 3 for u in ws.units)
    assert set(ws.unit_ids) <= {t["turn_id"] for t in turns if t["metadata"]["day"] == 3}


def test_metadata_survives_a_segment_a_compaction_and_a_lazy_reopen(tmp_path):
    d, turns = tmp_path / "c", _turns()
    m = Memory(d, encoder=WordEncoder())
    m.add("b", turns[:18])  # days 0-2: the base
    m.add("b", turns[18:20])  # two turns of day 3: a segment (too few to make a compaction due)
    coll = Collection(d)
    (seg,) = coll.segments("b")
    rec = json.loads((coll.bank_path("b") / f"{seg['name']}.json").read_text())
    assert [r["metadata"] for r in rec["turns"]] == [t["metadata"] for t in turns[18:20]]
    _check(Memory(d, encoder=WordEncoder(), max_resident_bytes=1), turns[:20])  # base + segment, opened lazily

    assert coll.compact("b") and coll.segments("b") == []
    meta = json.loads((coll.bank_path("b") / "meta.json").read_text())
    units = json.loads((coll.bank_path("b") / meta["base"]["files"]["units"]).read_text())
    assert meta["base"]["generation"] >= 1 and _meta_of(turns[:20]) == {r["id"]: r["metadata"] for r in units}
    lazy = Memory(d, encoder=WordEncoder(), max_resident_bytes=1)
    _check(lazy, turns[:20])  # the compacted base, opened lazily
    assert {t.turn_id: dict(t.metadata) for t in coll.load("b", mmap=True).turns} == _meta_of(turns[:20])

    lazy.add("b", turns[20:])  # an append to the compacted bank, then a forget (a whole rewrite)
    assert lazy.forget("b", ["D0:0"])["forgotten"] == ["D0:0"]
    _check(Memory(d, encoder=WordEncoder(), max_resident_bytes=1), turns[1:])


LIVES = {"subject": "Clara", "attribute": "lives in"}


def test_facts_and_history_on_banks_under_a_resident_budget(tmp_path):
    d = tmp_path / "c"
    m = Memory(d, encoder=WordEncoder())
    for b in ("a", "b", "c"):
        m.add(b, _turns()[:18])
    m.add("b", _turns()[18:20])  # b: a base and a segment
    lazy = Memory(d, encoder=WordEncoder(), max_resident_bytes=1)  # one bank at a time
    reg = lazy._core.registry
    got = lazy.add_facts("b", [{"text": "Clara lives in Lyon.", "source_turns": ["D0:1"],
                                "valid_from": "2024-03-01", **LIVES}])
    old = got["added"][0]
    assert got["superseded"] == [] and got["n_facts"] == 1
    lazy.select("a", "pottery", budget=3)
    assert set(reg.banks()) == {"a"}  # b was let go ...
    moved = lazy.add_facts("b", [{"text": "Clara lives in Rotterdam.", "source_turns": ["D3:1"],
                                  "valid_from": "2024-03-04", "id": "F:rot", **LIVES}])
    assert moved["superseded"] == [{"old": old, "new": "F:rot", "cause": "rule"}]
    assert set(reg.banks()) == {"b"} and set(lazy._core.engines.banks) == {"b"}  # ... came back, a went
    assert lazy._core.resident.evicted >= 2

    lazy.select("c", "pottery", budget=3)  # b is cold again: its history reads from its files
    assert [(e["event"], e.get("by")) for e in lazy.history("b", old)] == [("added", None), ("superseded", "F:rot")]
    assert lazy.history("b", "F:rot")[0]["supersedes"] == old
    assert [e["event"] for e in lazy.history("b", "D3:1")] == ["added"]
    assert len(reg.banks()) <= 2

    lazy.select("c", "pottery", budget=3)
    lazy.add("b", _turns()[20:22])  # an append after the facts: a segment, the facts kept
    assert len(Collection(d).segments("b")) >= 1
    facts = {f.fact_id: f for f in Memory(d, encoder=WordEncoder(), max_resident_bytes=1)._core.registry.get("b").facts}
    assert facts[old].superseded_by == "F:rot" and facts["F:rot"].current

    q = "Where does Clara live?"
    layered = Memory(d, encoder=WordEncoder(), max_resident_bytes=1, units=("turns", "facts"))
    assert "F:rot" in layered.select("b", q, budget=40).unit_ids
    then = layered.select("b", q, budget=40, as_of="2024-03-02")
    assert old in then.unit_ids and "F:rot" not in then.unit_ids

    lazy.select("a", "pottery", budget=3)  # b cold: its forget still records the facts that go with the turn
    lazy.forget("b", ["D3:1"])
    assert [e["event"] for e in lazy.history("b", "F:rot")][-1] == "forgotten"
    assert [e["event"] for e in lazy.history("b", "D3:1")] == ["added", "forgotten"]
    assert Memory(d, encoder=WordEncoder())._core.registry.get("b").facts[0].current  # Lyon holds again
