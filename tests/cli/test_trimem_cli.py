"""TriMem on the command line against the local protocol server (``trimem_fake.respond``):
``build --facts llm --profiles llm`` and its ``--update``, ``eval`` / ``query --method trimem``
(planning on), and ``evolve-prompts`` with its versions, its best prompts and its resumable state."""
from __future__ import annotations

import json

import pytest

from trawmem_gpu.cli import main
from trawmem_gpu.store import Collection
from trimem_fake import EVOLVE_LINE, respond, write_locomo

S1 = [("Ana", "I adopted a beagle called Rex, the answer is beagle."), ("Ben", "Ben likes pottery a lot."),
      ("Ana", "Rex likes the park by the river."), ("Ben", "I made a blue bowl, the answer is blue bowl.")]
S2 = [("Ben", "Ben works at the harbour office now."), ("Ana", "Rex chewed my boots, the answer is boots.")]
QA = [{"question": "What breed is Rex?", "answer": "beagle", "evidence": ["D1:1"], "category": 4},
      {"question": "What did Ben make?", "answer": "blue bowl", "evidence": ["D1:4"], "category": 4},
      {"question": "Where does Ben work?", "answer": "the harbour office", "evidence": ["D2:1"], "category": 1},
      {"question": "What did Rex chew?", "answer": "boots", "evidence": ["D2:2"], "category": 2}]


@pytest.fixture
def env(tmp_path, monkeypatch, server):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    server.responders.append(respond)
    return tmp_path


def _build(env, server, data, *extra):
    return main(["build", "--input", str(data), "--out", str(env / "coll"), "--facts", "llm", "--profiles", "llm",
                 "--llm", server.base_url, "--quiet", *extra])


