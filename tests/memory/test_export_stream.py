"""Export as a stream of one revision, the path written atomically, ``--vectors``, and the import's
bounds (issue 45 items 2 and 4): each bad input ends in one line naming its line and field, with
nothing of the bank stored."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from trawmem_gpu.errors import InputError
from trawmem_gpu.memory.export import MAX_BANK_LINES, LineTooLong
from word_encoder import WordEncoder


class Counting(WordEncoder):
    """The word encoder, counting the texts it encodes for a bank (queries left out)."""

    def __init__(self):
        self.texts = 0

    def _encode_batch(self, texts, is_query):
        self.texts += 0 if is_query else len(texts)
        return super()._encode_batch(texts, is_query)


class Other(WordEncoder):
    id = "test-words-other"


def _turns(n: int, bank_day: str = "2024-05") -> list[dict]:
    return [{"turn_id": f"S{1 + i // 10}:{i % 10}", "speaker": ("Ana", "Ben")[i % 2],
             "text": f"item {i}: the {('cello', 'harbour', 'cat', 'garden')[i % 4]} story number {i}",
             "timestamp": f"{bank_day}-{1 + i // 10:02d}T10:{i % 10:02d}:00"} for i in range(n)]


@pytest.fixture
def mem(tmp_path, monkeypatch):
    from trawmem_gpu import Memory

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    m = Memory(tmp_path / "src", encoder=Counting())
    m.add("b", _turns(30))
    m.add_facts("b", [{"id": "F:1", "text": "Ana plays the cello.", "source_turns": ["S1:0"],
                       "subject": "Ana", "attribute": "plays"},
                      {"id": "F:2", "text": "Ana plays the harp.", "source_turns": ["S2:0"],
                       "subject": "Ana", "attribute": "plays"}])
    return m


def _no_created(lines) -> list[str]:
    """The lines with the header's export time taken out (two exports differ only there)."""
    head = json.loads(lines[0])
    head.pop("created")
    return [json.dumps(head)] + list(lines[1:])


def test_export_lines_hold_the_revision_they_started_from(mem):
    before = list(mem.export_lines(["b"]))
    it = mem.export_lines(["b"])
    got = list(itertools.islice(it, 3))  # header, bank line, first turn: the bank is read
    mem.add("b", [{"turn_id": "S9:1", "speaker": "Ana", "text": "a turn added meanwhile",
                   "timestamp": "2024-05-09T10:00:00"}])
    mem.forget("b", turn_ids=["S1:5"])
    got += list(it)
    assert _no_created(got) == _no_created(before)  # neither the add nor the forget tore it
    after = "".join(mem.export_lines(["b"]))
    assert '"S9:1"' in after and '"S1:5"' not in after  # while a new export sees both


def test_export_to_a_path_replaces_it_whole_or_not_at_all(mem, tmp_path, monkeypatch):
    import trawmem_gpu.memory.export as ex

    out = tmp_path / "out.jsonl"
    out.write_text("the previous export\n")
    real = ex._turn_rec

    def fails_midway(bank_id, t):
        if t.turn_id == "S2:3":
            raise RuntimeError("killed midway")
        return real(bank_id, t)

    monkeypatch.setattr(ex, "_turn_rec", fails_midway)
    with pytest.raises(RuntimeError):
        mem.export(out)
    assert out.read_text() == "the previous export\n" and [p.name for p in tmp_path.iterdir() if
                                                            p.name.startswith(".out")] == []
    monkeypatch.setattr(ex, "_turn_rec", real)
    res = mem.export(out)
    assert res["turns"] == 30 and len(out.read_text().splitlines()) == 1 + 1 + 30 + 2 + res["events"]


def _bank(m):
    return m._core.registry.get("b")


