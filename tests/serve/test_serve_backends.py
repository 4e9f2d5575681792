"""One route suite, run against every backend of the app (``serve/backend.py``).

The routes are written against one ``Backend`` Protocol; this file drives the same HTTP suite
through each implementation, each a real server over its own copy of the sample collection:

* ``local``: ``LocalBackend`` over a ``SelectionService`` (the app in this process);
* ``remote``: ``trawmem serve --http-workers 1`` in a subprocess: the routes run in a front
  process over ``RemoteBackend``, every call crosses the socket to the engine process;
* ``ray``: the Ray Serve application on a local Ray instance (one shard), the routes over
  ``RayBackend`` in its router (skipped, with the reason, when ray is not installed).

Every answer is checked against its wire model (``serve/models.py``), and every backend's
workspace against the one the in-process backend gives. Without a server: every backend class
has each Protocol method with the Protocol's signature, the routes use nothing else of a
backend, and the OpenAPI document is the pinned one (``tests/support/openapi_v1.json``).
"""
from __future__ import annotations

import ast
import inspect
import json
import socket
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import NO_DEADLINE_S, SAMPLE_BANK, build_sample_collection, copy_collection, running, serve_command, \
    stop_serve  # noqa: E402
from trawmem_gpu.serve import models as M  # noqa: E402
from trawmem_gpu.serve.backend import CALLS, LIFECYCLE, Backend, LocalBackend  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402

PINNED = Path(__file__).resolve().parents[1] / "support" / "openapi_v1.json"
QUESTION = "Why did Ana walk home during her long run?"
NEW = "acme-suite"
"""The bank the suite creates, appends to and forgets (in each backend's own collection)."""


def _turn(tid, text="We adopted a puppy called Biscuit today.", ts="2024-06-01T10:00:00"):
    return {"turn_id": tid, "speaker": "Ana", "text": text, "timestamp": ts}


# ----------------------------------------------------------------------------------------------
# the servers
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return build_sample_collection(tmp_path_factory.mktemp("backends") / "coll")


@pytest.fixture(scope="module")
def local(sample, tmp_path_factory):
    """The in-process server: a backend of the suite and the reference of every other's workspaces."""
    path = copy_collection(sample, tmp_path_factory.mktemp("local") / "coll")
    with running(ServeConfig(collection=path, max_wait_ms=2)) as (url, _, _srv):
        yield url


def _remote(sample, tmp):
    """``trawmem serve --http-workers 1`` in a subprocess (its URL), stopped by SIGTERM at the end."""
    path = copy_collection(sample, tmp / "coll")
    proc, url, _ = serve_command(path, "--http-workers", "1", "--max-wait-ms", "2", "--timeout", str(NO_DEADLINE_S))
    try:
        yield url
    finally:
        stop_serve(proc)


def _ray(sample, tmp):
    """The Ray Serve application on a local Ray instance (one shard; its URL), shut down at the end."""
    pytest.importorskip("ray", reason="the ray extra (ray[data,serve]) is not installed: no Ray backend to run")
    pytest.importorskip("ray.serve", reason="the ray extra (ray[data,serve]) is not installed")
    import ray
    from ray import serve

    from trawmem_gpu.serve.ray_app import start_app

    path = copy_collection(sample, tmp / "coll")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    try:
        cfg = ServeConfig(collection=path, port=port, max_wait_ms=2, threads=1, timeout_s=NO_DEADLINE_S)
        start_app(cfg, shards=1, shard_cpus=1)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module", params=["local", "remote", "ray"])
def be(request, local, sample, tmp_path_factory):
    """(name, client) of one backend's server; the module's tests run on each in turn."""
    if request.param == "local":
        url, stop = local, None
    else:
        gen = (_remote if request.param == "remote" else _ray)(sample, tmp_path_factory.mktemp(request.param))
        url, stop = next(gen), gen
    try:
        with httpx.Client(base_url=url, timeout=300) as c:
            yield request.param, c
    finally:
        if stop is not None:
            stop.close()  # runs the generator's finally: the server stops


@pytest.fixture(scope="module")
def reference(local):
    """The in-process backend's workspaces of the suite's questions (by budget)."""
    with httpx.Client(base_url=local, timeout=300) as c:
        return {b: c.post("/v1/select", json={"bank_id": SAMPLE_BANK, "question": QUESTION, "budget": b}).json()
                for b in (4, 8)}


