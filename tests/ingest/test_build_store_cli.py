"""Banks end to end, the CLI: build, info and --update, fixed segmentation, bad input (exit 2).

Encoding goes through the on-disk embedding cache (``TRAWMEM_CACHE`` or ~/.cache/trawmem_gpu),
so a rerun does not encode the dev turns again. Synthetic conversations are written by the
tests themselves; the dev data is only read in place.
"""
from __future__ import annotations

import json

import numpy as np

from trawmem_gpu.ingest.config import BuildConfig
from trawmem_gpu.data import load_jsonl, sample_path
from trawmem_gpu.store import Collection, save_bank
from trawmem_gpu.store.files import UNITS
from bank_compare import assert_banks_equal
from build_store_cases import check_bank_invariants


# ----------------------------------------------------------------------------------------------
# (f) CLI
# ----------------------------------------------------------------------------------------------

def _main(argv):
    from trawmem_gpu.cli import main

    return main(argv)


def test_cli_build_and_info_sample(tmp_path, capsys):
    out = tmp_path / "coll"
    assert _main(["build", "--input", str(sample_path()), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "built 1 bank," in printed and "encode" in printed and "graph" in printed
    assert _main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    convs = load_jsonl(sample_path())
    n = sum(len(c.turns) for c in convs)
    assert info["banks"] == len(convs) and info["units"] == n
    assert info["encoder"] == "all-MiniLM-L6-v2:mean:256"
    tl = info["thread_length"]
    assert 2 <= tl["mean"] <= 15 and tl["min"] >= 1 and tl["max"] <= BuildConfig().max_thread_len
    assert info["threads"] == sum(r["threads"] for r in info["per_bank"])
    assert info["edges"]["adjacent"] == info["threads"] - info["banks"]
    bank = Collection(out).load(convs[0].bank_id)
    check_bank_invariants(bank, BuildConfig())
    # plain-text info, and info on one bank directory
    assert _main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{n} units" in text and "thread length: mean" in text
    assert _main(["info", str(Collection(out).bank_path(convs[0].bank_id)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["units"] == n


def test_cli_fixed_segmentation(tmp_path, capsys):
    out = tmp_path / "coll"
    assert _main(["build", "--input", str(sample_path()), "--out", str(out), "--segmentation", "fixed",
                  "--fixed-size", "5", "--quiet"]) == 0
    capsys.readouterr()
    (b,) = Collection(out).load_all()
    assert b.build_config["segmentation"] == "fixed" and np.diff(b.thread_offsets).max() <= 5


def test_cli_update(tmp_path, capsys):
    lines = sample_path().read_text(encoding="utf-8").splitlines(keepends=True)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(lines[:20]), encoding="utf-8")
    inc, full = tmp_path / "inc", tmp_path / "full"
    assert _main(["build", "--input", str(part), "--out", str(inc), "--quiet"]) == 0
    assert _main(["build", "--input", str(sample_path()), "--out", str(inc), "--update", "--quiet"]) == 0
    printed = capsys.readouterr().out
    bank_id = load_jsonl(sample_path())[0].bank_id
    assert f"updated {bank_id}: +{len([l for l in lines if l.strip()]) - 20} units" in printed
    assert _main(["build", "--input", str(sample_path()), "--out", str(full), "--quiet"]) == 0
    capsys.readouterr()
    assert_banks_equal(Collection(inc).load(bank_id), Collection(full).load(bank_id), exact=False)
    # an input whose history conflicts with the stored one is refused with exit code 2
    other = tmp_path / "other.jsonl"
    rec = json.loads(lines[3])
    rec["text"] = "an edited message"
    other.write_text("".join(lines[:3]) + json.dumps(rec) + "\n" + "".join(lines[4:]), encoding="utf-8")
    assert _main(["build", "--input", str(other), "--out", str(inc), "--update", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"turn {rec['turn_id']!r} differs" in err and "'text'" in err and "Traceback" not in err


def _one_line_error(capsys, *fragments):
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert err.count("\n") == 0, err
    assert "Traceback" not in cap.err
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"
    return err


def test_cli_bad_input_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(sample_path().read_text().splitlines()[0] + "\n{oops\n", encoding="utf-8")
    assert _main(["build", "--input", str(bad), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = _one_line_error(capsys, f"{bad}:2", "bad JSON")
    assert err.startswith("trawmem build: error:")
    assert not (tmp_path / "o" / "banks").exists()

    miss = tmp_path / "missing.jsonl"
    miss.write_text('{"bank_id": "a", "turn_id": "1", "speaker": "A", "timestamp": "2024-01-01"}\n')
    assert _main(["build", "--input", str(miss), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    _one_line_error(capsys, f"{miss}:1", "'text'")

    loc = tmp_path / "bad.json"
    loc.write_text(json.dumps([{"sample_id": "s", "conversation": {"session_1_date_time": "never",
                                                                    "session_1": [{"speaker": "A", "dia_id": "D" + "1:1",
                                                                                   "text": "hi"}]}}]))
    assert _main(["build", "--input", str(loc), "--out", str(tmp_path / "o"), "--format", "locomo"]) == 2
    _one_line_error(capsys, str(loc), "sample 0", "session_1_date_time")

    assert _main(["build", "--input", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "nope.jsonl", "not found")


def test_cli_llm_without_backend_exit_2(tmp_path, capsys):
    assert _main(["build", "--input", str(sample_path()), "--out", str(tmp_path / "o"), "--segmentation", "llm",
                  "--quiet"]) == 2
    _one_line_error(capsys, "segmentation='llm'", "none configured")


def test_cli_info_on_corrupt_or_missing(tmp_path, capsys, syn_bank):
    assert _main(["info", str(tmp_path / "nothing")]) == 2
    _one_line_error(capsys, "nothing: does not exist")
    (tmp_path / "empty").mkdir()
    assert _main(["info", str(tmp_path / "empty")]) == 2
    _one_line_error(capsys, "not a collection")
    d = save_bank(syn_bank, tmp_path / "b")
    (d / UNITS).unlink()
    assert _main(["info", str(d)]) == 2
    _one_line_error(capsys, UNITS, "missing")
