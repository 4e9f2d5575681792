"""`trawmem serve`: API v1 against the in-process engine (select, batch, dates, question vectors,
banks / health / openapi / metrics, the edge's query checks, token budgets).

The real server in-process on 127.0.0.1 and a free port, driven with httpx.
"""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, running  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from serve_cases import coll, sample_coll, shared  # noqa: E402, F401, F811 (fixtures)
from serve_cases import QUESTION, _post  # noqa: E402


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
