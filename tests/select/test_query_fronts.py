"""One ``QueryParams`` from every front: the same request through ``Memory``, HTTP, MCP, the
command line and ``score`` reaches the engine as the ``QueryParams`` that
``select.params.merge_params`` gives (the request over the collection's defaults over the
method's). Each front is driven through its own door; what reaches the engine is recorded where
the engine would be called."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from trawmem_gpu.encode.base import Encoder
from trawmem_gpu.select.params import QueryParams, merge_params

CASES = [  # (request fields, collection defaults or None)
    ({}, None),
    ({"budget": 5, "hops": 2}, None),
    ({"token_budget": 200}, None),
    ({"token_budget": 200, "budget": 4}, None),
    ({"hops": 0}, None),
    ({}, {"token_budget": 800}),
    ({"budget": 8}, {"token_budget": 800}),
    ({"token_budget": 300}, {"budget": 6, "hops": 2}),
    ({"hops": 3}, {"budget": 6, "hops": 2}),
]
IDS = [f"{'+'.join(f'{k}={v}' for k, v in r.items()) or 'none'}/over/"
       f"{'+'.join(f'{k}={v}' for k, v in (c or {}).items()) or 'method'}" for r, c in CASES]
BANK = "fronts-1"


class _Stub(Encoder):
    """A deterministic 8-dimensional encoder (no model): texts hash to vectors."""

    id, dim = "stub-fronts-8", 8

    def _encode_batch(self, texts, is_query):
        return np.stack([np.random.default_rng(abs(hash(t)) % (1 << 32)).normal(size=self.dim) + 1.0
                         for t in texts]).astype(np.float32)


class _Reached(Exception):
    """Raised where the engine would be called, carrying the params that reached it."""


def _want(request, coll) -> QueryParams:
    return merge_params(request, None if coll is None else merge_params(coll))


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    from trawmem_gpu import Memory

    path = tmp_path_factory.mktemp("fronts") / "m"
    Memory(path, encoder=_Stub()).add(BANK, [
        {"turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben", "text": text, "timestamp": f"2031-03-0{i + 1}"}
        for i, text in enumerate(["I moved to Lisbon.", "My sister lives in Porto.", "We adopted a cat."])])
    return path


@pytest.fixture
def reached(monkeypatch):
    """The ``QueryParams`` lists that reached the engine through the engine client (``select.client.run``)."""
    import trawmem_gpu.select.client as client

    seen = []

    def run(engine, bids, qs, Z, params, dates=None, masks=None):
        seen.append(list(params))
        raise _Reached

    monkeypatch.setattr(client, "run", run)
    return seen


@pytest.mark.parametrize("request_, coll", CASES, ids=IDS)
def test_memory_select_and_select_many(collection, reached, request_, coll):
    from trawmem_gpu import Memory

    mem = Memory(collection, encoder=_Stub(), create=False, **(coll or {}))
    assert mem.defaults == (QueryParams() if coll is None else merge_params(coll))
    for call in (lambda: mem.select(BANK, "Where does Ben's sister live?", **request_),
                 lambda: mem.select_many([(BANK, "a?"), (BANK, "b?")], **request_),
                 lambda: mem.select(BANK, "c?", params=mem.defaults, **request_)):
        with pytest.raises(_Reached):
            call()
    assert [set(p) for p in reached] == [{_want(request_, coll)}] * 3


@pytest.mark.parametrize("request_, coll", CASES, ids=IDS)
def test_http(request_, coll):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from trawmem_gpu.errors import UnknownBank
    from trawmem_gpu.serve.app import create_app
    from trawmem_gpu.serve.config import ServeConfig

    seen = []

    class Backend:
        defaults = QueryParams() if coll is None else merge_params(coll)
        dim, encoder_id, ready = 8, _Stub.id, True

        async def start(self):
            pass

        async def stop(self):
            pass

        def queue_depth(self):
            return 0

        async def select(self, items, batch=False, quota=None):
            seen.extend(it.params for it in items)
            raise UnknownBank(items[0].bank_id)

    with TestClient(create_app(Backend(), ServeConfig())) as c:
        body = {"bank_id": BANK, "question": "Where does Ben's sister live?", **request_}
        assert c.post("/v1/select", json=body).status_code == 404
        assert c.post("/v1/select/batch", json={"requests": [body, body]}).status_code == 404
    assert seen == [_want(request_, coll)] * 3


@pytest.mark.parametrize("request_, coll", [(r, c) for r, c in CASES if set(r) <= {"token_budget"}],
                         ids=[i for i, (r, _) in zip(IDS, CASES) if set(r) <= {"token_budget"}])
def test_mcp_recall(collection, reached, request_, coll):
    """``recall`` names only a token budget; the tool's default T (800) is the request's when it
    names none, over the Memory's defaults."""
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    from mcp import Client

    from trawmem_gpu import Memory
    from trawmem_gpu.mcp.server import build_server
    from trawmem_gpu.serve.keys import LOCAL_TENANT

    mem = Memory(collection, encoder=_Stub(), create=False, **(coll or {}))

    async def go():
        async with Client(build_server(mem, lambda ctx: LOCAL_TENANT, default_token_budget=800)) as c:
            return await c.call_tool("recall", {"bank_id": BANK, "question": "Where?", **request_})

    asyncio.run(asyncio.wait_for(go(), 120))
    assert reached == [[_want({"token_budget": 800, **request_}, coll)]]


def _flags(request_) -> list[str]:
    return [x for k, v in request_.items() for x in (f"--{k.replace('_', '-')}", str(v))]


@pytest.mark.parametrize("request_", [r for r, c in CASES if c is None])
def test_cli_query_and_score(request_, tmp_path):
    """The command line has no collection defaults: its flags over the method's."""
    from trawmem_gpu.cli import build_parser
    from trawmem_gpu.cli.score import _spec
    from trawmem_gpu.cli.query import _select_config

    want = _want(request_, None)
    p = build_parser(["query", "eval", "score"])
    for argv in (["query", "--bank", str(tmp_path), "--question", "q"], ["eval", "--data", "x.json", "--output", "o.json"]):
        assert _select_config(p.parse_args([*argv, *_flags(request_)]))[1] == want
    a = p.parse_args(["score", "--data", "x.json", "--out", str(tmp_path / "o.jsonl"), *_flags(request_)])
    assert _spec(a).params() == want


@pytest.mark.parametrize("request_", [r for r, _ in CASES])
def test_a_score_spec_merges_its_select_fields_by_the_one_rule(request_):
    """A stored ``ScoreSpec`` names query fields in ``select``; those it leaves out are the method's
    (a score job has no collection defaults), with the one rule's unit cap under a token budget."""
    from trawmem_gpu.score.job import ScoreSpec

    assert ScoreSpec(select=dict(request_)).params() == _want(request_, None)
