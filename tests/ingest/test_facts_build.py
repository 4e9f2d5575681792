"""``trawmem build --facts`` (issue 21.1): the facts layer from LoCoMo observations, stored with the
turns, and ``--update`` adding facts for the new turns only; the ``llm`` hook's contract."""
from __future__ import annotations

import json

import numpy as np
import pytest

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.ingest.layers.facts import attach_facts
from trawmem_gpu.store import Collection
from locomo_files import _sample


def _main(argv):
    from trawmem_gpu.cli import main

    return main(argv)


def test_build_facts_locomo_and_update(tmp_path, capsys):
    part, full = tmp_path / "part.json", tmp_path / "full.json"
    part.write_text(json.dumps([_sample(2)]), encoding="utf-8")
    full.write_text(json.dumps([_sample(3)]), encoding="utf-8")
    out = tmp_path / "coll"
    assert _main(["build", "--input", str(part), "--out", str(out), "--facts", "locomo", "--quiet"]) == 0
    assert "facts: 8 facts added" in capsys.readouterr().out
    b = Collection(out).load("made-up")
    assert len(b.facts) == 8 and b.fact_vecs.shape == (8, b.unit_vecs.shape[1])
    assert b.layer_sources == {"facts": "locomo"}
    assert _main(["info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layers"] == {"facts": 8, "profile_sections": 0}
    assert b.facts[3].source_turns == ("D1:2", "D1:4") and b.facts[3].persons == ("Ben",)
    assert np.allclose(np.linalg.norm(b.fact_vecs, axis=1), 1.0, atol=1e-5)
    # --update continues with the bank's own facts source and adds the new session's facts only
    assert _main(["build", "--input", str(full), "--out", str(out), "--update", "--quiet"]) == 0
    assert "+4 facts" in capsys.readouterr().out
    u = Collection(out).load("made-up")
    assert u.facts[:8] == b.facts and np.array_equal(u.fact_vecs[:8], b.fact_vecs)
    assert {f.session for f in u.facts[8:]} == {"3"}
    # the same as a full build with facts (same facts, same vectors)
    out2 = tmp_path / "coll2"
    assert _main(["build", "--input", str(full), "--out", str(out2), "--facts", "locomo", "--quiet"]) == 0
    f2 = Collection(out2).load("made-up")
    assert f2.facts == u.facts and np.allclose(f2.fact_vecs, u.fact_vecs, atol=1e-6)
    # without --facts, a plain build keeps no layer
    out3 = tmp_path / "coll3"
    assert _main(["build", "--input", str(part), "--out", str(out3), "--quiet"]) == 0
    assert Collection(out3).load("made-up").facts == ()


def test_facts_llm_without_extractor_is_a_clear_error(tmp_path, capsys):
    p = tmp_path / "s.json"
    p.write_text(json.dumps([_sample(1)]), encoding="utf-8")
    assert _main(["build", "--input", str(p), "--out", str(tmp_path / "o"), "--facts", "llm", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "llm" in err


def test_facts_locomo_needs_a_locomo_input(tmp_path, capsys):
    p = tmp_path / "h.jsonl"
    p.write_text(json.dumps({"bank_id": "b", "turn_id": "t1", "speaker": "Ana", "text": "hello there",
                             "timestamp": "2031-05-01"}) + "\n", encoding="utf-8")
    assert _main(["build", "--input", str(p), "--out", str(tmp_path / "o"), "--facts", "locomo", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "LoCoMo-layout input" in err and "Traceback" not in err


def test_attach_facts_checks_its_source():
    with pytest.raises(ConfigError, match="`facts` must be one of"):
        attach_facts([], "gpt", None)
    with pytest.raises(ConfigError, match="needs an LLM"):
        from engine_banks import make_bank
        attach_facts([make_bank("b", [3], 0)], "llm", None)


def test_query_and_eval_with_facts_as_units(tmp_path, capsys):
    data = tmp_path / "s.json"
    data.write_text(json.dumps([_sample(2)]), encoding="utf-8")
    out = tmp_path / "coll"
    assert _main(["build", "--input", str(data), "--out", str(out), "--facts", "locomo", "--quiet"]) == 0
    capsys.readouterr()
    q = ["query", "--bank", str(out), "--question", "What did Ana say about the violin?", "--token-budget", "200",
         "--json"]
    assert _main(q) == 0
    plain = json.loads(capsys.readouterr().out)
    assert not any(u.startswith("F:") for u in plain["units"])
    assert _main(q + ["--units", "turns,facts"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert any(u.startswith("F:") for u in got["units"]) and " from D" in got["workspace"]
    assert got["tokens"] <= 200
    assert _main(q + ["--units", "turns,profiles"]) == 2
    assert "has no profiles" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # refused at parse time, naming the flag
        _main(q + ["--units", "facts"])
    assert e.value.code == 2 and "argument --units: must include 'turns'" in capsys.readouterr().err
    # eval over turns and facts (facts from the data file): recall with citations and the mix
    res = tmp_path / "r.json"
    assert _main(["eval", "--data", str(data), "--token-budget", "120", "--units", "turns,facts", "--facts", "locomo",
                  "--output", str(res)]) == 0
    assert "with citations" in capsys.readouterr().out
    r = json.loads(res.read_text())
    rec = r["records"][0]
    assert {"evidence_recall_cited", "n_facts", "n_turns"} <= set(rec)
    assert rec["evidence_recall_cited"] >= rec["evidence_recall"]
    assert r["config"]["units"] == ["turns", "facts"]


def test_sweep_with_facts_as_units(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "s.json"
    data.write_text(json.dumps([_sample(2)]), encoding="utf-8")
    base = ["sweep", "--data", str(data), "--budget", "6", "--hops", "1", "--method", "trawmem", "--rounds", "1",
            "--warmup", "0", "--batch-size", "4", "--quiet"]
    assert _main(base + ["--output", str(tmp_path / "a.json")]) == 0
    assert _main(base + ["--units", "turns,facts", "--facts", "locomo", "--output", str(tmp_path / "b.json")]) == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    (ca,), (cb,) = a["cells"], b["cells"]
    assert cb["candidates_mean"] > ca["candidates_mean"]  # the facts joined the candidates


def test_update_keeps_a_fact_of_a_new_turn_whose_number_a_stored_fact_has(tmp_path, capsys):
    """A LoCoMo observation dropped at the first build (its turn not in the bank yet) shifts the
    numbers of the session's later facts: on ``--update`` the fact of the new turn must still be added."""
    full = _sample(1)
    part = json.loads(json.dumps(full))
    part["conversation"]["session_1"] = part["conversation"]["session_1"][:4]  # D1:5, D1:6 come later
    pp, fp = tmp_path / "part.json", tmp_path / "full.json"
    pp.write_text(json.dumps([part]), encoding="utf-8")
    fp.write_text(json.dumps([full]), encoding="utf-8")
    out = tmp_path / "coll"
    assert _main(["build", "--input", str(pp), "--out", str(out), "--facts", "locomo", "--quiet"]) == 0
    b = Collection(out).load("made-up")
    assert not any("D1:5" in f.source_turns for f in b.facts)
    assert _main(["build", "--input", str(fp), "--out", str(out), "--update", "--quiet"]) == 0
    capsys.readouterr()
    u = Collection(out).load("made-up")
    assert u.facts[:len(b.facts)] == b.facts
    assert [f.source_turns for f in u.facts[len(b.facts):]] == [("D1:5",)]
    assert len({f.fact_id for f in u.facts}) == len(u.facts)
