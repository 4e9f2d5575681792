"""``Memory.add`` runs the ingest layers a bank was built with (issue 43 item 3): with the Memory's
LLM it extends the facts and profiles over the new turns as ``trawmem build --update`` does (the
same steps, ``ingest.layers.steps``); without one, ``layers=None`` leaves them as they are and
says so, ``layers=True`` refuses the add (nothing stored), ``layers=False`` never runs them."""
from __future__ import annotations

import shutil

import pytest

from trawmem_gpu import Memory
from trawmem_gpu.cli import main
from trawmem_gpu.data import load_conversations
from trawmem_gpu.errors import ConfigError, InputError
from trawmem_gpu.llm.factory import llm_from_args
from trawmem_gpu.store import Collection
from trimem_fake import respond, write_locomo

S1 = [("Ana", "I adopted a beagle called Rex, the answer is beagle."), ("Ben", "Ben likes pottery a lot."),
      ("Ana", "Rex likes the park by the river."), ("Ben", "I made a blue bowl, the answer is blue bowl.")]
S2 = [("Ben", "Ben works at the harbour office now."), ("Ana", "Rex chewed my boots, the answer is boots.")]


@pytest.fixture
def built(tmp_path, monkeypatch, server):
    """A collection built with ``--facts llm --profiles llm`` from session 1, and the input with session 2."""
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    server.responders.append(respond)
    first, full = write_locomo(tmp_path / "d1.json", [S1], []), write_locomo(tmp_path / "d2.json", [S1, S2], [])
    assert main(["build", "--input", str(first), "--out", str(tmp_path / "a"), "--facts", "llm", "--profiles", "llm",
                 "--llm", server.base_url, "--quiet"]) == 0
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    new = [t for t in load_conversations(full)[0].turns if t.session == 2]
    return tmp_path, full, new


def _layers(bank):
    return ([(f.fact_id, f.text, f.source_turns, f.superseded_by) for f in bank.facts],
            {p.unit_id: p.lines for p in bank.profiles})


def test_add_with_an_llm_extends_the_layers_as_build_update_does(built, server):
    tmp, full, new = built
    assert main(["build", "--input", str(full), "--out", str(tmp / "a"), "--update", "--llm", server.base_url,
                 "--quiet"]) == 0
    want = Collection(tmp / "a").load("conv-x")
    mem = Memory(tmp / "b", llm=llm_from_args(server.base_url))
    res = mem.add("conv-x", new)
    got = Collection(tmp / "b").load("conv-x")
    assert [t.turn_id for t in got.turns] == [t.turn_id for t in want.turns]
    assert _layers(got) == _layers(want) and len(got.facts) == 6  # two new facts, the same sections changed
    facts, profiles = res["layers"]["facts"], res["layers"]["profiles"]
    assert (facts["source"], facts["ran"], facts["facts_added"]) == ("llm", True, 2)
    assert (profiles["ran"], profiles["created"], profiles["updated"]) == (True, 0, 2)
    assert [e["event"] for e in mem.history("conv-x", got.facts[-1].fact_id)] == ["added"]


def test_add_without_an_llm_leaves_the_layers_or_refuses(built):
    tmp, _, new = built
    before = Collection(tmp / "b").load("conv-x")
    mem = Memory(tmp / "b")
    with pytest.raises(ConfigError, match=r"`layers`: bank 'conv-x' was built with facts from 'llm', which needs an "
                                          r"LLM.*nothing was stored"):
        mem.add("conv-x", new[:1], layers=True)
    assert Collection(tmp / "b").load("conv-x").n_units == before.n_units  # refused: nothing stored
    with pytest.raises(InputError, match="layers: expected True, False or None"):
        mem.add("conv-x", new[:1], layers="yes")
    res = mem.add("conv-x", new[:1])  # None: stored, the layers left as they are, and said so
    assert res["stored"] == [new[0].turn_id]
    assert res["layers"] == {"facts": {"source": "llm", "ran": False, "why": "needs an LLM (`llm`)"},
                             "profiles": {"source": "llm", "ran": False, "why": "needs an LLM (`llm`)"}}
    res = mem.add("conv-x", new[1:], layers=False)
    assert "layers" not in res and res["stored"] == [new[1].turn_id]
    after = Collection(tmp / "b").load("conv-x")
    assert _layers(after) == _layers(before) and after.n_units == before.n_units + 2


def test_locomo_facts_are_left_and_so_are_the_profiles_made_from_them(tmp_path, monkeypatch, server):
    """LoCoMo observations come from an input file, which an add has not: the facts are left, and
    the profiles, which would be made from the new facts, with them (an LLM or not)."""
    import json

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    server.responders.append(respond)
    data = write_locomo(tmp_path / "d.json", [S1], [])
    raw = json.loads(data.read_text())
    raw[0]["observation"] = {"session_1_observation": {"Ana": [["Ana has a beagle called Rex.", "D1:1"]],
                                                        "Ben": [["Ben likes pottery.", "D1:2"]]}}
    data.write_text(json.dumps(raw))
    assert main(["build", "--input", str(data), "--out", str(tmp_path / "c"), "--facts", "locomo", "--profiles", "llm",
                 "--llm", server.base_url, "--quiet"]) == 0
    before = Collection(tmp_path / "c").load("conv-x")
    assert before.layer_sources == {"facts": "locomo", "profiles": "llm"} and len(before.facts) == 2
    mem = Memory(tmp_path / "c", llm=llm_from_args(server.base_url))
    turn = {"turn_id": "D2:1", "speaker": "Ben", "text": S2[0][1], "timestamp": "2031-05-03T14:14:00"}
    with pytest.raises(ConfigError, match="reads 'locomo' from an input file"):
        mem.add("conv-x", [turn], layers=True)
    res = mem.add("conv-x", [turn])
    assert res["stored"] == ["D2:1"]
    assert res["layers"] == {"facts": {"source": "locomo", "ran": False,
                                       "why": "reads 'locomo' from an input file, which an add has not"},
                             "profiles": {"source": "llm", "ran": False, "why": "its facts were not run"}}
    assert _layers(Collection(tmp_path / "c").load("conv-x")) == _layers(before)


def test_facts_of_add_facts_are_left_by_any_add(tmp_path, monkeypatch):
    """Facts a caller added (``Memory.add_facts``, source ``api``) are made by no build step: an add
    leaves them, even with ``layers=True``, and says so."""
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    mem = Memory(tmp_path / "c")
    mem.add("b", [{"turn_id": "t1", "speaker": "Ana", "text": "I moved to Lyon.", "timestamp": "2031-05-01T10:00:00"}])
    mem.add_facts("b", [{"text": "Ana lives in Lyon.", "source_turns": ["t1"]}])
    res = mem.add("b", [{"turn_id": "t2", "speaker": "Ana", "text": "I like it here.",
                         "timestamp": "2031-05-02T10:00:00"}], layers=True)
    assert res["stored"] == ["t2"]
    assert res["layers"] == {"facts": {"source": "api", "ran": False, "why": "made by 'api', not by a build step"}}
    assert [f.text for f in Collection(tmp_path / "c").load("b").facts] == ["Ana lives in Lyon."]
