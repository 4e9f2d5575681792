"""The command line checks what it is given: input and output paths, flags and budgets at parse time,
missing data, long bank lists, option defaults in the help, plural counts, a closed pipe."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from trawmem_gpu.cli import build_parser, main
from trawmem_gpu.data import sample_path
from trawmem_gpu.errors import name_list, UnknownBank
from trawmem_gpu.store import Collection

from store_writer import tiny_bank, turn
from cli_inputs import _err, cache, ROOT  # noqa: F401 - cache: a fixture


def test_input_directory_and_output_file(tmp_path, capsys):
    assert main(["build", "--input", str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    _err(capsys, "is a directory")
    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["build", "--input", str(sample_path()), "--out", str(f), "--quiet"]) == 2
    _err(capsys, str(f), "is a file")
    busy = tmp_path / "home"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert main(["build", "--input", str(sample_path()), "--out", str(busy), "--quiet"]) == 2
    _err(capsys, "is not a collection", "notes.txt")


def test_info_into_a_closed_pipe(tmp_path):
    """`trawmem info DIR --json | head`: the reader leaves early; no traceback, no 'Exception ignored'."""
    d = tmp_path / "coll"
    coll = Collection(d, create=True)
    for i in range(3):
        coll.put(tiny_bank(f"b{i}", [turn(f"b{i}-{k}", 1) for k in range(3)]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "info", str(d), "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the command writes anything
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == "", err


@pytest.mark.parametrize("argv,msg", [
    (["query", "--bank", "B", "--question", "q", "--budget", "0"], "argument --budget: must be at least 1, got 0"),
    (["query", "--bank", "B", "--question", "q", "--hops", "-2"], "argument --hops: must be 0 or more, got -2"),
    (["eval", "--data", "D", "--output", "o", "--budget", "x"], "argument --budget: expected an integer, got 'x'"),
    (["eval", "--data", "D", "--output", "o", "--categories", "1,x"], "argument --categories: expected"),
    (["eval", "--data", "D", "--output", "o", "--llm-timeout", "0"], "argument --llm-timeout: must be a positive"),
    (["eval", "--data", "D", "--output", "o", "--allow-failures", "-1"], "argument --allow-failures"),
    (["build", "--input", "I", "--out", "o", "--fixed-size", "0"], "argument --fixed-size: must be at least 1"),
])
def test_flags_checked_at_parse_time(capsys, monkeypatch, argv, msg):
    import trawmem_gpu.encode as enc

    monkeypatch.setattr(enc, "get_encoder", lambda *a, **k: pytest.fail("loaded a model before checking flags"))
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2 and msg in capsys.readouterr().err
    assert "self." not in msg


def test_eval_missing_data_and_data_without_questions(tmp_path, cache, capsys):
    assert main(["eval", "--data", str(tmp_path / "nope.json"), "--output", str(tmp_path / "r.json")]) == 2
    err = _err(capsys, "nope.json: file not found")
    assert "Errno" not in err
    out = tmp_path / "r.json"
    assert main(["eval", "--data", str(sample_path()), "--output", str(out)]) == 2
    _err(capsys, "no question with gold evidence", "can be built, not evaluated")
    assert not out.exists()


def test_bank_lists_in_errors_say_how_many_are_left_out(tmp_path, capsys):
    assert name_list(["a", "b"]) == "'a', 'b'"
    assert name_list(list("abcdefg")) == "'a', 'b', 'c', 'd', 'e', ... (2 more)"
    d = tmp_path / "coll"
    coll = Collection(d, create=True)
    for i in range(7):
        coll.put(tiny_bank(f"b{i}", [turn(f"b{i}-1", 1)]))
    with pytest.raises(UnknownBank) as ei:
        coll.load("nope")
    assert str(ei.value).endswith("(it holds 7: 'b0', 'b1', 'b2', 'b3', 'b4', ... (2 more))")
    assert main(["query", "--bank", str(d), "--question", "hi"]) == 2
    _err(capsys, "holds 7 banks", "... (2 more)")


def _help_lines(parser) -> dict:
    """option -> its whole help entry."""
    text = parser.format_help()
    out = {}
    for a in parser._actions:
        for s in a.option_strings:
            if s.startswith("--") and s != "--help":
                m = re.search(rf"^  {re.escape(s)}\b.*?(?=^  -|\Z)", text, re.M | re.S)
                out[s] = " ".join(m.group(0).split()) if m else ""
    return out


def test_every_option_shows_its_default():
    """Every command is listed; each option states its default as typed, is marked required, or is a
    flag (the full walk, with descriptions and no ``None``: ``tests/cli/test_cli_help.py``)."""
    p = build_parser()
    top = p.format_help()
    assert set(p.commands) == {"build", "info", "query", "eval", "demo", "train-head", "train-affinity", "sweep",
                               "score", "serve", "serve-key", "repair-index", "forget", "evolve-prompts", "mcp",
                               "export", "import", "history"}
    for name, sp in p.commands.items():
        assert name in top
        flags = {s for a in sp._actions if a.nargs == 0 for s in a.option_strings}
        for opt, entry in _help_lines(sp).items():
            assert opt in flags or "(default:" in entry or "(required)" in entry, (name, opt, entry)
            assert "None" not in entry, (name, opt, entry)


def test_plural_counts(tmp_path, cache, capsys):
    assert main(["build", "--input", str(sample_path()), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "built 1 bank," in out and "1 banks" not in out


@pytest.mark.parametrize("argv", [["eval", "--data", "d.json", "--engine", "batched", "--output", "o.json"],
                                  ["score", "--data", "d.json", "--out", "o.jsonl"], ["sweep", "--data", "d.json"]])
def test_huge_budgets_are_refused_at_parse_time(capsys, argv):
    """``--budget 1000000000`` allocated 22-119 GiB and died; the flag's range stops it first."""
    with pytest.raises(SystemExit) as e:
        main(argv + ["--budget", "1000000000"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: argument --budget:" in err and "must be at most 4096, got 1000000000" in err