def test_vectors_are_used_not_encoded_again(mem, tmp_path):
    from trawmem_gpu import Memory

    with_v, without = tmp_path / "v.jsonl", tmp_path / "plain.jsonl"
    mem.export(with_v, vectors=True)
    mem.export(without)
    head = json.loads(with_v.read_text().splitlines()[0])
    assert head["vectors"] == {"model": "test-words-32", "dim": 32, "dtype": "float32"}
    enc = Counting()
    dst = Memory(tmp_path / "dst", encoder=enc)
    dst.import_(with_v)
    assert enc.texts == 0  # no turn, fact or head encoded: the file's vectors were used
    a, b = _bank(mem), _bank(dst)
    assert [t.turn_id for t in a.turns] == [t.turn_id for t in b.turns]
    for k in ("unit_vecs", "head_vecs", "fact_vecs"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    enc2 = Counting()
    Memory(tmp_path / "dst2", encoder=enc2).import_(without)
    assert enc2.texts >= 30 + 2  # the same file without vectors is encoded


@pytest.mark.parametrize("edit, says", [
    (lambda ls: [ls[0].replace('"model":"test-words-32"', '"model":"test-words-other"')] + ls[1:],
     "line 1: field 'vectors.model'"),
    (lambda ls: [ls[0].replace('"dim":32', '"dim":64')] + ls[1:], "line 1: field 'vectors.dim'"),
    (lambda ls: ls[:2] + [json.dumps({**json.loads(ls[2]), "vector": "AAAA"})] + ls[3:], "line 3: field 'vector'"),
])
def test_a_bad_vector_header_or_line_is_one_line_and_stores_nothing(mem, tmp_path, edit, says):
    from trawmem_gpu import Memory

    ls = "".join(mem.export_lines(vectors=True)).splitlines()
    dst = Memory(tmp_path / "dst", encoder=Counting())
    with pytest.raises(InputError) as e:
        dst.import_([x + "\n" for x in edit(ls)])
    assert says in str(e.value) and "\n" not in str(e.value)
    assert dst.banks() == []


def test_vectors_into_a_collection_of_another_encoder_stop_at_the_header(mem, tmp_path):
    from trawmem_gpu import Memory

    dst = Memory(tmp_path / "dst", encoder=Other())
    with pytest.raises(InputError, match=r"^line 1: field 'vectors.model': .*'test-words-32'.*'test-words-other'"):
        dst.import_(list(mem.export_lines(vectors=True)))
    assert dst.banks() == []
    dst.import_(list(mem.export_lines()))  # without vectors the texts are encoded by its own encoder
    assert len(dst.turns("b")) == 30


def _header():
    return json.dumps({"format": "trawmem-export", "version": 1, "encoder": "test-words-32", "created": None}) + "\n"


def _turn_line(i: int) -> str:
    return json.dumps({"type": "turn", "bank_id": "big", "id": f"T{i}", "speaker": "Ana", "text": f"word {i}",
                       "date": "2024-05-01T10:00:00"}) + "\n"


class Lines:
    """A file of a million small lines, made as they are read (``taken`` counts them)."""

    def __init__(self, n: int = 10 ** 6, bad_at: int | None = None):
        self.n, self.bad_at, self.taken = n, bad_at, 0

    def __iter__(self):
        yield _header()
        yield json.dumps({"type": "bank", "bank_id": "big", "n_turns": self.n - 2}) + "\n"
        self.taken = 2
        for i in range(3, self.n + 1):
            self.taken += 1
            yield "{not json\n" if i == self.bad_at else _turn_line(i)


def test_a_million_line_import_is_read_as_a_stream_and_bounded(tmp_path):
    from trawmem_gpu import Memory

    dst = Memory(tmp_path / "dst", encoder=Counting())
    src = Lines(bad_at=5)
    with pytest.raises(InputError, match=r"^line 5: not JSON"):
        dst.import_(src)
    assert src.taken == 5  # the rest of the million lines was never read
    src = Lines()
    with pytest.raises(InputError) as e:
        dst.import_(src)
    assert str(e.value).startswith(f"line {MAX_BANK_LINES + 3}: field 'type': bank 'big' holds more than "
                                   f"{MAX_BANK_LINES} turns and facts")
    assert src.taken == MAX_BANK_LINES + 3 and dst.banks() == []


def test_a_line_over_the_byte_bound_is_refused_unread(tmp_path):
    from trawmem_gpu import Memory

    f = tmp_path / "long.jsonl"
    with open(f, "w") as out:
        out.write(_header() + json.dumps({"type": "bank", "bank_id": "big"}) + "\n")
        out.write(_turn_line(1).replace("word 1", "w" * (3 << 20)))
    dst = Memory(tmp_path / "dst", encoder=Counting())
    with pytest.raises(LineTooLong, match=r"^line 3: longer than 2097152 bytes"):
        dst.import_(f)
    assert dst.banks() == []


def test_turns_and_facts_are_one_commit(mem, tmp_path, monkeypatch):
    """The facts reach the store in the same write as the turns: a failure computing them leaves
    the bank unwritten (before: the turns were stored, then the facts)."""
    from trawmem_gpu import Memory
    import trawmem_gpu.memory.facts as facts

    lines = list(mem.export_lines())
    dst = Memory(tmp_path / "dst", encoder=Counting())
    writes = []
    coll = dst._core.registry.coll
    real_update = coll.update
    monkeypatch.setattr(coll, "update", lambda b, fn, **kw: writes.append(b) or real_update(b, fn, **kw))
    dst.import_(lines)
    assert writes == ["b"] and {f.fact_id for f in _bank(dst).facts} == {"F:1", "F:2"}
    assert _bank(dst).facts[0].superseded_by == "F:2"  # supersession as exported

    def broken(*a, **kw):
        raise RuntimeError("died computing the facts")

    monkeypatch.setattr(facts, "extend_facts", broken)
    dst2 = Memory(tmp_path / "dst2", encoder=Counting())
    with pytest.raises(RuntimeError):
        dst2.import_(lines)
    assert dst2.banks() == []  # no bank of turns without its facts
