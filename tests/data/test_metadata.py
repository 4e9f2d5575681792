"""Turn metadata at every door that stores turns (JSONL input to ``trawmem build`` and
``--update``, ``Memory.add`` and so MCP ``add_turns``; the HTTP append route: tests/serve), its
rules (``data.metadata``), and its life in a bank: stored with the units, kept through appends,
``--update`` and forgets, in the turns digest only when a turn has some, so a bank without
metadata writes and reads the files it did before."""
from __future__ import annotations

import hashlib
import json
from datetime import date, datetime, timezone
from pathlib import Path

import pytest
from cli_inputs import _jsonl as write_jsonl, cache  # noqa: F401 - cache: the fixture

from trawmem_gpu.data import load_conversations
from trawmem_gpu.data.metadata import MAX_METADATA_KEYS, SCOPE_KEYS
from trawmem_gpu.data.types import Turn, turns_digest
from trawmem_gpu.errors import DuplicateTurns, InputError

BASE = {"bank_id": "b", "turn_id": "t1", "speaker": "Ana", "text": "I love pottery.", "timestamp": "2024-03-02T10:00:00"}
META = {"user_id": "u1", "agent_id": "planner", "run_id": 7, "importance": 2.5, "pinned": True,
        "due": "2024-04-01T09:00:00Z"}


pytestmark = pytest.mark.usefixtures("cache")  # each test's own embedding cache


def _jsonl(path: Path, *records) -> Path:
    return write_jsonl(path, records)


def test_scope_keys_are_ordinary_keys_and_values_keep_their_kind(tmp_path):
    assert SCOPE_KEYS == ("user_id", "agent_id", "run_id")
    (conv,) = load_conversations(_jsonl(tmp_path / "t.jsonl", {**BASE, "metadata": META},
                                        {**BASE, "turn_id": "t2", "metadata": {}},
                                        {**BASE, "turn_id": "t3", "metadata": None}))
    t1, t2, t3 = conv.turns
    assert t1.metadata == META and isinstance(t1.metadata["run_id"], int) and t1.metadata["pinned"] is True
    assert t1.metadata["due"] == "2024-04-01T09:00:00Z"  # a date keeps the text as written
    assert t2.metadata is None and t3.metadata is None  # {} and null: no metadata


@pytest.mark.parametrize("meta,field,why", [
    ("u1", "'metadata'", "must be an object"),
    ({"user_id": None}, "'metadata.user_id' is null", "leave the key out"),
    ({"tags": ["a", "b"]}, "'metadata.tags'", "flat map"),
    ({"where": {"city": "Lyon"}}, "'metadata.where'", "flat map"),
    ({"n": 2 ** 60}, "'metadata.n'", "2**53"),
    ({"n": float("nan")}, "'metadata.n'", "finite"),
    ({"note": "x" * 1025}, "'metadata.note' is 1025 characters", "the limit is 1024"),
    ({"note": "a\x00b"}, "'metadata.note'", "control character"),
    ({"user id": "u1"}, "key 'user id'", "not a metadata key"),
    ({"": "u1"}, "key ''", "not a metadata key"),
    ({"OR": 1}, "key 'OR'", "filter language"),
    ({f"k{i}": i for i in range(MAX_METADATA_KEYS + 1)}, "'metadata'", f"the limit is {MAX_METADATA_KEYS}"),
])
def test_bad_metadata_is_refused_naming_the_field(tmp_path, meta, field, why):
    p = _jsonl(tmp_path / "t.jsonl", BASE, {**BASE, "turn_id": "t2", "metadata": meta})
    with pytest.raises(InputError) as e:
        load_conversations(p)
    msg = str(e.value)
    assert msg.startswith("t.jsonl:2") or "t.jsonl:2:" in msg, msg
    assert field in msg and why in msg, msg
    assert "x" * 100 not in msg


def test_python_dates_are_stored_as_iso_text():
    from trawmem_gpu.data.jsonl import turn_from_record

    aware = datetime(2024, 3, 2, 12, tzinfo=timezone.utc)
    _, t = turn_from_record({**BASE, "metadata": {"due": date(2024, 3, 1), "at": aware}})
    assert t.metadata == {"due": "2024-03-01", "at": "2024-03-02T12:00:00"}


def test_the_digest_reads_metadata_only_when_a_turn_has_some():
    plain = Turn("t1", "Ana", "hi", 1, "2024-03-02", datetime(2024, 3, 2))
    row = json.dumps(["t1", "Ana", "hi", 1, "2024-03-02", "2024-03-02T00:00:00", None], separators=(",", ":"))
    assert turns_digest([plain]) == hashlib.sha256(row.encode() + b"\n").hexdigest()  # the digest of every older bank
    tagged = Turn("t1", "Ana", "hi", 1, "2024-03-02", datetime(2024, 3, 2), None, {"user_id": "u1", "n": 1})
    reordered = Turn("t1", "Ana", "hi", 1, "2024-03-02", datetime(2024, 3, 2), None, {"n": 1, "user_id": "u1"})
    other = Turn("t1", "Ana", "hi", 1, "2024-03-02", datetime(2024, 3, 2), None, {"user_id": "u2", "n": 1})
    assert turns_digest([tagged]) == turns_digest([reordered]) != turns_digest([plain])
    assert turns_digest([other]) != turns_digest([tagged])
    assert hash(tagged) == hash(plain) and tagged != plain  # hashable (rendering caches key on turns)


