"""A collection's vector storage choice (``store/vectors.py``): recorded in ``collection.json`` at
creation, fixed for the collection's life (a mismatched open is a ``ConfigError`` naming the field),
``float32`` for an index without the field, and what a ``Memory`` over the collection selects with."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.errors import BankError, ConfigError
from trawmem_gpu.store import Collection

from benchmarks.synthetic_banks import make_banks


def _index(path) -> dict:
    return json.loads((path / "collection.json").read_text())


@pytest.mark.parametrize("vectors", ["float16", "int8"])
def test_the_choice_is_recorded_and_a_mismatched_open_is_refused(tmp_path, vectors):
    c = Collection(tmp_path / "c", create=True, vectors=vectors)
    c.put(make_banks(1, units=20, d=8)[0])
    assert _index(tmp_path / "c")["vectors"] == vectors
    assert Collection(tmp_path / "c").vectors == vectors
    assert Collection(tmp_path / "c", vectors=vectors).vectors == vectors
    other = "float32" if vectors == "int8" else "int8"
    with pytest.raises(ConfigError, match=rf"vectors: the collection .* stores {vectors} vectors .* not {other}"):
        Collection(tmp_path / "c", vectors=other)


def test_an_empty_new_collection_records_it_too(tmp_path):
    c = Collection(tmp_path / "c", create=True, vectors="int8")
    assert c.create_empty() and _index(tmp_path / "c")["vectors"] == "int8"
    with pytest.raises(ConfigError, match="vectors"):
        Collection(tmp_path / "c", vectors="float16")


def test_an_old_collection_without_the_field_opens_as_float32(tmp_path):
    c = Collection(tmp_path / "c", create=True)
    c.put(make_banks(1, units=20, d=8)[0])
    assert "vectors" not in _index(tmp_path / "c")  # a float32 index is written as before the field
    assert Collection(tmp_path / "c").vectors == "float32"
    assert Collection(tmp_path / "c", vectors="float32").vectors == "float32"
    with pytest.raises(ConfigError, match="stores float32 vectors"):
        Collection(tmp_path / "c", vectors="int8")


def test_bad_values_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"vectors must be one of float32, float16, int8, pq \(got 'int4'\)"):
        Collection(tmp_path / "c", create=True, vectors="int4")
    c = Collection(tmp_path / "d", create=True)
    c.create_empty()
    idx = _index(tmp_path / "d")
    (tmp_path / "d" / "collection.json").write_text(json.dumps({**idx, "vectors": "bf16"}))
    with pytest.raises(BankError, match="field 'vectors' must be one of"):
        Collection(tmp_path / "d")


def test_a_memory_over_a_compact_collection_selects_with_its_choice(tmp_path, monkeypatch):
    from word_encoder import WordEncoder

    from trawmem_gpu import Memory

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    Collection(tmp_path / "m", create=True, vectors="int8").create_empty()
    from trawmem_gpu.data import load_conversations, sample_path

    mem = Memory(tmp_path / "m", encoder=WordEncoder())
    mem.add("b", list(load_conversations(sample_path())[0].turns)[:12])
    assert mem.select("b", "where did we hike?", budget=2)
    assert mem._core.engines.engine.engine_config.vectors == "int8"
    assert Collection(tmp_path / "m").vectors == "int8"


def test_a_repaired_index_keeps_the_choice_it_could_read(tmp_path):
    from trawmem_gpu.store.repair import repair_index

    c = Collection(tmp_path / "c", create=True, vectors="float16")
    c.put(make_banks(1, units=20, d=8)[0])
    repair_index(tmp_path / "c")
    assert _index(tmp_path / "c")["vectors"] == "float16"
