"""The app's replies: JSON responses, the ``HTTPError`` a route raises, the request body read by
hand (``body_of``), and the exception handlers that turn every error into ``{"detail": "..."}``
with its status (the table in ``serve/app.py``'s docstring)."""
from __future__ import annotations

import asyncio
import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, DuplicateTurns, InputError, QuarantinedBank, UnknownBank, loads_json
from .batcher import DeadlineExceeded, OutcomeUnknown, QueueFull, ShuttingDown
from .portable import BodyTimeout, LineTooLong
from .wire import EngineCallFailed

log = logging.getLogger(__name__)

try:  # orjson is faster; the stdlib is the fallback
    import orjson

    def _dumps(obj) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover
    def _dumps(obj) -> bytes:
        return json.dumps(obj, ensure_ascii=False).encode()


class HTTPError(Exception):
    """A route's error answer: ``{"detail": detail}`` with ``status``; ``kind`` (a 404's
    :data:`NOT_FOUND` kind) goes in the body's ``error`` so a client can tell what is missing."""

    def __init__(self, status: int, detail: str, headers: dict | None = None, kind: str | None = None):
        super().__init__(detail)
        self.status, self.detail, self.headers, self.kind = status, detail, headers or {}, kind


NOT_FOUND = ("unknown_bank", "unknown_unit", "unknown_turn")
"""What a 404's body names in ``error``: a bank (missing, or not the key's), a unit of a bank that
has no history of it (``GET .../units/{unit_id}/history``), a turn a bank does not hold
(``DELETE .../turns/{turn_id}``). The client maps each to its error class."""


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(_dumps(obj), status_code=status, media_type="application/json", headers=headers)


OFF_LOOP_BYTES = 64 << 10
"""A request body over this many bytes has its Python-level work (its filter parsed, its items
built) done on a thread (:func:`off_loop`), as has a batch's reply of many workspaces."""
OFF_LOOP_ITEMS = 8
"""A batch of more requests than this is built, and its reply encoded, on a thread."""


async def off_loop(heavy: bool, fn, *args):
    """``fn(*args)``: on a thread of the loop's default executor when ``heavy``, else here. One
    tenant's large request then never holds the event loop that reads and answers every other
    tenant's requests: the thread gives the GIL up at each switch interval (the server sets
    0.5 ms), where on the loop the whole call ran before any other request (a 256-query batch:
    tens of ms to build and as many to encode; a large filter: seconds)."""
    if not heavy:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def batch_reply(results: list) -> Response:
    """``{"results": [...]}`` encoded one workspace at a time (each ``_dumps`` a short call, so a
    thread running this gives the GIL up between them; one call over the whole list would hold it)."""
    return Response(b'{"results":[' + b",".join(map(_dumps, results)) + b"]}", media_type="application/json")


def unknown_bank(bank_id: str, where: str = "") -> HTTPError:
    # The same answer for a bank that does not exist and a bank the key does not own.
    return HTTPError(404, f"{where}unknown bank id {bank_id!r}", kind="unknown_bank")


def _keep(obj: dict) -> dict:
    return obj


def _validated(model: type[BaseModel], raw: bytes) -> BaseModel:
    """``raw`` as ``model``: pydantic's Rust parser for a small body; over :data:`OFF_LOOP_BYTES`,
    the stdlib parser with a Python ``object_hook`` (a thread running it gives the GIL up while it
    builds the objects, where ``model_validate_json`` holds it for the whole body: about 0.2 s
    for a 4 MB filter of empty objects), then the model over the parsed objects. Errors are
    FastAPI's ``RequestValidationError`` with ``body`` locations (422 like any other route)."""
    try:
        if len(raw) <= OFF_LOOP_BYTES:
            return model.model_validate_json(raw)
        try:
            obj = loads_json(raw, object_hook=_keep)
        except ValueError as e:  # JSONDecodeError, bad UTF-8, nesting past the stack (JSONTooDeep)
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                           "msg": f"Invalid JSON: {type(e).__name__}"}]) from None
        return model.model_validate(obj)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])}
                                      for err in e.errors(include_url=False, include_context=False)]) from None


