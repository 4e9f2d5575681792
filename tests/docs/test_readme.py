"""The README's first screen is tested as it is written: its length, every relative link (and
anchor) of it and of the pages it links to, its Python examples run, and its commands are the
ones the set-up scripts, CI and the command line take."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _blocks(text: str, lang: str) -> list[str]:
    """The bodies of the fenced code blocks of ``text`` opened with ```` ```lang ```` ("": none)."""
    out, body, open_lang = [], None, None
    for line in text.splitlines():
        if line.startswith("```"):
            if body is None:
                body, open_lang = [], line[3:].strip()
            else:
                if open_lang == lang:
                    out.append("\n".join(body) + "\n")
                body = None
        elif body is not None:
            body.append(line)
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", md.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _pages() -> list[Path]:
    """The README and every markdown page reachable from it by relative links."""
    seen, todo = [], [README]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.append(page)
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            path = target.split("#")[0]
            if path and "://" not in path and path.endswith(".md"):
                p = (page.parent / path).resolve()
                if p.exists():
                    todo.append(p)
    return seen


def test_readme_is_a_first_screen():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads[:2] == ["Install", "Python"] and "Documentation" in heads
    # the documentation list: one "- [docs/...](...)" line per page, easy to extend
    docs = text[text.index("## Documentation"):]
    assert len(re.findall(r"^- \[docs/[\w.-]+\.md\]\(docs/[\w.-]+\.md\)", docs, re.M)) >= 8


def test_every_relative_link_resolves():
    bad = []
    pages = _pages()
    assert {ROOT / "docs" / f for f in ("cli.md", "serving.md", "method.md", "configuration.md", "evaluation.md",
                                        "reliability.md", "scoring.md")} <= set(pages)
    for page in pages:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def _run(code: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRAWMEM_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_python_example_runs_as_written(tmp_path):
    text = README.read_text(encoding="utf-8")
    code = _blocks(text[text.index("## Python"):], "python")[0]
    assert "from trawmem_gpu import Memory" in code and "mem.forget(" in code
    r = _run(code, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # the workspace it prints is the one the README shows under it
    shown = _blocks(text[text.index("## Python"):], "")[0].strip()
    assert shown in r.stdout, (shown, r.stdout[:2000])
    assert (tmp_path / "memories").is_dir()
    # what it forgot is gone from the collection's files
    blob = b"".join(p.read_bytes() for p in (tmp_path / "memories").rglob("*") if p.is_file())
    assert b"grey cat named Pixel" not in blob and b"Rotterdam" in blob


def test_the_client_example_runs_against_the_real_server(tmp_path):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from serve_util import build_sample_collection, running
    from trawmem_gpu.serve.config import ServeConfig

    text = README.read_text(encoding="utf-8")
    serve = text[text.index("## Serve it"):text.index("## Results")]
    code = _blocks(serve, "python")[0]
    assert "http://127.0.0.1:8000" in code  # what `trawmem serve` listens on by default
    coll = build_sample_collection(tmp_path / "coll")
    with running(ServeConfig(collection=str(coll), max_wait_ms=1)) as (url, _, _):
        r = _run(code.replace("http://127.0.0.1:8000", url), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^## \d{1,2} \w+ \d{4}$", r.stdout, re.M) and "[S" in r.stdout


def _commands() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    out = []
    for block in _blocks(text, "bash"):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                for part in line.split("&&"):
                    out.append(shlex.split(part))
    return out


def test_the_install_commands_are_what_ci_and_the_scripts_run():
    cmds = _commands()
    assert ["python3", "-m", "venv", ".venv"] in cmds and [".", ".venv/bin/activate"] in cmds
    assert ["bash", "scripts/setup.sh"] in cmds and ["bash", "scripts/test.sh"] in cmds
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv .venv" in ci and re.search(r"^bash scripts/test\.sh$", ci, re.M)
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert "bash scripts/setup.sh --test" in test_sh and "pytest tests" in test_sh
    # the test extra installs what the README says it adds
    import tomllib

    extra = " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"])
    for pkg in ("fastapi", "mcp", "ray", "onnxruntime", "pytest"):
        assert pkg in extra, pkg


def test_the_trawmem_commands_parse_and_the_demo_runs(tmp_path, capsys):
    from trawmem_gpu.cli import build_parser, main

    cmds = [c for c in _commands() if c[0] == "trawmem"]
    assert {c[1] for c in cmds} >= {"demo", "serve", "mcp"}
    for c in cmds:
        p = build_parser([c[1]])
        p.parse_args(c[1:])  # argparse exits (status 2) on anything it does not take
    demo = next(c for c in cmds if c[1] == "demo")
    i = demo.index("--out")
    demo[i + 1] = str(tmp_path / demo[i + 1])
    assert main(demo[1:]) == 0
    assert "## " in capsys.readouterr().out


def test_the_results_table_is_the_committed_run():
    """Every row of the README's table is a row of ``benchmarks/results/equal_tokens_current.md``."""
    text = README.read_text(encoding="utf-8")
    table = text[text.index("## Results"):text.index("## Documentation")]
    rows = [[c.strip().strip("*") for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| data set")]
    assert len(rows) == 6
    src = (ROOT / "benchmarks" / "results" / "equal_tokens_current.md").read_text(encoding="utf-8")
    want = {}
    for line in src.splitlines():
        c = [x.strip() for x in line.strip("|").split("|")]
        if len(c) == 6 and c[1].isdigit():  # set | T | margin before | margin now | recall before -> now | hybrid
            want[(c[0], int(c[1]))] = (c[5], c[4].split("->")[1].strip(), c[3])
    for data, t, hybrid, trawmem, margin in rows:
        assert want[(data, int(t.replace(",", "")))] == (hybrid, trawmem, margin), (data, t)
