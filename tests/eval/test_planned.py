"""Planned TrawMem (``eval.planned``): the LLM-free path is the engine's own selection, planned
searches and follow-ups bring in units the question alone does not pick while B and T hold,
malformed replies fall back and are counted, one encoder and one engine call per stage, and the
command line (``query`` / ``eval --method trawmem --plan-llm``), against the local protocol server."""
from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest

from engine_banks import D, make_bank
from trawmem_gpu.cli import main
from trawmem_gpu.errors import ConfigError
from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.params import QueryParams
from trawmem_gpu.eval.planned import merge_picks, plan_summary, planned_select
from trawmem_gpu.select.trimem.plan import QueryPlan, parse_follow_ups, plain_plan
from trawmem_gpu.select.workspace import assemble, token_costs
from trimem_fake import write_locomo

PARAMS = [QueryParams(budget=16), QueryParams(budget=5), QueryParams(budget=None, token_budget=120),
          QueryParams(budget=6, token_budget=300), QueryParams(budget=8, hops=2)]


def _vec(text: str, d: int = D) -> np.ndarray:
    """A made-up query vector per text (deterministic)."""
    x = np.random.default_rng(int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)).normal(size=d)
    return (x / np.linalg.norm(x)).astype(np.float32)


class Counted:
    """An encoder function and an engine whose calls are counted."""

    def __init__(self, engine, encode):
        self.engine, self._encode = engine, encode
        self.encodes, self.encoded, self.selects = 0, [], 0
        real = engine.select_units

        def select_units(*a, **kw):
            self.selects += 1
            return real(*a, **kw)

        engine.select_units = select_units

    def encode(self, texts):
        self.encodes += 1
        self.encoded.append(list(texts))
        return self._encode(texts)


@pytest.fixture(scope="module")
def rbanks():
    return [make_bank("odd", [3, 1, 5, 2, 7, 4, 1, 6, 3], seed=1, n_semantic=5), make_bank("tiny", [1, 2], seed=3),
            make_bank("wide", [2, 3, 4, 5] * 8, seed=4, n_semantic=20)]


@pytest.fixture(scope="module")
def reng(rbanks):
    return SelectionEngine(rbanks, device="cpu")


def _ritems(rbanks):
    rng = np.random.default_rng(5)
    items = [(b.bank_id, f"did Ann {w} the {v}?") for b in rbanks for w, v in zip(("like", "paint", "see", "cook"),
                                                                                    rng.permutation(["dog", "lake",
                                                                                                     "piano", "art"]))]
    return items, np.stack([_vec(q) for _, q in items])


def _backend(server, *responders):
    server.responders[:0] = list(responders)
    return OpenAIHTTPBackend(server.base_url, model="test-model-a", max_retries=0)


def _question(messages) -> str:
    return messages[0]["content"].split("Question: ", 1)[1].split("\n", 1)[0]


# -- the LLM-free path ------------------------------------------------------------------------
def test_single_search_is_the_engines_own_workspace_on_random_banks(rbanks, reng):
    items, Z = _ritems(rbanks)
    ids, qs = [b for b, _ in items], [q for _, q in items]
    for qp in PARAMS:
        want = reng.select_units(ids, qs, Z, params=qp)
        c = Counted(reng, lambda xs: np.stack([_vec(x) for x in xs]))
        got = planned_select(reng, items, Z, qp, encode=c.encode)
        assert [g.units for g in got] == want, qp
        assert c.encodes == 0 and c.selects == 1  # the questions' own vectors, one engine call
        assert all(g.plan == plain_plan(q) and set(g.sources) <= {0} for g, q in zip(got, qs))
        del reng.select_units
        # given plans of one search each: the same
        got = planned_select(reng, items, Z, qp, encode=c.encode, plans=[plain_plan(q) for q in qs])
        assert [g.units for g in got] == want


