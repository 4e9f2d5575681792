"""`trawmem serve --upstream`: the chat-completions proxy (issue 44 item 1) against a fake upstream,
a real HTTP server on 127.0.0.1 that records what it received (tests/support/fake_upstream.py).

The real server in-process on a free port, driven with httpx."""
from __future__ import annotations

import hashlib
import json
import re
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from fake_upstream import ANSWER, FakeUpstream, completion, sse_bytes  # noqa: E402
from serve_util import KEYS, running  # noqa: E402
from serve_cases import coll, sample_coll  # noqa: E402, F401, F811 (fixtures)
from trawmem_gpu.errors import ConfigError  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from trawmem_gpu.serve.keys import KeyStore, add_key  # noqa: E402
from trawmem_gpu.serve.proxy import HEADER, ChatRequest  # noqa: E402

QUESTION = "Why did Ana walk home during her long run?"
HANG_GUARD_S = 120.0  # a bound on waiting for the background append, not a speed claim
UP_KEY = "upstream-secret-key-42"


def _keys(path, bound=None, token_budget=None) -> str:
    h = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    rows = [{"sha256": h(KEYS["rw"]), "tenant": "acme", "banks": ["acme-*"], "access": "read-write"},
            {"sha256": h(KEYS["ro"]), "tenant": "acme-reader", "banks": ["acme-*"], "access": "read-only"},
            {"sha256": h(KEYS["other"]), "tenant": "other", "banks": ["other-*"], "access": "read-write"}]
    if token_budget is not None:
        rows[0]["token_budget"] = token_budget
    if bound is not None:
        rows.append({"sha256": h("key-bound-0123456789"), "tenant": "acme-u1", "banks": ["acme-*"],
                     "access": "read-write", "where": bound})
    path.write_text(json.dumps({"keys": rows}))
    return str(path)


def _chat(question=QUESTION, stream=False, **kw) -> dict:
    return {"model": "fake", "stream": stream, "user": "acme-1",
            "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": question}], **kw}


