"""One schema for facts (issue 42.6): every fact door checks a fact by the turns' rules (ids,
lengths, dates capped before parsing) before anything is written; validity is compared in UTC; a
fact not yet valid is not current; the history stays true when a successor is forgotten; a
Memory selecting from facts writes no bank it could not serve."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trawmem_gpu.errors import ConfigError, InputError
from trawmem_gpu.store.facts import Fact, fact_from_record


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def _t(tid, day=1, text=None):
    return {"turn_id": tid, "speaker": "Ana", "text": text or f"Turn {tid}: Clara talked about where she lives.",
            "timestamp": f"2024-05-{day:02d}T10:00:00"}


def _files(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


KEY = {"subject": "Clara", "attribute": "lives in"}
OK = {"text": "Clara lives in Lyon.", "source_turns": ["t1"]}


@pytest.mark.parametrize("bad,msg", [
    ({"valid_from": "2024-03-01Tgarbage"}, r"facts\[1\]: field 'valid_from'"),
    ({"date": "not a date"}, r"facts\[1\]: field 'date'"),
    ({"valid_from": "2" * 1_000_000}, r"'valid_from' is 1000000 characters; the limit is 64"),
    ({"text": "x" * 10_000_000}, r"'text' is 10000000 characters; the limit is 131072"),
    ({"subject": "C" * 1_000_000, "attribute": "lives in"}, r"'subject' is 1000000 characters; the limit is 256"),
    ({"id": {"a": 1}}, r"facts\[1\]: field 'id' must be a string or an integer, got an object"),
    ({"id": "F:a\nb"}, r"facts\[1\]: field 'id' holds the control character"),
    ({"id": "F" * 100_000}, r"facts\[1\]: field 'id' is 100000 characters; the limit is 256"),
    ({"id": ""}, r"facts\[1\]: field 'id' is empty"),
    ({"persons": ["Ana"] * 100_000}, r"'persons' holds 100000 items; the limit is 64"),
    ({"keywords": ["k" * 300]}, r"'keywords' is 300 characters; the limit is 256"),
    ({"source_turns": ["t1"] * 100_000}, r"'source_turns' holds 100000 ids; the limit is 4096"),
    ({"source_turns": [{"x": 1}]}, r"field 'source_turns' must be a string or an integer"),
])
def test_a_bad_fact_is_refused_and_nothing_is_written(tmp_path, bad, msg):
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "c")
    mem.add("b", [_t("t1"), _t("t2", day=2)])
    before = _files(tmp_path / "c")
    with pytest.raises(InputError, match=msg):
        mem.add_facts("b", [OK, {"text": "Clara lives in Porto.", "source_turns": ["t2"], **bad}])
    assert _files(tmp_path / "c") == before
    assert mem._core.registry.get("b").facts == ()


def test_the_schema_holds_at_the_store_the_locomo_and_the_extraction_doors():
    from trawmem_gpu.ingest.layers.locomo import facts_from_sample
    from trawmem_gpu.ingest.layers.trimem_extract import ExtractStats, _facts_from, _Parsed
    from trawmem_gpu.data.types import Turn
    from datetime import datetime

    rec = Fact("F:1", "Ana runs.", ("t1",), valid_from="2024-03-01").to_record()
    for field, value in (("valid_from", "2024-03-01Tgarbage"), ("date", "not a date"), ("id", "F\n1"),
                         ("text", "x" * 200_000), ("valid_to", "9" * 10_000)):
        with pytest.raises(ValueError, match=repr(field) if field != "id" else "control character"):
            fact_from_record({**rec, field: value})  # a bank file read back
    from locomo_files import layout_sample

    sample = dict(layout_sample("made-up", ("Ana", "Ben"), [("9:40 am on 14 July, 2031", [])]),
                  observation={"session_1_observation": {"Ana": [["x" * 200_000, "D1:1"]]}})
    with pytest.raises(InputError, match=r"observation.session_1_observation.Ana\[0\]'.*'text' is 200000"):
        facts_from_sample(sample, {"D1:1"}, "f.json: sample 0")
    turn = Turn("t1", "Ana", "Ana runs every morning in the park near her home.", 1, "2024-05-01",
                datetime(2024, 5, 1))
    st = ExtractStats()
    entries = [{"text": "Ana runs every morning in the park.", "source_turns": ("t1",), "persons": ["\ud800"]},
               {"text": "Ana runs in the park near her home.", "source_turns": ("t1",)}]
    out = _facts_from([turn], [_Parsed(entries)], 0, (), st)
    assert [f.text for f in out] == ["Ana runs in the park near her home."] and out[0].fact_id == "F:1:0"
    assert st.refused == 1 and st.refusals == {"breaks the fact schema (store.facts)": 1}


def test_validity_is_compared_in_utc_and_a_future_fact_is_not_current():
    late = Fact("F:1", "x", ("t",), valid_from="2024-06-01T04:30Z")
    assert not late.valid_at("2024-05-31") and late.valid_at("2024-06-01")
    assert not late.valid_at("2024-06-01T04:00:00") and late.valid_at("2024-06-01T04:30:00")
    local = Fact("F:0", "x", ("t",), valid_from="2024-05-31T23:30-05:00")  # the issue's: 2024-06-01T04:30 in UTC
    assert not local.valid_at("2024-05-31") and local.valid_at("2024-06-01")
    early = Fact("F:2", "x", ("t",), valid_from="2024-06-01T04:30+05:00")  # 2024-05-31T23:30 in UTC
    assert early.valid_at("2024-05-31") and not early.valid_at("2024-05-30")
    ended = Fact("F:3", "x", ("t",), valid_from="2024-01-01", valid_to="2024-06-01T01:00+02:00", superseded_by="F:4")
    assert ended.valid_at("2024-05-31T22:59:00") and not ended.valid_at("2024-05-31")
    assert not Fact("F:5", "x", ("t",), valid_from="2999-01-01").valid_at(None)
    assert Fact("F:7", "x", ("t",), date="2999-01-01").valid_at(None)  # a coming event's fact holds now
    assert Fact("F:6", "x", ("t",), valid_from="2024-01-01").valid_at(None)
    assert not ended.valid_at(None)


def test_selection_shows_what_holds_now_and_at_an_instant(tmp_path):
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "c")
    mem.add("b", [_t("t1"), _t("t2", day=2), _t("t3", day=3)])
    mem.add_facts("b", [{**OK, "id": "F:lyon", "valid_from": "2023-06-01", **KEY}])
    got = mem.add_facts("b", [{"text": "Clara lives in Oslo.", "source_turns": ["t2"], "id": "F:oslo",
                               "valid_from": "2024-06-01T06:30+02:00", **KEY},
                              {"text": "Clara will live on Mars.", "source_turns": ["t3"], "id": "F:mars",
                               "valid_from": "2999-01-01", "subject": "Clara", "attribute": "plans"}])
    facts = {f.fact_id: f for f in mem._core.registry.get("b").facts}
    assert facts["F:oslo"].valid_from == "2024-06-01T04:30:00" and facts["F:lyon"].valid_to == "2024-06-01T04:30:00"
    sel = Memory(tmp_path / "c", units=("turns", "facts"))
    q = "Where does Clara live?"

    def shown(**kw):
        return {u for u in sel.select("b", q, budget=40, **kw).unit_ids if u.startswith("F:")}

    assert shown() == {"F:oslo"}  # F:mars starts in 2999: not current
    assert shown(as_of="2024-05-31") == {"F:lyon"}
    assert shown(as_of="2024-06-01T04:00") == {"F:lyon"} and shown(as_of="2024-06-01T06:45+02:00") == {"F:oslo"}
    assert shown(as_of="3000-01-01") == {"F:oslo", "F:mars"}
    assert got["superseded"] == [{"old": "F:lyon", "new": "F:oslo", "cause": "rule"}]


def test_a_forgotten_successor_hands_over_to_the_next_of_its_chain(tmp_path):
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "c")
    mem.add("b", [_t("t1"), _t("t2", day=2), _t("t3", day=3)])
    for tid, fid, day in (("t1", "F:a", 1), ("t2", "F:b", 2), ("t3", "F:c", 3)):
        mem.add_facts("b", [{"text": f"Clara lives in {fid}.", "source_turns": [tid], "id": fid,
                             "valid_from": f"2024-05-0{day}", **KEY}])
    mem.forget("b", ["t2"])
    facts = {f.fact_id: f for f in mem._core.registry.get("b").facts}
    assert (facts["F:a"].superseded_by, facts["F:a"].valid_to) == ("F:c", "2024-05-03") and facts["F:c"].current
    assert [(e["event"], e["cause"], e.get("by")) for e in mem.history("b", "F:a")][-1] == \
        ("superseded", "successor forgotten", "F:c")
    mem.forget("b", ["t3"])
    assert mem._core.registry.get("b").facts[0].current
    assert [(e["event"], e["cause"]) for e in mem.history("b", "F:a")][-1] == ("reinstated", "successor forgotten")


def test_a_memory_that_selects_facts_writes_no_bank_it_cannot_serve(tmp_path):
    from trawmem_gpu import Memory

    mem = Memory(tmp_path / "c", units=("turns", "facts"))
    before = _files(tmp_path / "c")
    with pytest.raises(ConfigError, match="nothing was stored"):
        mem.add("new", [_t("t1")])
    assert _files(tmp_path / "c") == before and "new" not in {b["bank_id"] for b in Memory(tmp_path / "c").banks()}


def test_a_server_that_selects_facts_refuses_to_create_a_bank_with_409(tmp_path):
    from serve_util import running

    from trawmem_gpu import Memory
    from trawmem_gpu.serve.config import ServeConfig

    Memory(tmp_path / "c").add("b", [_t("t1")])
    Memory(tmp_path / "c").add_facts("b", [OK])
    before = _files(tmp_path / "c")
    with running(ServeConfig(collection=str(tmp_path / "c"), max_wait_ms=1, units=("turns", "facts"))) as (url, _, _):
        import httpx

        r = httpx.post(url + "/v1/banks/new/turns", json={"turns": [_t("n1")]}, timeout=60)
        assert r.status_code == 409 and "nothing was stored" in r.json()["detail"]
        assert httpx.post(url + "/v1/banks/b/turns", json={"turns": [_t("t2", day=2)]}, timeout=60).status_code == 200
    assert "new" not in {b["bank_id"] for b in Memory(tmp_path / "c").banks()}
    assert _files(tmp_path / "c") != before  # the bank with facts took its turn
