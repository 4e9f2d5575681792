"""The HTTP backend against a server that behaves as llama.cpp's does (tests/support/llm_server.py):
streamed replies and their cancellation, a plain reply never sent twice, a one-at-a-time server
detected, time limits on server time, the reply schema in the form the endpoint takes (a refusal
detected once), JSON mode dropped for the refused request only, the model's context learned from
an overflow, and replies cut at their token limit."""
from __future__ import annotations

import time

import pytest

from llm_server import http_backend, user_turn
from trawmem_gpu.llm import CachedBackend, cache_key
from trawmem_gpu.llm.endpoint import DEFAULT_GEN_TPS, EndpointState, endpoint_state
from trawmem_gpu.llm.openai_http import CONTEXT_EXCEEDED
from trawmem_gpu.llm.prompts import HEAD, JUDGE


_http, _conv = http_backend, user_turn


def test_replies_stream_and_a_timed_out_stream_is_cancelled_on_the_server(server):
    server.word_delay_s = 0.05
    server.responders.append(lambda m: " ".join(f"w{i}" for i in range(200)) if "long" in m[0]["content"] else None)
    be = _http(server, timeout_s=0.6, max_retries=1, raise_if_all_failed=False)
    r = be.chat([_conv("short one")], max_tokens=300)[0]
    assert r.ok and server.bodies[-1]["stream"] is True and r.finish_reason == "stop"
    r = be.chat([_conv("a long one")], max_tokens=300)[0]
    assert not r.ok and "timeout" in r.error and r.retries == 1
    deadline = time.monotonic() + 30
    while server.cancelled < 2 and time.monotonic() < deadline:  # both attempts' streams were closed
        time.sleep(0.05)
    assert server.cancelled == 2


def test_a_plain_reply_that_times_out_is_waited_for_not_sent_again(server):
    server.streams = False  # a server that ignores `stream`: no way to cancel a request
    server.delay_s = 1.2
    be = _http(server, timeout_s=0.5, max_retries=4)
    be.chat([_conv("warm")], max_tokens=8)  # learns that the server does not stream
    server.reset_counts()
    r = be.chat([_conv("slow")], max_tokens=8)[0]
    assert r.ok and server.requests == 1  # waited past two limits for the one request it sent


def test_a_one_at_a_time_server_is_detected_by_its_interruptions(server):
    server.serial = server.interrupt = True
    server.word_delay_s = 0.02
    be = _http(server, timeout_s=30)
    res = be.chat([_conv(f"prompt {i} " + "x " * 30) for i in range(6)], max_tokens=64)
    assert all(r.ok for r in res) and be.state.serial is True
    assert server.interrupted >= 1 and be.state.in_flight_limit(None) == 1
    assert be.state.streams is False  # another client's request would cut a stream too: plain from now on
    server.reset_counts()
    be.chat([_conv(f"again {i}") for i in range(4)], max_tokens=8)
    assert server.max_in_flight == 1 and server.interrupted == 0
    assert not any(b.get("stream") for b in server.bodies)


def test_after_an_interruption_the_retry_goes_plain_whatever_replies_come_late(server):
    # llama-cpp-python: the stream in flight is cut when the next request arrives; the request
    # that cut it streams its own reply afterwards. Its late stream must not turn streaming back
    # on: the retry of the cut request goes plain (another client's request would cut it again).
    server.serial = server.interrupt = True
    server.gate_at = 2  # the first request starts only once the second waits behind it: it is cut
    server.delay_s = 0.3  # the second's stream begins after the client has seen the cut
    be = _http(server, timeout_s=30)
    res = be.chat([_conv(f"prompt {i} " + "x " * 20) for i in range(2)], max_tokens=64)
    assert all(r.ok for r in res) and server.interrupted == 1
    assert [bool(b.get("stream")) for b in server.bodies] == [True, True, False]
    assert be.state.streams is False and be.state.serial is True


