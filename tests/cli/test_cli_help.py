"""The command line's help: every command listed and described, every option described, defaults
shown the way they are typed (never ``None`` or a Python repr), and ``trawmem --help`` fast
because it imports no model code."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest

from trawmem_gpu.cli import COMMANDS, build_parser, main

HEAVY = ("torch", "numba", "transformers", "faiss")


def _imported_after(argv: list[str]) -> dict:
    """Run ``main(argv)`` in a fresh interpreter; the heavy and command modules it imported."""
    code = ("import json, sys\nfrom trawmem_gpu.cli import main\n"
            "try:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in %r or m.startswith('trawmem_gpu'))))"
            % (argv, HEAVY))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return {"out": out.stdout, "modules": set(json.loads(out.stdout.strip().splitlines()[-1]))}


def test_top_level_help_lists_every_command_and_imports_no_model_code():
    got = _imported_after(["--help"])
    for name, (_, summary) in COMMANDS.items():
        assert re.search(rf"^\s+{re.escape(name)}\b", got["out"], re.M), name
    heavy = {m for m in got["modules"] if m.split(".")[0] in HEAVY}
    assert not heavy, sorted(heavy)[:5]
    # only the dispatcher and its light helpers: no command's module
    assert not {m for m in got["modules"] if m.startswith(("trawmem_gpu.cli.", "trawmem_gpu.serve",
                                                             "trawmem_gpu.head", "trawmem_gpu.select"))} \
        - {"trawmem_gpu.cli.args", "trawmem_gpu.select", "trawmem_gpu.select.params"}  # the bounds of the ranges


def _help_imports(cmd: str) -> set[str]:
    """The modules a fresh interpreter holds after parsing ``trawmem CMD --help`` (run by a small
    runner: the table's module for CMD is imported, its ``configure`` called, its help printed)."""
    code = ("import json, sys\nfrom trawmem_gpu.cli import build_parser\np = build_parser([%r])\n"
            "try:\n    p.parse_args([%r, '--help'])\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(sys.modules)))" % (cmd, cmd))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_every_command_help_imports_nothing_heavy_and_no_other_command(cmd):
    mods = _help_imports(cmd)
    heavy = sorted(m for m in mods if m.split(".")[0] in HEAVY)
    assert not heavy, f"trawmem {cmd} --help imports {heavy[:5]}"
    own = COMMANDS[cmd][0]
    others = {COMMANDS[c][0] for c in COMMANDS} - {own}
    assert own in mods and not others & mods, others & mods


def test_the_table_names_one_module_per_command():
    import importlib

    modules = [m for m, _ in COMMANDS.values()]
    assert len(set(modules)) == len(modules)
    for m in modules:
        assert m.startswith("trawmem_gpu.cli.") and callable(importlib.import_module(m).configure), m


def test_python_dash_m_runs_the_command_line():
    out = subprocess.run([sys.executable, "-m", "trawmem_gpu.cli", "--help"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "repair-index" in out.stdout, out.stderr


def _entries(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.Action, str]]:
    """option -> (action, its help entry as printed, whitespace folded)."""
    text = parser.format_help()
    out = {}
    for a in parser._actions:
        if not a.option_strings or "--help" in a.option_strings:
            continue
        s = a.option_strings[-1]
        m = re.search(rf"^  (?:-\w, )?{re.escape(s)}\b.*?(?=^  -|\Z)", text, re.M | re.S)
        assert m, (parser.prog, s)
        out[s] = (a, " ".join(m.group(0).split()))
    return out


def help_problems(parser: argparse.ArgumentParser) -> list[str]:
    """What is wrong with one command's help (empty when nothing)."""
    bad = []
    if not parser.description or len(parser.description) < 40:
        bad.append(f"{parser.prog}: no description beyond the summary")
    for opt, (a, entry) in _entries(parser).items():
        where = f"{parser.prog} {opt}"
        if not a.help or not a.help.strip():
            bad.append(f"{where}: no description")
        if re.search(r"\bNone\b|\(default: [\[(]|\(default: (True|False)\)", entry):
            bad.append(f"{where}: Python value shown: {entry}")
        if "(default: none)" in entry and "none" not in (a.choices or ()):
            bad.append(f"{where}: '(default: none)' without saying what none means: {entry}")
        if a.required and "default" in entry:
            bad.append(f"{where}: required but shows a default: {entry}")
        if a.required and "(required)" not in entry:
            bad.append(f"{where}: required, not marked: {entry}")
        if not a.required and a.nargs != 0 and a.default is None and "(default:" not in entry:
            bad.append(f"{where}: unset default and the help does not say what happens without it: {entry}")
        if not a.required and a.nargs != 0 and a.default is not None and "(default:" not in entry:
            bad.append(f"{where}: default not shown: {entry}")
    return bad


def test_every_command_and_option_has_consistent_help():
    p = build_parser()
    assert set(p.commands) == set(COMMANDS)
    bad = [b for sp in p.commands.values() for b in help_problems(sp)]
    assert not bad, "\n".join(bad)


def test_the_checker_catches_what_the_issue_found():
    from trawmem_gpu.cli.args import Parser

    p = Parser(prog="t", description="x")
    p.add_argument("--tenant", required=True, help="who")  # fine
    p.add_argument("--grid", type=int, nargs="+", default=[1, 2, 3], help="values")  # shown as 1,2,3: fine
    assert help_problems(p) == ["t: no description beyond the summary"]
    p.add_argument("--encoder", help="which encoder")  # unset default, nothing said about it
    p.add_argument("--kind", default="a", help="a kind (default: None)")
    p.add_argument("--model", help="a model (default: none)")
    p.add_argument("--mode", choices=["none", "x"], help="a mode (default: none)")  # a real value: fine
    assert [b.split(":")[0] for b in help_problems(p)[1:]] == ["t --encoder", "t --kind", "t --model"]


def test_headings_and_banks_help_match_the_real_defaults(monkeypatch, tmp_path):
    from trawmem_gpu.select.config import SelectConfig

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "elsewhere"))
    p = build_parser(["query", "eval", "score"])
    for cmd in ("query", "eval", "score"):
        entries = _entries(p.commands[cmd])
        assert f"(default: {SelectConfig().headings}," in entries["--headings"][1]
        assert entries["--headings"][0].default is None  # --paper keeps its own headings
        if cmd != "query":
            assert str(tmp_path / "elsewhere") in entries["--banks"][1].replace(" ", "")
            assert ".cache/trawmem_gpu" not in entries["--banks"][1]


def test_eval_and_score_default_to_the_same_engine():
    p = build_parser(["eval", "score"])
    e = p.parse_args(["eval", "--data", "d", "--output", "o"])
    s = p.parse_args(["score", "--out", "o"])
    assert e.engine == s.engine == "batched"
    assert p.parse_args(["eval", "--data", "d", "--output", "o", "--engine", "reference"]).engine == "reference"


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2 and "invalid choice: 'frobnicate'" in capsys.readouterr().err
