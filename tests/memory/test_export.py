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
    assert [x.get("type") for x in lines[1:3]] == ["bank", "turn"]
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


def _with_profiles(mem, path):
    """``mem``'s bank with two profile sections citing its facts, written to its collection; the
    collection reopened."""
    from dataclasses import replace

    import numpy as np

    from trawmem_gpu import Memory
    from trawmem_gpu.store.collection import Collection
    from trawmem_gpu.store.facts import ProfileLine, ProfileSection
    from trawmem_gpu.store.layers.profiles import profile_embed_text

    secs = (ProfileSection("Ana", "identity", (ProfileLine("lives in Rotterdam", ("F:rdam",)),)),
            ProfileSection("Ana", "interests", (ProfileLine("lived in Lyon", ("F:lyon",)), ProfileLine("walks", ()))))
    vecs = np.asarray(mem._core.encoder.encode([profile_embed_text(s) for s in secs]), dtype=np.float32)
    Collection(path).update("ana-ben", lambda b: replace(b, profiles=secs, profile_vecs=vecs,
                                                           layer_sources={**b.layer_sources, "profiles": "api"}))
    return Memory(path), secs


def test_profiles_round_trip(mem, tmp_path):
    """Profile sections are exported after the facts (``profile`` lines, counted by the bank
    line's ``n_profiles``) and imported in the bank's one commit, encoded as the layer encodes them."""
    from trawmem_gpu import Memory

    src, secs = _with_profiles(mem, tmp_path / "src")
    text = _dump(src)
    lines = [json.loads(x) for x in text.splitlines()]
    assert [x for x in lines if x.get("type") == "bank"][0]["n_profiles"] == 2
    assert [x.get("type") for x in lines if x.get("type") in ("fact", "profile")] == ["fact", "fact", "profile", "profile"]
    dst = Memory(tmp_path / "dst")
    res = import_(dst, io.StringIO(text))
    assert res["banks"][0]["profiles"] == 2 and res["banks"][0]["facts"] == 2
    got = dst._core.registry.get("ana-ben")
    assert got.profiles == secs
    np = pytest.importorskip("numpy")
    np.testing.assert_allclose(got.profile_vecs, src._core.registry.get("ana-ben").profile_vecs, atol=1e-6)
    assert [x for x in _dump(dst).splitlines() if '"profile"' in x] == [x for x in text.splitlines() if '"profile"' in x]
    again = import_(dst, io.StringIO(text))  # a retried import adds nothing
    assert again["banks"][0]["profiles"] == 0 and dst._core.registry.get("ana-ben").profiles == secs


def test_a_profile_citing_a_forgotten_fact_is_not_imported(mem, tmp_path):
    from trawmem_gpu import Memory

    src, secs = _with_profiles(mem, tmp_path / "src")
    text = _dump(src)
    dst = Memory(tmp_path / "dst")
    dst.add("ana-ben", TURNS)
    dst.forget("ana-ben", ["S1:1"])  # the source of F:lyon, which the interests section cites
    res = import_(dst, io.StringIO(text))
    assert {r["id"] for r in res["banks"][0]["refused"]} == {"S1:1"}
    assert [p.section for p in dst._core.registry.get("ana-ben").profiles] == ["identity"]


@pytest.mark.parametrize("bad, message", [
    ({"section": "hobbies"}, "profile: field 'section' must be one of"),
    ({"lines": "walks"}, "profile: field 'lines' must be a list"),
])
def test_a_bad_profile_line_names_its_line_and_field(mem, tmp_path, bad, message):
    from trawmem_gpu import Memory

    src, _secs = _with_profiles(mem, tmp_path / "src")
    lines = _dump(src).splitlines()
    k = next(i for i, x in enumerate(lines) if json.loads(x).get("type") == "profile")
    lines[k] = json.dumps({**json.loads(lines[k]), **bad})
    dst = Memory(tmp_path / "dst")
    with pytest.raises(InputError, match=f"^line {k + 1}: {message}"):
        import_(dst, io.StringIO("\n".join(lines) + "\n"))
    assert dst._core.registry.get("ana-ben") is None  # nothing of the bank stored


def test_a_file_cut_in_its_profiles_is_refused(mem, tmp_path):
    from trawmem_gpu import Memory

    src, _secs = _with_profiles(mem, tmp_path / "src")
    lines = [x for x in _dump(src).splitlines() if json.loads(x).get("type") != "event"][:-1]  # the last section cut
    with pytest.raises(InputError, match="n_profiles"):
        import_(Memory(tmp_path / "dst"), io.StringIO("\n".join(lines) + "\n"))