def test_a_serial_server_gets_one_request_at_a_time_from_the_whole_process(server):
    # two batches at once (two threads: AsyncMemory's workers, an answer and a judge backend)
    # share what was learned of the endpoint, and its one slot
    import threading

    server.serial = server.interrupt = True
    server.word_delay_s = 0.01
    server.responders.append(lambda m: " ".join(["word"] * 20))
    first = _http(server, timeout_s=30)
    assert all(r.ok for r in first.chat([_conv(f"probe {i}") for i in range(3)], max_tokens=64))
    assert first.state.serial is True
    server.reset_counts()
    server.delay_s = 0.2  # plain replies take a while: the two batches overlap
    out = {}

    def run(k: int) -> None:
        be = _http(server, timeout_s=30)  # another backend on the same server
        out[k] = be.chat([_conv(f"thread {k} prompt {i}") for i in range(3)], max_tokens=64)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r.ok for k in out for r in out[k]) and len(out) == 2
    assert server.max_in_flight == 1 and server.interrupted == 0 and server.requests == 6


def test_a_serial_server_without_interruptions_is_detected_too(server):
    server.serial = True
    server.word_delay_s = 0.02
    server.responders.append(lambda m: " ".join(["word"] * 30))  # 0.6 s a reply: a wait behind one shows
    be = _http(server, timeout_s=30)
    be.chat([_conv(f"p{i}") for i in range(6)], max_tokens=64)
    assert be.state.serial is True and be.state.streams is True  # no interruption: it still streams


def test_fast_replies_of_a_parallel_server_are_no_evidence_of_a_serial_one(server):
    be = _http(server, timeout_s=30)
    be.chat([_conv(f"fast {i}") for i in range(12)], max_tokens=8)
    assert be.state.serial is not True


def test_a_server_that_serves_several_at_once_gets_more_in_flight(server):
    server.word_delay_s = 0.02
    server.responders.append(lambda m: " ".join(["word"] * 40))  # 0.8 s a reply: they overlap for a while
    be = _http(server, timeout_s=30)
    be.chat([_conv(f"q{i}") for i in range(6)], max_tokens=64)
    assert be.state.serial is False and be.state.in_flight_limit(None) > 2


def test_a_time_limit_counts_server_time_not_the_wait_in_the_clients_queue(server):
    server.delay_s = 0.4
    be = _http(server, concurrency=1, timeout_s=1.0, max_retries=0)
    res = be.chat([_conv(f"q{i}") for i in range(5)], max_tokens=8)  # 2 s in all, 0.4 s each on the server
    assert all(r.ok for r in res) and server.max_in_flight == 1


def test_the_derived_limit_fits_a_long_reply_of_a_slow_model():
    st = EndpointState("http://x/v1")
    assert st.time_limit(1700, 2048) > 2048 / 30 + 1700 / 80  # a 2,048-token reply at 30 tokens/s fits
    assert st.time_limit(100, 2048) >= 2048 / DEFAULT_GEN_TPS
    for _ in range(5):  # a fast server measured: the limit shrinks, never below its fixed part
        st.observe(1000, 500, 0.5, 2.5, 0)
    assert 30 <= st.time_limit(1000, 512) < 60


def test_the_schema_goes_in_the_form_the_endpoint_takes_and_a_refusal_is_detected_once(server):
    server.schema_forms = ("json_object_schema", "json_object")  # llama-cpp-python
    be = _http(server, timeout_s=10)
    for k in range(3):
        r = be.chat([HEAD.messages(thread=f"[1 May] Ana ran {k}")], max_tokens=64, json_mode=True,
                    schema=HEAD.schema)[0]
        assert r.ok
    forms = [b["response_format"] for b in server.bodies]
    assert forms[0]["type"] == "json_schema" and forms[0]["json_schema"]["schema"] == HEAD.schema
    assert all(f == {"type": "json_object", "schema": HEAD.schema} for f in forms[1:]) and len(forms) == 4
    assert be.describe()["endpoint"]["schema_form"] == "json_object_schema"


def test_an_endpoint_without_schemas_gets_json_mode_and_says_why(server, caplog):
    server.schema_forms = ("json_object",)
    be = _http(server, timeout_s=10)
    for _ in range(2):
        assert be.chat([JUDGE.messages(question="q", gold="g", prediction="p")], max_tokens=16, json_mode=True,
                       schema=JUDGE.schema)[0].ok
    assert server.bodies[-1]["response_format"] == {"type": "json_object"}
    assert "does not take JSON schemas" in caplog.text and be.state.schema_refusal
    assert sum("does not take JSON schemas" in r.message for r in caplog.records) == 1


