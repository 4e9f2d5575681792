"""The HTTP API (v1): FastAPI routes over a selection backend.

The backend is a :class:`~trawmem_gpu.serve.service.SelectionService` (one process) or the
Ray Serve router of ``ray_app.py`` (shards on many machines): the app is the same either way.
Every error is a JSON ``{"detail": "..."}`` with a 4xx/5xx status; the server keeps serving.

=====  ==========================================================================================
401    no API key, or a key that is not in the keys file
403    a read-only key appending to (or forgetting from) a bank it owns
404    a bank that does not exist *or* that the key does not own (same body either way)
408    request headers or body not delivered within ``--header-timeout`` / ``--body-timeout``
409    an append with a turn id the bank already holds *with other content* (nothing appended; the
       same content again is a retry: 200, listed in ``already_stored``); or a quarantined bank
       (its files could not be served; the detail says why): only ``DELETE /v1/banks/{id}``
       takes it, and removes it
413    a body over ``--max-body-bytes``
422    malformed or out-of-range input (empty / oversized question or field, budget or hops out of
       range, NaN or wrong-length vector, unparseable date, malformed turn, ...)
429    the queue is full, or this key has its limit of queued queries or appends in flight
       (``Retry-After`` says when to come back)
503    draining for shutdown, or not yet ready; for an append whose answer was lost (the engine
       process went away), ``"outcome": "unknown"`` in the body: resend it (a retry is safe)
504    no answer within ``--timeout``
=====  ==========================================================================================

Every field's size is bounded (``models.py``; docs/serving-limits.md) and checked while the body
is validated, after the edge has read the whole body under its size cap and deadline; no field
is parsed further (dates, turns) before it passed its bound.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import time
from contextlib import asynccontextmanager

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError

from ..data.dates import parse_date
from ..errors import ConfigError, InputError
from ..select.params import LimitError, merge_params
from .batcher import DeadlineExceeded, OutcomeUnknown, QueueFull, ShuttingDown
from .config import ServeConfig
from .keys import LOCAL_TENANT, KeyStore, Tenant
from .metrics import Metrics
from .openapi import with_models, documented_body, offline_docs
from .models import (AppendRequest, AppendResponse, BankInfo, BankList, BatchRequest, BatchResponse, Error,
                     ForgetRequest, ForgetResponse, SelectRequest, SelectResponse)
from ..memory.banks import check_bank_id
from ..errors import DuplicateTurns, QuarantinedBank, UnknownBank
from .service import SelectItem

log = logging.getLogger(__name__)

try:  # orjson is faster; the stdlib is the fallback
    import orjson

    def _dumps(obj) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover
    def _dumps(obj) -> bytes:
        return json.dumps(obj, ensure_ascii=False).encode()


class HTTPError(Exception):
    def __init__(self, status: int, detail: str, headers: dict | None = None):
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


def _json(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(_dumps(obj), status_code=status, media_type="application/json", headers=headers)


def _unknown_bank(bank_id: str, where: str = "") -> HTTPError:
    # The same answer for a bank that does not exist and a bank the key does not own.
    return HTTPError(404, f"{where}unknown bank id {bank_id!r}")


async def _maybe(x):
    return await x if inspect.isawaitable(x) else x


async def body_of(request: Request, model: type[BaseModel]) -> BaseModel:
    """The request body as ``model``, validated by pydantic from the raw bytes (its Rust JSON
    parser; NaN and Infinity are read as Python clients write them). Errors are FastAPI's
    ``RequestValidationError`` with ``body`` locations, so they answer 422 like any other route."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])}
                                      for err in e.errors(include_url=False, include_context=False)]) from None


