"""A client for ``trawmem serve`` (API v1), sync and async, on httpx.

::

    from trawmem_gpu.client import Client
    with Client() as c:                       # TRAWMEM_SERVE_URL, TRAWMEM_SERVE_KEY
        ws = c.select("ana-ben", "Where does Ben's sister live?", token_budget=800)
        print(ws.text, ws.units, ws.tokens)
        wss = c.select_many([("ana-ben", "Who adopted a cat?"), ("ana-ben", "What is Pixel?")], budget=8)

:class:`AsyncClient` has the same methods as coroutines. Results are the dataclasses below,
field for field the server's response models (``serve/models.py``); a field the server adds
later is ignored, never an error.

**Retries.** A 429 (queue full) or 503 (draining, not ready) means the server did no work, so
every call, appends included, is sent again: after the ``Retry-After`` the server gave (seconds
or an HTTP date, at most a day), else after an exponential backoff (0.1 s doubling, at most 5 s,
jittered down to half). A ``Retry-After`` that is negative, NaN, infinite, over a day or
unreadable is ignored (the backoff is used), and no wait is shorter than 0.05 s, so a bad header
never makes the client hammer the server. Retries stop at ``max_retries``, or at once when the
next wait would end past the call's ``deadline``; the last answer is then raised as
:class:`Overloaded`, with its ``retry_after``.

**Deadline.** ``deadline`` is wall-clock seconds from the call's start to its result: every
request, every wait between retries and every byte of every answer (for ``select_many``, all its
batch requests) fit in it. A server that is slow, or that trickles its answer a byte at a time,
ends the call in :class:`DeadlineExceeded` (an :class:`Unreachable`) once it has passed.
``timeout`` is httpx's, per connect, read or write, and is also cut to what is left of the
deadline. How each client holds the bound: ``clients.py``.

**Keys and address** come from the arguments, else from ``TRAWMEM_SERVE_KEY`` and
``TRAWMEM_SERVE_URL`` (default ``http://127.0.0.1:8000``). They are not ``TRAWMEM_API_KEY``,
which holds the key of an LLM server (``trawmem eval --answer-llm``): the two never travel to
each other's server. The key is sent as ``Authorization: Bearer KEY`` and never appears in a
message or ``repr``.

**Errors** are this package's (:class:`~trawmem_gpu.errors.TrawmemError`): each HTTP status has
its class (:data:`STATUS_ERRORS`), carrying ``status`` and the server's ``detail``; a 404 is a
:class:`BankNotFound` (an :class:`~trawmem_gpu.errors.UnknownBank`), or, when the server's body
names a unit or a turn (``"error": "unknown_unit"``), a :class:`UnitNotFound` (an
:class:`~trawmem_gpu.errors.UnknownUnit`, as ``Memory.history`` raises); a 409 or 422 an
:class:`~trawmem_gpu.errors.InputError`, as the local API raises them. A server that cannot be
reached raises :class:`Unreachable`. A 200 whose body is not JSON, or not of the result's shape
(not an object, a field missing or of another type), raises :class:`ServerError` with that
status, the field named; any error body (null, a list, text, not UTF-8) still gets its status's
class, its ``detail`` clipped to 4,000 characters. No builtin exception escapes a call because of
what a server sent.
"""
from .clients import DEFAULT_URL, KEY_ENV, RETRY_STATUSES, URL_ENV, AsyncClient, Client
from .errors import (NOT_FOUND_ERRORS, STATUS_ERRORS, BankNotFound, Conflict, DeadlineExceeded, Forbidden,
                     InvalidRequest, Overloaded, ServerError, ServerTimeout, Unauthorized, UnitNotFound, Unreachable,
                     retry_after_s)
from .results import (AppendItem, AppendResult, BankInfo, BankList, BankSummary, ForgetResult, History, HistoryEvent,
                      ImportRefused, ImportResult, SelectResult, ThreadHead, Timings, Unit)
from .transport import deadline_transport

__all__ = ["AppendItem", "AppendResult", "AsyncClient", "BankInfo", "BankList", "BankNotFound", "BankSummary", "Client",
           "Conflict", "DEFAULT_URL", "DeadlineExceeded", "ForgetResult", "Forbidden", "History", "HistoryEvent",
           "ImportRefused", "ImportResult", "InvalidRequest", "KEY_ENV",
           "NOT_FOUND_ERRORS", "Overloaded", "RETRY_STATUSES", "STATUS_ERRORS",
           "SelectResult", "ServerError", "ServerTimeout", "ThreadHead", "Timings", "URL_ENV", "Unauthorized", "Unit",
           "UnitNotFound", "Unreachable", "deadline_transport", "retry_after_s"]
