"""The client's errors: one class per HTTP status, all :class:`ServerError` (a
:class:`~trawmem_gpu.errors.TrawmemError`)."""
from __future__ import annotations

import http
import json

import httpx

from ..errors import InputError, TrawmemError, UnknownBank, UnknownUnit, loads_json
from ..http_headers import retry_after_s  # noqa: F401 - re-exported by the client package


class ServerError(TrawmemError):
    """The server answered with an error status: ``status`` and its ``detail`` (the JSON body)."""

    def __init__(self, status: int | None, detail: str, retry_after: float | None = None):
        # TrawmemError's, not the next class's in a subclass's MRO: UnknownBank's would wrap the
        # message as a bank id (BankNotFound: "unknown bank id 'HTTP 404: ...'")
        TrawmemError.__init__(self, f"HTTP {status}: {detail}" if status is not None else detail)
        self.status, self.detail, self.retry_after = status, detail, retry_after


class Unauthorized(ServerError):
    """401: no API key, or one the server's keys file does not hold."""


class Forbidden(ServerError):
    """403: a read-only key asked to write."""


class BankNotFound(ServerError, UnknownBank):
    """404: a bank that does not exist, or that the key does not own (the server does not say which)."""

    def __init__(self, status, detail, retry_after=None, bank_id: str = ""):
        ServerError.__init__(self, status, detail, retry_after)
        self.bank_id, self.where, self.detail = bank_id, "", detail

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):
        return type(self), (self.status, self.detail, self.retry_after, self.bank_id)


class UnitNotFound(ServerError, UnknownUnit):
    """404 naming a unit, not the bank: a unit id the bank neither holds nor has a history of
    (``history``), or a turn it does not hold (``DELETE /v1/banks/{bank_id}/turns/{turn_id}``):
    an :class:`~trawmem_gpu.errors.UnknownUnit` (a ``KeyError``), as ``Memory.history`` raises."""

    def __init__(self, status, detail, retry_after=None, bank_id: str = "", unit_id: str = ""):
        ServerError.__init__(self, status, detail, retry_after)
        self.bank_id, self.unit_id = bank_id, unit_id

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):
        return type(self), (self.status, self.detail, self.retry_after, self.bank_id, self.unit_id)


class Conflict(ServerError, InputError):
    """409: turn ids the bank already holds (nothing was appended)."""


class InvalidRequest(ServerError, InputError):
    """413 or 422: a body over the server's limit, or a field out of range (``detail`` names it)."""


class Overloaded(ServerError):
    """429 or 503 once the retries or the deadline ran out; ``retry_after`` is the server's last word."""


class ServerTimeout(ServerError):
    """504: no answer within the server's ``timeout_s``."""


class Unreachable(ServerError):
    """No HTTP answer at all (connection refused, reset, or the client's own timeout)."""


class DeadlineExceeded(Unreachable):
    """The call's ``deadline`` passed before a whole answer came (a slow or trickling server,
    retries included); an :class:`Unreachable`, as the client's own timeout is."""


STATUS_ERRORS: dict[int, type[ServerError]] = {401: Unauthorized, 403: Forbidden, 404: BankNotFound,
                                               409: Conflict, 413: InvalidRequest, 422: InvalidRequest,
                                               429: Overloaded, 503: Overloaded, 504: ServerTimeout}


MAX_DETAIL = 4000
"""The most characters of an error body kept as ``detail`` (a hostile server's body is not echoed whole)."""


def _clip(text: str) -> str:
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL - 15] + "... (clipped)"


NOT_FOUND_ERRORS: dict[str, type[ServerError]] = {"unknown_bank": BankNotFound, "unknown_unit": UnitNotFound,
                                                  "unknown_turn": UnitNotFound}
"""A 404's class by the ``error`` its body names (``serve.replies.NOT_FOUND``); a 404 naming none
(an older server, a path that is no route) is a :class:`BankNotFound`, as before kinds were sent."""


def _doc(text: str) -> dict | None:
    """The error body as a JSON object, or None (malformed, nested too deeply, not an object)."""
    try:
        doc = loads_json(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def detail_of(body: bytes, status: int) -> str:
    """The server's ``detail``: the ``detail`` key of a JSON object body, else the body's text,
    else the status's reason phrase; whatever the body is (null, a list, not JSON, not UTF-8)."""
    text = body.decode("utf-8", "replace")
    doc = _doc(text)
    if doc is not None and doc.get("detail") is not None:
        d = doc["detail"]
        return _clip(d if isinstance(d, str) else json.dumps(d))
    if text.strip():
        return _clip(text.strip())
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "no detail"


def _error_of(r: httpx.Response, bank_id: str = "", body: bytes | None = None, unit_id: str = "") -> ServerError:
    """The error of answer ``r`` (an error status), its class by status, a 404's by the ``error``
    its body names (:data:`NOT_FOUND_ERRORS`); ``body``: ``r``'s body when it was read as a stream."""
    raw = r.content if body is None else body
    detail = detail_of(raw, r.status_code)
    cls = STATUS_ERRORS.get(r.status_code, ServerError)
    ra = retry_after_s(r.headers.get("retry-after"))
    if cls is BankNotFound:
        kind = (_doc(raw.decode("utf-8", "replace")) or {}).get("error")
        if isinstance(kind, str) and NOT_FOUND_ERRORS.get(kind) is UnitNotFound:
            return UnitNotFound(r.status_code, detail, ra, bank_id, unit_id)
        return BankNotFound(r.status_code, detail, ra, bank_id)
    return cls(r.status_code, detail, ra)