def test_json_mode_is_dropped_for_the_refused_request_only(server):
    server.schema_forms = ()  # refuses any response_format
    be = _http(server, timeout_s=10)
    r = be.chat([_conv("a")], max_tokens=8, json_mode=True)[0]
    assert r.ok and "response_format" not in server.bodies[-1]
    be.chat([_conv("b")], max_tokens=8, json_mode=True)
    assert server.bodies[-2]["response_format"] == {"type": "json_object"}  # asked again, refused again


def test_an_unrelated_400_keeps_json_mode(server):
    server.context_words = 5
    be = _http(server, timeout_s=10, raise_if_all_failed=False)
    r = be.chat([_conv("one two three four five six seven")], max_tokens=8, json_mode=True)[0]
    assert r.error.startswith(CONTEXT_EXCEEDED) and server.requests == 1  # not retried as it is
    assert be.context_tokens == 5 and endpoint_state(be.endpoint).context_tokens == 5
    assert be.chat([_conv("short")], max_tokens=8, json_mode=True)[0].ok
    assert server.bodies[-1]["response_format"] == {"type": "json_object"}


def test_a_reply_cut_at_its_token_limit_says_so_and_is_cached_with_it(server, tmp_path):
    server.responders.append(lambda m: "one two three four five six")
    be = CachedBackend(_http(server, timeout_s=10), tmp_path / "llm.sqlite")
    r = be.chat([_conv("q")], max_tokens=3)[0]
    assert r.cut and r.text == "one two three" and be.usage.summary()["default"]["cut"] == 1
    again = be.chat([_conv("q")], max_tokens=3)[0]
    assert again.cached and again.finish_reason == "length"


def test_stream_usage_missing_is_counted_by_the_client(server):
    server.stream_usage = False  # llama-cpp-python sends no usage in a stream
    be = _http(server, timeout_s=10)
    r = be.chat([_conv("hello there")], max_tokens=8)[0]
    assert r.tokens_estimated and r.completion_tokens == len(r.text.split()) and r.prompt_tokens > 0


def test_constraining_keys_the_cache_apart(server, tmp_path):
    db = tmp_path / "llm.sqlite"
    m = HEAD.messages(thread="[1 May] Ana ran a race in Porto")
    with_schema = CachedBackend(_http(server, timeout_s=10), db)
    with_schema.chat([m], max_tokens=64, json_mode=True, schema=HEAD.schema)
    json_only = CachedBackend(_http(server, timeout_s=10, constrain="json"), db)
    assert not json_only.chat([m], max_tokens=64, json_mode=True, schema=HEAD.schema)[0].cached
    assert "response_format" in server.bodies[-1] and server.bodies[-1]["response_format"] == {"type": "json_object"}
    ep = with_schema.endpoint
    keys = {cache_key("m", m, 64, 0.0, True, ep, HEAD.schema), cache_key("m", m, 64, 0.0, True, ep)}
    assert len(keys) == 2 and all(with_schema.cache.get(k) is not None for k in keys)


def test_no_schema_sends_a_string_bound_llama_cpp_cannot_compile():
    # llama-cpp-python's server dies (segmentation fault) on a grammar past its repetition limit:
    # on the real model a maxLength of 1,200 killed it (the critique's was 1,500, apply's 6,000)
    from trawmem_gpu.ingest.layers import prompts as layer_prompts
    from trawmem_gpu.llm import prompts as llm_prompts
    from trawmem_gpu.llm.prompts import GRAMMAR_MAX_LENGTH, Prompt

    def bounds(node):
        if isinstance(node, dict):
            yield from ([node["maxLength"]] if "maxLength" in node else [])
            for v in node.values():
                yield from bounds(v)
        elif isinstance(node, list):
            for v in node:
                yield from bounds(v)

    found = [p for mod in (llm_prompts, layer_prompts) for p in vars(mod).values()
             if isinstance(p, Prompt) and p.schema]
    assert len(found) >= 8
    assert all(b <= GRAMMAR_MAX_LENGTH for p in found for b in bounds(p.schema))
