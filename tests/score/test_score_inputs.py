"""``score`` input checks: lone surrogates in the questions file, and damaged sidecars of a finished
run (the output's ``.meta.json``, the collection's files)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trawmem_gpu.cli import main

from cli_inputs import _err


@pytest.mark.parametrize("field", ["id", "bank_id", "question", "date"])
def test_lone_surrogates_in_score_questions_are_input_errors(tmp_path, capsys, field):
    rec = {"id": "q1", "bank_id": "b", "question": "Where did Ana go?", "date": "2031-05-02"}
    rec[field] += "MARK"
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": "q0", "bank_id": "b", "question": "ok?"}) + "\n"
                 + json.dumps(rec).replace("MARK", "\\udfff") + "\n", encoding="utf-8")
    assert main(["score", "--questions", str(q), "--banks", str(tmp_path / "c"), "--out", str(tmp_path / "o.jsonl"),
                 "--quiet"]) == 2
    _err(capsys, f"{q}:2", f"'{field}'", "lone surrogate")


SIDECAR_DAMAGE = {"truncated JSON": lambda raw: raw[:len(raw) // 2], "a list": lambda raw: b"[1, 2]",
                  "non-UTF-8": lambda raw: b"\xff\xfe" + raw}


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A finished ``score`` run of a synthetic LongMemEval file: into ``--banks`` and into the
    automatic bank directory (the embedding cache and banks under the module's own cache)."""
    import lme_synthetic as L

    d = tmp_path_factory.mktemp("scored")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAWMEM_CACHE", str(d / "cache"))
    f = L.write(d / "lme.json", L.instances(4))
    for out, banks in (("o.jsonl", ["--banks", str(d / "bk")]), ("auto.jsonl", [])):
        assert main(["score", "--data", str(f), *banks, "--out", str(d / out), "--quiet"]) == 0
    yield d, f
    mp.undo()


def _rescore(d, f, out, banks, capsys, damaged: Path, bad):
    """Damage ``damaged`` with ``bad``, score again, and put every file back as it was."""
    files = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    damaged.write_bytes(bad(damaged.read_bytes()))
    try:
        rc = main(["score", "--data", str(f), *banks, "--out", str(d / out), "--quiet"])
        summary = d / f"{out}.summary.json"
        return rc, capsys.readouterr(), damaged.read_bytes(), json.loads(summary.read_text()) if rc == 0 else None
    finally:
        for p in d.rglob("*"):
            if p.is_file() and p not in files:
                p.unlink()
        for p, raw in files.items():
            p.write_bytes(raw)


@pytest.mark.parametrize("damage", list(SIDECAR_DAMAGE))
def test_damaged_score_sidecars(scored, capsys, monkeypatch, damage):
    """The output's ``.meta.json`` (which job wrote the records) and the collection's
    ``score-build.json`` (what its banks were built from): a clear error where they cannot be
    told again, a counted repair where they can (the automatic bank directory is named by it)."""
    d, f = scored
    monkeypatch.setenv("TRAWMEM_CACHE", str(d / "cache"))
    bad = SIDECAR_DAMAGE[damage]
    capsys.readouterr()
    banks = ["--banks", str(d / "bk")]
    rc, cap, _, _ = _rescore(d, f, "o.jsonl", banks, capsys, d / "o.jsonl.meta.json", bad)
    assert rc == 2 and "Traceback" not in cap.err and cap.err.count("\n") == 1, cap.err
    assert "o.jsonl holds 4 records, and" in cap.err and "o.jsonl.meta.json: damaged sidecar" in cap.err \
        and "--overwrite" in cap.err
    rc, cap, _, _ = _rescore(d, f, "o.jsonl", banks, capsys, d / "bk" / "score-build.json", bad)
    assert rc == 2 and "Traceback" not in cap.err and cap.err.count("\n") == 1, cap.err
    assert "score-build.json: damaged sidecar" in cap.err and "cannot be reused" in cap.err
    auto = next((d / "cache" / "banks").iterdir()) / "score-build.json"  # the one bank cache
    good = json.loads(auto.read_text())
    rc, cap, now, summary = _rescore(d, f, "auto.jsonl", [], capsys, auto, bad)
    assert rc == 0 and "Traceback" not in cap.err and "note:" in cap.err and "rewritten" in cap.err, cap.err
    assert "4 already in" in cap.out and json.loads(now) == good
    assert summary["build"]["sidecars_repaired"] == 1
