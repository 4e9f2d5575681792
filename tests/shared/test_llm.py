"""LLM layer against a local fake OpenAI-compatible server (no real model)."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import sys

import pytest

from llm_server import MALFORMED_ALWAYS, MALFORMED_ONCE, LLMServer, http_backend, user_turn
from trawmem_gpu.ingest.llm_threads import llm_heads, llm_segment
from trawmem_gpu.errors import ConfigError, InputError, NoLLMConfigured
from trawmem_gpu.eval.answer import answer_and_judge
from trawmem_gpu.llm import CachedBackend, FakeBackend, LLMRequestError, LLMResult, NoLLM, backend_from_spec
from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend
from trawmem_gpu.llm.prompts import ALL_PROMPTS, ANSWER, JUDGE, SEGMENT
from trawmem_gpu.llm.structured import clean_answer, extract_json, parse_boundaries, parse_head, parse_judge

SECRET = "sk-test-SuperSecret-0123456789"


def _http(server, **kw) -> OpenAIHTTPBackend:
    kw.setdefault("timeout_s", 5)
    return http_backend(server, **kw)


_conv = user_turn


# -- transport ---------------------------------------------------------------------------------
def test_concurrency_bound_and_order(server):
    server.gate_at = 3  # the first three are held until all three are in flight
    be = _http(server, concurrency=3)
    res = be.chat([_conv(f"prompt {i}") for i in range(15)], max_tokens=8, desc="t")
    assert all(r.ok for r in res)
    assert [r.text for r in res] == [LLMServer.reply_for(_conv(f"prompt {i}")) for i in range(15)]
    assert server.requests == 15
    assert server.max_in_flight == 3  # reached (the gate), never passed (the bound)
    u = be.usage.summary()["t"]
    assert u["requests"] == 15 and u["errors"] == 0 and u["prompt_tokens"] == 30 and u["completion_tokens"] == 30
    assert server.bodies[0]["max_tokens"] == 8 and server.bodies[0]["temperature"] == 0.0


def test_retries_after_transient_500(server):
    server.fail_first = 3
    be = _http(server, max_retries=4)
    res = be.chat([_conv("a"), _conv("b")], max_tokens=8)
    assert all(r.ok for r in res)
    assert server.requests == 5


def test_retry_after_header_is_honoured(server, monkeypatch):
    server.fail_first, server.fail_status, server.retry_after = 1, 429, "0.3"
    be = _http(server, max_retries=2, backoff_s=0.001)
    slept = []
    real_sleep = asyncio.sleep

    def sleep(d, *a, **k):
        """Counts the backend's own waits only: an event loop another test left running in its own
        thread sleeps too (5.0 s polls, seen under load) and must not be counted."""
        if sys._getframe(1).f_globals.get("__name__") == OpenAIHTTPBackend.__module__:
            slept.append(d)
            d = 0
        return real_sleep(d, *a, **k)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    res = be.chat([_conv("a")], max_tokens=8)
    assert res[0].ok and server.requests == 2
    assert [d for d in slept if d] == [0.3]  # the server's Retry-After, not the 0.001 s backoff


def test_non_retryable_status_is_not_retried(server):
    server.fail_first, server.fail_status = 1, 404
    be = _http(server, max_retries=3, raise_if_all_failed=False)
    res = be.chat([_conv("a")], max_tokens=8)
    assert res[0].error and "404" in res[0].error and server.requests == 1


def test_timeout_records_error_then_raises_when_all_fail(server):
    server.hang = True  # never answers: the timeout fires however loaded the machine is
    be = _http(server, timeout_s=0.5, max_retries=1, raise_if_all_failed=False)
    res = be.chat([_conv("a")], max_tokens=8)
    assert res[0].error and "timeout after 0.5s" in res[0].error and res[0].text == ""
    assert "(after 1 attempt(s))" in res[0].error  # one request, waited for a second time, not sent twice
    # the server may read a request after its client gave up: count what it saw, not when
    assert server.wait_requests(1) == 1
    be2 = _http(server, timeout_s=0.5, max_retries=0)
    with pytest.raises(LLMRequestError, match="timeout"):
        be2.chat([_conv("b")], max_tokens=8)
    assert server.wait_requests(2) == 2


def test_connection_refused_raises_after_retries():
    srv = LLMServer().start()
    url = srv.base_url
    srv.stop()
    be = OpenAIHTTPBackend(url, model="m", max_retries=1, backoff_s=0.01, timeout_s=2, progress=False)
    with pytest.raises(LLMRequestError, match="all 1 requests"):
        be.chat([_conv("a")], max_tokens=8)


def test_check_finds_a_wrong_key_before_any_chat_request(server):
    server.required_key = "the-right-key"
    for key, how in ((None, "no API key"), ("wrong-key", "the API key from")):
        with pytest.raises(ConfigError, match=f"refused {how}.*HTTP 401.*TRAWMEM_API_KEY") as ei:
            _http(server, api_key=key).check()
        assert "wrong-key" not in str(ei.value)
    assert server.requests == 0
    _http(server, api_key="the-right-key", model="test-model-b").check()
    be = _http(server, api_key="the-right-key", model=None)
    be.check()
    assert be.model == "test-model-a"


def test_check_finds_a_model_the_server_does_not_serve(server):
    with pytest.raises(ConfigError, match=r"model 'typo-model' is not served.*'test-model-a', 'test-model-b'"):
        _http(server, model="typo-model").check()


def test_check_on_a_server_that_is_down():
    srv = LLMServer().start()
    url = srv.base_url
    srv.stop()
    be = OpenAIHTTPBackend(url, model="m", max_retries=0, timeout_s=2, progress=False)
    with pytest.raises(LLMRequestError, match="could not reach the LLM server"):
        be.check()


def test_timeout_bounds_a_hung_request(server):
    """A server that never answers costs --llm-timeout per wait: without the bound, chat()
    would wait until the server stops (after the test), so returning at all is the check. It has
    not shown that it streams (a request it could stop), so the request is waited for once more,
    never sent twice."""
    server.hang = True
    be = _http(server, timeout_s=0.3, max_retries=1, raise_if_all_failed=False)
    (r,) = be.chat([_conv("a")], max_tokens=8)
    assert "timeout after 0.3s" in r.error and "`timeout_s`" in r.error and "never sent twice" in r.error
    assert server.wait_requests(1) == 1


def test_deadline_bounds_all_requests_together(server):
    """6 requests, one at a time, to a server that never answers, with a 30 s timeout and 3
    retries each (12 minutes without a deadline) under a 1.5 s deadline: the first is cut at the
    deadline, the rest fail without being sent; no retry runs past it."""
    server.hang = True
    be = _http(server, concurrency=1, timeout_s=30, max_retries=3, deadline_s=1.5, raise_if_all_failed=False)
    res = be.chat([_conv(f"p{i}") for i in range(6)], max_tokens=8)
    assert not any(r.ok for r in res)
    assert re.search(r"timeout after [0-9.]+s", res[0].error)  # cut at the deadline (what was left of it)
    assert "deadline of 1.5s reached before the next retry" in res[0].error
    assert sum("deadline of 1.5s passed" in r.error for r in res[1:]) >= 4
    assert all("deadline" in r.error for r in res)
    assert server.wait_requests(1) <= 2  # the cut one (and at most one more sent at the deadline's edge)
    with pytest.raises(ConfigError):
        _http(server, deadline_s=0)


def test_failed_requests_are_not_cached_and_a_rerun_retries_only_them(server, tmp_path):
    server.fail_first, server.fail_status = 2, 500
    db = tmp_path / "llm.sqlite"
    batch = [_conv(f"q{i}") for i in range(5)]
    r1 = CachedBackend(_http(server, max_retries=0, concurrency=1), db).chat(batch, max_tokens=8)
    assert sum(not r.ok for r in r1) == 2 and server.requests == 5
    server.reset_counts()
    r2 = CachedBackend(_http(server, max_retries=0), db).chat(batch, max_tokens=8)
    assert all(r.ok for r in r2) and server.requests == 2
    assert [r.cached for r in r2] == [r.ok for r in r1]  # the failed ones were sent again


def test_bad_batch_is_input_error(server):
    be = _http(server)
    with pytest.raises(InputError, match="item 0"):
        be.chat([[{"role": "robot", "content": "x"}]], max_tokens=8)
    with pytest.raises(InputError):
        be.chat([[]], max_tokens=8)
    with pytest.raises(ConfigError):
        be.chat([_conv("a")], max_tokens=0)
    assert be.chat([], max_tokens=8) == [] and server.requests == 0


# -- spec / NoLLM / vLLM ---------------------------------------------------------------------
def test_spec_parsing(server):
    for s in (None, "none", "NONE", "  "):
        assert isinstance(backend_from_spec(s), NoLLM)
    be = backend_from_spec(server.base_url + "@my-model", progress=False)
    assert isinstance(be, OpenAIHTTPBackend) and be.model == "my-model" and be.base_url == server.base_url
    assert server.model_requests == 0
    be = backend_from_spec("http://10.0.0.1:8000/v1@Qwen/Qwen2.5-7B-Instruct")
    assert be.base_url == "http://10.0.0.1:8000/v1" and be.model == "Qwen/Qwen2.5-7B-Instruct"
    assert backend_from_spec("https://api.example.com/v1/").base_url == "https://api.example.com/v1"
    assert backend_from_spec("http://host:8000").base_url == "http://host:8000/v1"
    for bad in ("ftp://x/v1", "gpt-4o", "vllm:", "http://", "http://a b/v1"):
        with pytest.raises(ConfigError) as ei:
            backend_from_spec(bad)
        assert repr(bad) in str(ei.value) or "vllm:" in str(ei.value)


def test_first_model_from_models_endpoint(server):
    be = backend_from_spec(server.base_url, progress=False, backoff_s=0.01)
    res = be.chat([_conv("hello")], max_tokens=8)
    assert res[0].ok
    assert be.model == "test-model-a" and server.model_requests == 1
    assert server.bodies[0]["model"] == "test-model-a"


def test_nollm_message():
    with pytest.raises(NoLLMConfigured) as ei:
        NoLLM().chat([_conv("x")], max_tokens=8, desc="answer")
    msg = str(ei.value)
    assert msg.startswith("no LLM configured") and "`answer_llm`" in msg and "answer" in msg
    with pytest.raises(NoLLMConfigured):
        llm_segment([["a", "b"]], NoLLM())
    with pytest.raises(NoLLMConfigured):
        answer_and_judge([{"qid": "q", "question": "?", "category": 1, "gold": "g", "context": "c"}], NoLLM(), None)


def test_vllm_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    with pytest.raises(ConfigError, match=r"pip install trawmem_gpu\[vllm\]"):
        backend_from_spec("vllm:/models/some-model")


def test_vllm_backend_module_when_installed():
    pytest.importorskip("vllm")
    from trawmem_gpu.llm.vllm_offline import VLLMOfflineBackend, _json_sampling_kwargs

    assert isinstance(_json_sampling_kwargs(), dict)
    assert VLLMOfflineBackend.name == "vllm"


# -- structured output, segmentation, heads ----------------------------------------------------
def test_extract_json_tolerance():
    assert extract_json('```json\n{"a": [1, 2,]}\n```') == {"a": [1, 2]}
    assert extract_json('Here you go: {"boundaries": [0, 4]} hope it helps') == {"boundaries": [0, 4]}
    assert extract_json("{'head': 'Mel went hiking on 8 May 2023', }") == {"head": "Mel went hiking on 8 May 2023"}
    assert extract_json('<think>{"x": 1}</think> {"label": "WRONG"}') == {"label": "WRONG"}
    assert extract_json('{"ok": true, "v": null}') == {"ok": True, "v": None}
    for hopeless in ("", None, "no json here", '{"a": [1, 2', "{{{{", "]]"):
        assert extract_json(hopeless) is None


def test_parsers():
    assert parse_boundaries('{"boundaries": [4, 2, 2]}', 6) == [0, 2, 4]
    assert parse_boundaries("[0, '3']", 6) == [0, 3]
    assert parse_boundaries('{"boundaries": []}', 6) == [0]
    assert parse_boundaries('{"boundaries": [0, 6]}', 6) is None  # out of range
    assert parse_boundaries('{"boundaries": ["x"]}', 6) is None
    assert parse_boundaries('{"other": 1}', 6) is None
    assert parse_head('{"head": "  Mel and Jo  talk "}') == "Mel and Jo talk"
    assert parse_head('{"head": ""}') is None and parse_head("just prose") is None
    assert parse_judge('{"label": "correct"}') == "CORRECT"
    assert parse_judge("WRONG") == "WRONG" and parse_judge("The answer is CORRECT.") == "CORRECT"
    assert parse_judge("INCORRECT") == "WRONG"
    assert parse_judge("CORRECT or WRONG?") is None and parse_judge("maybe") is None
    assert clean_answer("<think>hmm</think>\nAnswer: 'Paris'") == "Paris"


def test_prompts_have_sha_and_render():
    for p in ALL_PROMPTS.values():
        assert len(p.sha) == 64 and p.name and p.version
    assert SEGMENT.sha != JUDGE.sha
    assert "Question: why?" in ANSWER.render(context="ctx", question="why?")
    with pytest.raises(KeyError):
        ANSWER.render(context="only")


def test_llm_segment_retry_and_fallback(server):
    be = _http(server)
    sessions = [
        [f"A: turn {i}" for i in range(7)],
        [f"B: {MALFORMED_ONCE} {i}" for i in range(5)],
        [f"C: {MALFORMED_ALWAYS} {i}" for i in range(4)],
        ["D: only one turn"],
        [],
    ]
    starts, why = llm_segment(sessions, be, max_retries=1)
    assert starts == [[0, 3, 6], [0, 3], None, [0], []]
    assert why == [None, None, "malformed reply", None, None]
    assert server.requests == 3 + 2  # one batched attempt, then the two malformed ones once more
    assert set(be.usage.summary()) == {"segment", "segment-retry"}


def test_llm_heads_retry_and_fallback(server):
    be = _http(server)
    threads = ["[7 May 2023] Mel: I ran a charity race.", f"[8 May] {MALFORMED_ALWAYS}", "",
               f"x {MALFORMED_ONCE} Mel ran a race in May"]
    heads, why = llm_heads(threads, be)
    assert heads[0] == "Summary: Mel: I ran a charity race."
    assert heads[1] is None and heads[2] is None and heads[3].startswith("Summary: x")
    assert why == [None, "malformed reply", "failed: empty thread", None]
    heads0, why0 = llm_heads([f"{MALFORMED_ALWAYS}"], be, max_retries=0)
    assert heads0 == [None] and why0 == ["malformed reply"]


# -- cache -------------------------------------------------------------------------------------
def test_cache_resume_sends_nothing_second_time(server, tmp_path):
    db = tmp_path / "cache" / "llm.sqlite"
    batch = [_conv(f"q{i}") for i in range(4)] + [_conv("q0")]  # one in-batch duplicate
    be = CachedBackend(_http(server), db)
    r1 = be.chat(batch, max_tokens=8, desc="s")
    assert server.requests == 4 and not any(r.cached for r in r1[:4]) and r1[4].cached
    be.close()
    be2 = CachedBackend(_http(server), db)
    r2 = be2.chat(batch, max_tokens=8, desc="s")
    assert server.requests == 4  # zero new requests
    assert all(r.cached for r in r2) and [r.text for r in r2] == [r.text for r in r1]
    assert r2[0].prompt_tokens == r1[0].prompt_tokens
    assert be2.usage.summary()["s"]["requests"] == 0 and be2.usage.summary()["s"]["cached"] == 5
    # any change of the key fields is a miss
    be2.chat(batch[:1], max_tokens=9)
    be2.chat(batch[:1], max_tokens=8, json_mode=True)
    assert server.requests == 6
    be2.close()


def test_cache_commits_per_response_and_skips_errors(tmp_path):
    class Crashy(FakeBackend):
        def _chat(self, batch, *, max_tokens, temperature, json_mode, desc, on_result):
            for i, conv in enumerate(batch):
                if i == 2:
                    raise RuntimeError("crash mid-batch")
                self.requests += 1
                on_result(i, LLMResult(text="r" + conv[0]["content"]))
            return []

    db = tmp_path / "c.sqlite"
    batch = [_conv(f"p{i}") for i in range(5)]
    with pytest.raises(RuntimeError):
        CachedBackend(Crashy(lambda c: ""), db).chat(batch, max_tokens=8)
    fake = FakeBackend(lambda c: "r" + c[0]["content"])
    cb = CachedBackend(fake, db)
    res = cb.chat(batch, max_tokens=8)
    assert fake.requests == 3 and [r.cached for r in res] == [True, True, False, False, False]
    assert [r.text for r in res] == [f"rp{i}" for i in range(5)]
    # failed responses are not cached
    errs = FakeBackend(lambda c: "")
    errs._chat = lambda batch, **kw: [LLMResult(text="", error="boom") for _ in batch]
    cb2 = CachedBackend(errs, tmp_path / "e.sqlite")
    cb2.chat([_conv("z")], max_tokens=8)
    assert len(cb2.cache) == 0


# -- secrets -----------------------------------------------------------------------------------
def test_api_key_never_leaks(server, monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("TRAWMEM_API_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    server.echo_auth_in_errors = True
    server.fail_first = 2
    be = backend_from_spec(server.base_url, backoff_s=0.01, max_retries=3, progress=False)
    res = be.chat([_conv("a")], max_tokens=8)
    assert res[0].ok
    assert server.auth_headers and all(h == f"Bearer {SECRET}" for h in server.auth_headers)
    # a batch that fails for good, with the key echoed in the server's error body
    server.fail_first = 10
    with pytest.raises(LLMRequestError) as ei:
        be.chat([_conv("b")], max_tokens=8)
    server.fail_first = 0
    cached = CachedBackend(be, tmp_path / "k.sqlite")
    run = answer_and_judge([{"qid": "q1", "question": "Where?", "category": 4, "gold": "Paris",
                             "context": "Mel: the answer is Paris."}], cached, cached)
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"records": run.records, **run.summary(), "llm": be.describe()}))
    texts = [caplog.text, str(ei.value), repr(ei.value), repr(be), str(vars(be)), repr(cached),
             out.read_text(), json.dumps(be.describe())]
    assert "retry" in caplog.text  # the retries were logged ...
    for t in texts:
        assert SECRET not in t  # ... without the key
    assert "Bearer ***" in str(ei.value)  # the echoed header was masked, not dropped
    # OPENAI_API_KEY is the fallback variable
    monkeypatch.delenv("TRAWMEM_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-other-key-42")
    server.reset_counts()
    _http(server, api_key=None).chat([_conv("c")], max_tokens=8)
    assert server.auth_headers == ["Bearer sk-other-key-42"]


# -- answer + judge ----------------------------------------------------------------------------
def test_answer_and_judge_end_to_end(server):
    be = _http(server)
    items = [
        {"qid": "q1", "question": "Where did Mel go?", "category": 4, "gold": "Paris",
         "context": "[1 May 2023] Mel: the answer is Paris."},
        {"qid": "q2", "question": "When did Mel run?", "category": 2, "gold": "7 May 2023",
         "context": "[8 May 2023] Mel: the answer is 7 May 2023."},
        {"qid": "q3", "question": "What pets, which colours?", "category": 1, "gold": "cat, dog",
         "context": "Mel: the answer is dog, cat."},
        {"qid": "q4", "question": "What else?", "category": 3, "gold": "hiking; likely", "context": "nothing here"},
    ]
    run = answer_and_judge(items, be, be)
    recs = {r["qid"]: r for r in run.records}
    assert recs["q1"]["prediction"] == "Paris" and recs["q1"]["judge_label"] == "CORRECT" and recs["q1"]["judge"] == 1
    assert recs["q1"]["f1_locomo"] == 1.0 and recs["q1"]["f1_set"] == 1.0
    assert recs["q3"]["f1_locomo"] == 1.0  # comma split, order-free
    assert recs["q4"]["prediction"].startswith("Not mentioned") and recs["q4"]["judge"] == 0
    assert recs["q2"]["judge"] == 1
    # Requests run concurrently, so find each one by its content rather than its arrival order.
    answers = [b for b in server.bodies if "response_format" not in b]
    by_q = {q: next(b["messages"][0]["content"] for b in answers if q in b["messages"][0]["content"])
            for q in ("When did Mel run?", "Where did Mel go?")}
    assert "This question is about time" in by_q["When did Mel run?"]
    assert "This question is about time" not in by_q["Where did Mel go?"]
    judges = [b for b in server.bodies if "response_format" in b]
    assert len(judges) == 4 and all(b["response_format"]["type"] == "json_schema" for b in judges)
    assert all(b["response_format"]["json_schema"]["schema"] == JUDGE.schema for b in judges)
    assert run.usage["answer"]["requests"] == 4 and run.usage["judge"]["requests"] == 4
    assert run.usage["answer"]["prompt_tokens"] > 0 and run.usage["answer"]["batches"] == 1
    assert recs["q1"]["usage"]["answer"]["prompt_tokens"] > 0 and recs["q1"]["usage"]["judge"] is not None
    assert run.prompts["judge"]["sha"] == JUDGE.sha and run.models["answer"]["model"] == "m"
    m = run.metrics()
    assert m["per_category"]["4"]["judge"] == 1.0 and m["macro"]["categories"] == [1, 2, 3, 4]
    assert run.counts["judge_unparsed"] == 0 and run.counts["answer_errors"] == 0
    # no judge backend: judge is None and not aggregated
    run2 = answer_and_judge(items[:1], be, None)
    assert run2.records[0]["judge"] is None and run2.metrics()["macro"]["judge"] is None


def test_answer_and_judge_unparsed_and_missing_fields():
    ans = FakeBackend(lambda c: "Paris")
    judge = FakeBackend(lambda c: "I cannot decide")
    run = answer_and_judge([{"qid": 1, "question": "?", "category": 4, "gold": "Paris", "context": "c"}], ans, judge)
    assert run.records[0]["judge"] == 0 and run.records[0]["judge_label"] is None
    assert run.counts["judge_unparsed"] == 1
    with pytest.raises(InputError, match="missing"):
        answer_and_judge([{"qid": 1}], ans, judge)
