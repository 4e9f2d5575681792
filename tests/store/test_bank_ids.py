"""Bank ids never escape their directory: bank directory names are plain, unique and stable, and ids
that differ only by an invisible or bidirectional character are refused."""
from __future__ import annotations

import re

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.errors import InputError
from trawmem_gpu.store import Collection
from trawmem_gpu.store.collection import bank_dirname

from cli_inputs import _jsonl, _rec, cache  # noqa: F401 - cache: a fixture


NASTY_IDS = [".", "..", "../x", "a/b", "/etc", "..\\x", "", " ", ".hidden", "x.", "CON", "nul.txt", "Alice", "alice",
             "x" * 200, "é", "\u202e", "a b", "conv-26", "w0-b0.tmp-1", "a" * 79 + "."]


def test_bank_dirnames_are_plain_unique_and_stable():
    names = [bank_dirname(b) for b in NASTY_IDS]
    assert len(set(names)) == len(NASTY_IDS)
    for b, n in zip(NASTY_IDS, names):
        assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*", n) and n not in (".", "..") and len(n) <= 120, (b, n)
        assert bank_dirname(b) == n
    assert bank_dirname("conv-26") == "conv-26"  # plain ids keep their name


def test_dot_bank_ids_do_not_wipe_the_collection(tmp_path, cache, capsys):
    """Issue: banks `jb` and `.` printed "built 2 banks" and left a collection whose bank dirs were gone."""
    f = _jsonl(tmp_path / "h.jsonl", [_rec(b, f"{i}", f"message {i} of bank {b!r} about the weather")
                                      for b in ("jb", ".", "..", "../up") for i in range(3)])
    out = tmp_path / "out"
    assert main(["build", "--input", str(f), "--out", str(out), "--quiet"]) == 0
    assert "built 4 banks" in capsys.readouterr().out
    coll = Collection(out)
    assert set(coll.bank_ids) == {"jb", ".", "..", "../up"}
    for b in coll.bank_ids:
        assert [t.turn_id for t in coll.load(b).turns] == ["0", "1", "2"]
        assert coll.bank_path(b).parent == out / "banks"
    assert not (tmp_path / "up").exists()
    assert main(["info", str(out)]) == 0 and "4 banks" in capsys.readouterr().out


@pytest.mark.parametrize("bad, what", [("ana\u200bben", "U+200B"), ("ana\u202eben", "U+202E"),
                                       ("\ufeffana", "U+FEFF"), ("ana\u2066x\u2069", "U+2066"),
                                       ("cafe\u0301", "NFC")])
def test_ids_that_look_alike_are_refused(bad, what):
    """Bank and turn ids cannot differ from another only by an invisible or bidirectional
    character, or by NFC / NFD form (issue 23): the one id rule refuses them, naming the field."""
    from trawmem_gpu.data.fields import id_field
    from trawmem_gpu.memory.banks import check_bank_id

    for check in (lambda: id_field(bad, "bank_id", "line 1"), lambda: check_bank_id(bad)):
        with pytest.raises(InputError, match=re.escape(what)):
            check()
    assert id_field("caf\u00e9", "bank_id", "line 1") == "caf\u00e9"  # NFC, visible: fine
