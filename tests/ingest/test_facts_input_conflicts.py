"""``build --facts locomo`` input that cannot be honoured is refused, never ignored: an
``--update`` whose old observations (or old turns) changed is a conflict, and an observation for a
session the conversation does not have is an error naming its key. Nothing is written."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.errors import InputError
from trawmem_gpu.ingest.layers.locomo import facts_from_sample
from trawmem_gpu.store import Collection
from locomo_files import _sample


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def _write(path, sample):
    path.write_text(json.dumps([sample]), encoding="utf-8")
    return path


def _built(tmp_path, capsys, n_sessions=2):
    sample = _sample(n_sessions)
    out = tmp_path / "coll"
    assert main(["build", "--input", str(_write(tmp_path / "a.json", sample)), "--out", str(out),
                 "--facts", "locomo", "--quiet"]) == 0
    capsys.readouterr()
    return sample, out


def _files(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and ".locks" not in p.parts}


@pytest.mark.parametrize("more", [0, 1], ids=["same turns", "with a new session"])
def test_update_with_an_edited_old_observation_is_a_conflict(tmp_path, capsys, more):
    sample, out = _built(tmp_path, capsys)
    edited = _sample(2 + more)
    edited["observation"]["session_1_observation"]["Ana"][0][0] = "Ana never spoke of anything."
    before = _files(out)
    assert main(["build", "--input", str(_write(tmp_path / "b.json", edited)), "--out", str(out), "--update",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bank 'made-up'" in err and "session_1_observation.Ana" in err and "conflict" in err
    assert "rebuild the bank without --update" in err and "nothing new" not in err
    assert _files(out) == before  # nothing written


def test_update_with_a_changed_citation_or_a_removed_observation_is_a_conflict(tmp_path, capsys):
    sample, out = _built(tmp_path, capsys)
    cited = _sample(2)
    cited["observation"]["session_2_observation"]["Ben"][0][1] = ["D2:2"]
    assert main(["build", "--input", str(_write(tmp_path / "b.json", cited)), "--out", str(out), "--update",
                 "--quiet"]) == 2
    assert "cites ['D2:2'] in the input, ['D2:2', 'D2:4'] in the bank" in capsys.readouterr().err
    removed = _sample(2)
    del removed["observation"]["session_2_observation"]["Ben"]
    assert main(["build", "--input", str(_write(tmp_path / "c.json", removed)), "--out", str(out), "--update",
                 "--quiet"]) == 2
    assert "no longer in the input" in capsys.readouterr().err


def test_update_with_locomo_facts_on_a_bank_built_without_them_is_a_conflict(tmp_path, capsys):
    out = tmp_path / "coll"
    data = _write(tmp_path / "a.json", _sample(2))
    assert main(["build", "--input", str(data), "--out", str(out), "--quiet"]) == 0
    assert main(["build", "--input", str(_write(tmp_path / "b.json", _sample(3))), "--out", str(out),
                 "--update", "--facts", "locomo", "--quiet"]) == 2
    assert "its facts came from --facts 'none'" in capsys.readouterr().err
    assert Collection(out).load("made-up").facts == ()


def test_an_unchanged_update_still_says_nothing_new_or_adds_the_new_facts(tmp_path, capsys):
    sample, out = _built(tmp_path, capsys)
    assert main(["build", "--input", str(_write(tmp_path / "b.json", sample)), "--out", str(out), "--update",
                 "--quiet"]) == 0
    assert "nothing new" in capsys.readouterr().out
    assert main(["build", "--input", str(_write(tmp_path / "c.json", _sample(3))), "--out", str(out), "--update",
                 "--quiet"]) == 0
    assert "+4 facts" in capsys.readouterr().out
    full = tmp_path / "full"
    assert main(["build", "--input", str(tmp_path / "c.json"), "--out", str(full), "--facts", "locomo",
                 "--quiet"]) == 0
    assert Collection(full).load("made-up").facts == Collection(out).load("made-up").facts
    # a second update over the updated bank checks against every stored turn, and passes
    assert main(["build", "--input", str(tmp_path / "c.json"), "--out", str(out), "--update", "--quiet"]) == 0


def test_update_with_an_edited_old_turn_is_a_conflict(tmp_path, capsys):
    sample, out = _built(tmp_path, capsys)
    edited = _sample(2)
    edited["conversation"]["session_1"][0]["text"] = "Something else entirely."
    assert main(["build", "--input", str(_write(tmp_path / "b.json", edited)), "--out", str(out), "--update",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "turn 'D1:1' differs" in err and "field 'text'" in err


def test_an_observation_for_a_session_that_does_not_exist_is_refused(tmp_path, capsys):
    sample = _sample(2)
    sample["observation"]["session_42_observation"] = {"Ana": [["Ana sailed.", "D1:1"]]}
    data = _write(tmp_path / "a.json", sample)
    assert main(["build", "--input", str(data), "--out", str(tmp_path / "coll"), "--facts", "locomo",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "'observation.session_42_observation' is for session 42" in err and "it has sessions 1, 2" in err
    assert not (tmp_path / "coll" / "banks").exists() or not any((tmp_path / "coll" / "banks").iterdir())
    with pytest.raises(InputError, match="session 42"):
        facts_from_sample(sample, {"D1:1"}, "s")