def test_build_update_and_eval_with_trimem(env, server, capsys):
    first = write_locomo(env / "d1.json", [S1], QA[:2])
    assert _build(env, server, first) == 0
    out = capsys.readouterr().out
    assert "facts: 4 facts added" in out and "profiles: 2 persons, 2 created" in out
    bank = Collection(env / "coll").load("conv-x")
    assert len(bank.facts) == 4 and {p.person for p in bank.profiles} == {"Ana", "Ben"}
    assert bank.layer_sources == {"facts": "llm", "profiles": "llm"}
    before = {p.unit_id: p for p in bank.profiles}
    # --update with a second session: facts of the new turns only, Ben's career section only
    full = write_locomo(env / "d2.json", [S1, S2], QA)
    assert main(["build", "--input", str(full), "--out", str(env / "coll"), "--update", "--quiet"]) == 2
    assert "needs an LLM (--llm)" in capsys.readouterr().err  # the bank's layers are the LLM's: nothing written
    assert len(Collection(env / "coll").load("conv-x").facts) == 4
    server.reset_counts()
    assert main(["build", "--input", str(full), "--out", str(env / "coll"), "--update", "--llm", server.base_url,
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "+2 facts" in out and "profiles: 2 persons, 0 created, 2 updated" in out
    bank = Collection(env / "coll").load("conv-x")
    new = [f for f in bank.facts if f.session == "2"]
    assert [f.source_turns for f in new] == [("D2:1",), ("D2:2",)]
    after = {p.unit_id: p for p in bank.profiles}
    changed = sorted(k for k in after if after[k] != before.get(k))
    assert changed == ["P:Ana:interests", "P:Ben:career"]  # the sections the fake's update touches
    assert all(after[k] == before[k] for k in before if k not in changed)
    # eval --method trimem, planned, with answers
    res_path = env / "res.json"
    assert main(["eval", "--data", str(full), "--banks", str(env / "coll"), "--method", "trimem", "--budget", "4096",
                 "--plan-llm", server.base_url, "--answer-llm", server.base_url, "--output", str(res_path)]) == 0
    res = json.loads(res_path.read_text())
    assert res["method"] == "trimem" and res["trimem"]["planned"] == 4 and res["trimem"]["plan_fallbacks"] == 0
    rec = res["records"][0]
    assert any(u.startswith("F:") for u in rec["selected"]) and any(u.startswith("P:") for u in rec["selected"])
    assert rec["plan"]["queries"][0] == rec["question"] and res["macro"]["evidence_recall"] == 1.0
    assert res["macro"]["f1_locomo"] > 0  # answers came from the TriMem workspaces
    # query --method trimem under a token budget
    capsys.readouterr()
    assert main(["query", "--bank", str(env / "coll"), "--question", "What breed is Rex?", "--method", "trimem",
                 "--token-budget", "120", "--json"]) == 0
    q = json.loads(capsys.readouterr().out)
    assert q["tokens"] <= 120 and q["units"] and q["plan"]["queries"] == ["What breed is Rex?"]
    assert main(["query", "--bank", str(env / "coll"), "--question", "What breed is Rex?", "--method", "hybrid",
                 "--budget", "2", "--json"]) == 0
    h = json.loads(capsys.readouterr().out)
    assert len(h["units"]) == 2 and not any(u.startswith("F:") for u in h["units"])
    assert main(["query", "--bank", str(env / "coll"), "--question", "Q?", "--method", "trimem", "--units",
                 "turns,facts"]) == 2
    assert "--units does not apply to --method trimem" in capsys.readouterr().err
    # score and sweep take --method trimem too (no planning there)
    qs = env / "q.jsonl"
    qs.write_text(json.dumps({"id": "q1", "bank_id": "conv-x", "question": "What did Rex chew?"}) + "\n")
    assert main(["score", "--questions", str(qs), "--banks", str(env / "coll"), "--method", "trimem",
                 "--token-budget", "150", "--out", str(env / "s.jsonl"), "--quiet"]) == 0
    rec = json.loads((env / "s.jsonl").read_text().splitlines()[0])
    assert rec["tokens"] <= 150 and any(u.startswith("F:") for u in rec["units"]) and "[F:" in rec["workspace"]
    assert main(["sweep", "--data", str(full), "--banks", str(env / "coll"), "--method", "trimem,hybrid",
                 "--budget", "8", "--token-budget", "200", "--hops", "1", "--warmup", "0", "--rounds", "1",
                 "--output", str(env / "sw.json"), "--quiet"]) == 0
    cells = {c["key"]: c for c in json.loads((env / "sw.json").read_text())["cells"]}
    assert {"trimem B=8", "trimem T=200", "hybrid T=200"} <= set(cells)
    assert cells["trimem T=200"]["context_tokens"]["mean"] <= 200


def test_profiles_need_facts_and_method_trimem_needs_facts(env, server, capsys):
    data = write_locomo(env / "d.json", [S1], QA[:2])
    assert main(["build", "--input", str(data), "--out", str(env / "c"), "--profiles", "llm", "--llm",
                 server.base_url]) == 2
    assert "--profiles llm builds profiles from facts" in capsys.readouterr().err
    assert main(["build", "--input", str(data), "--out", str(env / "c"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["query", "--bank", str(env / "c"), "--question", "What breed is Rex?", "--method", "trimem"]) == 2
    err = capsys.readouterr().err
    assert "has no facts" in err and "Traceback" not in err


def test_evolve_prompts_versions_best_and_resume(env, server, capsys, monkeypatch):
    from trawmem_gpu.eval import evolve

    data = write_locomo(env / "dev.json", [S1, S2], QA)
    args = ["evolve-prompts", "--data", str(data), "--llm", server.base_url, "--steps", "2", "--out", str(env / "ev")]
    real = evolve.Evolution.memory
    calls = []

    def dies_at_version_1(self, ps):
        calls.append(ps.sha)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, ps)

    monkeypatch.setattr(evolve.Evolution, "memory", dies_at_version_1)
    assert main(args) == 130  # killed while building version 1
    st = json.loads((env / "ev" / "state.json").read_text())
    assert [v["version"] for v in st["versions"]] == [0] and st["next"]["version"] == 1 and not st["done"]
    capsys.readouterr()
    monkeypatch.setattr(evolve.Evolution, "memory", real)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("version 1:")  # continued, version 0 not redone
    st = json.loads((env / "ev" / "state.json").read_text())
    assert [v["version"] for v in st["versions"]] == [0, 1, 2] and st["done"]
    v0, v1, v2 = (json.loads((env / "ev" / f"v{k}.json").read_text()) for k in range(3))
    assert v0["wrong"] and v0["to_next"]["applied"] == ["extract", "profile"]
    assert EVOLVE_LINE in v1["prompts"]["prompts"]["extract"]["template"]
    assert v1["prompts"]["prompts"]["extract"]["version"] == "evolved-1" and "to_next" not in v2
    assert all(isinstance(v["score"], float) for v in (v0, v1, v2))
    best = json.loads((env / "ev" / "best_prompts.json").read_text())
    assert best["version"] == max(st["versions"], key=lambda v: (v["score"], -v["version"]))["version"]
    # a finished run reruns as a no-op; another configuration is refused
    assert main(args) == 0
    assert main(args[:-4] + ["--steps", "3", "--out", str(env / "ev")]) == 2
    assert "another configuration (steps differ)" in capsys.readouterr().err
    # the evolved prompts drive a build
    (env / "p.json").write_text(json.dumps({**v1["prompts"]}))
    monkeypatch.setenv("TRAWMEM_CACHE", str(env / "cache2"))  # evolution's own requests are cached
    server.reset_counts()
    assert main(["build", "--input", str(data), "--out", str(env / "c2"), "--facts", "llm", "--llm", server.base_url,
                 "--prompts", str(env / "p.json"), "--quiet"]) == 0
    sent = [b["messages"][0]["content"] for b in server.bodies]
    assert any(EVOLVE_LINE in s for s in sent)


def test_serve_method_trimem(env, server):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    import httpx
    from serve_util import running

    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.serve.config import ServeConfig

    assert _build(env, server, write_locomo(env / "d.json", [S1, S2], QA)) == 0
    with pytest.raises(ConfigError, match="method trimem shows its own units"):
        ServeConfig(collection=str(env / "coll"), method="trimem", units=("turns", "facts"))
    with running(ServeConfig(collection=str(env / "coll"), method="trimem", max_wait_ms=2)) as (url, _, _srv):
        with httpx.Client(base_url=url, timeout=60) as c:
            r = c.post("/v1/select", json={"bank_id": "conv-x", "question": "What did Rex chew?",
                                           "token_budget": 150})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = [u["id"] for u in body["units"]]
    assert any(i.startswith("F:") for i in ids) and "D2:2" in ids and body["n_tokens"] <= 150
    assert "[F:" in body["text"] and "## " not in body["text"]  # no thread headings


def test_update_does_not_extract_again_a_fact_the_bank_already_states(env, server, capsys):
    """``build --update --facts llm`` hands the stored facts to the extraction: a new turn that
    restates a stored fact word for word adds no second copy of it; a new sentence is added."""
    first = write_locomo(env / "d1.json", [S1], QA[:2])
    assert _build(env, server, first) == 0
    again = [S1[1], ("Ana", "Rex learned to fetch the paper.")]  # Ben's line said again, and a new one
    full = write_locomo(env / "d2.json", [S1, again], QA[:2])
    assert main(["build", "--input", str(full), "--out", str(env / "coll"), "--update", "--llm", server.base_url,
                 "--quiet"]) == 0
    capsys.readouterr()
    facts = Collection(env / "coll").load("conv-x").facts
    texts = [f.text for f in facts]
    assert len(texts) == len(set(texts))  # without the stored facts, Ben's sentence came twice
    assert [f.source_turns for f in facts if f.session == "2"] == [("D2:2",)]


def test_evolve_prompts_whose_facts_are_all_refused_score_zero_and_go_on(env, server, capsys):
    # SmolLM2-135M copies the extraction template: every fact cites "<turn id>" and is refused, so
    # no bank has facts; the version scores 0 and its critique is told that nothing was kept
    from trawmem_gpu.eval.evolve import NO_FACTS

    def template_copy(messages):
        if messages[0]["content"].startswith("You are a memory extraction agent"):
            return json.dumps({"facts": [{"text": "<one sentence>", "source_turns": ["<turn id>"], "persons": [],
                                          "date": None}]})
        return None

    server.responders.insert(0, template_copy)
    data = write_locomo(env / "dev.json", [S1, S2], QA)
    assert main(["evolve-prompts", "--data", str(data), "--llm", server.base_url, "--steps", "1", "--out",
                 str(env / "ev")]) == 0
    v0 = json.loads((env / "ev" / "v0.json").read_text())
    assert v0["score"] == 0.0 and len(v0["wrong"]) == len(QA)
    assert any(NO_FACTS in b["messages"][0]["content"] for b in server.bodies)  # the critic saw why
