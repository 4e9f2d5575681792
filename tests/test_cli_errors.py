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
