"""The v1 routes, registered on the app in groups (``add_*_routes(app, ctx)``) over one shared
:class:`RouteContext`: the backend, the server's config, the keys and the security objects.

The two query routes take the raw request: the key through the same security objects, the body
validated by pydantic straight from its JSON bytes (``replies.body_of``), skipping FastAPI's
dependency solving and the stdlib JSON parse, a large share of the event loop's work per query
(docs/design-notes.md); the OpenAPI document still shows both bodies and the security
(``openapi.documented_body``). The app's edge calls them directly (``app._Edge``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from ..data.dates import parse_date
from ..errors import ConfigError, InputError, TrawmemError
from ..memory.banks import check_bank_id
from ..memory.export import MAX_LINE_BYTES
from ..select.params import LimitError, QueryParams, merge_params
from ..store.facts import utc_text
from .backend import Backend
from .config import ServeConfig
from .keys import LOCAL_TENANT, KeyStore, Tenant
from .metrics import Metrics
from .models import (AppendRequest, AppendResponse, BankInfo, BankList, BatchRequest, BatchResponse, Error, History,
                     ForgetRequest, ForgetResponse, ImportResponse, SelectRequest, SelectResponse)
from .appends import append_batch
from .openapi import documented_body
from .portable import body_lines
from .replies import OFF_LOOP_ITEMS, HTTPError, batch_reply, body_of, json_response, off_loop, unknown_bank
from .service import SelectItem

QUERY_FIELDS = tuple(f for f in SelectRequest.model_fields if f in {p.name for p in fields(QueryParams)})
"""The ``QueryParams`` fields a ``SelectRequest`` may name (null or absent: the server's): those
the request model declares (budget, hops, token_budget)."""

ERRORS = {s: {"model": Error} for s in (401, 404, 413, 422, 429, 503, 504)}
"""The error responses every v1 route documents."""


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


def question_vector(values: list[float], backend: Backend, where: str = "") -> np.ndarray:
    """A request's ``question_vector`` as a unit float32 vector of the collection's dimension (422
    for a wrong length, NaN / infinite numbers, or all zeros)."""
    dim = backend.dim
    if len(values) != dim:
        raise HTTPError(422, f"{where}question_vector has {len(values)} numbers; the collection's "
                             f"encoder ({backend.encoder_id}) gives {dim}")
    vec = np.asarray(values, dtype=np.float64)
    sq = float(vec @ vec)  # NaN / inf anywhere make it NaN / inf; its root is np.linalg.norm's
    if sq == 0.0 or not math.isfinite(sq):
        if not np.all(np.isfinite(vec)):
            raise HTTPError(422, f"{where}question_vector holds NaN or infinite numbers")
        raise HTTPError(422, f"{where}question_vector is all zeros (or overflows)")
    return (vec / math.sqrt(sq)).astype(np.float32)


def finish(res: dict, t0: float) -> dict:
    """``res`` with its ``timings.total_ms``: the time since the request arrived (``t0``)."""
    res["timings"]["total_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    return res


def _t0(request: Request) -> float:
    return request.scope.get("trawmem_t0", time.perf_counter())


@dataclass
class RouteContext:
    """What every route group shares: the backend, the config, the keys (None: no keys file, every
    request is the local tenant) and the security objects the OpenAPI document names."""

    backend: Backend
    cfg: ServeConfig
    keys: KeyStore | None
    metrics: Metrics
    bearer: HTTPBearer = field(default_factory=lambda: HTTPBearer(
        auto_error=False, description="API key as a bearer token"))
    api_key: APIKeyHeader = field(default_factory=lambda: APIKeyHeader(
        name="X-API-Key", auto_error=False, description="API key"))

    def __post_init__(self):
        ctx = self

        # A plain function (not a bound method) with the security objects as its dependencies.
        async def tenant_of(cred: HTTPAuthorizationCredentials | None = Depends(self.bearer),
                            key: str | None = Depends(self.api_key)) -> Tenant:
            if ctx.keys is None:
                return LOCAL_TENANT
            t = ctx.keys.authenticate(cred.credentials if cred is not None else key)
            if t is None:
                raise HTTPError(401, "missing or invalid API key", {"WWW-Authenticate": "Bearer"})
            return t

        self.tenant_of = tenant_of

    async def tenant_of_request(self, request: Request) -> Tenant:
        return await self.tenant_of(await self.bearer(request), await self.api_key(request))

    def documented_body(self, model) -> dict:
        return documented_body(model, self.bearer, self.api_key)

    @staticmethod
    def owned(tenant: Tenant, bank_id: str, where: str = "") -> None:
        # A bank the key does not own gets the answer the backend gives for a missing bank
        # (UnknownBank, raised before any work is queued).
        if not tenant.owns(bank_id):
            raise unknown_bank(bank_id, where)

    @staticmethod
    def writer(tenant: Tenant, bank_id: str) -> None:
        """404 for a bank the key does not own, 403 for a read-only key."""
        if not tenant.owns(bank_id):
            raise unknown_bank(bank_id)
        if not tenant.writable:
            raise HTTPError(403, "this API key is read-only")

    def item_of(self, r: SelectRequest, t0: float, where: str = "", tenant: Tenant = LOCAL_TENANT) -> SelectItem:
        q = r.question.strip()
        if not q:
            raise HTTPError(422, f"{where}question is empty")
        limit = self.cfg.limits.max_question_chars
        if len(r.question) > limit:
            raise HTTPError(422, f"{where}question is {len(r.question)} characters; the limit is {limit}")
        params = request_params(r, self.backend.defaults, self.cfg, where)
        date = None
        if r.date is not None:
            try:
                date = parse_date(r.date)
            except ValueError as e:
                raise HTTPError(422, f"{where}date: {e}") from None
        vec = None if r.question_vector is None else question_vector(r.question_vector, self.backend, where)
        as_of = None
        if r.as_of is not None:
            try:
                as_of = utc_text(parse_date(r.as_of))  # a day, or an instant (UTC)
            except ValueError as e:
                raise HTTPError(422, f"{where}as_of: {e}") from None
        try:  # the request's filter, narrowed by the key's: a request cannot widen what its key sees
            flt = tenant.narrowed(r.where, f"{where}where")
        except InputError as e:
            raise HTTPError(422, str(e)) from None
        return SelectItem(r.bank_id, q, vec, params, date, t0, where=flt, as_of=as_of, bound=tenant.where is not None)


def add_select_routes(app: FastAPI, ctx: RouteContext) -> tuple:
    """``POST /v1/select`` and ``/v1/select/batch``; returns their endpoints (the edge's ``direct``)."""
    backend, cfg = ctx.backend, ctx.cfg

    @app.post("/v1/select", response_model=SelectResponse, responses=ERRORS, tags=["select"],
              summary="The workspace for one question", openapi_extra=ctx.documented_body(SelectRequest))
    async def select(request: Request):
        t0 = _t0(request)
        tenant = await ctx.tenant_of_request(request)
        item = await body_of(request, SelectRequest, lambda r: ctx.item_of(r, t0, tenant=tenant))
        ctx.owned(tenant, item.bank_id)
        (res,) = await backend.select([item], quota=tenant.quota(cfg))
        return json_response(finish(res, t0))

    @app.post("/v1/select/batch", response_model=BatchResponse, responses=ERRORS, tags=["select"],
              summary="Workspaces for a list of questions (answered together)",
              openapi_extra=ctx.documented_body(BatchRequest))
    async def select_batch(request: Request):
        t0 = _t0(request)
        tenant = await ctx.tenant_of_request(request)

        def build(req: BatchRequest) -> list[SelectItem]:
            if len(req.requests) > cfg.max_batch_request:
                raise HTTPError(422, f"requests holds {len(req.requests)} requests; the limit is "
                                     f"{cfg.max_batch_request}")
            return [ctx.item_of(r, t0, f"requests[{i}].", tenant) for i, r in enumerate(req.requests)]

        items = await body_of(request, BatchRequest, build, heavy=True)  # on a thread: up to 256 items
        for i, it in enumerate(items):
            ctx.owned(tenant, it.bank_id, f"requests[{i}]: ")
        res = await backend.select(items, batch=True, quota=tenant.quota(cfg))
        return await off_loop(len(res) > OFF_LOOP_ITEMS, batch_reply, [finish(r, t0) for r in res])

    return select, select_batch


def add_turn_routes(app: FastAPI, ctx: RouteContext) -> None:
    """``POST /v1/banks/{bank_id}/turns``: append turns (the first append creates the bank)."""
    backend, cfg = ctx.backend, ctx.cfg

    @app.post("/v1/banks/{bank_id:bank}/turns", response_model=AppendResponse,
              responses={**ERRORS, 403: {"model": Error}, 409: {"model": Error}}, tags=["banks"],
              summary="Append turns or chat messages to a bank, answered per item (the first append creates it; resending turns it holds is safe)",
              openapi_extra=ctx.documented_body(AppendRequest))
    async def append(bank_id: str, request: Request):
        tenant = await ctx.tenant_of_request(request)
        req = await body_of(request, AppendRequest)
        ctx.writer(tenant, bank_id)
        try:
            check_bank_id(bank_id)
        except InputError as e:
            raise HTTPError(422, str(e)) from None
        items = req.turns if req.turns is not None else req.messages
        if items is not None and len(items) > cfg.max_turns_per_append:
            what = "turns" if req.turns is not None else "messages"
            raise HTTPError(422, f"{what} holds {len(items)} {what}; the limit is {cfg.max_turns_per_append}")
        try:
            batch = append_batch(req.turns, req.messages, speakers=req.speakers, roles=req.roles, atomic=req.atomic)
        except InputError as e:
            raise HTTPError(422, str(e)) from None
        bad = next((i for i, r in enumerate(batch.entries) if isinstance(r, dict)
                    and not tenant.may_store(r.get("metadata"))), None)
        if bad is not None:  # a key bound to a filter stores only what it could select
            raise HTTPError(403, f"{batch.where}[{bad}].metadata: does not pass this API key's filter "
                                 f"{tenant.where.key}; nothing was stored")
        batch.scope = tenant.where  # its refusals and counts: of its own turns (memory.scope)
        return json_response(await backend.append(bank_id, batch, quota=tenant.quota(cfg)))


def add_forget_routes(app: FastAPI, ctx: RouteContext) -> None:
    """Forgetting a whole bank, one turn, or a list of turns."""
    backend, tenant_of = ctx.backend, ctx.tenant_of

    async def forget(bank_id: str, turn_ids: list[str] | None, tenant: Tenant) -> dict:
        ctx.writer(tenant, bank_id)
        if tenant.where is None:
            return await backend.forget(bank_id, turn_ids)
        if turn_ids is None:
            raise HTTPError(403, "this API key is bound to a filter: it forgets turns by id, not a whole bank")
        return await backend.forget(bank_id, turn_ids, tenant.where)  # turns outside its filter: missing

    forget_doc = {"response_model": ForgetResponse, "responses": {**ERRORS, 403: {"model": Error}},
                  "tags": ["banks"]}

    @app.delete("/v1/banks/{bank_id:bank}", summary="Forget a whole bank (files, engine, caches)", **forget_doc)
    async def forget_bank(bank_id: str, tenant: Tenant = Depends(tenant_of)):
        return json_response(await forget(bank_id, None, tenant))

    # {turn_id:path}: a turn id may hold "/" (sent percent-encoded as %2F, which the path arrives decoded from)
    @app.delete("/v1/banks/{bank_id:bank}/turns/{turn_id:path}", summary="Forget one turn of a bank", **forget_doc)
    async def forget_turn(bank_id: str, turn_id: str, tenant: Tenant = Depends(tenant_of)):
        res = await forget(bank_id, [turn_id], tenant)
        if res["missing"]:
            raise HTTPError(404, f"bank {bank_id!r} holds no turn {turn_id!r}", kind="unknown_turn")
        return json_response(res)

    @app.post("/v1/banks/{bank_id:bank}/forget", summary="Forget turns of a bank", **forget_doc)
    async def forget_turns(bank_id: str, req: ForgetRequest, tenant: Tenant = Depends(tenant_of)):
        return json_response(await forget(bank_id, list(dict.fromkeys(req.turn_ids)), tenant))


NDJSON = "application/x-ndjson"
"""The media type of an export (JSON Lines, ``docs/export.md``)."""


def _slices(body: bytes):
    """An export a backend sent whole (across a process), in the pieces a local one streams."""
    from .portable import CHUNK_BYTES

    for i in range(0, len(body), CHUNK_BYTES):
        yield body[i:i + CHUNK_BYTES]


def add_portable_routes(app: FastAPI, ctx: RouteContext) -> None:
    """``GET /v1/banks/{bank_id}/export`` and ``POST /v1/banks/{bank_id}/import``: one bank as an
    export (``memory.export``'s format), only what the key may read; and an export of that bank
    imported into it, turns outside a bound key's filter refused per item."""
    backend, cfg, tenant_of = ctx.backend, ctx.cfg, ctx.tenant_of

    @app.get("/v1/banks/{bank_id:bank}/export", response_class=Response, tags=["banks"],
             responses={**ERRORS, 200: {"content": {NDJSON: {"schema": {"type": "string"}}},
                                        "description": "the export (JSON Lines: header, bank, turns, facts, events)"}},
             summary="One bank as an export (JSON Lines; only the turns this key may read)")
    async def export_bank(bank_id: str, vectors: bool = False, tenant: Tenant = Depends(tenant_of)):
        """Sent as it is made (chunked), from one revision of the bank. vectors=true: each unit's vector
        (base64 of float32), with the encoder named in the header (docs/export.md)."""
        ctx.owned(tenant, bank_id)
        pieces = await backend.export_bank(bank_id, tenant.where, vectors)
        return StreamingResponse(pieces if not isinstance(pieces, bytes) else _slices(pieces), media_type=NDJSON)

    @app.post("/v1/banks/{bank_id:bank}/import", response_model=ImportResponse,
              responses={**ERRORS, 403: {"model": Error}, 409: {"model": Error}}, tags=["banks"],
              summary="Import an export of this one bank into it, answered per item (resending it is safe)",
              openapi_extra={"requestBody": {"required": True, "content": {NDJSON: {"schema": {"type": "string"}}},
                                             "description": "an export (docs/export.md) holding this bank alone"}})
    async def import_bank(bank_id: str, request: Request, tenant: Tenant = Depends(tenant_of)):
        ctx.writer(tenant, bank_id)
        try:
            check_bank_id(bank_id)
        except InputError as e:
            raise HTTPError(422, str(e)) from None
        lines = body_lines(request.stream(), MAX_LINE_BYTES)  # read as the import takes them (the edge: at most
        # max_body_bytes in all, within body_timeout_s)
        return json_response(await backend.import_bank(bank_id, lines, tenant.where, quota=tenant.quota(cfg)))


def add_bank_routes(app: FastAPI, ctx: RouteContext) -> None:
    """``GET /v1/banks``, ``GET /v1/banks/{bank_id}`` (the banks the key can see, with counts) and
    ``GET /v1/banks/{bank_id}/units/{unit_id}/history``; the export and import routes first."""
    backend, tenant_of = ctx.backend, ctx.tenant_of
    add_portable_routes(app, ctx)

    async def scoped_row(row: dict, where) -> dict | None:
        """A row of ``GET /v1/banks`` for a key bound to ``where``: a served bank's counts of the
        turns passing it (``bank_info``; None: gone since), a quarantined bank's row as it is."""
        if row.get("quarantined"):
            return row
        try:
            info = await backend.bank_info(row["bank_id"], where)
        except TrawmemError:  # gone or quarantined since the listing
            return None
        return None if info is None else {k: info[k] for k in ("bank_id", "n_units", "n_threads")}

    @app.get("/v1/banks", response_model=BankList, responses=ERRORS, tags=["banks"],
             summary="The banks this key can see, with counts")
    async def banks(tenant: Tenant = Depends(tenant_of)):
        rows = [b for b in await backend.bank_list() if tenant.owns(b["bank_id"])]
        if tenant.where is not None:  # a bound key: the counts of its own turns (memory.scope)
            rows = [r for r in [await scoped_row(b, tenant.where) for b in rows] if r is not None]
        return json_response({"banks": sorted(rows, key=lambda b: b["bank_id"]), "encoder": backend.encoder_id,
                              "dim": backend.dim})

    # {unit_id:path}: a unit id may hold "/" (sent percent-encoded as %2F)
    @app.get("/v1/banks/{bank_id:bank}/units/{unit_id:path}/history", response_model=History, responses=ERRORS,
             tags=["banks"], summary="What happened to one unit (turn, fact, profile section), oldest first")
    async def history(bank_id: str, unit_id: str, tenant: Tenant = Depends(tenant_of)):
        evs = await backend.history(bank_id, unit_id, tenant.where) if tenant.owns(bank_id) else None
        if evs is None:
            if not tenant.owns(bank_id):
                raise unknown_bank(bank_id)
            raise HTTPError(404, f"bank {bank_id!r} holds no unit {unit_id!r} and has no history of one",
                            kind="unknown_unit")
        return json_response({"bank_id": bank_id, "unit_id": unit_id, "events": evs})

    @app.get("/v1/banks/{bank_id:bank}", response_model=BankInfo, responses=ERRORS, tags=["banks"],
             summary="One bank's counts")
    async def bank(bank_id: str, tenant: Tenant = Depends(tenant_of)):
        info = await backend.bank_info(bank_id, tenant.where) if tenant.owns(bank_id) else None
        if info is None:
            raise unknown_bank(bank_id)
        return json_response(info)


def add_ops_routes(app: FastAPI, ctx: RouteContext) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics`` (no key needed)."""
    backend, metrics = ctx.backend, ctx.metrics

    @app.get("/healthz", tags=["ops"], summary="The process is up")
    async def healthz():
        return json_response({"status": "ok"})

    @app.get("/readyz", tags=["ops"], summary="Ready to answer (warmed up, not draining)",
             responses={503: {"model": Error}})
    async def readyz():
        if not backend.ready:
            return json_response({"detail": "not ready (warming up or draining)"}, 503)
        return json_response({"status": "ready"})

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics")
    async def prom():
        body = metrics.render() + await backend.metrics_text()  # the engine process's families (--http-workers)
        return Response(body, media_type=metrics.content_type)