class _Edge:
    """Pure ASGI middleware: body-size limit (413), body deadline (408), per-route metrics, and
    the query routes.

    Bodies with a Content-Length over the limit are refused before they are read; every other
    body is read here, up to the limit and within ``body_timeout_s`` of its headers (a client
    trickling its body gets 408), and replayed to the app.

    ``direct`` maps ``POST`` paths to their route endpoints (``endpoint(request) -> Response``),
    called here instead of through FastAPI's routing, exception and exit-stack layers (about a
    third of the event loop's time per query); an exception they raise answers through the app's
    own exception handlers (``handlers``), so every status and body is the route's. Other
    methods and paths go on to the app as before.
    """

    def __init__(self, app, limit: int, metrics: Metrics, direct: dict | None = None, handlers: dict | None = None,
                 body_timeout_s: float = 10.0):
        self.app, self.limit, self.metrics, self.body_timeout_s = app, limit, metrics, body_timeout_s
        self.direct, self.handlers = direct or {}, handlers or {}

    async def _direct(self, route, scope, receive, send) -> None:
        scope["route"] = route  # the metrics label, as the router would set it
        request = Request(scope, receive)
        try:
            response = await route.endpoint(request)
        except Exception as e:  # noqa: BLE001 - answered by the handler of its class, as FastAPI would
            handler = next((self.handlers[c] for c in type(e).__mro__ if c in self.handlers), None)
            if handler is None:
                raise
            response = await handler(request, e)
        await response(scope, receive, send)

    async def _read_body(self, receive) -> bytes | None:
        """The whole body (None: over the limit)."""
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
            if size > self.limit:
                return None
        return b"".join(chunks)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        scope["trawmem_t0"] = t0
        status = [500]
        m = self.metrics

        async def send_(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        m.in_flight.inc()
        try:
            if scope["method"] in ("POST", "PUT", "PATCH"):
                cl = dict(scope["headers"]).get(b"content-length")
                refusal = None
                if cl is not None and (not cl.isdigit() or int(cl) > self.limit):
                    refusal = 413
                else:
                    try:
                        body = await asyncio.wait_for(self._read_body(receive), self.body_timeout_s)
                    except asyncio.TimeoutError:
                        refusal = 408
                    else:
                        if body is None:
                            refusal = 413
                        else:
                            sent = [False]

                            async def receive():  # noqa: F811 - replay the buffered body
                                if sent[0]:
                                    return {"type": "http.disconnect"}
                                sent[0] = True
                                return {"type": "http.request", "body": body, "more_body": False}
                if refusal == 413:
                    await _json({"detail": f"request body over the {self.limit}-byte limit "
                                          "(the server's `max_body_bytes`)"},
                                413)(scope, receive, send_)
                    return
                if refusal == 408:
                    await _json({"detail": f"request body not received within {self.body_timeout_s:g} s "
                                          "(the server's `body_timeout_s`)"},
                                408, {"Connection": "close"})(scope, receive, send_)
                    return
            route = self.direct.get(scope["path"]) if scope["method"] == "POST" else None
            if route is not None:
                await self._direct(route, scope, receive, send_)
            else:
                await self.app(scope, receive, send_)
        finally:
            m.in_flight.dec()
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            m.requests.labels(path, scope["method"], str(status[0])).inc()
            m.latency.labels(path, scope["method"]).observe(time.perf_counter() - t0)


QUERY_FIELDS = ("budget", "hops", "token_budget")
"""The ``QueryParams`` fields a ``SelectRequest`` may name (null or absent: the server's)."""


def request_params(r: SelectRequest, defaults, cfg: ServeConfig, where: str = ""):
    """The ``QueryParams`` of request ``r``: its fields (null: left out) over the server's
    ``defaults`` by the one rule (``select.params.merge_params``), held to ``cfg.limits``; a value
    out of range is a 422 naming the body field and the server's option."""
    given = {k: v for k in QUERY_FIELDS if (v := getattr(r, k)) is not None}
    try:
        return merge_params(given, defaults, cfg.limits)
    except LimitError as e:
        raise HTTPError(422, f"{where}{e.field} must lie in {e.low}..{e.high} (the server's `{e.limit}`), "
                             f"got {e.got}") from None
    except ConfigError as e:
        raise HTTPError(422, f"{where}{str(e).replace('`', '')}") from None


def create_app(backend, cfg: ServeConfig, keys: KeyStore | None = None, metrics: Metrics | None = None) -> FastAPI:
    """The FastAPI app over ``backend`` (see the module docstring for the error statuses)."""
    metrics = metrics or Metrics()
    if metrics.queue_depth is not None:  # else the engine process reports it (``--http-workers``)
        metrics.queue_depth.set_function(lambda: float(backend.queue_depth()))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await backend.start()
        try:
            yield
        finally:
            await backend.stop()

    app = FastAPI(title="trawmem serve", version="1",
                  description="TrawMem workspace selection: which memories go into this prompt. "
                              "Send `Authorization: Bearer KEY` (or `X-API-Key: KEY`) when the server has a keys file.",
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    offline_docs(app)
    app.state.backend, app.state.metrics, app.state.cfg = backend, metrics, cfg

    bearer = HTTPBearer(auto_error=False, description="API key as a bearer token")
    api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key")

    async def tenant_of(cred: HTTPAuthorizationCredentials | None = Depends(bearer),
                  key: str | None = Depends(api_key)) -> Tenant:
        if keys is None:
            return LOCAL_TENANT
        t = keys.authenticate(cred.credentials if cred is not None else key)
        if t is None:
            raise HTTPError(401, "missing or invalid API key", {"WWW-Authenticate": "Bearer"})
        return t

    def owned(tenant: Tenant, bank_id: str, where: str = "") -> None:
        # A bank the key does not own gets the answer the backend gives for a missing bank
        # (UnknownBank, raised before any work is queued).
        if not tenant.owns(bank_id):
            raise _unknown_bank(bank_id, where)

    def item_of(r: SelectRequest, t0: float, where: str = "") -> SelectItem:
        q = r.question.strip()
        if not q:
            raise HTTPError(422, f"{where}question is empty")
        if len(r.question) > cfg.limits.max_question_chars:
            raise HTTPError(422, f"{where}question is {len(r.question)} characters; the limit is "
                                 f"{cfg.limits.max_question_chars}")
        params = request_params(r, backend.defaults, cfg, where)
        date = None
        if r.date is not None:
            try:
                date = parse_date(r.date)
            except ValueError as e:
                raise HTTPError(422, f"{where}date: {e}") from None
        vec = None
        if r.question_vector is not None:
            dim = backend.dim
            if len(r.question_vector) != dim:
                raise HTTPError(422, f"{where}question_vector has {len(r.question_vector)} numbers; the collection's "
                                     f"encoder ({backend.encoder_id}) gives {dim}")
            vec = np.asarray(r.question_vector, dtype=np.float64)
            sq = float(vec @ vec)  # NaN / inf anywhere make it NaN / inf; its root is np.linalg.norm's
            if sq == 0.0 or not math.isfinite(sq):
                if not np.all(np.isfinite(vec)):
                    raise HTTPError(422, f"{where}question_vector holds NaN or infinite numbers")
                raise HTTPError(422, f"{where}question_vector is all zeros (or overflows)")
            vec = (vec / math.sqrt(sq)).astype(np.float32)
        return SelectItem(r.bank_id, q, vec, params, date, t0)

    def finish(res: dict, t0: float) -> dict:
        res["timings"]["total_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        return res

    errors = {s: {"model": Error} for s in (401, 404, 413, 422, 429, 503, 504)}

    # The two query routes take the raw request: the key through the same security objects, the
    # body validated by pydantic straight from its JSON bytes (``body_of``), skipping FastAPI's
    # dependency solving and the stdlib JSON parse, a large share of the event loop's work per
    # query (docs/design-notes.md); the OpenAPI document still shows both bodies and the
    # security (``documented_body``).
    async def tenant_of_request(request: Request) -> Tenant:
        return await tenant_of(await bearer(request), await api_key(request))

    @app.post("/v1/select", response_model=SelectResponse, responses=errors, tags=["select"],
              summary="The workspace for one question", openapi_extra=documented_body(SelectRequest, bearer, api_key))
    async def select(request: Request):
        t0 = request.scope.get("trawmem_t0", time.perf_counter())
        tenant = await tenant_of_request(request)
        item = item_of(await body_of(request, SelectRequest), t0)
        owned(tenant, item.bank_id)
        (res,) = await backend.select([item], quota=tenant.quota(cfg))
        return _json(finish(res, t0))

    @app.post("/v1/select/batch", response_model=BatchResponse, responses=errors, tags=["select"],
              summary="Workspaces for a list of questions (answered together)",
              openapi_extra=documented_body(BatchRequest, bearer, api_key))
    async def select_batch(request: Request):
        t0 = request.scope.get("trawmem_t0", time.perf_counter())
        tenant = await tenant_of_request(request)
        req = await body_of(request, BatchRequest)
        if len(req.requests) > cfg.max_batch_request:
            raise HTTPError(422, f"requests holds {len(req.requests)} requests; the limit is {cfg.max_batch_request}")
        items = [item_of(r, t0, f"requests[{i}].") for i, r in enumerate(req.requests)]
        for i, it in enumerate(items):
            owned(tenant, it.bank_id, f"requests[{i}]: ")
        res = await backend.select(items, batch=True, quota=tenant.quota(cfg))
        return _json({"results": [finish(r, t0) for r in res]})

    @app.post("/v1/banks/{bank_id}/turns", response_model=AppendResponse,
              responses={**errors, 403: {"model": Error}, 409: {"model": Error}}, tags=["banks"],
              summary="Append turns to a bank (the first append creates it; resending turns it holds is safe)",
              openapi_extra=documented_body(AppendRequest, bearer, api_key))
    async def append(bank_id: str, request: Request):
        tenant = await tenant_of_request(request)
        req = await body_of(request, AppendRequest)
        if not tenant.owns(bank_id):
            raise _unknown_bank(bank_id)
        if not tenant.writable:
            raise HTTPError(403, "this API key is read-only")
        try:
            check_bank_id(bank_id)
        except InputError as e:
            raise HTTPError(422, str(e)) from None
        if len(req.turns) > cfg.max_turns_per_append:
            raise HTTPError(422, f"turns holds {len(req.turns)} turns; the limit is {cfg.max_turns_per_append}")
        records = [t.model_dump(exclude_none=True) for t in req.turns]
        return _json(await backend.append(bank_id, records, quota=tenant.quota(cfg)))

    async def forget(bank_id: str, turn_ids: list[str] | None, tenant: Tenant) -> dict:
        if not tenant.owns(bank_id):
            raise _unknown_bank(bank_id)
        if not tenant.writable:
            raise HTTPError(403, "this API key is read-only")
        return await backend.forget(bank_id, turn_ids)

    forget_doc = {"response_model": ForgetResponse, "responses": {**errors, 403: {"model": Error}},
                  "tags": ["banks"]}

    @app.delete("/v1/banks/{bank_id}", summary="Forget a whole bank (files, engine, caches)", **forget_doc)
    async def forget_bank(bank_id: str, tenant: Tenant = Depends(tenant_of)):
        return _json(await forget(bank_id, None, tenant))

    # {turn_id:path}: a turn id may hold "/" (sent percent-encoded as %2F, which the path arrives decoded from)
    @app.delete("/v1/banks/{bank_id}/turns/{turn_id:path}", summary="Forget one turn of a bank", **forget_doc)
    async def forget_turn(bank_id: str, turn_id: str, tenant: Tenant = Depends(tenant_of)):
        res = await forget(bank_id, [turn_id], tenant)
        if res["missing"]:
            raise HTTPError(404, f"bank {bank_id!r} holds no turn {turn_id!r}")
        return _json(res)

    @app.post("/v1/banks/{bank_id}/forget", summary="Forget turns of a bank", **forget_doc)
    async def forget_turns(bank_id: str, req: ForgetRequest, tenant: Tenant = Depends(tenant_of)):
        return _json(await forget(bank_id, list(dict.fromkeys(req.turn_ids)), tenant))

    @app.get("/v1/banks", response_model=BankList, responses=errors, tags=["banks"],
             summary="The banks this key can see, with counts")
    async def banks(tenant: Tenant = Depends(tenant_of)):
        rows = [b for b in await _maybe(backend.bank_list()) if tenant.owns(b["bank_id"])]
        return _json({"banks": sorted(rows, key=lambda b: b["bank_id"]), "encoder": backend.encoder_id,
                      "dim": backend.dim})

    @app.get("/v1/banks/{bank_id}", response_model=BankInfo, responses=errors, tags=["banks"],
             summary="One bank's counts")
    async def bank(bank_id: str, tenant: Tenant = Depends(tenant_of)):
        info = await _maybe(backend.bank_info(bank_id)) if tenant.owns(bank_id) else None
        if info is None:
            raise _unknown_bank(bank_id)
        return _json(info)

    @app.get("/healthz", tags=["ops"], summary="The process is up")
    async def healthz():
        return _json({"status": "ok"})

    @app.get("/readyz", tags=["ops"], summary="Ready to answer (warmed up, not draining)",
             responses={503: {"model": Error}})
    async def readyz():
        if not backend.ready:
            return _json({"detail": "not ready (warming up or draining)"}, 503)
        return _json({"status": "ready"})

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics")
    async def prom():
        body = metrics.render()
        engine_text = getattr(backend, "metrics_text", None)  # the engine process's families (--http-workers)
        if engine_text is not None:
            body += await engine_text()
        return Response(body, media_type=metrics.content_type)

    @app.exception_handler(HTTPError)
    async def _http_error(request, e: HTTPError):
        return _json({"detail": e.detail}, e.status, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        parts = []
        for err in e.errors()[:10]:
            loc = ""
            for x in err.get("loc", ()):
                if x != "body":
                    loc += f"[{x}]" if isinstance(x, int) else (f".{x}" if loc else str(x))
            parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
        return _json({"detail": "; ".join(parts)}, 422)

    @app.exception_handler(UnknownBank)
    async def _unknown(request, e: UnknownBank):  # never e.detail: what else is held is not the client's
        return _json({"detail": f"{e.where}unknown bank id {e.bank_id!r}"}, 404)

    @app.exception_handler(QuarantinedBank)
    async def _quarantined(request, e: QuarantinedBank):
        return _json({"detail": str(e)}, 409)

    @app.exception_handler(QueueFull)
    async def _full(request, e: QueueFull):
        return _json({"detail": str(e)}, 429, {"Retry-After": str(e.retry_after)})

    @app.exception_handler(DeadlineExceeded)
    async def _late(request, e: DeadlineExceeded):
        return _json({"detail": f"{e} (the server's `timeout_s`)"}, 504)

    @app.exception_handler(ShuttingDown)
    async def _draining(request, e: ShuttingDown):
        return _json({"detail": str(e)}, 503, {"Retry-After": "1"})

    @app.exception_handler(OutcomeUnknown)
    async def _unknown_outcome(request, e: OutcomeUnknown):
        return _json({"detail": str(e), "outcome": "unknown"}, 503, {"Retry-After": "1"})

    @app.exception_handler(DuplicateTurns)
    async def _dup(request, e: DuplicateTurns):
        return _json({"detail": str(e)}, 409)

    @app.exception_handler(InputError)
    async def _bad(request, e: InputError):
        return _json({"detail": str(e)}, 422)

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
        return _json({"detail": "internal server error"}, 500)

    app.openapi = with_models(app, [SelectRequest, BatchRequest, AppendRequest])
    direct = {r.path: r for r in app.routes if getattr(r, "endpoint", None) in (select, select_batch)}
    app.add_middleware(_Edge, limit=cfg.max_body_bytes, metrics=metrics, direct=direct,
                       handlers=app.exception_handlers, body_timeout_s=cfg.body_timeout_s)
    return app
