"""A lost collection index is refused, never overwritten; ``repair-index`` rebuilds it."""
from __future__ import annotations

from trawmem_gpu.cli import main
from trawmem_gpu.store import Collection

from locomo_files import write_data
from history_files import _build, _history, cache  # noqa: F401 - cache: an autouse fixture


def test_lost_index_is_refused_and_repaired(tmp_path, capsys):
    banks = tmp_path / "banks"
    assert _build(_history(tmp_path / "h.jsonl", banks=("b1", "b2", "b3")), banks) == 0
    (banks / "collection.json").unlink()
    capsys.readouterr()
    assert _build(_history(tmp_path / "h4.jsonl", banks=("b4",)), banks) == 2
    err = capsys.readouterr().err
    assert "collection.json is missing" in err and f"trawmem repair-index {banks}" in err
    assert not (banks / "collection.json").exists() and not (banks / "banks" / "b4").exists()
    assert main(["eval", "--data", str(write_data(tmp_path / "t.json")), "--banks", str(banks),
                 "--output", str(tmp_path / "r.json")]) == 2
    assert "repair-index" in capsys.readouterr().err
    assert main(["repair-index", str(banks)]) == 0
    assert "3 banks" in capsys.readouterr().out
    assert sorted(Collection(banks).bank_ids) == ["b1", "b2", "b3"]
    assert _build(_history(tmp_path / "h4.jsonl", banks=("b4",)), banks) == 0
    coll = Collection(banks)
    assert sorted(coll.bank_ids) == ["b1", "b2", "b3", "b4"] and all(coll.load(b).n_units == 8 for b in coll.bank_ids)
