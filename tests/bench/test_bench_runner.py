"""The benchmark suite's runner (``python -m benchmarks``) and its table (``benchmarks.SUITE``):
every script of ``benchmarks/`` is an entry, every entry imports light and answers ``--help``."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks
from benchmarks import harness

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
HEAVY = ("torch", "numba", "faiss", "transformers")


def _py(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_every_script_of_the_folder_is_an_entry():
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")} - set(benchmarks.SHARED)
    listed = [e.script for e in benchmarks.SUITE]
    assert sorted(listed) == sorted(set(listed)), "a script listed twice"
    assert scripts == set(listed), f"not in benchmarks.SUITE: {scripts - set(listed)}; gone: {set(listed) - scripts}"
    names = [e.name for e in benchmarks.SUITE]
    assert len(names) == len(set(names))
    for e in benchmarks.SUITE:
        assert e.measures and e.takes and all(r.endswith((".json", ".md", ".png")) for r in e.results), e


def test_list_prints_every_entry():
    r = _py("-m", "benchmarks", "list")
    assert r.returncode == 0, r.stderr
    for e in benchmarks.SUITE:
        assert any(line.split()[:2] == [e.name, e.script] for line in r.stdout.splitlines()), e.name


def test_the_readme_index_has_a_row_per_entry():
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    for e in benchmarks.SUITE:
        assert f"| `{e.name}` | `{e.script}` |" in readme, e.name


def test_every_entry_imports_without_heavy_modules():
    """Each module imports (so ``--help`` parses before torch, numba, faiss or transformers)."""
    mods = [e.module for e in benchmarks.SUITE if e.module]
    code = ("import importlib, json, sys\n"
            f"for m in {mods!r}:\n"
            "    mod = importlib.import_module(m); assert callable(mod.main), m\n"
            f"print(json.dumps([h for h in {HEAVY!r} if h in sys.modules]))\n")
    r = _py("-c", code)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("name, usage", [("select", "usage: bench_select.py"), ("quality", "usage: bench_quality.py"),
                                         ("bench_serve", "usage: bench_serve.py")])
def test_run_passes_the_arguments_to_the_script(name, usage):
    r = _py("-m", "benchmarks", "run", name, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(usage)


def test_run_help_of_the_shell_entry_prints_its_header_and_runs_nothing():
    r = _py("-m", "benchmarks", "run", "gpu_check", "--help")
    assert r.returncode == 0 and "One-shot GPU check" in r.stdout and "== 1." not in r.stdout


def test_an_unknown_entry_names_the_entries():
    r = _py("-m", "benchmarks", "run", "no-such-bench")
    assert r.returncode == 2 and "select" in r.stderr and "python -m benchmarks list" in r.stderr
    assert _py("-m", "benchmarks").returncode == 2


def test_a_script_still_runs_as_a_file():
    """``python benchmarks/bench_select.py`` (how ``--versus`` starts its workers) loads the package."""
    r = _py(str(BENCH / "bench_select.py"), "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: bench_select.py"), r.stderr


def test_experiments_import_and_write_to_the_archive(monkeypatch):
    names = sorted(p.stem for p in (BENCH / "experiments").glob("*.py") if p.stem != "__init__")
    r = _py("-c", "import importlib\n" + "".join(f"importlib.import_module('benchmarks.experiments.{n}')\n"
                                                   for n in names))
    assert r.returncode == 0, r.stderr
    monkeypatch.delenv("TRAWMEM_BENCH_OUT", raising=False)
    assert harness.ARCHIVE == harness.RESULTS / "archive" and harness.ARCHIVE.is_dir()
    assert harness.out_file(None, "x.json", harness.ARCHIVE) == harness.ARCHIVE / "x.json"


def test_the_runner_records_its_command(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(BENCH / "bench_select.py"), "--rounds", "2"])
    monkeypatch.setattr(harness, "RUN_AS", ["python", "-m", "benchmarks", "run", "select"])
    assert harness.command() == "python -m benchmarks run select --rounds 2"
