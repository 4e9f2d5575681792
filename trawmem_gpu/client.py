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
or an HTTP date), else after an exponential backoff (0.1 s doubling, at most 5 s). Retries stop
at ``max_retries`` or when the next wait would end past the call's ``deadline`` (seconds from
the call's start); the last answer is then raised as :class:`Overloaded`, with its
``retry_after``. Every request's own timeout is cut to what is left of the deadline.

**Keys and address** come from the arguments, else from ``TRAWMEM_SERVE_KEY`` and
``TRAWMEM_SERVE_URL`` (default ``http://127.0.0.1:8000``). They are not ``TRAWMEM_API_KEY``,
which holds the key of an LLM server (``trawmem eval --answer-llm``): the two never travel to
each other's server. The key is sent as ``Authorization: Bearer KEY`` and never appears in a
message or ``repr``.

**Errors** are this package's (:class:`~trawmem_gpu.errors.TrawmemError`): each HTTP status has
its class (:data:`STATUS_ERRORS`), carrying ``status`` and the server's ``detail``; a 404 is also
an :class:`~trawmem_gpu.errors.UnknownBank` and a 409 or 422 an
:class:`~trawmem_gpu.errors.InputError`, as the local API raises them. A server that cannot be
reached raises :class:`Unreachable`.
"""
from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Sequence
from urllib.parse import quote

import httpx

from .errors import InputError, TrawmemError, UnknownBank

URL_ENV, KEY_ENV = "TRAWMEM_SERVE_URL", "TRAWMEM_SERVE_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = (429, 503)


# --- results (serve/models.py) ---------------------------------------------------------------

def _from(cls, d: dict):
    """``cls`` from the keys of ``d`` it declares (others ignored: a newer server may add some)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class Unit:
    """One selected turn."""

    id: str
    speaker: str
    date: str | None
    timestamp: str
    text: str
    caption: str | None
    thread: int
    session: int


@dataclass(frozen=True)
class ThreadHead:
    thread: int
    head: str | None


@dataclass(frozen=True)
class SelectResult:
    """The workspace for one question (``POST /v1/select``)."""

    bank_id: str
    bank_n_units: int
    question: str
    budget: int | None
    hops: int
    token_budget: int | None
    date: str | None
    date_used: bool
    units: tuple[Unit, ...]
    threads: tuple[ThreadHead, ...]
    text: str
    n_tokens: int
    tokenizer: str
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        """``n_tokens``: the rendered workspace's tokens (as ``Memory``'s ``Workspace.tokens``)."""
        return self.n_tokens

    @property
    def unit_ids(self) -> list[str]:
        return [u.id for u in self.units]

    @classmethod
    def from_json(cls, d: dict) -> "SelectResult":
        return _from(cls, {**d, "units": tuple(_from(Unit, u) for u in d.get("units", ())),
                           "threads": tuple(_from(ThreadHead, t) for t in d.get("threads", ()))})


@dataclass(frozen=True)
class BankSummary:
    bank_id: str
    n_units: int
    n_threads: int


@dataclass(frozen=True)
class BankList:
    """``GET /v1/banks``: the banks this key can see, and the collection's encoder."""

    banks: tuple[BankSummary, ...]
    encoder: str | None
    dim: int

    @classmethod
    def from_json(cls, d: dict) -> "BankList":
        return _from(cls, {**d, "banks": tuple(_from(BankSummary, b) for b in d.get("banks", ()))})


@dataclass(frozen=True)
class BankInfo:
    """``GET /v1/banks/{bank_id}``."""

    bank_id: str
    n_units: int
    n_threads: int
    n_sessions: int
    first_date: str | None
    last_date: str | None


@dataclass(frozen=True)
class AppendResult:
    """``POST /v1/banks/{bank_id}/turns``: the bank after the append."""

    bank_id: str
    n_units: int
    n_threads: int
    n_sessions: int
    first_date: str | None
    last_date: str | None
    created: bool
    appended: int
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ForgetResult:
    """What a forget removed (the ``DELETE`` answers, as ``Memory.forget`` returns them): the turn
    ids ``forgotten`` and those the bank did not hold (``missing``), whether the whole bank is
    gone (``deleted``), and the bank's ``n_units`` after it."""

    bank_id: str
    forgotten: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    deleted: bool = False
    n_units: int = 0

    @classmethod
    def of(cls, bank_id: str, answers: list[dict]) -> "ForgetResult":
        """One result for the answers of one forget's ``DELETE`` requests (one per turn, or one)."""
        last = answers[-1] if answers else {}
        return cls(bank_id, tuple(t for a in answers for t in a.get("forgotten") or ()),
                   tuple(t for a in answers for t in a.get("missing") or ()), bool(last.get("deleted")),
                   int(last.get("n_units") or 0))


# --- errors ------------------------------------------------------------------------------------

class ServerError(TrawmemError):
    """The server answered with an error status: ``status`` and its ``detail`` (the JSON body)."""

    def __init__(self, status: int | None, detail: str, retry_after: float | None = None):
        super().__init__(f"HTTP {status}: {detail}" if status is not None else detail)
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


STATUS_ERRORS: dict[int, type[ServerError]] = {401: Unauthorized, 403: Forbidden, 404: BankNotFound,
                                               409: Conflict, 413: InvalidRequest, 422: InvalidRequest,
                                               429: Overloaded, 503: Overloaded, 504: ServerTimeout}


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header in seconds: a number of seconds, or an HTTP date (from ``now``,
    epoch seconds); None when it is missing or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _error_of(r: httpx.Response, bank_id: str = "") -> ServerError:
    try:
        detail = r.json().get("detail", r.text)
    except ValueError:
        detail = r.text or r.reason_phrase
    cls = STATUS_ERRORS.get(r.status_code, ServerError)
    ra = retry_after_s(r.headers.get("retry-after"))
    if cls is BankNotFound:
        return BankNotFound(r.status_code, str(detail), ra, bank_id)
    return cls(r.status_code, str(detail), ra)


# --- the request plan, shared by both clients ----------------------------------------------

@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    body: Any = None
    bank_id: str = ""


class _Retry:
    """When to send a call again (see the module docstring)."""

    def __init__(self, deadline: float, max_retries: int, base: float = 0.1, cap: float = 5.0):
        if not deadline > 0:
            raise InputError(f"deadline must be > 0 seconds, got {deadline!r}")
        if max_retries < 0:
            raise InputError(f"max_retries must be >= 0, got {max_retries!r}")
        self.deadline, self.max_retries, self.base, self.cap = float(deadline), int(max_retries), base, cap

    def wait(self, r: httpx.Response, attempt: int, t0: float, now: float) -> float | None:
        """Seconds to wait before sending again after answer ``r`` of try ``attempt`` (0-based), or
        None to give up (not a retry status, out of retries, or past the deadline)."""
        if r.status_code not in RETRY_STATUSES or attempt >= self.max_retries:
            return None
        ra = retry_after_s(r.headers.get("retry-after"))
        w = ra if ra is not None else min(self.cap, self.base * 2 ** attempt) * (0.5 + random.random() / 2)
        return None if now + w >= t0 + self.deadline else w

    def timeout(self, per_request: float, t0: float, now: float) -> float:
        return max(0.001, min(per_request, t0 + self.deadline - now))


def _select_body(bank_id: str, question: str, budget, hops, token_budget, date, question_vector) -> dict:
    body = {"bank_id": bank_id, "question": question}
    for k, v in (("budget", budget), ("hops", hops), ("token_budget", token_budget), ("date", date)):
        if v is not None:
            body[k] = v
    if question_vector is not None:
        body["question_vector"] = [float(x) for x in question_vector]
    return body


def _turn(t) -> dict:
    """A turn as the append route takes it: a dict, or an object with the turn's fields."""
    if isinstance(t, dict):
        return t
    d = {k: getattr(t, k) for k in ("turn_id", "speaker", "text", "timestamp", "caption", "session")
         if getattr(t, k, None) is not None}
    if not d:
        raise InputError(f"turns: expected dicts or objects with turn_id, speaker, text and timestamp, "
                         f"got {type(t).__name__}")
    return d


def _path_id(x) -> str:
    return quote(str(x), safe="")


class _Base:
    def __init__(self, url: str | None, api_key: str | None, timeout: float, deadline: float, max_retries: int,
                 batch_size: int):
        self.url = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get(KEY_ENV)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        if not timeout > 0:
            raise InputError(f"timeout must be > 0 seconds, got {timeout!r}")
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size!r}")
        self.timeout, self.batch_size = float(timeout), int(batch_size)
        self._retry = _Retry(deadline, max_retries)

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self.url!r}, key={'set' if self._headers else 'none'})"

    @staticmethod
    def _select_call(bank_id, question, budget=None, hops=None, token_budget=None, date=None,
                     question_vector=None) -> _Call:
        return _Call("POST", "/v1/select", _select_body(bank_id, question, budget, hops, token_budget, date,
                                                        question_vector), bank_id)

    def _batch_calls(self, pairs: Iterable, params: dict) -> list[_Call]:
        reqs = []
        for i, p in enumerate(pairs):
            if not (isinstance(p, (tuple, list)) and len(p) == 2):
                raise InputError(f"select_many: item {i} must be a (bank_id, question) pair, got {p!r}")
            reqs.append(_select_body(p[0], p[1], params.get("budget"), params.get("hops"),
                                     params.get("token_budget"), params.get("date"), None))
        if not reqs:
            raise InputError("select_many: no (bank_id, question) pairs")
        return [_Call("POST", "/v1/select/batch", {"requests": reqs[i:i + self.batch_size]})
                for i in range(0, len(reqs), self.batch_size)]

    @staticmethod
    def _append_call(bank_id, turns) -> _Call:
        return _Call("POST", f"/v1/banks/{_path_id(bank_id)}/turns", {"turns": [_turn(t) for t in turns]}, bank_id)

    @staticmethod
    def _forget_calls(bank_id, turn_ids) -> list[_Call]:
        if turn_ids is None:
            return [_Call("DELETE", f"/v1/banks/{_path_id(bank_id)}", None, bank_id)]
        if isinstance(turn_ids, (str, bytes)):
            raise InputError("turn_ids must be a list of turn ids, not one string")
        turn_ids = list(turn_ids)
        if not turn_ids:
            raise InputError("turn_ids is empty (pass None to forget the whole bank)")
        return [_Call("DELETE", f"/v1/banks/{_path_id(bank_id)}/turns/{_path_id(t)}", None, bank_id)
                for t in turn_ids]

    def _request_kw(self, call: _Call, timeout: float) -> dict:
        kw = {"headers": self._headers, "timeout": timeout}
        if call.body is not None:
            kw["json"] = call.body
        return kw

    @staticmethod
    def _result(call: _Call, r: httpx.Response) -> dict:
        if r.status_code >= 400:
            raise _error_of(r, call.bank_id)
        try:
            return r.json()
        except ValueError:
            raise ServerError(r.status_code, f"the answer to {call.method} {call.path} is not JSON") from None


