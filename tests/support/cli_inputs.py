"""Small input files written into a test's ``tmp_path`` (JSONL records), the embedding cache
redirected there, and the one-line error a command leaves on stderr."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _rec(bank, tid, text="hello there", ts="2024-03-02T10:00:00", speaker="Ana", **extra):
    return {"bank_id": bank, "turn_id": tid, "speaker": speaker, "text": text, "timestamp": ts, **extra}


def _jsonl(path, recs, ensure_ascii=True):
    path.write_text("".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in recs), encoding="utf-8")
    return path


def _err(capsys, *fragments) -> str:
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert "Traceback" not in cap.err and err.count("\n") == 0, cap.err
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"
    return err