@pytest.mark.slow
def test_single_search_is_the_engines_own_workspace_on_dev_banks(dev_path):
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.retrieval import banks_for

    convs, banks, _ = banks_for(dev_path, BuildConfig(), progress=False)
    convs, banks = convs[:2], banks[:2]
    enc = get_encoder()
    items = [(c.bank_id, q.question) for c in convs for q in
             [q for q in c.questions if q.category in (1, 2, 3, 4) and q.evidence][:20]]
    Z = enc.encode([q for _, q in items], is_query=True)
    eng = SelectionEngine(banks, device="cpu")
    for qp in (QueryParams(budget=16), QueryParams(budget=None, token_budget=400),
               QueryParams(budget=8, token_budget=800)):
        want = eng.select_units([b for b, _ in items], [q for _, q in items], Z, params=qp)
        got = planned_select(eng, items, Z, qp, encode=lambda xs: enc.encode(xs, is_query=True))
        assert [g.units for g in got] == want, qp


def test_merge_keeps_b_and_t_and_skips_what_overflows(rbanks):
    b = rbanks[0]
    costs = token_costs(b, "date")
    lists = [[0, 1, 2, 3], [5, 1, 9], [12, 13]]
    u, s = merge_picks(lists, costs, b.unit_thread, None, None)
    assert u == [0, 5, 12, 1, 13, 2, 9, 3] and s == [0, 1, 2, 0, 2, 0, 1, 0]  # round robin, each unit once
    assert merge_picks(lists, costs, b.unit_thread, 4, None)[0] == [0, 5, 12, 1]
    T = costs.cost([0, 5], b.unit_thread) + int(costs.unit[1])  # room for unit 1 (thread 0's heading paid)
    u, _ = merge_picks(lists, costs, b.unit_thread, None, T)
    assert u[:2] == [0, 5] and costs.cost(u, b.unit_thread) <= T and 12 not in u and 1 in u