def _contained(fn, *args):
    """``fn(*args)``, an exception re-raised without its traceback: the frames it held (a large
    parsed body among their locals) are freed on this thread, not on the event loop that handles
    the exception (freeing a 4 MB filter's objects takes about 0.1 s, the GIL held)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - re-raised as is, without the frames
        raise e.with_traceback(None) from None


async def body_of(request: Request, model: type[BaseModel], build=None, heavy: bool = False):
    """The request body as ``model`` (:func:`_validated`; NaN and Infinity are read as Python
    clients write them), or ``build(model)`` of it. A body over :data:`OFF_LOOP_BYTES`, or any
    when ``heavy``, is read (and built) on a thread, its objects freed there (:func:`off_loop`):
    give a ``build`` that keeps nothing of a large body but what the route needs."""
    raw = await request.body()
    job = (lambda: _validated(model, raw)) if build is None else (lambda: build(_validated(model, raw)))
    return await off_loop(heavy or len(raw) > OFF_LOOP_BYTES, _contained, job)


def _validation_detail(e: RequestValidationError) -> str:
    """``loc: msg`` for the first ten errors, ``; ``-joined (``requests[0].question: ...``)."""
    parts = []
    for err in e.errors()[:10]:
        loc = ""
        for x in err.get("loc", ()):
            if x != "body":
                loc += f"[{x}]" if isinstance(x, int) else (f".{x}" if loc else str(x))
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def add_exception_handlers(app: FastAPI) -> None:
    """Every error the routes and the backend raise, as its status and ``{"detail": ...}``."""

    @app.exception_handler(HTTPError)
    async def _http_error(request, e: HTTPError):
        body = {"detail": e.detail} if e.kind is None else {"detail": e.detail, "error": e.kind}
        return json_response(body, e.status, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        return json_response({"detail": _validation_detail(e)}, 422)

    @app.exception_handler(UnknownBank)
    async def _unknown(request, e: UnknownBank):  # never e.detail: what else is held is not the client's
        return json_response({"detail": f"{e.where}unknown bank id {e.bank_id!r}", "error": "unknown_bank"}, 404)

    @app.exception_handler(QuarantinedBank)
    async def _quarantined(request, e: QuarantinedBank):
        return json_response({"detail": str(e)}, 409)

    @app.exception_handler(QueueFull)
    async def _full(request, e: QueueFull):
        return json_response({"detail": str(e)}, 429, {"Retry-After": str(e.retry_after)})

    @app.exception_handler(DeadlineExceeded)
    async def _late(request, e: DeadlineExceeded):
        return json_response({"detail": f"{e} (the server's `timeout_s`)"}, 504)

    @app.exception_handler(ShuttingDown)
    async def _draining(request, e: ShuttingDown):
        return json_response({"detail": str(e)}, 503, {"Retry-After": "1"})

    @app.exception_handler(OutcomeUnknown)
    async def _unknown_outcome(request, e: OutcomeUnknown):
        return json_response({"detail": str(e), "outcome": "unknown"}, 503, {"Retry-After": "1"})

    @app.exception_handler(DuplicateTurns)
    async def _dup(request, e: DuplicateTurns):
        return json_response({"detail": str(e)}, 409)

    @app.exception_handler(InputError)
    async def _bad(request, e: InputError):
        return json_response({"detail": str(e)}, 422)

    @app.exception_handler(LineTooLong)
    async def _too_long(request, e: LineTooLong):  # an import's line or streamed body over its bound
        return json_response({"detail": str(e)}, 413, {"Connection": "close"})

    @app.exception_handler(BodyTimeout)
    async def _body_late(request, e: BodyTimeout):
        return json_response({"detail": str(e)}, 408, {"Connection": "close"})

    @app.exception_handler(EngineCallFailed)
    async def _engine_call(request, e: EngineCallFailed):  # names the failure's class, never its text
        return json_response({"detail": str(e)}, 500)

    @app.exception_handler(ConfigError)
    async def _conflict(request, e: ConfigError):  # the request conflicts with how the server runs (its units)
        return json_response({"detail": str(e).replace("`", "")}, 409)

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
        # the error goes on up (Starlette re-raises it for the server's log) and uvicorn then closes
        # the connection: say so, or a client that reuses it for its next request is reset
        return json_response({"detail": "internal server error"}, 500, {"Connection": "close"})
