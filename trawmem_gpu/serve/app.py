"""The HTTP API (v1): FastAPI routes over a selection backend.

The backend is any :class:`~trawmem_gpu.serve.backend.Backend`: the selection service of one
process (``LocalBackend``), the engine process behind ``--http-workers`` fronts (``RemoteBackend``)
or the Ray Serve router of ``ray_app.py`` (shards on many machines): the app is the same either way.
Every error is a JSON ``{"detail": "..."}`` with a 4xx/5xx status; the server keeps serving.

=====  ==========================================================================================
401    no API key, or a key that is not in the keys file
403    a read-only key appending to (or forgetting from) a bank it owns
404    a bank that does not exist *or* that the key does not own (same body either way,
       ``"error": "unknown_bank"``); a unit's history or a turn the bank does not hold
       (``"error": "unknown_unit"`` / ``"unknown_turn"``: ``replies.NOT_FOUND``)
408    request headers or body not delivered within ``--header-timeout`` / ``--body-timeout``
409    an append with a turn id the bank already holds *with other content* (nothing appended; the
       same content again is a retry: 200, listed in ``already_stored``); or a quarantined bank
       (its files could not be served; the detail says why): only ``DELETE /v1/banks/{id}``
       takes it, and removes it
413    a body over ``--max-body-bytes``
422    malformed or out-of-range input (empty / oversized question or field, budget or hops out of
       range, NaN or wrong-length vector, unparseable date, malformed turn, a path not UTF-8, ...)
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
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from ..aio import within
from .backend import Backend
from .bank_paths import BadPath, route_path
from .config import ServeConfig
from .keys import KeyStore
from .metrics import Metrics
from .models import SELECT_BODY_BYTES, AppendRequest, BatchRequest, SelectRequest
from .openapi import offline_docs, with_models
from .portable import BodyTimeout, BodyTooLarge
from .proxy import add_proxy_routes
from .replies import add_exception_handlers, json_response as _json
from .routes import RouteContext, add_bank_routes, add_forget_routes, add_ops_routes, add_select_routes, add_turn_routes


class _Edge:
    """Pure ASGI middleware: bank ids in paths (``bank_paths.route_path``; a path that is not
    UTF-8: 422), body-size limit (413), body deadline (408), per-route metrics, and the query routes.

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
                 body_timeout_s: float = 10.0, path_limits: dict | None = None):
        self.app, self.limit, self.metrics, self.body_timeout_s = app, limit, metrics, body_timeout_s
        self.path_limits = {p: min(n, limit) for p, n in (path_limits or {}).items()}
        """Smaller limits of some paths (``POST /v1/select``: ``models.SELECT_BODY_BYTES``)."""
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

    async def _read_body(self, receive, limit: int) -> bytes | None:
        """The whole body (None: over ``limit``)."""
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
            if size > limit:
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
            try:
                path = route_path(scope)
            except BadPath as e:
                await _json({"detail": str(e)}, 422)(scope, receive, send_)
                return
            if path is not None:
                scope["path"] = path
            if scope["method"] in ("POST", "PUT", "PATCH"):
                cl = dict(scope["headers"]).get(b"content-length")
                refusal, limit = None, self.path_limits.get(scope["path"], self.limit)
                if cl is not None and (not cl.isdigit() or int(cl) > limit):
                    refusal = 413
                elif streamed(scope["path"]):
                    receive = _metered(receive, limit, self.body_timeout_s)
                else:
                    try:
                        body = await within(self._read_body(receive, limit), self.body_timeout_s)
                    except asyncio.TimeoutError:
                        refusal = 408
                    else:
                        if body is None:
                            refusal = 413
                        else:
                            sent, wire = [False], receive

                            async def receive():  # noqa: F811 - replay the buffered body
                                if sent[0]:  # then the connection's own events (a streamed answer
                                    return await wire()  # waits on them for the client's disconnect)
                                sent[0] = True
                                return {"type": "http.request", "body": body, "more_body": False}
                if refusal == 413:
                    why = ("(the server's `max_body_bytes`)" if limit == self.limit else
                           "of a single select (every field at its bound fits; many queries go to /v1/select/batch)")
                    await _json({"detail": f"request body over the {limit}-byte limit {why}"},
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
            # the template without its convertors (``{bank_id}``, not ``{bank_id:bank}``)
            path = getattr(route, "path_format", None) or getattr(route, "path", None) or "unmatched"
            m.requests.labels(path, scope["method"], str(status[0])).inc()
            m.latency.labels(path, scope["method"]).observe(time.perf_counter() - t0)


def streamed(path: str) -> bool:
    """Whether a POST to ``path`` reaches its route unread (its body bounded as it is read,
    :func:`_metered`): an import (``POST /v1/banks/{bank_id}/import``), read line by line."""
    return path.startswith("/v1/banks/") and path.endswith("/import")


def _metered(wire, limit: int, timeout_s: float):
    """``wire`` (an ASGI receive) whose body may be at most ``limit`` bytes, all of it received
    within ``timeout_s`` of waiting (``BodyTooLarge`` 413, ``BodyTimeout`` 408, raised to the route
    reading it); after the body, the connection's own events as they come."""
    state = {"size": 0, "left": timeout_s, "done": False}

    async def receive():
        if state["done"]:
            return await wire()
        t = time.perf_counter()
        try:
            msg = await within(wire(), max(state["left"], 0.001))
        except asyncio.TimeoutError:
            raise BodyTimeout(f"request body not received within {timeout_s:g} s (the server's `body_timeout_s`)") \
                from None
        state["left"] -= time.perf_counter() - t
        if msg["type"] == "http.request":
            state["size"] += len(msg.get("body", b""))
            state["done"] = not msg.get("more_body", False)
            if state["size"] > limit:
                raise BodyTooLarge(f"request body over the {limit}-byte limit (the server's `max_body_bytes`)")
        else:
            state["done"] = True
        return msg

    return receive


def create_app(backend: Backend, cfg: ServeConfig, keys: KeyStore | None = None,
               metrics: Metrics | None = None) -> FastAPI:
    """The FastAPI app over ``backend`` (any :class:`~.backend.Backend`: see the module docstring
    for the error statuses); its routes are ``routes.py``'s groups, its error answers
    ``replies.add_exception_handlers``."""
    metrics = metrics or Metrics()
    if metrics.queue_depth is not None:  # else the engine process reports it (``--http-workers``)
        metrics.queue_depth.set_function(lambda: float(backend.queue_depth()))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await backend.start()
        try:
            yield
        finally:
            if proxy is not None:  # the proxied exchanges' appends in flight, before the backend drains
                await proxy.drain()
            await backend.stop()

    app = FastAPI(title="trawmem serve", version="1",
                  description="TrawMem workspace selection: which memories go into this prompt. "
                              "Send `Authorization: Bearer KEY` (or `X-API-Key: KEY`) when the server has a keys file.",
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    offline_docs(app)
    app.state.backend, app.state.metrics, app.state.cfg = backend, metrics, cfg

    ctx = RouteContext(backend, cfg, keys, metrics)
    query_endpoints = add_select_routes(app, ctx)
    add_turn_routes(app, ctx)
    add_forget_routes(app, ctx)
    add_bank_routes(app, ctx)
    add_ops_routes(app, ctx)
    proxy = add_proxy_routes(app, ctx)  # POST /v1/chat/completions with --upstream
    add_exception_handlers(app)

    app.openapi = with_models(app, [SelectRequest, BatchRequest, AppendRequest])
    direct = {r.path: r for r in app.routes if getattr(r, "endpoint", None) in query_endpoints}
    app.add_middleware(_Edge, limit=cfg.max_body_bytes, metrics=metrics, direct=direct,
                       handlers=app.exception_handlers, body_timeout_s=cfg.body_timeout_s,
                       path_limits={"/v1/select": SELECT_BODY_BYTES})
    return app