# -- planned searches and follow-ups against the local protocol server ------------------------
@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The bundled sample conversation as one bank, with the real query encoder."""
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.data import load_conversations, sample_path
    from trawmem_gpu.encode import get_encoder

    enc = get_encoder()
    banks, _ = build_banks(load_conversations(sample_path())[:1], encoder=enc, progress=False)
    return banks[0], enc


def _first_new(eng, bank, enc, taken, qp, skip=()):
    """A turn's text whose search's first pick is a unit not in ``taken``: ``(text, that unit)``."""
    for t in bank.turns:
        if t.text in skip:
            continue
        (p,) = eng.select_units([bank.bank_id], [t.text], enc.encode([t.text], is_query=True), params=qp)
        if p and p[0] not in taken:
            return t.text, p[0]
    raise AssertionError("no turn's search picks a unit the question leaves out")


@pytest.mark.parametrize("qp", [QueryParams(budget=4), QueryParams(budget=None, token_budget=160)],
                         ids=["B=4", "T=160"])
def test_second_search_brings_in_a_unit_the_question_leaves_out(server, sample, qp):
    bank, enc = sample
    eng = SelectionEngine([bank], device="cpu")
    q = "How did Ana's knee do in the race?"
    z = enc.encode([q], is_query=True)
    (plain,) = eng.select_units([bank.bank_id], [q], z, params=qp)
    target_text, target = _first_new(eng, bank, enc, set(plain), qp)

    def planner(messages):
        if messages[0]["content"].startswith("Plan searches"):
            return json.dumps({"queries": [_question(messages), target_text]})
        return None

    llm = _backend(server, planner)
    c = Counted(eng, lambda xs: enc.encode(xs, is_query=True))
    (got,) = planned_select(eng, [(bank.bank_id, q)], z, qp, encode=c.encode, llm=llm)
    assert got.plan.queries == (q, target_text) and got.plan.planned and got.plan.fallback == ()
    assert target in got.units and target not in plain and got.sources[got.units.index(target)] == 1
    assert got.units[0] == plain[0]  # the question's own first pick leads
    ws = assemble(bank, q, got.units, eng.cfg.headings)
    if qp.token_budget is None:
        assert len(got.units) <= qp.budget
    else:
        assert ws.n_tokens <= qp.token_budget
        assert token_costs(bank, eng.cfg.headings).cost(got.units, bank.unit_thread) <= qp.token_budget
    assert c.encodes == 1 and c.encoded == [[target_text]] and c.selects == 1
    assert set(llm.usage.stages) == {"trimem-target-query"}  # planned TrawMem skips the key-information step
    llm.close()


def test_follow_up_fills_the_rest_of_the_budget(server, sample):
    bank, enc = sample
    eng = SelectionEngine([bank], device="cpu")
    qp = QueryParams(budget=6)
    q = "How did Ana's knee do in the race?"
    z = enc.encode([q], is_query=True)
    (plain,) = eng.select_units([bank.bank_id], [q], z, params=qp)
    fu_text, fu_unit = _first_new(eng, bank, enc, set(plain), qp)
    seen = []

    def model(messages):
        text = messages[0]["content"]
        if text.startswith("Plan searches"):
            return json.dumps({"queries": [_question(messages)]})  # the question alone
        if text.startswith("A memory of past conversations was searched"):
            seen.append(text)
            return json.dumps({"queries": [fu_text, q]})  # the question itself is left out
        return None

    llm = _backend(server, model)
    c = Counted(eng, lambda xs: enc.encode(xs, is_query=True))
    (got,) = planned_select(eng, [(bank.bank_id, q)], z, qp, encode=c.encode, llm=llm, follow_up=True)
    assert got.follow_ups == (fu_text,) and not got.follow_up_fallback and got.searches == (q, fu_text)
    assert len(got.units) == 6 and fu_unit in got.units and got.sources[got.units.index(fu_unit)] == 1
    assert got.units[:4] == plain[:4] and got.units[4] == fu_unit  # stage 1 kept 6 - round(6 / 4) = 4
    # the model saw the question and the stage-1 workspace's text (its 4 units, with their ids)
    (prompt,) = seen
    assert f"Question: {q}" in prompt and all(f"[{bank.turns[u].turn_id}]" in prompt for u in plain[:4])
    assert f"[{bank.turns[plain[5]].turn_id}]" not in prompt
    assert (c.encodes, c.selects) == (1, 2) and c.encoded == [[fu_text]]  # no extra plan search: stage 2's only
    d = got.to_dict()
    assert d["follow_ups"] == [fu_text] and d["queries"] == [q] and len(d["sources"]) == 6
    llm.close()


def test_a_batch_costs_one_encoder_and_one_engine_call_per_stage(server, sample):
    bank, enc = sample
    eng = SelectionEngine([bank], device="cpu")
    qs = ["How did Ana's knee do in the race?", "Where did Clara move for her job?", "What did Ben cook?"]
    Z = enc.encode(qs, is_query=True)

    def model(messages):
        text, q = messages[0]["content"], None
        if text.startswith(("Plan searches", "A memory of past conversations was searched")):
            q = _question(messages)
        if text.startswith("Plan searches"):
            return json.dumps({"queries": [q, f"{q.split()[2]} plans", "the weekend"]})  # one search shared
        if q is not None:
            return json.dumps({"queries": [f"{q.split()[2]} later", "the weekend", "a third one"]})
        return None

    llm = _backend(server, model)
    c = Counted(eng, lambda xs: enc.encode(xs, is_query=True))
    qp = QueryParams(budget=None, token_budget=300)
    got = planned_select(eng, [(bank.bank_id, q) for q in qs], Z, qp, encode=c.encode, llm=llm, follow_up=True)
    assert (c.encodes, c.selects) == (2, 2)
    first, second = c.encoded
    assert sorted(first) == sorted({g.plan.queries[k] for g in got for k in (1, 2)}) and len(first) == 4
    assert all(g.follow_ups[0].endswith("later") and len(g.follow_ups) == 2 for g in got)  # at most 2 kept
    assert "the weekend" not in second  # already searched by every plan
    costs = token_costs(bank, eng.cfg.headings)
    assert all(costs.cost(g.units, bank.unit_thread) <= 300 for g in got)
    assert all(assemble(bank, q, g.units, eng.cfg.headings).n_tokens <= 300 for q, g in zip(qs, got))
    llm.close()


def test_malformed_replies_fall_back_and_are_counted(server, sample):
    bank, enc = sample
    eng = SelectionEngine([bank], device="cpu")
    qp = QueryParams(budget=5)
    qs = ["What did Ana say BROKEN?", "Where did Clara move ONCE?", "What did Ben cook?"]
    Z = enc.encode(qs, is_query=True)
    want = eng.select_units([bank.bank_id] * 3, qs, Z, params=qp)

    def model(messages):
        text, retry = messages[0]["content"], len(messages) > 1
        if not text.startswith(("Plan searches", "A memory of past conversations was searched")):
            return None
        q = _question(messages)
        if "BROKEN" in q or ("ONCE" in q and not retry):
            return "sorry, no JSON here"
        return json.dumps({"queries": [] if text.startswith("A memory") and "Ben" in q else [q]})

    llm = _backend(server, model)
    c = Counted(eng, lambda xs: enc.encode(xs, is_query=True))
    got = planned_select(eng, [(bank.bank_id, q) for q in qs], Z, qp, encode=c.encode, llm=llm, follow_up=True)
    # a plan that is the question alone searches nothing more: refused (degenerate), like a malformed one
    assert [g.plan.fallback for g in got] == [("target_query",)] * 3
    assert [g.plan.fallback_why for g in got] == [("malformed reply",)] + [
        ("refused: degenerate: no search beyond the question",)] * 2
    assert [g.follow_up_fallback for g in got] == [True, False, False]  # Ben's empty list: nothing missing
    assert [g.units for g in got] == want  # no search beyond the question: the engine's own workspace
    s = plan_summary(got, llm)
    assert (s["planned"], s["plan_fallbacks"], s["follow_ups"], s["follow_up_fallbacks"]) == (0, 3, 0, 1)
    assert llm.usage.stages["trimem-target-query"].fallbacks == 3
    assert c.encodes == 0 and c.selects == 1  # nothing to encode or select in stage 2
    assert llm.usage.stages["trimem-target-query-retry"].calls == 2  # BROKEN and ONCE retried once each
    assert llm.usage.stages["trawmem-follow-up-retry"].calls == 2
    llm.close()


def test_parse_follow_ups_and_bad_arguments(rbanks, reng):
    assert parse_follow_ups('{"queries": ["a  b", "Q?", "c", "d"]}', ["q?"]) == ("a b", "c")
    assert parse_follow_ups('{"queries": []}', ["q"]) == ()
    assert parse_follow_ups("no", ["q"]) is None
    items, Z = _ritems(rbanks)
    enc = lambda xs: np.stack([_vec(x) for x in xs])  # noqa: E731
    with pytest.raises(ConfigError, match="`follow_up` needs an `llm`"):
        planned_select(reng, items, Z, encode=enc, follow_up=True)
    with pytest.raises(ConfigError, match="first search must be the item's question"):
        planned_select(reng, items[:1], Z[:1], encode=enc, plans=[QueryPlan("other", ("other",))])
    with pytest.raises(ConfigError, match="1 items but 2 `plans`"):
        planned_select(reng, items[:1], Z[:1], encode=enc, plans=[plain_plan(items[0][1])] * 2)
    with pytest.raises(ConfigError, match="`params` must be one QueryParams"):
        planned_select(reng, items[:2], Z[:2], [QueryParams()] * 2, encode=enc)
    with pytest.raises(KeyError):
        planned_select(reng, [("nope", "q")], Z[:1], encode=enc)


# -- the command line -------------------------------------------------------------------------
S1 = [("Ana", "I adopted a beagle called Rex last spring."), ("Ben", "Ben likes pottery a lot."),
      ("Ana", "Rex likes the park by the river."), ("Ben", "I made a blue bowl at the studio.")]
S2 = [("Ben", "Ben works at the harbour office now."), ("Ana", "Rex chewed my boots yesterday.")]
QA = [{"question": "What breed is Rex?", "answer": "beagle", "evidence": ["D1:1"], "category": 4},
      {"question": "Where does Ben work?", "answer": "the harbour office", "evidence": ["D2:1"], "category": 1}]


@pytest.fixture
def coll(tmp_path, monkeypatch, server):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))

    def model(messages):
        text = messages[0]["content"]
        if text.startswith("Plan searches"):
            q = _question(messages)
            return json.dumps({"queries": [q, "the harbour office"]})
        if text.startswith("A memory of past conversations was searched"):
            return json.dumps({"queries": ["Rex chewed boots"]})
        return None

    server.responders.insert(0, model)
    data = write_locomo(tmp_path / "d.json", [S1, S2], QA)
    assert main(["build", "--input", str(data), "--out", str(tmp_path / "coll"), "--quiet"]) == 0
    return tmp_path, data


def test_query_and_eval_with_plan_llm(coll, server, capsys):
    tmp, data = coll
    capsys.readouterr()
    args = ["query", "--bank", str(tmp / "coll"), "--question", "What breed is Rex?", "--budget", "3", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "plan" not in plain
    assert main([*args, "--plan-llm", server.base_url, "--follow-up"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["plan"]["queries"] == ["What breed is Rex?", "the harbour office"]
    assert got["plan"]["follow_ups"] == ["Rex chewed boots"] and len(got["units"]) == 3
    assert "D2:1" in got["units"]  # the planned search's unit
    assert main(["eval", "--data", str(data), "--banks", str(tmp / "coll"), "--budget", "2", "--plan-llm",
                 server.base_url, "--output", str(tmp / "r.json")]) == 0
    res = json.loads((tmp / "r.json").read_text())
    assert res["method"] == "trawmem" and res["plan"]["planned"] == 2 and res["plan"]["plan_fallbacks"] == 0
    assert res["plan"]["follow_up"] is False and res["plan"]["follow_ups"] == 0
    assert all(r["plan"]["queries"][1] == "the harbour office" and len(r["selected"]) <= 2 for r in res["records"])
    assert res["per_category"]["1"]["evidence_recall"] == 1.0
    assert main(["eval", "--data", str(data), "--banks", str(tmp / "coll"), "--token-budget", "200",
                 "--plan-llm", server.base_url, "--follow-up", "--output", str(tmp / "r2.json")]) == 0
    res = json.loads((tmp / "r2.json").read_text())
    assert res["plan"]["follow_ups"] == 2 and res["plan"]["follow_up_fallbacks"] == 0
    assert max(r["context_tokens"] for r in res["records"]) <= 200


@pytest.mark.parametrize("extra,msg", [
    (["--method", "hybrid", "--plan-llm", "URL"], "--plan-llm applies to --method trimem or trawmem, not hybrid"),
    (["--follow-up"], "--follow-up needs --method trawmem with --plan-llm"),
    (["--method", "trimem", "--plan-llm", "URL", "--follow-up"], "--follow-up needs --method trawmem"),
    (["--plan-llm", "ftp://nowhere"], "ftp://nowhere"),
])
def test_bad_plan_flags_are_one_line_errors(coll, server, capsys, extra, msg):
    tmp, data = coll
    extra = [server.base_url if x == "URL" else x for x in extra]
    capsys.readouterr()
    assert main(["query", "--bank", str(tmp / "coll"), "--question", "What breed is Rex?", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and msg in err, err


def test_eval_plan_llm_needs_the_batched_engine(coll, server, capsys):
    tmp, data = coll
    capsys.readouterr()
    assert main(["eval", "--data", str(data), "--banks", str(tmp / "coll"), "--engine", "reference", "--plan-llm",
                 server.base_url, "--output", str(tmp / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(r"--plan-llm with --method trawmem runs the batched engine", err) and "Traceback" not in err
    assert not (tmp / "r.json").exists()


def test_memory_with_a_plan_llm_selects_what_the_cli_does(coll, server, capsys):
    """``Memory(plan_llm=...)``: the same workspace as ``query --plan-llm`` (the planner's search
    brings its unit in), its searches on the result; without a plan LLM the plain selection."""
    from trawmem_gpu import Memory

    tmp, _ = coll
    capsys.readouterr()
    assert main(["query", "--bank", str(tmp / "coll"), "--question", "What breed is Rex?", "--budget", "3", "--json",
                 "--plan-llm", server.base_url, "--follow-up"]) == 0
    cli = json.loads(capsys.readouterr().out)
    llm = OpenAIHTTPBackend(server.base_url, model="test-model-a", max_retries=0)
    ws = Memory(tmp / "coll", plan_llm=llm, follow_up=True).select("conv-x", "What breed is Rex?", budget=3)
    assert set(ws.unit_ids) == set(cli["units"]) and "D2:1" in ws.unit_ids
    assert ws.searches == ("What breed is Rex?", "the harbour office", "Rex chewed boots")
    assert ws.to_dict()["searches"] == list(ws.searches)
    plain = Memory(tmp / "coll").select("conv-x", "What breed is Rex?", budget=3)
    assert plain.searches == () and "searches" not in plain.to_dict() and "D2:1" not in plain.unit_ids
    with pytest.raises(ConfigError, match="`follow_up` needs a `plan_llm`"):
        Memory(tmp / "coll", follow_up=True)
