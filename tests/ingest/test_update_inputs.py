"""``build --update`` from a file of only the new turns or an overlapping one, and its refusal of a
conflicting history."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data import sample_path
from trawmem_gpu.store import Collection

from cli_inputs import _err, _jsonl, cache  # noqa: F401 - cache: a fixture


def _sample_lines():
    return sample_path().read_text(encoding="utf-8").splitlines(keepends=True)


@pytest.mark.parametrize("split,start", [(20, 20), (20, 12), (8, 8)])
def test_update_from_append_only_or_overlapping_file(tmp_path, cache, capsys, split, start):
    """The README's `--update` with a file of only the new turns (start == split), or one that
    repeats the last stored turns (start < split), equals a full build."""
    from bank_compare import assert_banks_equal

    lines = _sample_lines()
    part, new = tmp_path / "part.jsonl", tmp_path / "new.jsonl"
    part.write_text("".join(lines[:split]))
    new.write_text("".join(lines[start:]))
    inc, full = tmp_path / "inc", tmp_path / "full"
    assert main(["build", "--input", str(part), "--out", str(inc), "--quiet"]) == 0
    assert main(["build", "--input", str(new), "--out", str(inc), "--update", "--quiet"]) == 0
    assert f"updated ana-ben: +{len(lines) - split} units" in capsys.readouterr().out
    assert main(["build", "--input", str(sample_path()), "--out", str(full), "--quiet"]) == 0
    assert_banks_equal(Collection(inc).load("ana-ben"), Collection(full).load("ana-ben"), exact=False)
    # the same file again adds nothing
    assert main(["build", "--input", str(new), "--out", str(inc), "--update", "--quiet"]) == 0
    assert "nothing new" in capsys.readouterr().out


def test_update_refuses_conflicting_histories(tmp_path, cache, capsys):
    lines = _sample_lines()
    part = tmp_path / "part.jsonl"
    part.write_text("".join(lines[:20]))
    inc = tmp_path / "inc"
    assert main(["build", "--input", str(part), "--out", str(inc), "--quiet"]) == 0
    capsys.readouterr()
    recs = [json.loads(x) for x in lines]
    cases = {
        "gap": (recs[15:17] + recs[18:], "has turn 'S2:"),           # a stored turn missing from the repeat
        "reorder": (recs[20:22] + [recs[5]], "already stored"),       # a stored id among the new turns
        "speaker": ([{**recs[19], "speaker": "Eve"}] + recs[20:], "field 'speaker'"),
    }
    for name, (rs, msg) in cases.items():
        f = _jsonl(tmp_path / f"{name}.jsonl", rs)
        assert main(["build", "--input", str(f), "--out", str(inc), "--update", "--quiet"]) == 2, name
        _err(capsys, "--update: bank 'ana-ben'", msg, "rebuild")
    assert Collection(inc).load("ana-ben").n_units == 20
