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