# ----------------------------------------------------------------------------------------------
# the route suite
# ----------------------------------------------------------------------------------------------
def _ok(r: httpx.Response, model):
    """The answer as its wire model; it holds no key the model does not declare (the model is all of it)."""
    assert r.status_code == 200, r.text
    assert set(r.json()) <= set(model.model_fields), set(r.json()) - set(model.model_fields)
    return model.model_validate(r.json())


def _refused(r: httpx.Response, status: int, says: str) -> None:
    assert r.status_code == status, r.text
    assert says in M.Error.model_validate(r.json()).detail


def test_banks_and_counts(be):
    _, c = be
    listing = _ok(c.get("/v1/banks"), M.BankList)
    row = {b.bank_id: b for b in listing.banks}[SAMPLE_BANK]
    assert row.n_units > 0 and listing.dim > 0 and listing.encoder
    info = _ok(c.get(f"/v1/banks/{SAMPLE_BANK}"), M.BankInfo)
    assert (info.n_units, info.n_threads) == (row.n_units, row.n_threads) and info.first_date <= info.last_date
    _refused(c.get("/v1/banks/nobody-here"), 404, "unknown bank id 'nobody-here'")


def test_select_and_batch_give_the_in_process_workspaces(be, reference):
    _, c = be
    for budget, want in reference.items():
        got = _ok(c.post("/v1/select", json={"bank_id": SAMPLE_BANK, "question": QUESTION, "budget": budget}),
                  M.SelectResponse)
        assert [u.id for u in got.units] == [u["id"] for u in want["units"]] and 1 <= len(got.units) <= budget
        assert (got.text, got.n_tokens, got.budget) == (want["text"], want["n_tokens"], budget)
    reqs = [{"bank_id": SAMPLE_BANK, "question": QUESTION, "budget": b} for b in reference]
    batch = _ok(c.post("/v1/select/batch", json={"requests": reqs}), M.BatchResponse)
    assert [[u.id for u in x.units] for x in batch.results] == [[u["id"] for u in w["units"]]
                                                                for w in reference.values()]
    assert all(x.timings.batch_size >= 1 for x in batch.results)


def test_query_refusals(be):
    _, c = be
    _refused(c.post("/v1/select", json={"bank_id": "nobody-here", "question": QUESTION}), 404, "unknown bank id")
    _refused(c.post("/v1/select/batch", json={"requests": [{"bank_id": SAMPLE_BANK, "question": QUESTION},
                                                           {"bank_id": "nobody-here", "question": QUESTION}]}),
             404, "requests[1]: unknown bank id")
    _refused(c.post("/v1/select", json={"bank_id": SAMPLE_BANK, "question": "  "}), 422, "question is empty")
    _refused(c.post("/v1/select", json={"bank_id": SAMPLE_BANK, "question": QUESTION, "budget": 0}), 422,
             "budget must lie in")
    _refused(c.post("/v1/select", json={"bank_id": SAMPLE_BANK, "question": QUESTION, "question_vector": [1.0]}),
             422, "question_vector has 1 numbers")


def test_append_history_forget(be):
    name, c = be
    first = _ok(c.post(f"/v1/banks/{NEW}/turns", json={"turns": [_turn("t1"), _turn("t2", "Biscuit chewed a shoe.",
                                                                                     "2024-06-02T10:00:00")]}),
                M.AppendResponse)
    assert first.created and first.appended == 2 and first.stored == ["t1", "t2"] and first.n_units >= 1
    assert [i.status for i in first.items] == ["stored", "stored"] and first.refused == []
    again = _ok(c.post(f"/v1/banks/{NEW}/turns", json={"turns": [_turn("t1"), {"turn_id": "t3", "speaker": "Ana",
                                                                                "text": "no date"}]}),
                M.AppendResponse)
    assert not again.created and again.already_stored == ["t1"] and again.appended == 0
    assert [(i.status, i.field) for i in again.refused] == [("refused", "turns[1].timestamp")]
    ws = _ok(c.post("/v1/select", json={"bank_id": NEW, "question": "What did the puppy chew?"}), M.SelectResponse)
    assert {u.id for u in ws.units} <= {"t1", "t2"} and ws.units
    hist = _ok(c.get(f"/v1/banks/{NEW}/units/t1/history"), M.History)
    assert (hist.bank_id, hist.unit_id, hist.events[0].event) == (NEW, "t1", "added")
    _refused(c.get(f"/v1/banks/{NEW}/units/zz/history"), 404, "holds no unit 'zz'")
    gone = _ok(c.post(f"/v1/banks/{NEW}/forget", json={"turn_ids": ["t1", "zz"]}), M.ForgetResponse)
    assert (gone.forgotten, gone.missing, gone.deleted) == (["t1"], ["zz"], False), name
    _refused(c.delete(f"/v1/banks/{NEW}/turns/t1"), 404, "holds no turn 't1'")
    assert _ok(c.get(f"/v1/banks/{NEW}/units/t1/history"), M.History).events[-1].event == "forgotten"
    assert _ok(c.delete(f"/v1/banks/{NEW}"), M.ForgetResponse).deleted
    _refused(c.get(f"/v1/banks/{NEW}"), 404, "unknown bank id")


