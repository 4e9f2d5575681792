"""Stale, tampered or corrupt banks and collection indexes are refused with a clear error, never
used silently; ``repair-index`` rebuilds a lost index from the banks."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.errors import BankError
from trawmem_gpu.paths import file_sha256
from trawmem_gpu.store import Collection, files as store_files, FORMAT_VERSION, load_bank

from locomo_files import write_data
from store_writer import tiny_bank, turn
from cli_inputs import _err, cache  # noqa: F401 - cache: a fixture


def _truncated(data: Path, dst: Path) -> Path:
    """The same conversations with only their first session (banks built "from half the data")."""
    samples = json.loads(data.read_text())
    for s in samples:
        for k in [k for k in s["conversation"] if k.startswith("session_2")]:
            del s["conversation"][k]
        s["qa"] = []
    dst.write_text(json.dumps(samples))
    return dst


def test_eval_refuses_banks_built_from_other_turns(tmp_path, cache, capsys):
    data = write_data(tmp_path / "tiny.json")
    banks = tmp_path / "banks"
    assert main(["build", "--input", str(_truncated(data, tmp_path / "half.json")), "--out", str(banks),
                 "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "r.json"
    assert main(["eval", "--data", str(data), "--banks", str(banks), "--output", str(out)]) == 2
    _err(capsys, "bank 'conv-a'", "built from other turns", "bank: 6 turns, data: 12", f"remove {banks}")
    assert not out.exists()
    # banks of the data it is given are used
    assert main(["eval", "--data", str(data), "--banks", str(tmp_path / "fresh"), "--output", str(out)]) == 0
    assert main(["eval", "--data", str(data), "--banks", str(tmp_path / "fresh"), "--output", str(out)]) == 0


def test_eval_refuses_other_bank_sets_and_build_configs(tmp_path, cache, capsys):
    data = write_data(tmp_path / "tiny.json")
    samples = json.loads(data.read_text())
    one = tmp_path / "one.json"
    one.write_text(json.dumps(samples[:1]))
    b1 = tmp_path / "b1"
    assert main(["build", "--input", str(one), "--out", str(b1), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", "--data", str(data), "--banks", str(b1), "--output", str(tmp_path / "r.json")]) == 2
    _err(capsys, "lacks 1 bank(s)", "'conv-b'")
    # a fixed-segmentation ablation cannot reuse embedding-segmented banks
    b2 = tmp_path / "b2"
    assert main(["build", "--input", str(data), "--out", str(b2), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", "--data", str(data), "--banks", str(b2), "--ablation", "fixed_segmentation",
                 "--output", str(tmp_path / "r.json")]) == 2
    _err(capsys, "another build config", "segmentation")


def test_eval_refuses_a_corrupt_bank_instead_of_rebuilding_it(tmp_path, cache, capsys):
    data = write_data(tmp_path / "tiny.json")
    banks = tmp_path / "banks"
    assert main(["eval", "--data", str(data), "--banks", str(banks), "--output", str(tmp_path / "r.json")]) == 0
    capsys.readouterr()
    units = banks / "banks" / "conv-a" / "units.json"
    units.write_bytes(units.read_bytes()[:-10])
    before = {p: p.stat().st_mtime_ns for p in banks.rglob("*") if p.is_file()}
    assert main(["eval", "--data", str(data), "--banks", str(banks), "--output", str(tmp_path / "r.json")]) == 2
    _err(capsys, "units.json", "checksum mismatch", "--banks")
    assert {p: p.stat().st_mtime_ns for p in banks.rglob("*") if p.is_file()} == before  # left as it was


def test_automatic_cache_says_when_it_rebuilds(tmp_path, cache, caplog):
    from trawmem_gpu.eval.retrieval import banks_for

    caplog.set_level("INFO", logger="trawmem_gpu.eval.retrieval")  # the library logs its notes
    data = write_data(tmp_path / "tiny.json")
    _, banks, cdir = banks_for(data, progress=False)
    assert cdir.parent == tmp_path / "cache" / "banks"  # the one bank cache, shared with `trawmem score`
    t = next(cdir.glob("banks/*/tensors.safetensors"))
    t.write_bytes(t.read_bytes()[:50])
    caplog.clear()
    _, again, cdir2 = banks_for(data, progress=False)
    assert cdir2 == cdir and "bank cache is unusable" in caplog.text
    assert [b.n_units for b in again] == [b.n_units for b in banks]
    caplog.clear()
    _, third, _ = banks_for(data, progress=False)
    assert "unusable" not in caplog.text


def test_index_and_bank_identity_must_agree(tmp_path):
    d = tmp_path / "coll"
    coll = Collection(d, create=True)
    coll.put(tiny_bank("a", [turn("a1", 1), turn("a2", 1)]))
    coll.put(tiny_bank("b", [turn("b1", 1)]))
    shutil.rmtree(d / "banks" / "b")
    shutil.copytree(d / "banks" / "a", d / "banks" / "b")  # b's directory now holds bank a, checksums intact
    with pytest.raises(BankError, match=r"holds bank 'a' where the collection index expects 'b'"):
        Collection(d).load("b")


def test_duplicate_turn_ids_in_a_stored_bank(tmp_path):
    """A fully consistent tamper (checksums and digests recomputed) still fails the structure check."""
    from trawmem_gpu.data.types import turns_digest

    p = store_files.save_bank(tiny_bank("a", [turn("a1", 1), turn("a2", 1)]), tmp_path / "a")
    units = json.loads((p / "units.json").read_text())
    units[1]["id"] = "a1"
    (p / "units.json").write_text(json.dumps(units))
    meta = json.loads((p / "meta.json").read_text())
    meta["checksums"]["units.json"] = file_sha256(p / "units.json")
    meta["turns_sha256"] = turns_digest([store_files.turn_from(r) for r in units])
    meta["meta_sha256"] = store_files.meta_digest(meta)
    (p / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(BankError, match="duplicate turn id 'a1'"):
        load_bank(p)


@pytest.mark.parametrize("index,msg", [
    ({"format_version": FORMAT_VERSION, "encoder_id": None, "banks": ["a", "b"]}, "field 'banks' must be an object"),
    ({"format_version": str(FORMAT_VERSION), "encoder_id": None, "banks": {}}, "format_version must be an integer"),
    ({"format_version": FORMAT_VERSION, "encoder_id": None, "banks": {"a": "../../etc"}}, "not a plain name"),
    ({"format_version": FORMAT_VERSION, "encoder_id": None, "banks": {"a": "x", "b": "x"}}, "share one directory"),
    ([1, 2], "expected a JSON object"),
    ({"format_version": 1, "banks": {}}, "format version 1"),
])
def test_corrupt_collection_index(tmp_path, capsys, index, msg):
    (tmp_path / "collection.json").write_text(json.dumps(index))
    assert main(["info", str(tmp_path)]) == 2
    _err(capsys, "collection.json", msg)


def test_a_collection_index_nested_past_the_parser_is_corrupt_not_a_recursion_error(tmp_path, capsys):
    (tmp_path / "collection.json").write_text('{"banks":' * 100_000 + "{}" + "}" * 100_000)
    with pytest.raises(BankError, match=r"collection.json: corrupt collection index \(JSON nested too deeply"):
        Collection(tmp_path)
    assert main(["info", str(tmp_path)]) == 2
    _err(capsys, "collection.json", "JSON nested too deeply")


def test_repair_index_rebuilds_from_the_banks_and_refuses_what_it_cannot_read(tmp_path):
    """Issue 26: a lost collection.json made the next build start a fresh index over the banks."""
    from trawmem_gpu.store import repair_index

    d = tmp_path / "coll"
    coll = Collection(d, create=True)
    for b in ("a", "b", "Ana's chat"):
        coll.put(tiny_bank(b, [turn(f"{b}1", 1)]))
    (d / "collection.json").unlink()
    (d / "banks" / "b").rename(d / "banks" / ".b.old-dead1")  # a write killed mid-swap, too
    for create in (False, True):
        with pytest.raises(BankError, match=r"collection.json is missing .*trawmem repair-index"):
            Collection(d, create=create)
    r = repair_index(d)
    assert r["banks"] == 3 and sorted(r["added"]) == ["Ana's chat", "a", "b"] and r["dropped"] == []
    coll = Collection(d)
    assert sorted(coll.bank_ids) == ["Ana's chat", "a", "b"]
    assert [t.turn_id for t in coll.load("b").turns] == ["b1"]
    # a damaged bank stops the repair, naming the directory; nothing is written
    (d / "collection.json").unlink()
    meta = d / "banks" / "a" / "meta.json"
    meta.write_text(meta.read_text().replace('"n_units"', '"n_unitz"'))
    with pytest.raises(BankError, match=r"banks/a.*remove or move"):
        repair_index(d)
    assert not (d / "collection.json").exists()
