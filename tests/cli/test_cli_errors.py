"""Bad input on the command line ends with exit code 2 and a one-line error, never a traceback."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.data import sample_path
from trawmem_gpu.store import FORMAT_VERSION


@pytest.fixture(scope="module")
def sample_coll(tmp_path_factory):
    out = tmp_path_factory.mktemp("coll")
    assert main(["build", "--input", str(sample_path()), "--out", str(out), "--quiet"]) == 0
    return out


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_empty_collection(tmp_path, capsys):
    (tmp_path / "collection.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "encoder_id": None,
                                                          "banks": {}}))
    assert main(["info", str(tmp_path)]) == 2
    assert "no banks" in _err(capsys)


@pytest.mark.parametrize("question,msg", [("   ", "empty"), ("x" * 5000, "limit")])
def test_bad_questions(sample_coll, capsys, question, msg):
    assert main(["query", "--bank", str(sample_coll), "--question", question]) == 2
    assert msg in _err(capsys)


def test_unknown_bank_id(sample_coll, capsys):
    assert main(["query", "--bank", str(sample_coll), "--bank-id", "nope", "--question", "hi"]) == 2
    assert "unknown bank id 'nope'" in _err(capsys)


def test_query_on_corrupt_bank(sample_coll, tmp_path, capsys):
    import shutil

    c = tmp_path / "c"
    shutil.copytree(sample_coll, c)
    t = next(c.glob("banks/*/tensors.safetensors"))
    t.write_bytes(t.read_bytes()[:100])
    assert main(["query", "--bank", str(c), "--question", "hi"]) == 2
    assert "checksum" in _err(capsys)


def test_query_prints_workspace_json(sample_coll, capsys):
    assert main(["query", "--bank", str(sample_coll), "--question", "How did Ana's knee do in the race?",
                 "--budget", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["units"]) == 3 and out["tokens"] > 0 and out["tokenizer"] == "tiktoken/cl100k_base"
    assert all(u in out["workspace"] for u in out["units"])


@pytest.mark.parametrize("args,msg", [(["--http-workers", "2", "--ray"], "--http-workers is for one machine"),
                                      (["--http-workers", "-1"], "--http-workers")])
def test_serve_http_workers_errors(tmp_path, capsys, args, msg):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    try:
        code = main(["serve", "--collection", str(tmp_path / "c"), *args])
    except SystemExit as e:  # argparse rejects a negative count itself
        code = e.code
    assert code == 2
    assert msg in capsys.readouterr().err


# -- library errors name fields; only the CLI maps them to flags --------------------------------
def test_library_errors_name_fields_not_flags():
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.select.params import QueryLimits
    from trawmem_gpu.serve.config import ServeConfig

    with pytest.raises(ConfigError) as e:
        ServeConfig(limits=QueryLimits(max_hops=-1))
    assert "`max_hops` must lie in [0, 8] (got -1)" in str(e.value) and "--" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        ServeConfig(timeout_s=0)
    assert str(e.value).startswith("`timeout_s` must be > 0")


def test_the_cli_maps_fields_to_its_own_flags():
    from trawmem_gpu.cli import build_parser
    from trawmem_gpu.cli.args import flags_for_fields

    p = build_parser(["serve", "eval"])
    msg = "`timeout_s` must be > 0; `max_hops` too; `no_such_field` stays; `trawmem build` stays"
    assert flags_for_fields(msg, p.commands["serve"]) == \
        "--timeout must be > 0; --max-hops too; `no_such_field` stays; `trawmem build` stays"
    assert flags_for_fields("`timeout_s` and `bank_cache`", p.commands["eval"]) == "--llm-timeout and --banks"


def test_a_cli_error_still_names_the_flag(sample_coll, tmp_path, capsys):
    bad = tmp_path / "w.json"
    bad.write_text('{"format": "trawmem-affinity-weights", "features": ["bm25"], "weights": [1, 2]}')
    assert main(["query", "--bank", str(sample_coll), "--question", "hi", "--affinity-weights", str(bad)]) == 2
    err = _err(capsys)
    assert f"--affinity-weights {bad}: fitted for the features" in err and "`" not in err.split("`trawmem")[0]


def test_no_library_module_raises_a_message_naming_a_flag():
    """Every ``raise`` outside the command-line modules: no string in it names a ``--flag``.
    (``select/`` follows the same rule in its own rewrite, so it is left to that work.)"""
    import ast
    import re
    from pathlib import Path

    import trawmem_gpu

    root = Path(trawmem_gpu.__file__).parent
    bad = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(("cli/", "kernels/")) or \
                rel.startswith("select/") and not rel.startswith(("select/trimem/", "select/workspace.py")):
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                for c in ast.walk(node.exc):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and \
                            re.search(r"(?<![\w`])--[a-z]", c.value.replace("`trawmem", "")):
                        bad.append(f"{rel}:{node.lineno}: {c.value[:60]}")
    assert not bad, "\n".join(bad)


def test_serve_config_errors_name_the_serve_flags(tmp_path, capsys):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    assert main(["serve", "--collection", str(tmp_path / "c"), "--host", "0.0.0.0"]) == 2
    err = _err(capsys)
    assert "--host 0.0.0.0 without --keys" in err and "set --keys to serve other hosts" in err and "`" not in err
