"""A damaged embedding cache file (truncated, bit-flipped, garbage, foreign) is set aside and
rebuilt, and never stops ``query`` or ``score``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data import load_conversations, sample_path

from cli_inputs import cache  # noqa: F401 - cache: a fixture


def _damage(db: Path, kind: str) -> None:
    """Damage the embedding cache file ``db`` as the audit did."""
    import sqlite3

    raw = db.read_bytes()
    if kind == "truncated":
        db.write_bytes(raw[:len(raw) // 2])
    elif kind == "bit-flipped":  # flip bits in every page's header (the file header among them)
        b = bytearray(raw)
        for i in range(0, len(b), 4096):
            for k in range(i + 16, min(i + 40, len(b))):
                b[k] ^= 0x5A
        db.write_bytes(bytes(b))
    elif kind == "garbage":
        db.write_bytes(b"not a database at all " * 50)
    else:  # foreign: a database of another schema
        db.unlink()
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE notes (title TEXT)")
        con.commit()
        con.close()


def _cached_rows(db: Path) -> int:
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT COUNT(*) FROM emb").fetchone()[0]
    finally:
        con.close()


@pytest.mark.parametrize("kind", ["truncated", "bit-flipped", "garbage", "foreign"])
def test_a_damaged_embedding_cache_is_set_aside_and_rebuilt(tmp_path, cache, capsys, kind):
    from trawmem_gpu.encode import EmbeddingCache

    db = cache / "embeddings.sqlite"
    assert main(["build", "--input", str(sample_path()), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    n = _cached_rows(db)
    assert n > 10
    capsys.readouterr()
    _damage(db, kind)
    assert main(["build", "--input", str(sample_path()), "--out", str(tmp_path / "c2"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "note: the embedding cache" in err
    assert "set aside as embeddings.sqlite.bad-1" in err
    assert (cache / "embeddings.sqlite.bad-1").exists() and _cached_rows(db) == n  # rebuilt, every text again
    # the library: damage done under an open cache is found by its next write, set aside once, and
    # the write goes to the fresh cache
    import numpy as np

    c = EmbeddingCache(db)
    _damage(db, kind)
    if kind != "foreign":  # (a foreign file replaces ours: the open cache writes on to its own)
        c.put_many({"k": np.ones(4, dtype=np.float32)})
        assert c.set_aside == [cache / "embeddings.sqlite.bad-2"]
        assert EmbeddingCache(db).get_many(["k", "x"], 4)["k"].tolist() == [1.0] * 4
    else:
        assert EmbeddingCache(db).set_aside == [cache / "embeddings.sqlite.bad-2"]
    assert not EmbeddingCache(db).set_aside and len(list(cache.glob("embeddings.sqlite.bad-*"))) == 2


def test_a_damaged_embedding_cache_never_stops_query_or_score(tmp_path, cache, capsys):
    db = cache / "embeddings.sqlite"
    coll = tmp_path / "c"
    assert main(["build", "--input", str(sample_path()), "--out", str(coll), "--quiet"]) == 0
    bank_id = load_conversations(sample_path())[0].bank_id
    _damage(db, "truncated")
    assert main(["query", "--bank", str(coll), "--question", "Where does Clara live now?"]) == 0
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and "set aside" in cap.err and "[S1:" in cap.out
    _damage(db, "bit-flipped")
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": "q1", "bank_id": bank_id, "question": "Where does Clara live now?"}) + "\n")
    assert main(["score", "--questions", str(q), "--banks", str(coll), "--out", str(tmp_path / "o.jsonl"),
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "set aside as embeddings.sqlite.bad-2" in err
    assert (tmp_path / "o.jsonl").read_text().count("\n") == 1