def _metric(c: httpx.Client, name: str, outcome: str) -> float:
    m = re.search(rf'^{name}{{outcome="{outcome}"}} (\S+)$', c.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_appends(c: httpx.Client, outcome: str, n: float) -> None:
    t0 = time.monotonic()
    while _metric(c, "trawmem_proxy_appends_total", outcome) < n:
        assert time.monotonic() - t0 < HANG_GUARD_S, "the background append never finished"
        time.sleep(0.1)


def _n_units(c, key=KEYS["rw"], bank="acme-1") -> int:
    return c.get(f"/v1/banks/{bank}", headers={"Authorization": f"Bearer {key}"}).json()["n_units"]


@pytest.fixture
def proxied(coll, tmp_path, monkeypatch):
    """(client, upstream) of a server with keys over the sample collection, proxying to a fake upstream."""
    monkeypatch.setenv("TRAWMEM_UPSTREAM_API_KEY", UP_KEY)
    with FakeUpstream() as up:
        cfg = ServeConfig(collection=coll, keys_file=_keys(tmp_path / "keys.json", bound={"user_id": "u1"}),
                          upstream=up.url, max_wait_ms=1, proxy_token_budget=200)
        with running(cfg) as (url, _, _):
            with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as c:
                yield c, up


def test_workspace_placed_keys_swapped_answer_appended_once(proxied):
    c, up = proxied
    auth = {"Authorization": f"Bearer {KEYS['rw']}"}
    before = _n_units(c)
    body = _chat(trawmem={"token_budget": 120})
    r = c.post("/v1/chat/completions", json=body, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json() == completion()  # the upstream's answer, passed through
    (hdrs, sent), = up.received
    # the workspace: one system message after the caller's system prompt, before the user message
    assert [m["role"] for m in sent["messages"]] == ["system", "system", "user"]
    assert sent["messages"][0]["content"] == "You are terse."
    placed = sent["messages"][1]["content"]
    assert placed.startswith(HEADER) and "walk" in placed.lower()
    assert "trawmem" not in sent and sent["user"] == "acme-1"
    # the upstream's key from the server's environment, never the caller's
    assert hdrs["authorization"] == f"Bearer {UP_KEY}"
    assert KEYS["rw"] not in json.dumps(hdrs) and KEYS["rw"] not in json.dumps(sent)
    # counted in the model's tokens (the fake's /tokenize: a token per 4 characters), within the budget
    ws_text = placed[len(HEADER):]
    assert int(r.headers["X-Trawmem-Workspace-Tokens"]) == -(-len(HEADER) // 4) + -(-len(ws_text) // 4)
    _wait_appends(c, "stored", 1)
    assert _n_units(c) == before + 2
    # a retried identical request: answered again, appended nothing
    r2 = c.post("/v1/chat/completions", json=body, headers=auth)
    assert r2.status_code == 200 and len(up.received) == 2
    _wait_appends(c, "retry", 1)
    assert _n_units(c) == before + 2
    # the stored turns: the user's message, then the answer, under the ids of the exchange
    uid, aid = ChatRequest(json.dumps(body).encode(), {}, 1).turn_ids(ANSWER)
    for tid in (uid, aid):
        h = c.get(f"/v1/banks/acme-1/units/{tid}/history", headers=auth)
        assert h.status_code == 200, (tid, h.text)
    # /metrics counts the proxied requests, the workspace tokens and the upstream time
    text = c.get("/metrics").text
    assert _metric(c, "trawmem_proxy_requests_total", "ok") == 2
    assert "trawmem_proxy_workspace_tokens_count 2.0" in text
    assert "trawmem_proxy_upstream_seconds_count 2.0" in text


def test_stream_bytes_unchanged_and_answer_appended(proxied):
    c, up = proxied
    auth = {"X-API-Key": KEYS["rw"], "X-Trawmem-Bank": "acme-1", "X-Trawmem-Token-Budget": "80"}
    body = _chat(question="What did Ana do after her run?", stream=True, user="not-this-bank")
    before = _n_units(c)
    with c.stream("POST", "/v1/chat/completions", json=body, headers=auth) as r:
        assert r.status_code == 200
        got = b"".join(r.iter_raw())
    assert got == sse_bytes()  # byte for byte
    assert r.headers["content-type"].startswith("text/event-stream")
    placed = up.received[-1][1]["messages"][1]["content"]
    assert int(r.headers["X-Trawmem-Workspace-Tokens"]) == -(-len(HEADER) // 4) + -(-len(placed[len(HEADER):]) // 4)
    _wait_appends(c, "stored", 1)
    assert _n_units(c) == before + 2  # the header's bank, not the body's user field
    uid, aid = ChatRequest(json.dumps(body).encode(), {"x-trawmem-bank": "acme-1"}, 1).turn_ids("".join(
        ["Ana walked ", "home because ", "her knee hurt."]))
    assert c.get(f"/v1/banks/acme-1/units/{aid}/history", headers=auth).status_code == 200


def test_refusals_forward_nothing_and_store_nothing(proxied):
    c, up = proxied
    auth = {"Authorization": f"Bearer {KEYS['rw']}"}
    before = _n_units(c)
    cases = [
        (None, _chat(), 401, None),
        ({"Authorization": "Bearer wrong"}, _chat(), 401, None),
        (auth, _chat(n=2), 400, "n"),
        (auth, {"model": "fake", "user": "acme-1"}, 400, "messages"),
        (auth, {"model": "fake", "user": "acme-1", "messages": "hi"}, 400, "messages"),
        (auth, {"model": "fake", "user": "acme-1", "messages": [{"role": "system", "content": "x"}]}, 400, "messages"),
        (auth, _chat(trawmem={"token_budget": 0}), 400, "trawmem.token_budget"),
        (auth, _chat(trawmem={"token_budget": 10 ** 9}), 400, "trawmem.token_budget"),
        (auth, _chat(trawmem={"colour": 1}), 400, "trawmem"),
        ({**auth, "X-Trawmem-Token-Budget": "lots"}, _chat(), 400, "X-Trawmem-Token-Budget"),
        (auth, _chat(user=None), 400, "user"),
        (auth, _chat(user="other-1"), 404, "user"),  # a bank of another tenant: as a missing one
        ({"Authorization": f"Bearer {KEYS['other']}"}, _chat(), 404, "user"),
        ({"Authorization": "Bearer key-bound-0123456789"}, _chat(), 403, "trawmem.metadata"),
        ({"Authorization": "Bearer key-bound-0123456789"}, _chat(trawmem={"metadata": {"user_id": "u2"}}), 403,
         "trawmem.metadata"),
    ]
    for hdr, body, status, param in cases:
        r = c.post("/v1/chat/completions", json=body, headers=hdr or {})
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert err["message"] and err["param"] == param, (body, err)
    r = c.post("/v1/chat/completions", content=b"{not json", headers=auth)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert up.received == []
    assert _n_units(c) == before
    assert _metric(c, "trawmem_proxy_requests_total", "refused") == len(cases) - 2 + 1  # 401s answer before counting


def test_bound_key_sees_and_stores_only_its_scope(proxied):
    c, up = proxied
    rw = {"Authorization": f"Bearer {KEYS['rw']}"}
    turns = [{"turn_id": "u1-a", "speaker": "Ana", "text": "My dog Biscuit loves the beach.", "timestamp": "2031-01-01",
              "metadata": {"user_id": "u1"}},
             {"turn_id": "u2-a", "speaker": "Bo", "text": "My dog Rex hates the beach, secret code swordfish.",
              "timestamp": "2031-01-02", "metadata": {"user_id": "u2"}}]
    assert c.post("/v1/banks/acme-9/turns", json={"turns": turns}, headers=rw).status_code == 200
    bound = {"Authorization": "Bearer key-bound-0123456789"}
    body = _chat(question="Which dog hates or loves the beach?", user="acme-9", trawmem={"metadata": {"user_id": "u1"}})
    r = c.post("/v1/chat/completions", json=body, headers=bound)
    assert r.status_code == 200, r.text
    placed = up.received[-1][1]["messages"][1]["content"]
    assert "Biscuit" in placed and "swordfish" not in placed and "Rex" not in placed
    _wait_appends(c, "stored", 1)
    # the exchange was stored with the key's metadata: the bound key counts it as its own
    assert _n_units(c, "key-bound-0123456789", "acme-9") == 3
    # a bank the bound key cannot reach: 404 before anything is forwarded
    n = len(up.received)
    assert c.post("/v1/chat/completions", json=_chat(user="other-1"), headers=bound).status_code == 404
    assert len(up.received) == n


def test_read_only_key_gets_workspace_stores_nothing(proxied):
    c, up = proxied
    before = _n_units(c)
    r = c.post("/v1/chat/completions", json=_chat(), headers={"Authorization": f"Bearer {KEYS['ro']}"})
    assert r.status_code == 200 and up.received[-1][1]["messages"][1]["content"].startswith(HEADER)
    _wait_appends(c, "skipped", 1)
    assert _n_units(c) == before


def test_new_bank_gets_no_workspace_and_is_created(proxied):
    c, up = proxied
    auth = {"Authorization": f"Bearer {KEYS['rw']}"}
    r = c.post("/v1/chat/completions", json=_chat(user="acme-new"), headers=auth)
    assert r.status_code == 200 and r.headers["X-Trawmem-Workspace-Tokens"] == "0"
    assert [m["role"] for m in up.received[-1][1]["messages"]] == ["system", "user"]
    _wait_appends(c, "stored", 1)
    assert _n_units(c, bank="acme-new") == 2


def test_upstream_errors_pass_through(proxied):
    c, up = proxied
    auth = {"Authorization": f"Bearer {KEYS['rw']}"}
    before = _n_units(c)
    for mode, stream in (("429", False), ("500", False), ("429", True), ("500", True)):
        up.mode = mode
        r = c.post("/v1/chat/completions", json=_chat(stream=stream), headers=auth)
        assert r.status_code == int(mode)
        assert r.json() == {"error": {"message": f"fake {mode}", "type": "fake"}}
        if mode == "429":
            assert r.headers["retry-after"] == "7"
    assert _metric(c, "trawmem_proxy_requests_total", "upstream_error") == 4
    assert _n_units(c) == before and _metric(c, "trawmem_proxy_appends_total", "stored") == 0


def test_upstream_timeout_504_and_unreachable_502(coll, tmp_path):
    with FakeUpstream() as up:
        up.mode, up.delay_s = "slow", 5.0
        cfg = ServeConfig(collection=coll, upstream=up.url, upstream_timeout_s=0.5, max_wait_ms=1)
        with running(cfg) as (url, _, _):
            with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as c:
                for stream in (False, True):
                    r = c.post("/v1/chat/completions", json=_chat(user="ana-ben", stream=stream))
                    assert r.status_code == 504, r.text
                    assert r.json()["error"]["code"] == "upstream_timeout"
        dead = up.url
    cfg = ServeConfig(collection=coll, upstream=dead, max_wait_ms=1)
    with running(cfg) as (url, _, _):
        with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as c:
            r = c.post("/v1/chat/completions", json=_chat(user="ana-ben"))
            assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable"
            assert _metric(c, "trawmem_proxy_requests_total", "unreachable") == 1


def test_over_budget_in_model_tokens_reselects_smaller(coll):
    # the model's tokens are many more than the encoder's (a token per character): selected once more
    with FakeUpstream(chars_per_token=1) as up:
        cfg = ServeConfig(collection=coll, upstream=up.url, max_wait_ms=1)
        with running(cfg) as (url, _, _):
            with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as c:
                r = c.post("/v1/chat/completions", json=_chat(user="ana-ben"),
                           headers={"X-Trawmem-Token-Budget": "400"})
                assert r.status_code == 200
    header, first, second = up.tokenized  # the header once, then the workspace, then the smaller one
    assert header == HEADER and len(header) + len(first) > 400 and len(second) < len(first)
    placed = up.received[-1][1]["messages"][1]["content"]
    assert placed == HEADER + second
    assert r.headers["X-Trawmem-Workspace-Tokens"] == str(len(HEADER) + len(second))


def test_no_tokenize_counts_encoder_tokens_and_key_budget(coll, tmp_path):
    with FakeUpstream(tokenize=False) as up:
        cfg = ServeConfig(collection=coll, keys_file=_keys(tmp_path / "k.json", token_budget=60), upstream=up.url,
                          max_wait_ms=1)
        with running(cfg) as (url, _, _):
            with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as c:
                auth = {"Authorization": f"Bearer {KEYS['rw']}"}
                sel = c.post("/v1/select", json={"bank_id": "acme-1", "question": QUESTION, "token_budget": 60},
                             headers=auth).json()
                r = c.post("/v1/chat/completions", json=_chat(), headers=auth)
                assert r.status_code == 200
                assert r.headers["X-Trawmem-Workspace-Tokens"] == str(sel["n_tokens"])  # the key's budget
                assert up.received[-1][1]["messages"][1]["content"] == HEADER + sel["text"]


def test_config_and_keys(tmp_path):
    with pytest.raises(ConfigError, match="upstream"):
        ServeConfig(upstream="127.0.0.1:8080")
    with pytest.raises(ConfigError, match="proxy_token_budget"):
        ServeConfig(proxy_token_budget=0)
    with pytest.raises(ConfigError, match="upstream_timeout_s"):
        ServeConfig(upstream_timeout_s=0)
    add_key(tmp_path / "k.json", "t", ["t-*"], True, token_budget=300)
    add_key(tmp_path / "k.json", "u", ["u-*"], True)
    assert [t.token_budget for t in KeyStore.load(tmp_path / "k.json").tenants] == [300, None]
    from trawmem_gpu.cli import main

    assert main(["serve-key", "--keys", str(tmp_path / "cli.json"), "--tenant", "c", "--banks", "c-*",
                 "--token-budget", "77"]) == 0
    assert [t.token_budget for t in KeyStore.load(tmp_path / "cli.json").tenants] == [77]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"keys": [{"sha256": "0" * 64, "tenant": "t", "banks": ["*"], "access": "read-only",
                                         "token_budget": "lots"}]}))
    with pytest.raises(ConfigError, match="token_budget"):
        KeyStore.load(bad)


def test_exchange_ids_held_unseen_are_not_stored_again(proxied):
    # the exchange's ids held already where the key's history cannot see them (another user's
    # metadata): the append is refused as holding them, counted as a retry, nothing stored twice
    c, up = proxied
    rw, bound = {"Authorization": f"Bearer {KEYS['rw']}"}, {"Authorization": "Bearer key-bound-0123456789"}
    body = _chat(user="acme-1", trawmem={"metadata": {"user_id": "u1"}})
    uid, aid = ChatRequest(json.dumps(body).encode(), {}, 1).turn_ids(ANSWER)
    held = [{"turn_id": t, "speaker": "x", "text": "held", "timestamp": "2030-01-01", "metadata": {"user_id": "u2"}}
            for t in (uid, aid)]
    assert c.post("/v1/banks/acme-1/turns", json={"turns": held}, headers=rw).status_code == 200
    before = _n_units(c)
    assert c.post("/v1/chat/completions", json=body, headers=bound).status_code == 200
    _wait_appends(c, "retry", 1)
    assert _n_units(c) == before and _metric(c, "trawmem_proxy_appends_total", "failed") == 0
