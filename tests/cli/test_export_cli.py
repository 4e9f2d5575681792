"""``trawmem export`` / ``trawmem import`` (issue 45 item 2): a round trip, and a bad file as one line."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.cli import main


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def test_export_import_round_trip(tmp_path, capsys):
    from trawmem_gpu import Memory

    src = Memory(tmp_path / "a")
    src.add("b1", [{"turn_id": "S1:1", "speaker": "Ana", "text": "I keep bees on the roof.", "timestamp": "2024-05-01"},
                   {"turn_id": "S1:2", "speaker": "Ben", "text": "Do they sting?", "timestamp": "2024-05-01"}])
    out = tmp_path / "x.jsonl"
    assert main(["export", "--collection", str(tmp_path / "a"), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["turns"] == 2
    assert main(["import", "--collection", str(tmp_path / "b"), "--input", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["banks"][0]["stored"] == 2
    assert Memory(tmp_path / "b").turns("b1") == src.turns("b1")


def test_import_bad_version_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format":"trawmem-export","version":9}\n')
    assert main(["import", "--collection", str(tmp_path / "c"), "--input", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 1: field 'version'" in err and "Traceback" not in err


def test_export_vectors_and_an_encoder_mismatch_is_one_line(tmp_path, capsys):
    """``--vectors`` names the encoder in the header and writes each turn's vector; importing it into
    a collection of another encoder is one line naming the header's field, nothing stored."""
    from trawmem_gpu import Memory

    src = Memory(tmp_path / "a")
    src.add("b1", [{"turn_id": "S1:1", "speaker": "Ana", "text": "I keep bees on the roof.", "timestamp": "2024-05-01"}])
    out = tmp_path / "x.jsonl"
    assert main(["export", "--collection", str(tmp_path / "a"), "--out", str(out), "--vectors"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["vectors"] == {"model": src.encoder_id, "dim": 384, "dtype": "float32"}
    assert len(lines[2]["vector"]) == 4 * ((384 * 4 + 2) // 3) and len(lines[2]["vector_of"]) == 64
    other = tmp_path / "other.jsonl"  # as written by a collection of another encoder
    other.write_text(out.read_text().replace(f'"model":"{src.encoder_id}"', '"model":"another-model:mean:256"', 1))
    capsys.readouterr()
    assert main(["import", "--collection", str(tmp_path / "c"), "--input", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "line 1: field 'vectors.model'" in err and "Traceback" not in err
    assert Memory(tmp_path / "c").banks() == []
    assert main(["import", "--collection", str(tmp_path / "c"), "--input", str(out)]) == 0  # the same encoder
    assert Memory(tmp_path / "c").turns("b1") == src.turns("b1")
