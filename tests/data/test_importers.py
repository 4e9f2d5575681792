"""Importers of other formats (issue 45 item 3), each on a small file the test writes."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.data.importers import read_turns
from trawmem_gpu.errors import InputError


def _write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def test_openai_messages(tmp_path):
    p = _write(tmp_path, "chat.json", {"c1": [{"role": "user", "content": "I play the oboe.", "name": "Ana",
                                               "timestamp": 1700000000},
                                              {"role": "assistant", "content": "Nice!"}]})
    got = list(read_turns("openai", p))
    assert [b for b, _ in got] == ["c1", "c1"]
    assert got[0][1]["speaker"] == "Ana" and got[0][1]["date"].startswith("2023-11-14")
    assert got[1][1] == {"id": "M2", "speaker": "assistant", "text": "Nice!", "date": "",
                         "metadata": {"role": "assistant"}}


def test_mem0_memories(tmp_path):
    p = _write(tmp_path, "m.json", {"results": [
        {"id": "m-1", "memory": "Likes tea", "user_id": "ana", "created_at": "2024-01-02T03:04:05",
         "metadata": {"topic": "food", "nested": {"x": 1}}}]})
    [(bank, t)] = list(read_turns("mem0", p))
    assert bank == "ana" and t["text"] == "Likes tea" and t["metadata"] == {"topic": "food", "user_id": "ana"}


def test_graphiti_episodes(tmp_path):
    p = _write(tmp_path, "g.json", [{"uuid": "e1", "name": "call", "content": "Ben moved to Oslo.",
                                     "valid_at": "2024-03-01", "group_id": "g"}])
    assert list(read_turns("graphiti", p)) == [("g", {"id": "e1", "speaker": "call", "text": "Ben moved to Oslo.",
                                                      "date": "2024-03-01", "metadata": None})]


def test_bad_record_names_its_index(tmp_path):
    p = _write(tmp_path, "chat.json", [{"role": "user", "content": "ok"}, {"role": "user"}])
    with pytest.raises(InputError, match=r"chat\[1\]: field 'content'"):
        list(read_turns("openai", p))
    with pytest.raises(InputError, match="unknown format"):
        read_turns("nope", p)


def test_openai_import_into_memory(tmp_path, monkeypatch):
    from trawmem_gpu import Memory

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    p = _write(tmp_path, "talk.json", [{"role": "user", "content": "My sister lives in Oslo.", "name": "Ana",
                                        "timestamp": "2024-03-01"}])
    mem = Memory(tmp_path / "c")
    res = mem.import_(p, format="openai")
    assert res["banks"][0]["stored"] == 1
    [t] = mem.turns("talk")
    assert (t.turn_id, t.speaker, t.text, t.metadata) == ("M1", "Ana", "My sister lives in Oslo.", {"role": "user"})


def test_locomo_sample(tmp_path):
    from locomo_files import layout_sample

    p = _write(tmp_path, "lo.json", [layout_sample("talk-x", ("Ana", "Ben"), [
        ("3:10 pm on 2 March, 2031", [("Ana", "I adopted a dog."), ("Ben", "What is its name?")])])])
    got = list(read_turns("locomo", p))
    assert [(b, t["id"], t["speaker"], t["session"]) for b, t in got] == [("talk-x", "D1:1", "Ana", 1),
                                                                          ("talk-x", "D1:2", "Ben", 1)]
    assert got[0][1]["date"] == "3:10 pm on 2 March, 2031"
