"""The facts layer (issue 21): schema records, storage beside the turns, LoCoMo observations, and
the bank's unit view (default ``turns``: the bank itself)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from trawmem_gpu.store.graph import LAYER
from trawmem_gpu.errors import BankError, ConfigError
from trawmem_gpu.ingest.layers.locomo import facts_from_sample
from trawmem_gpu.store.facts import Fact, ProfileLine, ProfileSection, fact_from_record, profile_from_record
from trawmem_gpu.store.view import layer_counts, parse_units, unit_view
from trawmem_gpu.store.files import LAYERS, load_bank, save_bank
from trawmem_gpu.select.workspace import assemble

from engine_banks import make_bank
from layered_banks import layered_bank


def test_records_round_trip_and_name_bad_fields():
    f = Fact("F:1:1", "Ana moved to Lyon in May 2031.", ("D1:3",), ("Ana",), ("Lyon",), ("move",), (), "2031-05-01", "1")
    assert fact_from_record(json.loads(json.dumps(f.to_record()))) == f
    p = ProfileSection("Ana", "life_events", (ProfileLine("moved to Lyon", ("F:1:1",)),))
    assert profile_from_record(json.loads(json.dumps(p.to_record()))) == p
    assert p.unit_id == "P:Ana:life_events" and p.fact_ids == ("F:1:1",)
    with pytest.raises(ValueError, match="source_turns"):
        Fact("F:1", "x", ())
    with pytest.raises(ValueError, match="'persons'"):
        fact_from_record({"id": "F:1", "text": "x", "source_turns": ["D1:1"], "persons": "Ana"})
    with pytest.raises(ValueError, match="'section'"):
        ProfileSection("Ana", "hobbies")
    with pytest.raises(ValueError, match="misses field 'text'"):
        fact_from_record({"id": "F:1", "source_turns": ["D1:1"]})


def test_layers_are_stored_with_the_turns(tmp_path):
    b = layered_bank()
    save_bank(b, tmp_path / "b")
    got = load_bank(tmp_path / "b")
    assert got.facts == b.facts and got.profiles == b.profiles
    assert np.array_equal(got.fact_vecs, b.fact_vecs) and np.array_equal(got.profile_vecs, b.profile_vecs)
    # a bank without layers writes exactly the files it always wrote
    plain = make_bank("b0", [4, 3, 5], 0)
    save_bank(plain, tmp_path / "p")
    assert not (tmp_path / "p" / LAYERS).exists() and "layers" not in json.loads((tmp_path / "p" / "meta.json").read_text())
    assert load_bank(tmp_path / "p").facts == ()
    # the layers are under the checksum
    (tmp_path / "b" / LAYERS).write_text((tmp_path / "b" / LAYERS).read_text().replace("fact number 1", "fact number 9"))
    with pytest.raises(BankError, match="layers.json: checksum mismatch"):
        load_bank(tmp_path / "b")


def test_validate_refuses_broken_links():
    b = layered_bank()
    bad = replace(b, facts=b.facts[:1] + (Fact("F:x", "t", ("nope",)),) + b.facts[2:])
    with pytest.raises(ValueError, match="cites turn 'nope'"):
        bad.validate()
    with pytest.raises(ValueError, match="duplicate fact id"):
        replace(b, facts=b.facts[:1] * 2 + b.facts[2:]).validate()
    with pytest.raises(ValueError, match="cites fact 'F:0'"):
        replace(b, facts=b.facts[1:], fact_vecs=b.fact_vecs[1:]).validate()
    with pytest.raises(ValueError, match="fact_vecs do not match"):
        replace(b, fact_vecs=b.fact_vecs[1:]).validate()


def test_default_view_is_the_bank_and_views_are_not_stored(tmp_path):
    b = layered_bank()
    assert unit_view(b) is b and unit_view(b, ("turns",)) is b and unit_view(b, "turns") is b
    v = unit_view(b, "turns,facts,profiles")
    with pytest.raises(BankError, match="unit view"):
        save_bank(v, tmp_path / "v")
    for spec, msg in (("turns,fact", "unknown layer 'fact'"), ("facts", "must include 'turns'"),
                      ("turns,turns", "twice")):
        with pytest.raises(ConfigError, match=msg):
            parse_units(spec)
    with pytest.raises(ConfigError, match="has no profiles"):
        unit_view(layered_bank(profiles=False), ("turns", "profiles"))


def test_view_structure():
    b = layered_bank()
    v = unit_view(b, ("profiles", "turns", "facts"))  # any order: the layers stand in UNIT_KINDS order
    N, F, P = b.n_units, len(b.facts), len(b.profiles)
    assert v.units == ("turns", "facts", "profiles") and v.n_units == N + F + P
    turns = [t for t in v.turns if getattr(t, "layer", "turns") == "turns"]
    assert turns == b.turns  # the turns in their order, with their vectors
    idx = v.index_of()
    assert np.array_equal(v.unit_vecs[[idx[t.turn_id] for t in b.turns]], b.unit_vecs)
    # each session's facts follow its turns: the thread order is by session, profiles last
    sessions = [v.turns[int(v.thread_offsets[j])].session for j in range(v.n_threads)]
    layer = [getattr(v.turns[int(v.thread_offsets[j])], "layer", "turns") for j in range(v.n_threads)]
    assert [s for s, k in zip(sessions, layer) if k != "profiles"] == sorted(s for s, k in zip(sessions, layer)
                                                                            if k != "profiles")
    assert layer[-1] == "profiles" and layer.count("profiles") == 1
    # bank edges survive, renumbered: every bank edge joins the view threads of the same turns
    vt = {t.turn_id: int(v.unit_thread[idx[t.turn_id]]) for t in b.turns}
    first = [b.turns[int(b.thread_offsets[j])].turn_id for j in range(b.n_threads)]
    ve = set(zip(v.edge_src.tolist(), v.edge_dst.tolist()))
    assert all((vt[first[s]], vt[first[d]]) in ve for s, d in zip(b.edge_src.tolist(), b.edge_dst.tolist()))
    assert layer_counts(v.turns) == {"turns": N, "facts": F, "profiles": P}
    assert all(v.turns[idx[f.fact_id]].speaker == f.persons[0] for f in b.facts)  # who the fact is about
    pairs = set(zip(v.support_src.tolist(), v.support_dst.tolist()))
    for f in b.facts:  # each fact restates its source turns, and its thread meets theirs in the graph
        assert {(idx[f.fact_id], idx[t]) for t in f.source_turns} <= pairs
        ft = v.unit_thread[idx[f.fact_id]]
        layer_nbrs = set(v.edge_dst[(v.edge_src == ft) & (v.edge_kind == LAYER)].tolist())
        assert {int(v.unit_thread[idx[t]]) for t in f.source_turns} <= layer_nbrs
    assert (idx["P:Ana:career"], idx["F:0"]) in pairs and (idx["P:Ana:career"], idx["F:1"]) in pairs
    # edges stay sorted and in both directions
    e = list(zip(v.edge_src.tolist(), v.edge_dst.tolist()))
    assert e == sorted(e) and set(e) == {(d, s) for s, d in e}
    # without the facts layer a profile restates its facts' source turns
    v2 = unit_view(b, ("turns", "profiles"))
    i2 = v2.index_of()
    want = {(i2["P:Ana:career"], i2[t]) for f in b.facts[:2] for t in f.source_turns}
    assert want <= set(zip(v2.support_src.tolist(), v2.support_dst.tolist()))


def test_workspace_shows_facts_with_their_cited_turns():
    b = layered_bank()
    v = unit_view(b, ("turns", "facts"))
    i = v.index_of()["F:0"]
    t0 = v.index_of()[b.turns[0].turn_id]
    text = assemble(v, "q", [t0, i]).render()
    assert f"[F:0 from {', '.join(b.facts[0].source_turns)}] {b.facts[0].text}" in text
    assert f"[{b.turns[0].turn_id}]" in text


def test_locomo_observations_map_like_evidence():
    sample = {"conversation": {"session_2_date_time": "1:00 pm on 8 May, 2031"},
              "observation": {"session_2_observation": {
                  "Ana": [["Ana adopted a cat.", "D2:1"], ["Ana and Ben sail.", ["D2:3", "D:2:4"]],
                          ["Nothing cited.", "D9:9"], ["Two in one.", "D2:1, D2:3"]]}}}
    facts, st = facts_from_sample(sample, {"D2:1", "D2:3", "D2:4"})
    assert [f.fact_id for f in facts] == ["F:2:1", "F:2:2", "F:2:3"]
    assert [f.source_turns for f in facts] == [("D2:1",), ("D2:3", "D2:4"), ("D2:1", "D2:3")]
    assert facts[0].date == "2031-05-08" and facts[0].persons == ("Ana",) and facts[0].session == "2"
    assert st["dropped_facts"] == 1 and st["dropped_unknown"] == 1 and st["normalized_ids"] == 1
    assert st["multi_id_strings"] == 1