def test_export_import(be):
    """A bank exported and imported into another bank through each backend: its turns again; a file
    of another bank refused naming the line and field (nothing stored)."""
    name, c = be
    r = c.get(f"/v1/banks/{SAMPLE_BANK}/export")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson"), r.text
    lines = r.content.decode().splitlines()
    assert json.loads(lines[0])["version"] == 1 and json.loads(lines[1])["bank_id"] == SAMPLE_BANK
    copy = "suite-copy"
    body = r.content.replace(f'"bank_id":"{SAMPLE_BANK}"'.encode(), f'"bank_id":"{copy}"'.encode())
    _refused(c.post("/v1/banks/suite-other/import", content=body), 422, "line 2: field 'bank_id'")
    _refused(c.get("/v1/banks/suite-other"), 404, "unknown bank id")
    _refused(c.get("/v1/banks/suite-other/export"), 404, "unknown bank id")
    got = _ok(c.post(f"/v1/banks/{copy}/import", content=body), M.ImportResponse)
    assert (got.bank_id, got.stored, got.refused) == (copy, len(lines) - 2, []), name
    back = c.get(f"/v1/banks/{copy}/export").content.decode().splitlines()
    turns = lambda ls: [json.loads(x) for x in ls if '"type":"turn"' in x]  # noqa: E731
    assert turns(back) == turns(body.decode().splitlines()) and turns(back)
    with_v = c.get(f"/v1/banks/{copy}/export?vectors=true").content.decode().splitlines()  # streamed or sent whole
    assert json.loads(with_v[0])["vectors"]["dim"] > 0 and turns(with_v)[0]["vector_of"], name
    assert [{k: v for k, v in x.items() if "vector" not in k} for x in turns(with_v)] == turns(back)
    assert _ok(c.delete(f"/v1/banks/{copy}"), M.ForgetResponse).deleted


def test_ops_routes(be):
    name, c = be
    assert c.get("/healthz").json() == {"status": "ok"} and c.get("/readyz").json() == {"status": "ready"}
    if name != "ray":  # Ray Serve's router answers /metrics with its own app's families only
        text = c.get("/metrics").text
        assert "trawmem_http_requests" in text and "trawmem_batch_size" in text  # the engine's, over the socket too


def _is_pinned(spec: dict) -> None:
    """``spec`` is byte for byte the pinned document (one line of JSON; a difference is shown as a
    diff of the indented forms)."""
    import difflib

    want = PINNED.read_text().rstrip("\n")
    if json.dumps(spec) != want:
        diff = difflib.unified_diff(json.dumps(json.loads(want), indent=1).splitlines(),
                                    json.dumps(spec, indent=1).splitlines(), "pinned", "now", lineterm="", n=2)
        pytest.fail("the OpenAPI document changed:\n" + "\n".join(list(diff)[:80]))


def test_openapi_document_is_the_pinned_one(be):
    _, c = be
    _is_pinned(c.get("/openapi.json").json())


# ----------------------------------------------------------------------------------------------
# without a server
# ----------------------------------------------------------------------------------------------
def _backend_classes() -> list:
    from trawmem_gpu.serve.remote import RemoteBackend

    out = [LocalBackend, RemoteBackend]
    try:
        from trawmem_gpu.serve.ray_app import RayBackend
    except ImportError:  # no ray: its class cannot be imported (it subclasses nothing of ray's, but imports serve)
        return out
    return [*out, RayBackend]


def _shape(fn) -> list:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn, follow_wrapped=False).parameters.values()]


