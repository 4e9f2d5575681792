"""Forgets always finish: a forget killed (``kill -9``) at any stage is finished by the next open
of the collection (``Memory``, the server, ``trawmem forget``) before anything is served, the
score outputs it named included (the journal records them), also when the rerun names none; and a
forget from another process beside a running server is finished through the server's forget
routes (the server re-reads the bank), after which ``/v1/select`` no longer returns the turn. Each
is checked with the no-trace search of ``test_forget``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pause_kill import kill_when_paused

from forget_traces import _KILLED, MARKER, MARKER_ID, QUESTION, ROOT, _history, _needles, _traces
from trawmem_gpu.cli import main


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A collection (``ana-ben`` with the marker turn, and ``other``) built with the embedding
    cache, and a score output with one record that picked the marker turn and one that did not."""
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = tmp_path / "coll"
    assert main(["build", "--input", str(_history(tmp_path)), "--out", str(coll), "--quiet"]) == 0
    out = tmp_path / "scores" / "o.jsonl"
    out.parent.mkdir()
    out.write_text(json.dumps({"id": "q0", "bank_id": "ana-ben", "units": [MARKER_ID], "answer": "the code"}) + "\n"
                   + json.dumps({"id": "q1", "bank_id": "ana-ben", "units": ["S1:1"], "answer": "Rotterdam"}) + "\n")
    return coll, out, _needles(coll)


def _forget_in_another_process(coll: Path, ids: str, out: Path, stage: str | None, tmp_path: Path) -> None:
    """``Memory(coll).forget("ana-ben", ids, outputs=[out])`` in a child process; with ``stage``,
    ``kill -9`` it when the forget reaches that stage (``memory.erase.pause_point``)."""
    flag = tmp_path / f"paused-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if stage:
        env["TRAWMEM_FORGET_PAUSE"] = f"{stage}:{flag}"
    p = subprocess.Popen([sys.executable, "-c", _KILLED, str(coll), ids, str(out)], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if stage is not None:
        kill_when_paused(p, flag)
        return
    try:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
    finally:
        if p.poll() is None:
            p.kill()


def _dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "coll", tmp_path / "cache", tmp_path / "scores"]


def _open(how: str, coll: Path, capsys):
    """Open the collection as ``how`` does; returns what holds it (for the in-process search)."""
    if how == "memory":
        from trawmem_gpu import Memory

        return Memory(coll)
    if how == "serve":
        from trawmem_gpu.serve.config import ServeConfig
        from trawmem_gpu.serve.service import SelectionService

        return SelectionService(ServeConfig(collection=str(coll), threads=1)).core
    assert main(["forget", "--collection", str(coll), "--bank", "other", "--turns", "never-there"]) == 0
    assert "finished an interrupted forget of 'ana-ben'" in capsys.readouterr().err
    return None


@pytest.mark.parametrize("stage,whole,how", [("journaled", False, "memory"), ("stored", False, "memory"),
                                             ("stored", True, "memory"), ("journaled", True, "serve"),
                                             ("stored", False, "serve"), ("stored", False, "cli")])
def test_a_killed_forget_is_finished_by_the_next_open(built, tmp_path, capsys, stage, whole, how):
    from trawmem_gpu.memory.erase import read_journal
    from trawmem_gpu.store import Collection

    coll, out, needles = built
    _forget_in_another_process(coll, "-" if whole else MARKER_ID, out, stage, tmp_path)
    assert read_journal(coll, "ana-ben").outputs == [str(out.resolve())]  # the journal names the outputs
    assert _traces(_dirs(tmp_path), needles)  # the kill left traces
    held = _open(how, coll, capsys)
    assert _traces(_dirs(tmp_path), needles, held) == []
    assert not list((coll / ".forget").glob("*"))
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ([] if whole else ["q1"])
    c = Collection(coll)
    assert ("ana-ben" in c) != whole and "other" in c
    if not whole:
        assert MARKER_ID not in c.load("ana-ben").index_of()


@pytest.mark.parametrize("stage", ["journaled", "stored"])
def test_a_rerun_without_the_outputs_still_scrubs_them(built, tmp_path, stage):
    """A Memory opened before the kill (so no open finishes it) reruns the forget without naming
    the outputs: the journal's outputs are scrubbed, and the turn counts as forgotten, not missing."""
    from trawmem_gpu import Memory

    coll, out, needles = built
    mem = Memory(coll)
    assert MARKER_ID in mem.select("ana-ben", QUESTION, budget=40).unit_ids
    _forget_in_another_process(coll, MARKER_ID, out, stage, tmp_path)
    res = mem.forget("ana-ben", [MARKER_ID])
    assert res["forgotten"] == [MARKER_ID] and res["missing"] == [] and res["output_records"] == 1
    assert _traces(_dirs(tmp_path), needles, mem) == []
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["q1"]
    assert MARKER_ID not in mem.select("ana-ben", QUESTION, budget=40).unit_ids
    assert mem.forget("ana-ben", [MARKER_ID])["missing"] == [MARKER_ID]  # and once done, it is done


@pytest.mark.parametrize("stage,route", [(None, "delete"), (None, "post"), ("journaled", "delete"),
                                         ("stored", "post")])
def test_a_forget_beside_the_server_is_finished_through_it(built, tmp_path, stage, route):
    """``Memory(coll).forget`` from another process while the server runs (finished, or killed at
    a stage): the server's forget route re-reads the bank, forgets the turn in its engine too and
    answers it forgotten; ``/v1/select`` no longer returns it, and no trace is left."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_util import running
    from trawmem_gpu.serve.config import ServeConfig

    coll, out, needles = built
    q = {"bank_id": "ana-ben", "question": QUESTION, "budget": 40}
    with running(ServeConfig(collection=str(coll), max_wait_ms=1, threads=1)) as (url, service, _), \
            httpx.Client(base_url=url, timeout=300) as c:
        assert MARKER_ID in [u["id"] for u in c.post("/v1/select", json=q).json()["units"]]
        _forget_in_another_process(coll, MARKER_ID, out, stage, tmp_path)
        if route == "delete":
            r = c.delete(f"/v1/banks/ana-ben/turns/{MARKER_ID}")
        else:
            r = c.post("/v1/banks/ana-ben/forget", json={"turn_ids": [MARKER_ID]})
        assert r.status_code == 200, r.text
        assert MARKER_ID in r.json()["forgotten"] and r.json()["missing"] == []
        units = [u["id"] for u in c.post("/v1/select", json=q).json()["units"]]
        assert units and MARKER_ID not in units
        assert MARKER not in json.dumps(c.post("/v1/select", json=q).json())
        assert _traces(_dirs(tmp_path), needles, service.core) == []
        assert not list((coll / ".forget").glob("*"))
        assert c.post("/v1/select", json={"bank_id": "other", "question": "kayak"}).json()["units"]