def _build(*argv) -> int:
    from trawmem_gpu.cli import main

    return main(["build", "--quiet", *map(str, argv)])


def test_build_stores_metadata_and_update_keeps_it(tmp_path):
    from trawmem_gpu.store import Collection

    out = tmp_path / "c"
    assert _build("--input", _jsonl(tmp_path / "a.jsonl", {**BASE, "metadata": META},
                                    {**BASE, "turn_id": "t2", "text": "No tag here."}), "--out", out) == 0
    units = json.loads((out / "banks").glob("*").__next__().joinpath("units.json").read_text())
    assert units[0]["metadata"] == META and "metadata" not in units[1]  # none written for a turn without
    more = _jsonl(tmp_path / "b.jsonl", {**BASE, "turn_id": "t3", "timestamp": "2024-03-05", "metadata": {"user_id": "u2"}})
    assert _build("--input", more, "--out", out, "--update") == 0
    got = {t.turn_id: t.metadata for t in Collection(out).load("b").turns}
    assert got == {"t1": META, "t2": None, "t3": {"user_id": "u2"}}


def test_a_changed_tag_in_the_data_is_another_banks_data(tmp_path):
    """``eval --banks`` / ``score --data`` refuse a bank built before the data's metadata changed."""
    from trawmem_gpu.errors import BankError
    from trawmem_gpu.store import Collection
    from trawmem_gpu.store.verify import verify_banks

    out = tmp_path / "c"
    assert _build("--input", _jsonl(tmp_path / "a.jsonl", {**BASE, "metadata": {"user_id": "u1"}}), "--out", out) == 0
    same = load_conversations(_jsonl(tmp_path / "s.jsonl", {**BASE, "metadata": {"user_id": "u1"}}))
    assert verify_banks(Collection(out), same, "s.jsonl") == []
    changed = load_conversations(_jsonl(tmp_path / "d.jsonl", {**BASE, "metadata": {"user_id": "u2"}}))
    with pytest.raises(BankError, match="first differing turn 't1'"):
        verify_banks(Collection(out), changed, "d.jsonl")


def _turn(tid: str, ts: str = "2024-03-02T10:00:00", **kw) -> dict:
    return {"turn_id": tid, "speaker": "Ana", "text": f"I love pottery ({tid}).", "timestamp": ts, **kw}


def test_memory_add_keeps_metadata_through_appends_retries_and_forgets(tmp_path):
    from trawmem_gpu import Memory

    m = Memory(tmp_path / "c")
    m.add("b", [_turn("t1", metadata={"user_id": "u1"}), _turn("t2", metadata={"user_id": "u2", "n": 1})])
    with pytest.raises(InputError, match=r"^turns\[0\]: field 'metadata.n'"):
        m.add("b", [_turn("t3", metadata={"n": [1]})], atomic=True)
    (item,) = m.add("b", [_turn("t3", metadata={"n": [1]})])["refused"]  # per item, the field named
    assert item["field"] == "turns[0].metadata.n" and "flat map" in item["reason"]
    again = m.add("b", [_turn("t2", metadata={"n": 1, "user_id": "u2"}), _turn("t3")])  # a retry, keys reordered
    assert again["already_stored"] == ["t2"] and again["stored"] == ["t3"]
    with pytest.raises(DuplicateTurns):  # the same id with other metadata is other content
        m.add("b", [_turn("t2", metadata={"user_id": "u1", "n": 1})], atomic=True)
    with pytest.raises(DuplicateTurns):
        m.add("b", [_turn("t2", metadata={"user_id": "u2", "n": True})], atomic=True)  # true is not 1
    m.forget("b", ["t1"])
    reopened = Memory(tmp_path / "c")
    assert {t.turn_id: t.metadata for t in reopened.turns("b")} == {"t2": {"user_id": "u2", "n": 1}, "t3": None}
    ws = reopened.select("b", "pottery")
    assert {u.id: u.metadata for u in ws.units} == {"t2": {"user_id": "u2", "n": 1}, "t3": None}


def test_metadata_is_read_only_and_plain_json():
    import copy
    import pickle

    from trawmem_gpu.data.jsonl import turn_from_record

    _, t = turn_from_record({**BASE, "metadata": {"user_id": "u1"}})
    for change in (lambda m: m.__setitem__("user_id", "u2"), lambda m: m.update(x=1), lambda m: m.pop("user_id"),
                   lambda m: m.clear(), lambda m: m.setdefault("x", 1)):
        with pytest.raises(TypeError, match="read-only"):
            change(t.metadata)
    assert t.metadata == {"user_id": "u1"} and json.dumps(t.metadata) == '{"user_id": "u1"}'
    assert pickle.loads(pickle.dumps(t)) == t and copy.deepcopy(t.metadata) == {"user_id": "u1"}
