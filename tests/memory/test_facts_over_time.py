"""Facts that change over time (issue 35.2): a keyed fact supersedes the current fact of the same
subject and attribute by rule; the old one stays with valid_to and superseded_by; selection shows
current facts, ``as_of`` those of a date; the LLM's proposals are grounded in the facts shown."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from trawmem_gpu.data import sample_path
from trawmem_gpu.errors import InputError
from trawmem_gpu.store.facts import Fact, fact_from_record


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


LIVES = {"subject": "Clara", "attribute": "lives in"}


@pytest.fixture
def coll(tmp_path):
    from trawmem_gpu import Memory
    from trawmem_gpu.data import load_conversations

    mem = Memory(tmp_path / "c")
    mem.add("ana-ben", list(load_conversations(sample_path())[0].turns))
    got = mem.add_facts("ana-ben", [
        {"text": "Clara lives in Lyon.", "source_turns": ["S1:7"], "valid_from": "2023-06-01", **LIVES},
        {"text": "Ana signed up for the Porto half marathon.", "source_turns": ["S1:1"]}])
    assert got["superseded"] == [] and len(got["added"]) == 2
    moved = mem.add_facts("ana-ben", [{"text": "Clara lives in Rotterdam.", "source_turns": ["S1:8"],
                                       "valid_from": "2024-02-01", "id": "F:rotterdam", **LIVES}])
    old = got["added"][0]
    assert moved["superseded"] == [{"old": old, "new": "F:rotterdam", "cause": "rule"}]
    return tmp_path / "c", old


def test_a_keyed_fact_supersedes_by_rule_and_the_old_one_stays(coll):
    from trawmem_gpu import Memory

    path, old = coll
    mem = Memory(path)
    facts = {f.fact_id: f for f in mem._core.registry.get("ana-ben").facts}
    assert (facts[old].valid_to, facts[old].superseded_by, facts[old].text) == ("2024-02-01", "F:rotterdam",
                                                                                "Clara lives in Lyon.")
    assert facts["F:rotterdam"].current and facts["F:rotterdam"].key == ("clara", "lives in")
    assert [(e["event"], e["cause"], e.get("by")) for e in mem.history("ana-ben", old)] == \
        [("added", "add_facts", None), ("superseded", "rule", "F:rotterdam")]
    assert mem.history("ana-ben", "F:rotterdam")[0]["supersedes"] == old
    # a fact that arrives late (it starts before the current one) is stored superseded already
    late = mem.add_facts("ana-ben", [{"text": "Clara lives in Paris.", "source_turns": ["S1:7"],
                                      "valid_from": "2023-12-01", "id": "F:paris", **LIVES}])
    assert {(p["old"], p["new"]) for p in late["superseded"]} == {(old, "F:paris"), ("F:paris", "F:rotterdam")}
    facts = {f.fact_id: f for f in mem._core.registry.get("ana-ben").facts}
    assert facts[old].superseded_by == "F:paris" and facts["F:paris"].superseded_by == "F:rotterdam"
    assert facts["F:rotterdam"].current


def test_selection_shows_current_facts_and_as_of_those_of_a_date(coll):
    from trawmem_gpu import Memory

    path, old = coll
    mem = Memory(path, units=("turns", "facts"))
    q = "Where does Clara live?"
    now = mem.select("ana-ben", q, budget=40)
    ids = set(now.unit_ids)
    assert "F:rotterdam" in ids and old not in ids
    then = mem.select("ana-ben", q, budget=40, as_of="2023-09-01")
    assert old in then.unit_ids and "F:rotterdam" not in then.unit_ids
    assert "F:rotterdam" in mem.select("ana-ben", q, budget=40, as_of="2024-03-01").unit_ids
    assert set(mem.select("ana-ben", q, budget=40).unit_ids) == ids  # the served engine is untouched
    with pytest.raises(InputError, match="as_of"):
        mem.select("ana-ben", q, as_of="whenever")


def test_forgetting_the_newer_fact_makes_the_older_current_again(coll):
    from trawmem_gpu import Memory

    path, old = coll
    mem = Memory(path)
    mem.forget("ana-ben", ["S1:8"])
    facts = {f.fact_id: f for f in mem._core.registry.get("ana-ben").facts}
    assert "F:rotterdam" not in facts and facts[old].current and facts[old].valid_to is None
    assert [e["event"] for e in mem.history("ana-ben", "F:rotterdam")][-1] == "forgotten"


def test_fact_records_and_checks(coll):
    from trawmem_gpu import Memory

    plain = Fact("F:1:1", "Ana runs.", ("S1:1",), date="2024-03-02")
    assert set(plain.to_record()) == {"id", "text", "source_turns", "persons", "locations", "keywords", "entities",
                                      "date", "session"}  # a fact without a key writes the record it always did
    keyed = Fact("F:1:2", "Ana lives in Porto.", ("S1:1",), subject="Ana", attribute="lives in",
                 valid_from="2024-03", valid_to="2024-05-01", superseded_by="F:1:3")
    assert fact_from_record(keyed.to_record()) == keyed
    assert keyed.valid_at("2024-04-30") and not keyed.valid_at("2024-05-01") and not keyed.valid_at("2024-02-28")
    with pytest.raises(ValueError, match="together"):
        Fact("F", "x", ("a",), subject="Ana")
    with pytest.raises(ValueError, match="valid_from"):
        Fact("F", "x", ("a",), valid_from="soon")
    mem = Memory(coll[0])
    for bad, msg in [([{"text": "x"}], r"facts\[0\]: missing field 'source_turns'"),
                     ([{"text": "x", "source_turns": ["nope"]}], "holds no turn 'nope'"),
                     ([{"text": "x", "source_turns": ["S1:1"], "subject": "Ana"}], "together"),
                     ([{"text": "x", "source_turns": ["S1:1"], "valid_to": "2024-01-01"}], "unknown field 'valid_to'"),
                     ([{"text": "x", "source_turns": ["S1:1"], "id": "S1:2"}], "field 'id'")]:
        with pytest.raises(InputError, match=msg):
            mem.add_facts("ana-ben", bad)


def _f(fid, text, start, names=("Clara",), **kw):
    return Fact(fid, text, ("t",), persons=names, valid_from=start, **kw)


class _Replies:
    """A stand-in LLM backend (plumbing only): answers each chat call with the next reply."""

    def __init__(self, *replies):
        self.replies, self.sent = list(replies), []

    def chat(self, batch, **kw):
        self.sent.append(batch)
        return [SimpleNamespace(text=self.replies.pop(0), error=None) for _ in batch]


def test_llm_proposals_are_grounded_and_retried():
    from trawmem_gpu.ingest.layers.supersede import SupersedeStats, supersede

    stored = (_f("F:1", "Clara lives in Lyon.", "2023-01-01"), _f("F:2", "Ben learns Dutch.", "2023-02-01", ("Ben",)))
    new = (_f("F:9", "Clara moved to Rotterdam.", "2024-01-01"),)
    llm = _Replies('{"supersessions": [{"new": "F:9", "old": "F:404"}]}',  # an id never shown: retried
                   '{"supersessions": [{"new": "F:9", "old": "F:1"}, {"new": "F:9", "old": "F:1"}]}')
    st = SupersedeStats()
    res = supersede(stored, new, llm, st)
    assert [(p.old, p.new, p.cause) for p in res.pairs] == [("F:1", "F:9", "llm")]
    assert (st.requests, st.retried, st.unknown_ids, st.superseded) == (2, 1, 2, 1)
    shown = llm.sent[0][0][0]["content"]
    assert "[F:1]" in shown and "[F:2]" not in shown  # only stored facts sharing a name are candidates
    marked = {f.fact_id: f for f in res.facts}
    assert (marked["F:1"].superseded_by, marked["F:1"].valid_to) == ("F:9", "2024-01-01")
    # a malformed reply twice: nothing superseded, counted
    st = SupersedeStats()
    assert supersede(stored, new, _Replies("no json", "still none"), st).pairs == [] and st.malformed == 1


def test_as_of_over_http_the_client_and_the_cli(coll, capsys):
    from serve_util import running

    from trawmem_gpu.cli import main
    from trawmem_gpu.client import Client
    from trawmem_gpu.serve.config import ServeConfig

    path, old = coll
    q = "Where does Clara live?"
    with running(ServeConfig(collection=str(path), max_wait_ms=1, units=("turns", "facts"))) as (url, _, _):
        with Client(url, deadline=120) as c:
            now = c.select("ana-ben", q, budget=40)
            then = c.select("ana-ben", q, budget=40, as_of="2023-09-01")
            assert "F:rotterdam" in now.unit_ids and old not in now.unit_ids and now.as_of is None
            assert old in then.unit_ids and "F:rotterdam" not in then.unit_ids and then.as_of == "2023-09-01"
            r = c._http.post(url + "/v1/select", json={"bank_id": "ana-ben", "question": q, "as_of": "someday"})
            assert r.status_code == 422 and "as_of" in r.json()["detail"]
    assert main(["query", "--bank", str(path), "--bank-id", "ana-ben", "--question", q, "--budget", "40",
                 "--units", "turns,facts", "--as-of", "2023-09-01", "--json"]) == 0
    import json

    got = json.loads(capsys.readouterr().out)
    assert old in got["units"] and "F:rotterdam" not in got["units"]


def test_an_llm_update_supersedes_in_the_facts_layer_it_writes():
    """The hook of ``build --update --facts llm`` (``ingest.layers.facts.superseded``): the new facts
    of an update are shown with the stored ones, and the grounded proposal marks the stored fact."""
    from dataclasses import replace

    import numpy as np

    from trawmem_gpu.data import load_conversations
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.ingest.layers.facts import superseded

    (b,), _ = build_banks(load_conversations(sample_path())[:1], progress=False)
    d = b.unit_vecs.shape[1]
    lyon = Fact("F:1:1", "Clara lives in Lyon.", ("S1:7",), persons=("Clara",), date="2024-03-02")
    moved = Fact("F:1:2", "Clara moved to Rotterdam.", ("S1:8",), persons=("Clara",), date="2024-03-02")
    old = replace(b, facts=(lyon,), fact_vecs=np.eye(1, d, dtype=np.float32), layer_sources={"facts": "llm"})
    new = replace(old, facts=(lyon, moved), fact_vecs=np.eye(2, d, dtype=np.float32))
    stats: dict = {}
    got = superseded(old, new, _Replies('{"supersessions": [{"new": "F:1:2", "old": "F:1:1"}]}'), stats)
    got.validate()
    assert (got.facts[0].superseded_by, got.facts[0].valid_to) == ("F:1:2", "2024-03-02") and got.facts[1].current
    assert stats["superseded"] == 1 and stats["supersede_llm"]["requests"] == 1
    assert superseded(old, old, _Replies(), {}) is old  # nothing new: no call