@pytest.mark.parametrize("cls", _backend_classes(), ids=lambda c: c.__name__)
def test_every_backend_has_the_protocols_methods_and_signatures(cls):
    """Each call a coroutine with the Protocol's parameters (names, kinds, defaults), ``queue_depth``
    a plain method, the state attributes present (as attributes or properties)."""
    for name in (*LIFECYCLE, *CALLS):
        fn = getattr(cls, name, None)
        assert fn is not None, f"{cls.__name__} lacks {name}"
        assert inspect.iscoroutinefunction(fn), f"{cls.__name__}.{name} is not async"
        assert _shape(fn) == _shape(getattr(Backend, name)), f"{cls.__name__}.{name}: {inspect.signature(fn)}"
    assert not inspect.iscoroutinefunction(cls.queue_depth) and _shape(cls.queue_depth) == _shape(Backend.queue_depth)
    if cls is LocalBackend:
        assert all(isinstance(getattr(cls, a), property) for a in ("ready", "dim", "encoder_id", "defaults"))
    else:
        inst = cls("/nonexistent.sock", ServeConfig()) if cls.__name__ == "RemoteBackend" else cls(ServeConfig(), 1)
        assert {a: type(getattr(inst, a)).__name__ for a in ("ready", "dim", "defaults")} == {
            "ready": "bool", "dim": "int", "defaults": "QueryParams"}


def test_the_routes_use_only_the_protocol():
    """Every ``backend.X`` in ``serve/routes.py`` is a member the Protocol declares."""
    import trawmem_gpu.serve.routes as routes

    used = {n.attr for n in ast.walk(ast.parse(inspect.getsource(routes)))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "backend"}
    declared = set(CALLS) | set(LIFECYCLE) | {"queue_depth"} | set(Backend.__annotations__)
    assert used and used <= declared, used - declared


def test_openapi_document_unchanged_without_a_server():
    """``app.openapi()`` over any backend is byte for byte the pinned document (API v1: a change to a
    route, a model or a description shows here, to be made on purpose and listed)."""
    from trawmem_gpu.serve.app import create_app

    _is_pinned(create_app(LocalBackend(None), ServeConfig()).openapi())


def _required(op: str) -> int:
    """How many arguments the Protocol's ``op`` requires (after self)."""
    params = inspect.signature(getattr(Backend, op)).parameters.values()
    return sum(p.default is inspect.Parameter.empty for p in params) - 1


def test_a_front_forwards_each_call_by_name_with_its_arguments_in_order():
    """``RemoteBackend``'s methods (made from ``CALLS``) send each call's arguments in the Protocol's
    order, defaults filled in; the engine's ``EngineEndpoint`` answers every name of the table, by the
    service's own method, and refuses a name outside it."""
    import asyncio

    from trawmem_gpu.serve.remote import EngineEndpoint, RemoteBackend

    sent = []

    async def call(op, *args):
        sent.append((op, args))
        return args

    be = RemoteBackend("/nonexistent.sock", ServeConfig())
    be._call = call  # noqa: SLF001 - the socket, answering at once

    class Service:  # the engine's service: records which of its methods answered, with what
        ready, dim, encoder_id, defaults = True, 4, "f", None

        def queue_depth(self):
            return 0

        def __getattr__(self, name):
            async def coro(*args):
                return (name, args)

            def plain(*args):
                return (name, args)

            return coro if name in ("select", "append", "forget", "export_bank", "import_bank") else plain

    async def main():
        items, q, where = ["it"], object(), object()
        await be.select(items)
        await be.select(items, batch=True, quota=q)
        await be.append("b", "batch")
        await be.forget("b", None, where=where)
        await be.history("b", "u")
        for bad in (lambda: be.select(), lambda: be.select(items, bogus=1), lambda: be.has_bank("a", "b")):
            with pytest.raises(TypeError):
                await bad()
        ep = EngineEndpoint(Service(), "/nonexistent.sock")
        answered = {op: await ep._call(op, ("x",) * _required(op)) for op in CALLS if op != "metrics_text"}
        with pytest.raises(ValueError, match="unknown engine call 'drop_everything'"):
            await ep._call("drop_everything", ())
        return items, q, where, answered, await ep._call("state", ())

    items, q, where, answered, state = asyncio.run(main())
    assert sent == [("select", (items, False, None)), ("select", (items, True, q)), ("append", ("b", "batch", None)),
                    ("forget", ("b", None, where)), ("history", ("b", "u", None))]
    assert {op: a[0] for op, a in answered.items()} == {op: op for op in answered}  # the service's own method
    assert all(a[1][:_required(op)] == ("x",) * _required(op) for op, a in answered.items())
    assert state == {"ready": True, "queue_depth": 0, "dim": 4, "encoder_id": "f", "defaults": None, "loading": None}
