"""`trawmem serve`: the real server in-process on 127.0.0.1 and a free port, driven with httpx.

Covers the API against the in-process engine, dynamic batching (one encoder call per batch),
the auth matrix, bad inputs (4xx, nothing half-applied, the server keeps serving), concurrent
appends beside queries (no lost turns, readers see one bank version), 429 / 504 / draining.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import KEYS, SAMPLE_BANK, build_sample_collection, copy_collection, keys_file, running  # noqa: E402
from trawmem_gpu.select.params import QueryLimits  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402

QUESTION = "Why did Ana walk home during her long run?"


@pytest.fixture(scope="module")
def sample_coll(tmp_path_factory) -> Path:
    return build_sample_collection(tmp_path_factory.mktemp("serve") / "coll", extra_ids=("acme-1", "other-1"))


@pytest.fixture
def coll(sample_coll, tmp_path) -> str:
    """A private copy of the sample collection (tests that append mutate it)."""
    return copy_collection(sample_coll, tmp_path / "coll")


@pytest.fixture(scope="module")
def shared(sample_coll, tmp_path_factory):
    """One read-only server for the tests that only query."""
    path = copy_collection(sample_coll, tmp_path_factory.mktemp("shared") / "coll")
    with running(ServeConfig(collection=path, max_wait_ms=2)) as (url, service, srv):
        with httpx.Client(base_url=url, timeout=60) as c:
            yield c, service


def _post(c, path, body):
    return c.post(path, json=body)


# ----------------------------------------------------------------------------------------------
# API v1 against the in-process engine
# ----------------------------------------------------------------------------------------------
def test_select_matches_in_process_engine(shared):
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.tokens import count_tokens
    from trawmem_gpu.select.workspace import assemble

    c, service = shared
    bank = service.registry.get(SAMPLE_BANK)
    for budget, hops in ((4, 1), (8, 2), (16, 0)):
        r = _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": QUESTION, "budget": budget, "hops": hops})
        assert r.status_code == 200, r.text
        got = r.json()
        z = service.encoder.encode([QUESTION], is_query=True)
        want_units = SelectionEngine([bank], SelectConfig()).select_units(
            [SAMPLE_BANK], [QUESTION], z, params=QueryParams(budget=budget, hops=hops))[0]
        ws = assemble(bank, QUESTION, want_units)
        assert [u["id"] for u in got["units"]] == ws.unit_ids
        assert 1 <= len(got["units"]) <= budget
        assert got["text"] == ws.render()
        assert got["n_tokens"] == count_tokens(got["text"])
        assert [t["thread"] for t in got["threads"]] == [b.thread for b in ws.blocks]
        assert [t["head"] for t in got["threads"]] == [b.head for b in ws.blocks]
        by_id = {t.turn_id: t for t in bank.turns}
        for u in got["units"]:
            t = by_id[u["id"]]
            assert (u["speaker"], u["text"], u["session"]) == (t.speaker, t.text, t.session)
            assert u["thread"] == int(bank.unit_thread[bank.index_of()[u["id"]]])
        assert (got["budget"], got["hops"], got["bank_n_units"]) == (budget, hops, bank.n_units)
        assert set(got["timings"]) >= {"queue_ms", "encode_ms", "select_ms", "assemble_ms", "batch_size", "total_ms"}


def test_date_is_each_querys_now(shared):
    from datetime import datetime

    from trawmem_gpu.select.engine import SelectionEngine

    c, service = shared
    r = _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": QUESTION, "date": "1 May 2024"})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["date"] == "2024-05-01T00:00:00" and got["date_used"] is True
    z = service.encoder.encode([QUESTION], is_query=True)
    want = SelectionEngine([service.registry.get(SAMPLE_BANK)]).select_units(
        [SAMPLE_BANK], [QUESTION], z, dates=[datetime(2024, 5, 1)])[0]
    bank = service.registry.get(SAMPLE_BANK)
    assert {u["id"] for u in got["units"]} == {bank.turns[i].turn_id for i in want}
    assert _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": QUESTION}).json()["date_used"] is False


def test_question_vector_skips_the_encoder(shared):
    c, service = shared
    z = service.encoder.encode([QUESTION], is_query=True)[0]
    base = _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": QUESTION}).json()
    calls = []
    inner = service.encoder.inner.encode
    service.encoder.inner.encode = lambda *a, **k: calls.append(1) or inner(*a, **k)
    try:
        # Not unit length: the server normalizes it.
        r = _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": QUESTION,
                                    "question_vector": (3.0 * z).tolist()})
    finally:
        service.encoder.inner.encode = inner
    assert r.status_code == 200, r.text
    assert calls == []
    assert [u["id"] for u in r.json()["units"]] == [u["id"] for u in base["units"]]
    assert r.json()["timings"]["encode_ms"] == 0.0


def test_batch_endpoint_answers_each_request_as_alone(shared):
    c, _ = shared
    reqs = [{"bank_id": b, "question": q, "budget": B}
            for b, q, B in ((SAMPLE_BANK, QUESTION, 4), ("acme-1", "When did Ana run the Porto half marathon?", 8),
                            (SAMPLE_BANK, "How did Ana keep her fitness?", 16))]
    r = _post(c, "/v1/select/batch", {"requests": reqs})
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [x["bank_id"] for x in res] == [q["bank_id"] for q in reqs]
    for q, x in zip(reqs, res):
        alone = _post(c, "/v1/select", q).json()
        assert [u["id"] for u in x["units"]] == [u["id"] for u in alone["units"]]
        assert x["timings"]["batch_size"] == 3


def test_banks_health_openapi_metrics(shared):
    c, service = shared
    r = c.get("/v1/banks")
    assert r.status_code == 200
    body = r.json()
    assert {b["bank_id"] for b in body["banks"]} == {SAMPLE_BANK, "acme-1", "other-1"}
    assert body["dim"] == service.dim and body["encoder"] == service.encoder_id
    info = c.get(f"/v1/banks/{SAMPLE_BANK}").json()
    bank = service.registry.get(SAMPLE_BANK)
    assert (info["n_units"], info["n_threads"]) == (bank.n_units, bank.n_threads)
    assert c.get("/v1/banks/nope").status_code == 404
    assert c.get("/healthz").json() == {"status": "ok"}
    assert c.get("/readyz").status_code == 200
    spec = c.get("/openapi.json").json()
    for p in ("/v1/select", "/v1/select/batch", "/v1/banks/{bank_id}/turns", "/v1/banks", "/v1/banks/{bank_id}"):
        assert p in spec["paths"], p
    assert "question_vector" in spec["components"]["schemas"]["SelectRequest"]["properties"]
    # /docs works offline: its page loads Swagger UI from this server, never from a CDN
    docs = c.get("/docs")
    assert docs.status_code == 200 and "/docs-assets/swagger-ui-bundle.js" in docs.text
    assert "http://" not in docs.text and "https://" not in docs.text, docs.text
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        r = c.get(f"/docs-assets/{asset}")
        assert r.status_code == 200 and len(r.content) > 1000, asset
    _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": QUESTION})
    _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": ""})
    m = c.get("/metrics").text
    assert 'trawmem_http_requests_total{method="POST",route="/v1/select",status="200"}' in m
    assert 'trawmem_http_requests_total{method="POST",route="/v1/select",status="422"}' in m
    assert 'trawmem_http_request_seconds_bucket{le="0.005",method="POST",route="/v1/select"}' in m
    assert "trawmem_batch_size_bucket" in m and "trawmem_queue_depth" in m


def test_query_routes_are_answered_at_the_edge(shared, monkeypatch):
    """POST /v1/select and /v1/select/batch are answered by the edge middleware, not FastAPI's
    router (which would serve any route alike): with the router's handler broken they still
    answer, errors included, while other routes and other methods on those paths go to it. The
    OpenAPI document still describes their bodies and keys."""
    import fastapi.routing

    c, service = shared
    spec = c.get("/openapi.json").json()
    for path, model in (("/v1/select", "SelectRequest"), ("/v1/select/batch", "BatchRequest")):
        op = spec["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + model)
        assert op["security"] == spec["paths"]["/v1/banks"]["get"]["security"]
    assert spec["components"]["schemas"]["BatchRequest"]["properties"]["requests"]["items"]["$ref"].endswith(
        "/SelectRequest")

    async def broken(self, scope, receive, send):
        raise AssertionError("the router was reached")

    monkeypatch.setattr(fastapi.routing.APIRoute, "handle", broken)
    ok = {"bank_id": SAMPLE_BANK, "question": QUESTION}
    assert _post(c, "/v1/select", ok).status_code == 200
    assert _post(c, "/v1/select/batch", {"requests": [ok, ok]}).status_code == 200
    r = _post(c, "/v1/select", {**ok, "hops": 99})
    assert r.status_code == 422 and "hops must lie" in r.json()["detail"]
    r = _post(c, "/v1/select", {"question": QUESTION})
    assert r.status_code == 422 and r.json()["detail"] == "bank_id: Field required"
    r = _post(c, "/v1/select/batch", {"requests": [ok, {**ok, "budget": "x"}]})
    assert r.status_code == 422 and r.json()["detail"].startswith("requests[1].budget:")
    assert _post(c, "/v1/select", {**ok, "bank_id": "nope"}).status_code == 404
    assert c.get("/v1/banks").status_code == 500  # through the router: broken
    monkeypatch.undo()
    assert c.get("/v1/select").status_code == 405
    assert c.get("/v1/banks").status_code == 200


def test_one_engine_whatever_budgets_hops_and_token_budgets(coll):
    """12 distinct (B, H, T), alone and mixed in one batch: one engine, built once, its tables
    never rebuilt or copied."""
    cfg = ServeConfig(collection=coll, max_wait_ms=1)
    with running(cfg) as (url, service, _):
        eng = service.engines.engine
        tables = {k: v.data_ptr() for k, v in eng.snapshot.t.items()}
        cases = [{"budget": b, "hops": h} for b in (4, 8, 12) for h in (0, 1, 2)] + \
                [{"token_budget": t} for t in (150, 300, 600)]
        with httpx.Client(base_url=url, timeout=60) as c:
            alone = []
            for p in cases:
                r = _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": QUESTION, **p})
                assert r.status_code == 200 and len(r.json()["units"]) <= p.get("budget", 10 ** 6)
                alone.append(r.json()["text"])
            r = _post(c, "/v1/select/batch", {"requests": [{"bank_id": SAMPLE_BANK, "question": QUESTION, **p}
                                                           for p in cases]})
            assert [x["text"] for x in r.json()["results"]] == alone
        assert service.engines.builds == 1 and service.engines.engine is eng
        assert {k: v.data_ptr() for k, v in eng.snapshot.t.items()} == tables


def test_token_budget_per_request(shared):
    """``token_budget`` (T): the workspace the in-process engine selects under T (no unit cap unless
    ``budget`` is given too), rendered within T, from an engine keyed by (B, H, T); a batch mixing
    T answers each request as alone; bad T values get a 422 that names it."""
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.tokens import count_tokens
    from trawmem_gpu.select.workspace import assemble

    c, service = shared
    bank = service.registry.get(SAMPLE_BANK)
    z = service.encoder.encode([QUESTION], is_query=True)
    ok = {"bank_id": SAMPLE_BANK, "question": QUESTION}
    cases = ((150, None, 1), (400, None, 2), (400, 3, 1))
    for T, B, H in cases:
        r = _post(c, "/v1/select", {**ok, "token_budget": T, "hops": H, **({"budget": B} if B else {})})
        assert r.status_code == 200, r.text
        got = r.json()
        want = SelectionEngine([bank], SelectConfig()).select_units(
            [SAMPLE_BANK], [QUESTION], z, params=QueryParams(budget=B, hops=H, token_budget=T))[0]
        assert [u["id"] for u in got["units"]] == assemble(bank, QUESTION, want).unit_ids
        assert (got["token_budget"], got["budget"], got["hops"]) == (T, B, H)
        assert got["n_tokens"] == count_tokens(got["text"]) <= T
        assert len(got["units"]) <= (B or bank.n_units) and service.engines.builds == 1
    assert len(_post(c, "/v1/select", {**ok, "token_budget": 400, "hops": 2}).json()["units"]) > 3  # no cap of B
    plain = _post(c, "/v1/select", ok).json()
    assert plain["token_budget"] is None and plain["budget"] == service.defaults.budget
    reqs = [{**ok, "token_budget": T, "hops": H, **({"budget": B} if B else {})} for T, B, H in cases] + [ok]
    alone = [_post(c, "/v1/select", q).json() for q in reqs]
    batch = _post(c, "/v1/select/batch", {"requests": reqs}).json()["results"]
    assert [x["text"] for x in batch] == [x["text"] for x in alone]
    for bad in (0, -5, 2.5, "x", True, 10 ** 9):
        r = _post(c, "/v1/select", {**ok, "token_budget": bad})
        assert r.status_code == 422 and "token_budget" in r.json()["detail"], (bad, r.text)
    r = _post(c, "/v1/select/batch", {"requests": [ok, {**ok, "token_budget": 0}]})
    assert r.status_code == 422 and r.json()["detail"].startswith("requests[1].token_budget must lie in 1..")


# ----------------------------------------------------------------------------------------------
# dynamic batching
# ----------------------------------------------------------------------------------------------
def _wait_for(cond, limit_s: float = 120.0) -> None:
    """Poll ``cond`` until it holds (bounded); the test then asserts on the state, not on time."""
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < limit_s:
        time.sleep(0.01)


def test_concurrent_requests_share_encoder_and_engine_calls(coll):
    """15 requests that queue while a batch runs are answered by one encoder call and one
    engine call (the first batch is held at a gate, so no timing decides the batches)."""
    cfg = ServeConfig(collection=coll, max_batch=32, max_wait_ms=0)
    with running(cfg) as (url, service, _):
        enc_calls, eng_calls = [], []
        inner = service.encoder.inner.encode
        service.encoder.inner.encode = lambda texts, **k: enc_calls.append(len(texts)) or inner(texts, **k)
        eng = service.engines.engine
        sel = eng.select_units
        eng.select_units = lambda b, q, Z, **k: eng_calls.append(len(b)) or sel(b, q, Z, **k)
        gate, _ = _gate(service)
        body = lambda i: {"bank_id": SAMPLE_BANK, "question": f"{QUESTION} ({i})"}  # noqa: E731
        with httpx.Client(base_url=url, timeout=600) as c, ThreadPoolExecutor(16) as ex:
            futs = [ex.submit(_post, c, "/v1/select", body(0))]
            _wait_for(lambda: service.batcher.running == 1)  # the first batch is held at the gate
            futs += [ex.submit(_post, c, "/v1/select", body(i)) for i in range(1, 16)]
            _wait_for(lambda: service.batcher.depth == 15)
            gate.set()
            rs = [f.result() for f in futs]
        assert all(r.status_code == 200 for r in rs)
        sizes = [r.json()["timings"]["batch_size"] for r in rs]
        assert enc_calls == [1, 15] and eng_calls == [1, 15]  # coalesced: one call for the 15 queued
        assert sorted(sizes) == [1] + [15] * 15


def test_batcher_unit_behaviour():
    """The batcher alone: max batch, multi-item admission all-or-nothing, queued timeouts skipped."""
    import asyncio

    from trawmem_gpu.serve.batcher import DeadlineExceeded, DynamicBatcher, QueueFull, ShuttingDown

    seen: list[list] = []
    gate = threading.Event()

    def process(items):
        gate.wait(600)  # a safety bound only: the test sets the gate
        seen.append(list(items))
        return [x * 10 for x in items]

    async def until(cond):  # polls the loop (bounded); asserts on state, never on elapsed time
        for _ in range(12000):
            if cond():
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the batcher never got there")

    async def main():
        with ThreadPoolExecutor(1) as ex:
            b = DynamicBatcher(process, max_batch=3, max_wait_s=0.05, max_queue=4, executor=ex)
            b.start()
            t1 = asyncio.ensure_future(b.submit([1], 60))
            await until(lambda: b.running == 1)  # batch [1] is running (blocked on the gate)
            t2 = asyncio.ensure_future(b.submit([2, 3, 4, 5], 60))  # fills the queue exactly
            await until(lambda: b.depth == 4)
            with pytest.raises(QueueFull) as e:
                await b.submit([6], 10)
            assert e.value.retry_after >= 1
            t3 = asyncio.ensure_future(b.submit([7], 0.05))  # 4 queued of 4: still full
            with pytest.raises(QueueFull):
                await t3
            gate.set()
            assert await t1 == [10]
            assert await t2 == [20, 30, 40, 50]
            # a request that times out while queued never reaches process()
            gate.clear()
            t4 = asyncio.ensure_future(b.submit([8], 60))
            await until(lambda: b.running == 1)
            with pytest.raises(DeadlineExceeded):
                await b.submit([9], 0.1)
            gate.set()
            assert await t4 == [80]
            await b.close()
            with pytest.raises(ShuttingDown):
                await b.submit([10], 1)

    asyncio.run(main())
    assert seen[0] == [1] and all(len(s) <= 3 for s in seen)
    assert [x for s in seen for x in s] == [1, 2, 3, 4, 5, 8]


def test_batcher_answers_chunks_together():
    """Results handed over as ``Later`` (one pool future per chunk): each request gets its own
    element, an exception element fails only that request, a failed chunk fails its requests."""
    import asyncio

    from trawmem_gpu.serve.batcher import DynamicBatcher, Later

    pool = ThreadPoolExecutor(2)

    def chunk(xs):
        time.sleep(0.02)
        if 13 in xs:
            raise RuntimeError("whole chunk failed")
        return [ValueError(f"bad {x}") if x < 0 else x * 10 for x in xs]

    def process(items):
        out = []
        for c in range(0, len(items), 2):  # chunks of two
            fut = pool.submit(chunk, items[c:c + 2])
            out += [Later(fut, k) for k in range(len(items[c:c + 2]))]
        return out

    async def main():
        with ThreadPoolExecutor(1) as ex:
            b = DynamicBatcher(process, max_batch=8, max_wait_s=0.05, max_queue=64, executor=ex)
            b.start()
            one = [asyncio.ensure_future(b.submit([x], 10)) for x in (1, -2, 3, 4, 5)]
            res = await asyncio.gather(*one, return_exceptions=True)
            assert res[0] == [10] and res[2:] == [[30], [40], [50]]
            assert isinstance(res[1], ValueError) and "bad -2" in str(res[1])
            assert await b.submit([6, 7, 8], 10) == [60, 70, 80]
            with pytest.raises(RuntimeError, match="whole chunk"):
                await b.submit([13, 14], 10)
            await b.close()

    asyncio.run(main())
    pool.shutdown()


# ----------------------------------------------------------------------------------------------
# tenants and keys
# ----------------------------------------------------------------------------------------------


def _turn(tid, text="We adopted a puppy called Biscuit today.", ts="2024-06-01T10:00:00", **kw):
    return {"turn_id": tid, "speaker": "Ana", "text": text, "timestamp": ts, **kw}


def test_auth_matrix(coll, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    cfg = ServeConfig(collection=coll, keys_file=keys_file(tmp_path / "keys.json"), max_wait_ms=1)
    bodies = []
    with running(cfg) as (url, service, _):
        c = httpx.Client(base_url=url, timeout=60)

        def call(method, path, key=None, body=None, bearer=True):
            hdr = {} if key is None else ({"Authorization": f"Bearer {key}"} if bearer else {"X-API-Key": key})
            r = c.request(method, path, json=body, headers=hdr)
            bodies.append(r.text)
            return r

        sel = lambda b: {"bank_id": b, "question": QUESTION}  # noqa: E731

        def same_404(a, b, id_a, id_b):  # the foreign bank's answer is the missing bank's, but for the id
            assert a.status_code == b.status_code == 404
            assert a.json()["detail"].replace(repr(id_a), "ID") == b.json()["detail"].replace(repr(id_b), "ID")
            assert a.headers.get("content-type") == b.headers.get("content-type")
        # no key / wrong key: 401 everywhere a bank is touched
        for key in (None, "wrong-key", KEYS["rw"] + "x", KEYS["rw"][:-1]):
            assert call("POST", "/v1/select", key, sel("acme-1")).status_code == 401
            assert call("POST", "/v1/select/batch", key, {"requests": [sel("acme-1")]}).status_code == 401
            assert call("POST", "/v1/banks/acme-1/turns", key, {"turns": [_turn("x1")]}).status_code == 401
            assert call("GET", "/v1/banks", key).status_code == 401
            assert call("GET", "/v1/banks/acme-1", key).status_code == 401
        assert call("POST", "/v1/select", None, {"bank_id": "acme-1"}).status_code == 401  # auth before body checks
        # the owner reads with either header
        assert call("POST", "/v1/select", KEYS["rw"], sel("acme-1")).status_code == 200
        assert call("POST", "/v1/select", KEYS["rw"], sel("acme-1"), bearer=False).status_code == 200
        assert call("POST", "/v1/select", KEYS["ro"], sel("acme-1")).status_code == 200
        # a bank the key does not own answers exactly as a bank that does not exist
        for key, foreign, missing in ((KEYS["rw"], "other-1", "acme-zzz"), (KEYS["other"], "acme-1", "other-zzz"),
                                      (KEYS["rw"], SAMPLE_BANK, "nope")):
            for route, body in (("/v1/select", sel), ("/v1/select/batch", lambda b: {"requests": [sel(b)]})):
                same_404(call("POST", route, key, body(foreign)), call("POST", route, key, body(missing)), foreign,
                         missing)
            same_404(call("GET", f"/v1/banks/{foreign}", key), call("GET", f"/v1/banks/{missing}", key), foreign,
                     missing)
            # appends: neither an existing foreign bank nor a new bank outside the patterns
            for bank_id in (foreign, "zzz-" + missing):
                r = call("POST", f"/v1/banks/{bank_id}/turns", key, {"turns": [_turn("x1")]})
                assert r.status_code == 404 and r.json()["detail"] == f"unknown bank id {bank_id!r}"
        assert service.registry.get("acme-1").n_units == service.registry.get(SAMPLE_BANK).n_units
        assert "zzz-acme-zzz" not in service.registry and "zzz-other-zzz" not in service.registry
        # read-only key: 403 on its own bank, 404 on others
        assert call("POST", "/v1/banks/acme-1/turns", KEYS["ro"], {"turns": [_turn("x1")]}).status_code == 403
        assert call("POST", "/v1/banks/other-1/turns", KEYS["ro"], {"turns": [_turn("x1")]}).status_code == 404
        # read-write: append, and create a bank inside its patterns
        n0 = service.registry.get("acme-1").n_units
        r = call("POST", "/v1/banks/acme-1/turns", KEYS["rw"], {"turns": [_turn("x1")]})
        assert r.status_code == 200 and r.json()["n_units"] == n0 + 1 and r.json()["created"] is False
        r = call("POST", "/v1/banks/acme-new/turns", KEYS["rw"], {"turns": [_turn("n1"), _turn("n2", "Bye")]})
        assert r.status_code == 200 and r.json()["created"] is True and r.json()["n_units"] == 2
        # listings show only owned banks
        assert {b["bank_id"] for b in call("GET", "/v1/banks", KEYS["ro"]).json()["banks"]} == {"acme-1", "acme-new"}
        assert {b["bank_id"] for b in call("GET", "/v1/banks", KEYS["other"]).json()["banks"]} == {"other-1",
                                                                                                   SAMPLE_BANK}
        bodies.append(c.get("/metrics").text)
        c.close()
    # keys appear in no response, metric or log line
    logs = "\n".join(r.getMessage() for r in caplog.records)
    for k in KEYS.values():
        assert all(k not in b for b in bodies) and k not in logs


def test_keys_file_errors_and_serve_key(tmp_path):
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.serve.keys import KeyStore, add_key

    p = tmp_path / "k.json"
    for doc, msg in (({"keys": [{"sha256": "xyz", "tenant": "a", "banks": ["*"], "access": "read-only"}]}, "64 hex"),
                     ({"keys": [{"sha256": "0" * 64, "tenant": "a", "banks": [], "access": "read-only"}]}, "banks"),
                     ({"keys": [{"sha256": "0" * 64, "tenant": "a", "banks": ["*"], "access": "admin"}]}, "access"),
                     ({"nokeys": []}, "expected")):
        p.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match=msg):
            KeyStore.load(p)
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        KeyStore.load(p)
    p.unlink()
    k1 = add_key(p, "acme", ["acme-*"], writable=True)
    k2 = add_key(p, "acme", ["acme-*"], writable=False)
    assert k1 not in p.read_text() and k2 not in p.read_text()
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    ks = KeyStore.load(p)
    assert ks.authenticate(k1).writable and not ks.authenticate(k2).writable
    assert ks.authenticate(k1 + "x") is None and ks.authenticate(None) is None
    with pytest.raises(ConfigError, match="127.0.0.1 only"):
        ServeConfig(host="0.0.0.0")
    ServeConfig(host="0.0.0.0", keys_file=str(p))


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------
def _bank_files(coll: str, bank_id: str) -> dict:
    from trawmem_gpu.store import Collection

    d = Collection(coll).bank_path(bank_id)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_bad_inputs_get_4xx_and_leave_banks_unchanged(coll):
    cfg = ServeConfig(collection=coll, max_body_bytes=64 * 1024, limits=QueryLimits(max_budget=32, max_hops=3),
                      max_batch_request=4, max_wait_ms=1)
    before = _bank_files(coll, SAMPLE_BANK)
    with running(cfg) as (url, service, _):
        c = httpx.Client(base_url=url, timeout=60)
        dim = service.dim
        ok = {"bank_id": SAMPLE_BANK, "question": QUESTION}
        n0 = service.registry.get(SAMPLE_BANK).n_units
        cases = [
            ({**ok, "question": ""}, 422, "question is empty"),
            ({**ok, "question": "   "}, 422, "question is empty"),
            ({**ok, "question": "x" * 4001}, 422, "the limit is 4000"),
            ({**ok, "bank_id": "nope"}, 404, "unknown bank id 'nope'"),
            ({**ok, "budget": 0}, 422, "budget must lie in 1..32"),
            ({**ok, "budget": 33}, 422, "budget must lie in 1..32"),
            ({**ok, "budget": 2.5}, 422, "budget"),
            ({**ok, "hops": -1}, 422, "hops must lie in 0..3"),
            ({**ok, "hops": 4}, 422, "hops must lie in 0..3"),
            ({**ok, "date": "sometime"}, 422, "date"),
            ({**ok, "question_vector": [0.1] * (dim - 1)}, 422, f"gives {dim}"),
            ({**ok, "question_vector": [0.0] * dim}, 422, "all zeros"),
            ({**ok, "question_vector": ["a"] * dim}, 422, "question_vector"),
            ({**ok, "question_vector": ["0.5"] * dim}, 422, "question_vector"),  # numbers only, strictly
            ({**ok, "question_vector": [True] * dim}, 422, "question_vector"),
            ({**ok, "extra": 1}, 422, "extra"),
            ({"question": QUESTION}, 422, "bank_id: Field required"),
        ]
        for body, status, msg in cases:
            r = _post(c, "/v1/select", body)
            assert r.status_code == status and msg in r.json()["detail"], (body.keys(), r.status_code, r.text)
        # NaN / inf cannot be written in strict JSON but Python clients send them
        for bad in ("NaN", "Infinity"):
            vec = ", ".join(["0.1"] * (dim - 1) + [bad])
            r = c.post("/v1/select", content=f'{{"bank_id": "{SAMPLE_BANK}", "question": "q", "question_vector": '
                                             f'[{vec}]}}', headers={"content-type": "application/json"})
            assert r.status_code == 422 and "NaN or infinite" in r.json()["detail"]
        r = c.post("/v1/select", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422
        # batch: limits and the index of the bad request
        r = _post(c, "/v1/select/batch", {"requests": [ok] * 5})
        assert r.status_code == 422 and "limit is 4" in r.json()["detail"]
        r = _post(c, "/v1/select/batch", {"requests": [ok, {**ok, "question": ""}]})
        assert r.status_code == 422 and r.json()["detail"].startswith("requests[1].")
        r = _post(c, "/v1/select/batch", {"requests": [ok, {**ok, "bank_id": "nope"}]})
        assert r.status_code == 404 and r.json()["detail"] == "requests[1]: unknown bank id 'nope'"
        assert _post(c, "/v1/select/batch", {"requests": []}).status_code == 422
        # oversized bodies: with a Content-Length, and chunked without one
        big = {**ok, "question": "y" * (70 * 1024)}
        r = _post(c, "/v1/select", big)
        assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]
        r = c.post("/v1/select", content=iter([json.dumps(big).encode()[i:i + 8192] for i in range(0, 80000, 8192)]),
                   headers={"content-type": "application/json"})
        assert r.status_code == 413
        small = json.dumps(ok).encode()
        r = c.post("/v1/select", content=iter([small[:10], small[10:]]), headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        # malformed turns: nothing appended, the bank's files untouched
        T = "/v1/banks/ana-ben/turns"
        turn_cases = [
            ({"turns": []}, 422, "turns"),
            ({"turns": [_turn("n1"), _turn("n2", text="")]}, 422, "turns[1]: turn 'n2' has empty 'text'"),
            ({"turns": [_turn("n1"), _turn("n2", ts="not a date")]}, 422, "turns[1]: field 'timestamp'"),
            ({"turns": [_turn("n1"), _turn("n1")]}, 422, "duplicate turn id 'n1'"),
            ({"turns": [_turn("n1", session=9), _turn("n2")]}, 422, "on every turn of a request or on none"),
            ({"turns": [_turn("n1", session=1)]}, 422, "turns[0]: field 'session' goes backwards"),
            ({"turns": [{"turn_id": "n1", "speaker": "A", "text": "hi"}]}, 422, "turns[0].timestamp: Field required"),
            ({"turns": [{**_turn("n1"), "bank_id": "x"}]}, 422, "turns[0].bank_id: Extra inputs are not permitted"),
            ({"turns": [_turn("S1:1")]}, 409, "already holds turn ids ['S1:1']"),
        ]
        for body, status, msg in turn_cases:
            r = _post(c, T, body)
            assert r.status_code == status and msg in r.json()["detail"], (body, r.status_code, r.text)
        r = _post(c, "/v1/banks/bad%01id/turns", {"turns": [_turn("n1")]})
        assert r.status_code == 422 and "bank id" in r.json()["detail"], r.text
        assert service.registry.get(SAMPLE_BANK).n_units == n0
        assert _bank_files(coll, SAMPLE_BANK) == before
        # and the server still serves
        assert _post(c, "/v1/select", ok).status_code == 200
        assert c.get("/readyz").status_code == 200
        c.close()


def test_turn_sessions_continue_across_appends(coll):
    with running(ServeConfig(collection=coll, max_wait_ms=1)) as (url, service, _):
        c = httpx.Client(base_url=url, timeout=60)
        last = service.registry.get(SAMPLE_BANK).turns[-1]
        same_day = last.time.isoformat()
        r = _post(c, "/v1/banks/ana-ben/turns", {"turns": [_turn("a1", ts=same_day), _turn("a2", ts="2031-01-02")]})
        assert r.status_code == 200, r.text
        turns = service.registry.get(SAMPLE_BANK).turns
        assert turns[-2].session == last.session and turns[-1].session == last.session + 1
        r = _post(c, "/v1/banks/fresh/turns", {"turns": [_turn("f1", ts="2031-01-01"), _turn("f2", ts="2031-01-03")]})
        assert r.status_code == 200 and r.json()["n_sessions"] == 2
        # the new turns are selectable at once (read-your-writes)
        r = _post(c, "/v1/select", {"bank_id": "fresh", "question": "What is the puppy called?"})
        assert r.status_code == 200 and {u["id"] for u in r.json()["units"]} == {"f1", "f2"}
        c.close()


# ----------------------------------------------------------------------------------------------
# appends beside queries
# ----------------------------------------------------------------------------------------------
def test_concurrent_appends_and_queries_lose_nothing(coll):
    from trawmem_gpu.store import Collection

    cfg = ServeConfig(collection=coll, max_wait_ms=2)
    banks = (SAMPLE_BANK, "acme-1")
    with running(cfg) as (url, service, _):
        versions: dict[tuple[str, int], object] = {}
        for b in banks:
            bank = service.registry.get(b)
            versions[(b, bank.n_units)] = bank
        orig = service.registry.append

        def recording_append(*a, **k):
            res = orig(*a, **k)
            versions[(res.bank.bank_id, res.bank.n_units)] = res.bank
            return res

        service.registry.append = recording_append
        n0 = {b: service.registry.get(b).n_units for b in banks}
        stop = threading.Event()
        answers, failures = [], []

        def writer(w):
            with httpx.Client(base_url=url, timeout=60) as c:
                for i in range(4):
                    b = banks[(w + i) % 2]
                    # one date for every writer: the appends race, and an append never goes back in time
                    body = {"turns": [_turn(f"w{w}-{i}-{j}", f"Writer {w} says item {i}.{j}: we bought a kayak.",
                                            ts="2030-01-10T10:00:00") for j in range(2)]}
                    r = _post(c, f"/v1/banks/{b}/turns", body)
                    (answers if r.status_code == 200 else failures).append(r)

        def reader(k):
            with httpx.Client(base_url=url, timeout=60) as c:
                while not stop.is_set():
                    r = _post(c, "/v1/select", {"bank_id": banks[k % 2], "question": "What did they buy?",
                                                "budget": 8})
                    (answers if r.status_code == 200 else failures).append(r)

        with ThreadPoolExecutor(8) as ex:
            rf = [ex.submit(reader, k) for k in range(4)]
            wf = [ex.submit(writer, w) for w in range(4)]
            for f in wf:
                f.result()
            stop.set()
            for f in rf:
                f.result()
        assert not failures, [(r.status_code, r.text) for r in failures[:3]]
        selects = [r.json() for r in answers if "units" in r.json()]
        assert len(selects) >= 8
        # every answer was read from exactly one bank version: ids, threads and heads agree with it
        for s in selects:
            v = versions[(s["bank_id"], s["bank_n_units"])]
            idx = v.index_of()
            for u in s["units"]:
                assert u["thread"] == int(v.unit_thread[idx[u["id"]]])
            assert all(t["head"] == v.heads[t["thread"]] for t in s["threads"])
        # no lost turns: 4 writers x 4 appends x 2 turns, in memory, through the API and on disk
        final = {b: service.registry.get(b) for b in banks}
        assert sum(final[b].n_units - n0[b] for b in banks) == 32
        ids = {t.turn_id for b in banks for t in final[b].turns}
        assert all(f"w{w}-{i}-{j}" in ids for w in range(4) for i in range(4) for j in range(2))
        with httpx.Client(base_url=url, timeout=60) as c:
            for b in banks:
                assert c.get(f"/v1/banks/{b}").json()["n_units"] == final[b].n_units
    disk = Collection(coll)
    for b in banks:
        assert [t.turn_id for t in disk.load(b).turns] == [t.turn_id for t in final[b].turns]


# ----------------------------------------------------------------------------------------------
# overload, deadlines, draining
# ----------------------------------------------------------------------------------------------
def _gate(service):
    """Block the batch function until the returned event is set; returns (event, processed items)."""
    gate, seen = threading.Event(), []
    orig = service.batcher.process

    def gated(items):
        gate.wait(600)  # a safety bound only: every test sets the gate
        seen.extend(it.question for it in items)
        return orig(items)

    service.batcher.process = gated
    return gate, seen


def test_full_queue_gets_429_with_retry_after(coll):
    cfg = ServeConfig(collection=coll, max_batch=1, max_queue=2, max_wait_ms=0)
    with running(cfg) as (url, service, _):
        gate, _ = _gate(service)
        body = lambda i: {"bank_id": SAMPLE_BANK, "question": f"{QUESTION} {i}"}  # noqa: E731
        with httpx.Client(base_url=url, timeout=600) as c, ThreadPoolExecutor(3) as ex:
            futs = [ex.submit(_post, c, "/v1/select", body(0))]
            _wait_for(lambda: service.batcher.running == 1)  # taken into a batch, held at the gate
            futs += [ex.submit(_post, c, "/v1/select", body(i)) for i in (1, 2)]
            _wait_for(lambda: service.batcher.depth == 2)  # the queue is full
            r = _post(c, "/v1/select", body(9))
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
            r = _post(c, "/v1/select/batch", {"requests": [body(10), body(11)]})
            assert r.status_code == 429
            gate.set()
            assert [f.result().status_code for f in futs] == [200, 200, 200]
            assert _post(c, "/v1/select", body(12)).status_code == 200
            assert 'status="429"' in c.get("/metrics").text


def test_deadline_gets_504_and_expired_requests_are_dropped(coll):
    cfg = ServeConfig(collection=coll, max_batch=1, timeout_s=0.5, max_wait_ms=0)
    with running(cfg) as (url, service, _):
        gate, seen = _gate(service)
        with httpx.Client(base_url=url, timeout=60) as c, ThreadPoolExecutor(2) as ex:
            first = ex.submit(_post, c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": "first"})
            _wait_for(lambda: service.batcher.running == 1)  # first is held at the gate
            second = ex.submit(_post, c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": "second"})
            r1, r2 = first.result(), second.result()
            assert r1.status_code == r2.status_code == 504 and "timeout_s" in r1.json()["detail"]
            gate.set()
            _wait_for(lambda: not service.batcher.running)
            r = _post(c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": "third"})
            assert r.status_code == 200
        assert "second" not in seen  # expired while queued: never cost engine time


def test_shutdown_drains_in_flight_requests(coll):
    cfg = ServeConfig(collection=coll, max_batch=2, max_wait_ms=0, timeout_s=30)
    from trawmem_gpu.serve.server import BackgroundServer, build_app

    app, service = build_app(cfg)
    srv = BackgroundServer(app, cfg).start()
    gate, seen = _gate(service)
    with httpx.Client(base_url=srv.url, timeout=60) as c, ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(_post, c, "/v1/select", {"bank_id": SAMPLE_BANK, "question": f"q{i}"}) for i in range(4)]
        _wait_for(lambda: service.batcher.depth + service.batcher.running == 4)
        stopper = threading.Thread(target=srv.stop)
        stopper.start()  # SIGTERM-equivalent: stop accepting, drain
        time.sleep(0.3)
        assert stopper.is_alive()  # waiting for the in-flight requests
        gate.set()
        stopper.join(60)
        assert [f.result().status_code for f in futs] == [200] * 4
    assert sorted(seen) == [f"q{i}" for i in range(4)]
    assert service.batcher.closing and not service.ready


# ----------------------------------------------------------------------------------------------
# the served engine and its refresh
# ----------------------------------------------------------------------------------------------
class _FakeBank:
    def __init__(self, bank_id, v=0):
        self.bank_id, self.v = bank_id, v


class _Eng:
    def __init__(self, banks, cfg):
        self.banks, self.cfg = {b.bank_id: b for b in banks}, cfg
        self.built, self.published = [], []

    def prepare_bank(self, bank):
        from types import SimpleNamespace

        self.built.append(bank.bank_id)
        return SimpleNamespace(bank=bank), {}

    def replace_bank(self, bank, prepared=None):
        if prepared is None:
            self.built.append(bank.bank_id)
        self.published.append(bank.bank_id)
        self.banks[bank.bank_id] = bank


def test_served_engine_refresh():
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.memory.engines import ServedEngine

    es = ServedEngine({}, SelectConfig(), make=_Eng)
    assert es.builds == 0 and es.prepare(_FakeBank("a")) is None
    with pytest.raises(LookupError):
        es.engine
    a, b = _FakeBank("a"), _FakeBank("b")
    es.refresh(a)  # the first bank builds the engine
    es.refresh(b)  # later ones join it in place
    eng = es.engine
    assert es.builds == 1 and eng.banks == {"a": a, "b": b} and es.bank("b") is b
    # prepared off the worker: refresh only publishes; tables prepared for another bank object are not used
    eng.built.clear()
    b2 = _FakeBank("b", 2)
    prep = es.prepare(b2)
    assert eng.built == ["b"]
    es.refresh(b2, prep)
    assert eng.built == ["b"] and eng.banks["b"] is b2 and eng.published[-1] == "b"
    eng.built.clear()
    b3 = _FakeBank("b", 3)
    es.refresh(b3, prep)  # prepared for b2: ignored, b3 is built
    assert eng.built == ["b"] and eng.banks["b"] is b3 and es.builds == 1


def test_dates_reach_the_engine():
    from datetime import datetime

    from trawmem_gpu.memory.engines import select_units

    class Eng:
        def select_units(self, bank_ids, questions, Z, dates=None, params=None):
            self.dates, self.params = dates, params
            return [[1]] * len(bank_ids)

    d = [datetime(2031, 1, 2), None]
    eng = Eng()
    assert select_units(eng, ["a", "b"], ["q", "q"], None, d, ["p", "p"]) == ([[1], [1]], [True, False]) and eng.dates == d
    assert select_units(eng, ["a"], ["q"], None, [None], ["p"]) == ([[1]], [False]) and eng.dates is None
    assert eng.params == ["p"]


def test_serve_creates_a_missing_collection_and_sigterm_drains_with_a_message(tmp_path):
    """`serve --collection NEW` does what its help says (creates it) and says so; SIGTERM says
    it drains, answers what it holds, and the process exits 0 with a last line."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    new = tmp_path / "typo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "serve", "--collection", str(new),
                             "--port", str(port), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300 and proc.poll() is None:  # bounded wait for readiness
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/banks", timeout=30).json()["banks"] == []
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "0 banks, 0 units" in out and "1 banks" not in out
    assert f"{new} did not exist: created an empty collection there" in out
    assert "SIGTERM: draining" in out and out.rstrip().endswith("trawmem serve: stopped"), out
    assert (new / "collection.json").exists()
