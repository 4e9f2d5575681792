"""The LLM reply cache keys on the server as well as the model, and keeps only usable replies:
a reply its parser rejects (or a refusal) is never stored, and one stored before is sent again."""
from __future__ import annotations

import sqlite3

import httpx
import pytest

from trawmem_gpu.ingest.llm_threads import llm_heads
from trawmem_gpu.llm import CachedBackend, FakeBackend, ResponseCache, cache_key
from trawmem_gpu.llm.openai_http import OpenAIHTTPBackend
from trawmem_gpu.llm.prompts import HEAD
from trawmem_gpu.llm.structured import parse_head


def _http(server) -> OpenAIHTTPBackend:
    return OpenAIHTTPBackend(server.base_url, model="same-name", max_retries=0, timeout_s=10, progress=False)


def _conv(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def two_servers():
    """Two servers serving a model of the same name that answer differently."""
    from llm_server import LLMServer

    servers = [LLMServer(models=("same-name",)).start() for _ in range(2)]
    for k, s in enumerate(servers):
        s.responders.append(lambda messages, k=k: f"reply of server {k}")
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def test_servers_with_the_same_model_name_do_not_share_replies(two_servers, tmp_path):
    db = tmp_path / "llm.sqlite"
    got = []
    for s in two_servers:
        be = CachedBackend(_http(s), db)
        got.append(be.chat([_conv("the same prompt")], max_tokens=8)[0])
        be.close()
    assert [r.text for r in got] == ["reply of server 0", "reply of server 1"]
    assert [r.cached for r in got] == [False, False] and [s.requests for s in two_servers] == [1, 1]
    be = CachedBackend(_http(two_servers[1]), db)  # a rerun against either is answered from the cache
    assert be.chat([_conv("the same prompt")], max_tokens=8)[0].cached
    rows = sqlite3.connect(db).execute("SELECT model, endpoint FROM responses ORDER BY endpoint").fetchall()
    assert rows == sorted([("same-name", s.base_url) for s in two_servers], key=lambda r: r[1])


def test_the_key_names_the_endpoint():
    m = [{"role": "user", "content": "x"}]
    a, b = cache_key("m", m, 8, 0.0, True, "http://a/v1"), cache_key("m", m, 8, 0.0, True, "http://b/v1")
    assert a != b and len({a, b, cache_key("m", m, 8, 0.0, True)}) == 3
    be = OpenAIHTTPBackend("http://Host.Example:8000/v1/", model="m")
    assert be.endpoint == "http://host.example:8000/v1"
    assert FakeBackend(lambda c: "x").endpoint == "fake"


THREAD = "[2031-05-02] Ana: a kayak trip down the river"


def _head_conv(thread: str) -> list[dict]:
    return HEAD.messages(thread=thread)


def test_a_reply_the_parser_rejects_is_not_kept_and_a_fixed_server_answers_afresh(server, tmp_path):
    """A head reply that is not the JSON asked for: not stored (nor its retry); once the server is
    fixed, a rerun with the same cache sends the request again and gets the good reply."""
    broken = [True]
    server.responders.append(lambda messages: "garbage, not JSON" if broken[0] else None)
    db = tmp_path / "llm.sqlite"
    be = CachedBackend(_http(server), db)
    heads, why = llm_heads([THREAD], be, max_retries=1)
    assert heads == [None] and why == ["malformed reply"] and len(be.cache) == 0 and server.requests == 2
    be.close()
    broken[0] = False
    be = CachedBackend(_http(server), db)
    heads, why = llm_heads([THREAD], be, max_retries=1)
    assert why == [None] and heads[0].startswith("Summary:") and server.requests == 3
    assert len(be.cache) == 1


def test_a_malformed_reply_stored_before_is_dropped_and_sent_again(server, tmp_path):
    """A cache written before replies were checked holds garbage under a request's key: a
    structured call does not take it, it asks the server again and stores the good reply."""
    db = tmp_path / "llm.sqlite"
    be = CachedBackend(_http(server), db)
    conv = _head_conv(THREAD)
    key = cache_key("same-name", conv, 128, 0.0, True, be.endpoint, HEAD.schema)
    from trawmem_gpu.llm.base import LLMResult

    be.cache.put(key, "same-name", LLMResult("garbage"), be.endpoint)
    heads, why = llm_heads([THREAD], be, max_retries=0)
    assert why == [None] and heads[0].startswith("Summary:") and server.requests == 1
    assert parse_head(be.cache.get(key).text).startswith("Summary:")
    # a plain call (no parser) still takes whatever is stored
    assert be.chat([_conv("q")], max_tokens=8)[0].text == be.chat([_conv("q")], max_tokens=8)[0].text
    be.close()


def _refused(be, body: dict):
    from trawmem_gpu.llm.openai_wire import parse_completion

    return be._result(parse_completion(body), 0.1, [_conv("q")[0]], 1, 0)


def test_a_refused_request_is_a_failure_and_never_cached(tmp_path):
    be = OpenAIHTTPBackend("http://127.0.0.1:9/v1", model="m")
    for choice in ({"message": {"content": None, "refusal": "I can't help with that."}, "finish_reason": "stop"},
                   {"message": {"content": ""}, "finish_reason": "content_filter"}):
        r = _refused(be, {"choices": [choice]})
        assert r.error is not None and r.error.startswith("the model refused the request") and r.text == ""
    inner = FakeBackend(lambda c: "x")
    inner._chat = lambda batch, **kw: [_refused(be, {"choices": [{"message": {"content": None, "refusal": "no"}}]})
                                       for _ in batch]
    cached = CachedBackend(inner, tmp_path / "llm.sqlite")
    assert cached.chat([_conv("q")], max_tokens=8)[0].error and len(cached.cache) == 0


def test_a_format_1_cache_is_upgraded_and_its_unattributed_replies_dropped(tmp_path):
    db_path = tmp_path / "llm.sqlite"
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT)")
    db.execute("INSERT INTO meta VALUES ('format', '1')")
    db.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, model TEXT, text TEXT, prompt_tokens INTEGER,"
               " completion_tokens INTEGER, created REAL)")
    db.execute("INSERT INTO responses VALUES (?, 'm', 'the first server''s garbage', 0, 0, 0)",
               (cache_key("m", _conv("q"), 8, 0.0, False),))
    db.commit()
    db.close()
    c = ResponseCache(db_path)
    assert len(c) == 0
    c.close()
    db = sqlite3.connect(db_path)
    assert db.execute("SELECT v FROM meta WHERE k='format'").fetchone() == ("2",)
    assert "endpoint" in {r[1] for r in db.execute("PRAGMA table_info(responses)")}
    db.close()
    be = CachedBackend(FakeBackend(lambda conv: "fresh"), db_path)
    assert be.chat([_conv("q")], max_tokens=8)[0].text == "fresh"
    be.close()