class Client(_Base):
    """The synchronous client; a context manager (or call :meth:`close`).

    :param url: the server (default ``$TRAWMEM_SERVE_URL``, else ``http://127.0.0.1:8000``)
    :param api_key: the tenant key (default ``$TRAWMEM_SERVE_KEY``; none: no ``Authorization``)
    :param timeout: seconds per HTTP request
    :param deadline: seconds per call, retries included
    :param max_retries: most retries of a 429 / 503 per request
    :param batch_size: questions per ``/v1/select/batch`` request in :meth:`select_many`
        (the server's ``max_batch_request`` defaults to 256)
    :param http: an ``httpx.Client`` to use (its base URL is ignored; it is not closed here)
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0,
                 deadline: float = 60.0, max_retries: int = 8, batch_size: int = 256,
                 http: httpx.Client | None = None):
        super().__init__(url, api_key, timeout, deadline, max_retries, batch_size)
        self._own = http is None
        self._http = http or httpx.Client()
        self._sleep = time.sleep

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, call: _Call) -> dict:
        attempt = 0
        t0 = time.monotonic()
        while True:
            now = time.monotonic()
            try:
                r = self._http.request(call.method, self.url + call.path,
                                       **self._request_kw(call, self._retry.timeout(self.timeout, t0, now)))
            except httpx.HTTPError as e:
                raise Unreachable(None, f"{call.method} {self.url}{call.path}: {type(e).__name__}: {e}") from None
            w = self._retry.wait(r, attempt, t0, time.monotonic())
            if w is None:
                return self._result(call, r)
            self._sleep(w)
            attempt += 1

    def select(self, bank_id: str, question: str, *, budget: int | None = None, hops: int | None = None,
               token_budget: int | None = None, date: str | None = None,
               question_vector: Sequence[float] | None = None) -> SelectResult:
        """The workspace for ``question`` from bank ``bank_id`` (unset parameters: the server's)."""
        return SelectResult.from_json(self._send(self._select_call(bank_id, question, budget, hops, token_budget,
                                                                   date, question_vector)))

    def select_many(self, pairs: Iterable[tuple[str, str]], *, budget: int | None = None, hops: int | None = None,
                    token_budget: int | None = None, date: str | None = None) -> list[SelectResult]:
        """Workspaces for ``(bank_id, question)`` pairs, in order, over ``/v1/select/batch``
        (``batch_size`` questions per request); the parameters apply to every question."""
        params = {"budget": budget, "hops": hops, "token_budget": token_budget, "date": date}
        return [SelectResult.from_json(d) for call in self._batch_calls(pairs, params)
                for d in self._send(call)["results"]]

    def append(self, bank_id: str, turns: Iterable) -> AppendResult:
        """Append ``turns`` (dicts or objects with ``turn_id, speaker, text, timestamp[, caption,
        session]``) to ``bank_id``; the first append creates the bank."""
        return _from(AppendResult, self._send(self._append_call(bank_id, turns)))

    def banks(self) -> BankList:
        """The banks this key can see."""
        return BankList.from_json(self._send(_Call("GET", "/v1/banks")))

    def bank(self, bank_id: str) -> BankInfo:
        return _from(BankInfo, self._send(_Call("GET", f"/v1/banks/{_path_id(bank_id)}", None, bank_id)))

    def forget(self, bank_id: str, turn_ids: Sequence[str] | None = None) -> ForgetResult:
        """Forget turns ``turn_ids`` of ``bank_id``, or (``None``) the whole bank."""
        return ForgetResult.of(bank_id, [self._send(call) for call in self._forget_calls(bank_id, turn_ids)])

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 (no retries)."""
        try:
            return self._http.get(self.url + "/readyz", timeout=self.timeout).status_code == 200
        except httpx.HTTPError:
            return False


class AsyncClient(_Base):
    """The asynchronous client: :class:`Client`'s arguments and methods, as coroutines;
    ``async with AsyncClient() as c: ws = await c.select(...)``."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0,
                 deadline: float = 60.0, max_retries: int = 8, batch_size: int = 256,
                 http: httpx.AsyncClient | None = None):
        super().__init__(url, api_key, timeout, deadline, max_retries, batch_size)
        self._own = http is None
        self._http = http or httpx.AsyncClient()
        self._sleep = asyncio.sleep

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _send(self, call: _Call) -> dict:
        attempt = 0
        t0 = time.monotonic()
        while True:
            now = time.monotonic()
            try:
                r = await self._http.request(call.method, self.url + call.path,
                                             **self._request_kw(call, self._retry.timeout(self.timeout, t0, now)))
            except httpx.HTTPError as e:
                raise Unreachable(None, f"{call.method} {self.url}{call.path}: {type(e).__name__}: {e}") from None
            w = self._retry.wait(r, attempt, t0, time.monotonic())
            if w is None:
                return self._result(call, r)
            await self._sleep(w)
            attempt += 1

    async def select(self, bank_id: str, question: str, *, budget: int | None = None, hops: int | None = None,
                     token_budget: int | None = None, date: str | None = None,
                     question_vector: Sequence[float] | None = None) -> SelectResult:
        return SelectResult.from_json(await self._send(self._select_call(bank_id, question, budget, hops,
                                                                         token_budget, date, question_vector)))

    async def select_many(self, pairs: Iterable[tuple[str, str]], *, budget: int | None = None,
                          hops: int | None = None, token_budget: int | None = None,
                          date: str | None = None) -> list[SelectResult]:
        params = {"budget": budget, "hops": hops, "token_budget": token_budget, "date": date}
        out = []
        for call in self._batch_calls(pairs, params):
            out += [SelectResult.from_json(d) for d in (await self._send(call))["results"]]
        return out

    async def append(self, bank_id: str, turns: Iterable) -> AppendResult:
        return _from(AppendResult, await self._send(self._append_call(bank_id, turns)))

    async def banks(self) -> BankList:
        return BankList.from_json(await self._send(_Call("GET", "/v1/banks")))

    async def bank(self, bank_id: str) -> BankInfo:
        return _from(BankInfo, await self._send(_Call("GET", f"/v1/banks/{_path_id(bank_id)}", None, bank_id)))

    async def forget(self, bank_id: str, turn_ids: Sequence[str] | None = None) -> ForgetResult:
        return ForgetResult.of(bank_id, [await self._send(call) for call in self._forget_calls(bank_id, turn_ids)])

    async def ready(self) -> bool:
        try:
            return (await self._http.get(self.url + "/readyz", timeout=self.timeout)).status_code == 200
        except httpx.HTTPError:
            return False
