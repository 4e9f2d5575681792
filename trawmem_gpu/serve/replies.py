"""The app's replies: JSON responses, the ``HTTPError`` a route raises, the request body read by
hand (``body_of``), and the exception handlers that turn every error into ``{"detail": "..."}``
with its status (the table in ``serve/app.py``'s docstring)."""
from __future__ import annotations

import inspect
import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, DuplicateTurns, InputError, QuarantinedBank, UnknownBank
from .batcher import DeadlineExceeded, OutcomeUnknown, QueueFull, ShuttingDown
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
    def __init__(self, status: int, detail: str, headers: dict | None = None):
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(_dumps(obj), status_code=status, media_type="application/json", headers=headers)


def unknown_bank(bank_id: str, where: str = "") -> HTTPError:
    # The same answer for a bank that does not exist and a bank the key does not own.
    return HTTPError(404, f"{where}unknown bank id {bank_id!r}")


async def maybe_await(x):
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
        return json_response({"detail": e.detail}, e.status, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        return json_response({"detail": _validation_detail(e)}, 422)

    @app.exception_handler(UnknownBank)
    async def _unknown(request, e: UnknownBank):  # never e.detail: what else is held is not the client's
        return json_response({"detail": f"{e.where}unknown bank id {e.bank_id!r}"}, 404)

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

    @app.exception_handler(EngineCallFailed)
    async def _engine_call(request, e: EngineCallFailed):  # names the failure's class, never its text
        return json_response({"detail": str(e)}, 500)

    @app.exception_handler(ConfigError)
    async def _conflict(request, e: ConfigError):  # the request conflicts with how the server runs (its units)
        return json_response({"detail": str(e).replace("`", "")}, 409)

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
        return json_response({"detail": "internal server error"}, 500)
