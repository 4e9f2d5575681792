"""The two clients, :class:`Client` and :class:`AsyncClient`, over one request plan (``_Base``)
and one retry rule (``_Retry``); see the package docstring.

**The deadline is wall-clock time** from the call's start to its result, retries, waits and
every byte of every answer included (:class:`~.errors.DeadlineExceeded` once it has passed):

- :class:`AsyncClient` runs the whole call under ``asyncio.timeout``;
- :class:`Client` has no event loop to cancel a blocked read from, so its own transport
  (``transport.py``) cuts every socket connect, read and write to what is left of the call, and
  it reads each answer as a stream, checking the deadline between chunks. A server that
  trickles its headers or body cannot hold a call past its deadline. An ``http`` client of your
  own keeps the whole bound when its transport is :func:`~.transport.deadline_transport`;
  without it the chunk checks and the cut request timeouts still hold (a trickled body stops
  within a read's timeout of the deadline), but a server trickling its headers can hold the
  call, since httpx reads the headers in one go.

Either way a timeout that fires at the deadline is :class:`~.errors.DeadlineExceeded`, any other
transport failure :class:`~.errors.Unreachable`.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence
from urllib.parse import quote

import httpx

from ..data.jsonl import record_of
from ..errors import InputError, loads_json
from .errors import DeadlineExceeded, ServerError, Unreachable, _error_of, retry_after_s
from .exports import ExportSink, content, read_export, sunk
from .results import (AppendResult, BankInfo, BankList, ForgetResult, History, ImportResult, Malformed, SelectResult,
                      parse)
from .transport import deadline_at, deadline_transport

URL_ENV, KEY_ENV = "TRAWMEM_SERVE_URL", "TRAWMEM_SERVE_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = (429, 503)
_SLACK_S = 0.05  # a timeout this close to the deadline is the deadline's


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    body: Any = None
    bank_id: str = ""
    unit_id: str = ""  # a history's unit (named by its UnitNotFound)
    raw: Any = None  # a JSON Lines body (an import), sent as it is (``exports.read_export``)
    as_bytes: bool = False  # the answer's bytes (an export), not JSON
    sink: Any = None  # where a 2xx answer's body goes as it arrives (``exports.ExportSink``), not kept


@dataclass(frozen=True)
class _Answer:
    """A whole answer: its response (headers, status) and the body read from its stream."""

    response: httpx.Response
    body: bytes

    @property
    def status(self) -> int:
        return self.response.status_code


class _Retry:
    """When to send a call again (see the package docstring): the server's ``Retry-After`` when it
    is readable, else the backoff; never less than ``floor``; never a wait that ends past the
    deadline (the call gives up at once instead)."""

    def __init__(self, deadline: float, max_retries: int, base: float = 0.1, cap: float = 5.0,
                 floor: float = 0.05):
        if not deadline > 0:
            raise InputError(f"`deadline` must be > 0 seconds, got {deadline!r}")
        if max_retries < 0:
            raise InputError(f"`max_retries` must be >= 0, got {max_retries!r}")
        self.deadline, self.max_retries = float(deadline), int(max_retries)
        self.base, self.cap, self.floor = base, cap, floor

    def wait(self, a: _Answer, attempt: int, now: float, end: float) -> float | None:
        """Seconds to wait before sending again after answer ``a`` of try ``attempt`` (0-based), or
        None to give up (not a retry status, out of retries, or the wait would end past ``end``)."""
        if a.status not in RETRY_STATUSES or attempt >= self.max_retries:
            return None
        ra = retry_after_s(a.response.headers.get("retry-after"))
        w = ra if ra is not None else min(self.cap, self.base * 2 ** attempt) * (0.5 + random.random() / 2)
        w = max(w, self.floor)
        return None if now + w >= end else w

    def timeout(self, per_request: float, end: float, now: float) -> float:
        return max(0.001, min(per_request, end - now))


def _late(call: _Call, what: str = "") -> DeadlineExceeded:
    return DeadlineExceeded(None, f"{call.method} {call.path}: the call's deadline passed{what}")


def _http_error(call: _Call, url: str, e: httpx.HTTPError, end: float) -> ServerError:
    if isinstance(e, httpx.TimeoutException) and time.monotonic() >= end - _SLACK_S:
        return _late(call, f" ({type(e).__name__})")
    return Unreachable(None, f"{call.method} {url}{call.path}: {type(e).__name__}: {e}")


def _select_body(bank_id: str, question: str, budget, hops, token_budget, date, question_vector,
                 as_of=None, where=None) -> dict:
    body = {"bank_id": bank_id, "question": question}
    for k, v in (("budget", budget), ("hops", hops), ("token_budget", token_budget), ("date", date),
                 ("as_of", as_of)):
        if v is not None:
            body[k] = v
    if question_vector is not None:
        body["question_vector"] = [float(x) for x in question_vector]
    if where is not None:  # a filter's JSON (a data.filters.Filter sends its canonical form)
        body["where"] = getattr(where, "json", where)
    return body


def _path_id(x) -> str:
    return quote(str(x), safe="")


def _export_call(bank_id, out, vectors: bool) -> _Call:
    q = "?vectors=true" if vectors else ""
    return _Call("GET", f"/v1/banks/{_path_id(bank_id)}/export{q}", None, bank_id, as_bytes=True,
                 sink=ExportSink(out))


def _import_call(bank_id, source) -> _Call:
    return _Call("POST", f"/v1/banks/{_path_id(bank_id)}/import", None, bank_id, raw=read_export(source))


class _Base:
    def __init__(self, url: str | None, api_key: str | None, timeout: float, deadline: float, max_retries: int,
                 batch_size: int):
        self.url = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get(KEY_ENV)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        if not timeout > 0:
            raise InputError(f"`timeout` must be > 0 seconds, got {timeout!r}")
        if batch_size < 1:
            raise InputError(f"`batch_size` must be at least 1, got {batch_size!r}")
        self.timeout, self.batch_size = float(timeout), int(batch_size)
        self._retry = _Retry(deadline, max_retries)

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self.url!r}, key={'set' if self._headers else 'none'})"

    @staticmethod
    def _select_call(bank_id, question, budget=None, hops=None, token_budget=None, date=None,
                     question_vector=None, as_of=None, where=None) -> _Call:
        return _Call("POST", "/v1/select", _select_body(bank_id, question, budget, hops, token_budget, date,
                                                        question_vector, as_of, where), bank_id)

    def _batch_calls(self, pairs: Iterable, params: dict) -> list[_Call]:
        reqs = []
        for i, p in enumerate(pairs):
            if not (isinstance(p, (tuple, list)) and len(p) == 2):
                raise InputError(f"select_many: item {i} must be a (bank_id, question) pair, got {p!r}")
            reqs.append(_select_body(p[0], p[1], params.get("budget"), params.get("hops"),
                                     params.get("token_budget"), params.get("date"), None, params.get("as_of"),
                                     params.get("where")))
        if not reqs:
            raise InputError("select_many: no (bank_id, question) pairs")
        return [_Call("POST", "/v1/select/batch", {"requests": reqs[i:i + self.batch_size]})
                for i in range(0, len(reqs), self.batch_size)]

    @staticmethod
    def _append_call(bank_id, turns=None, messages=None, speakers=None, roles=None, atomic=False) -> _Call:
        if (turns is None) == (messages is None):
            raise InputError("give either `turns` or `messages` (chat messages), not " +
                             ("both" if turns is not None else "neither"))
        if turns is not None:
            body: dict = {"turns": [record_of(t, f"turns[{i}]", bank_id) for i, t in enumerate(turns)]}
        else:
            body = {"messages": [dict(m) if isinstance(m, dict) else m for m in messages]}
            body.update({k: v for k, v in (("speakers", speakers), ("roles", roles)) if v is not None})
        if atomic:
            body["atomic"] = True
        return _Call("POST", f"/v1/banks/{_path_id(bank_id)}/turns", body, bank_id)

    @staticmethod
    def _history_call(bank_id, unit_id) -> _Call:
        return _Call("GET", f"/v1/banks/{_path_id(bank_id)}/units/{_path_id(unit_id)}/history", None, bank_id,
                     str(unit_id))

    @staticmethod
    def _forget_call(bank_id, turn_ids) -> _Call:
        if turn_ids is None:
            return _Call("DELETE", f"/v1/banks/{_path_id(bank_id)}", None, bank_id)
        if isinstance(turn_ids, (str, bytes)):
            raise InputError("`turn_ids` must be a list of turn ids, not one string")
        turn_ids = [str(t) for t in turn_ids]
        if not turn_ids:
            raise InputError("`turn_ids` is empty (pass None to forget the whole bank)")
        return _Call("POST", f"/v1/banks/{_path_id(bank_id)}/forget", {"turn_ids": turn_ids}, bank_id)

    def _request_kw(self, call: _Call, timeout: float, aio: bool = False) -> dict:
        kw = {"headers": self._headers, "timeout": timeout}
        if call.raw is not None:
            kw.update(content=content(call.raw, aio), headers={**self._headers, "Content-Type": "application/x-ndjson"})
        if call.body is not None:
            kw["json"] = call.body
        return kw

    @staticmethod
    def _result(call: _Call, a: _Answer):
        """The JSON of answer ``a``, or its error (an error status; a body that is not JSON)."""
        if a.status >= 400:
            raise _error_of(a.response, call.bank_id, a.body, call.unit_id)
        if call.as_bytes:
            return a.body
        try:
            return loads_json(a.body)
        except ValueError:  # malformed or nested too deeply
            raise ServerError(a.status, f"the answer to {call.method} {call.path} is not JSON") from None

    @staticmethod
    def _parse(cls, call: _Call, doc, status: int = 200):
        try:
            return parse(cls, doc)
        except Malformed as e:
            raise ServerError(status, f"the answer to {call.method} {call.path} is malformed: {e}") from None

    @staticmethod
    def _results(call: _Call, doc, status: int = 200) -> list:
        """The ``results`` of a batch answer, one per question of ``call``."""
        n = len(call.body["requests"])
        got = doc.get("results") if isinstance(doc, dict) else None
        if not isinstance(got, list) or len(got) != n:
            raise ServerError(status, f"the answer to {call.method} {call.path} is malformed: expected `results`, "
                                      f"a list of {n} workspaces")
        return [_Base._parse(SelectResult, call, d, status) for d in got]

    def _end(self) -> float:
        return time.monotonic() + self._retry.deadline


class Client(_Base):
    """The synchronous client; a context manager (or call :meth:`close`).

    :param url: the server (default ``$TRAWMEM_SERVE_URL``, else ``http://127.0.0.1:8000``)
    :param api_key: the tenant key (default ``$TRAWMEM_SERVE_KEY``; none: no ``Authorization``)
    :param timeout: seconds one connect, read or write may wait (httpx's timeout: per operation)
    :param deadline: wall-clock seconds per call, from its start to its result: retries, waits
        and every byte of every answer included (:class:`DeadlineExceeded` when it passes; for
        :meth:`select_many`, all its batch requests together)
    :param max_retries: most retries of a 429 / 503 per request
    :param batch_size: questions per ``/v1/select/batch`` request in :meth:`select_many`
        (the server's ``max_batch_request`` defaults to 256)
    :param http: an ``httpx.Client`` to use (its base URL is ignored; it is not closed here).
        The client's own has a transport that cuts every socket operation to the deadline; give
        yours ``transport=deadline_transport()`` to keep that (module docstring)
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0,
                 deadline: float = 60.0, max_retries: int = 8, batch_size: int = 256,
                 http: httpx.Client | None = None):
        super().__init__(url, api_key, timeout, deadline, max_retries, batch_size)
        self._own = http is None
        self._http = http or httpx.Client(transport=deadline_transport())
        self._sleep = time.sleep

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _attempt(self, call: _Call, end: float) -> _Answer:
        """One request of ``call`` and its whole answer, by ``end``."""
        now = time.monotonic()
        if now >= end:
            raise _late(call)
        kw = self._request_kw(call, self._retry.timeout(self.timeout, end, now))
        try:
            with deadline_at(end), self._http.stream(call.method, self.url + call.path, **kw) as r:
                chunks, sink = [], call.sink if r.status_code < 300 else None
                for chunk in r.iter_bytes():
                    if time.monotonic() >= end:
                        raise _late(call)
                    sink.write(chunk) if sink is not None else chunks.append(chunk)
                return _Answer(r, b"".join(chunks))
        except httpx.HTTPError as e:
            raise _http_error(call, self.url, e, end) from None

    def _send(self, call: _Call, end: float | None = None) -> tuple[int, Any]:
        """(status, JSON) of ``call``'s answer, retried as the package docstring says, by ``end``
        (default: the deadline from now)."""
        end = self._end() if end is None else end
        attempt = 0
        while True:
            a = self._attempt(call, end)
            w = self._retry.wait(a, attempt, time.monotonic(), end)
            if w is None:
                return a.status, self._result(call, a)
            self._sleep(w)
            attempt += 1

    def _get(self, cls, call: _Call):
        status, doc = self._send(call)
        return self._parse(cls, call, doc, status)

    def select(self, bank_id: str, question: str, *, budget: int | None = None, hops: int | None = None,
               token_budget: int | None = None, date: str | None = None,
               question_vector: Sequence[float] | None = None, as_of: str | None = None,
               where=None) -> SelectResult:
        """The workspace for ``question`` from bank ``bank_id`` (unset parameters: the server's;
        ``as_of``: show the facts valid on that date; ``where``: a filter over the turns'
        metadata, docs/python-api.md)."""
        return self._get(SelectResult, self._select_call(bank_id, question, budget, hops, token_budget, date,
                                                         question_vector, as_of, where))

    def select_many(self, pairs: Iterable[tuple[str, str]], *, budget: int | None = None, hops: int | None = None,
                    token_budget: int | None = None, date: str | None = None, where=None) -> list[SelectResult]:
        """Workspaces for ``(bank_id, question)`` pairs, in order, over ``/v1/select/batch``
        (``batch_size`` questions per request, all within one ``deadline``); the parameters apply
        to every question."""
        params = {"budget": budget, "hops": hops, "token_budget": token_budget, "date": date, "where": where}
        calls, end, out = self._batch_calls(pairs, params), self._end(), []
        for call in calls:
            status, doc = self._send(call, end)
            out += self._results(call, doc, status)
        return out

    def append(self, bank_id: str, turns: Iterable | None = None, *, messages: Iterable | None = None,
               speakers: dict | None = None, roles: Sequence[str] | None = None, atomic: bool = False) -> AppendResult:
        """Append ``turns`` (dicts or objects with ``turn_id, speaker, text, timestamp[, caption,
        session]``), or chat ``messages`` (``{role, content, name}``, with ``speakers`` and
        ``roles`` as ``Memory.add`` takes them), to ``bank_id``; the first append creates the bank.
        Every item is answered (``items``, ``refused``); ``atomic=True`` refuses the whole request
        when one item is refused (an error, nothing stored)."""
        return self._get(AppendResult, self._append_call(bank_id, turns, messages, speakers, roles, atomic))

    def banks(self) -> BankList:
        """The banks this key can see."""
        return self._get(BankList, _Call("GET", "/v1/banks"))

    def bank(self, bank_id: str) -> BankInfo:
        return self._get(BankInfo, _Call("GET", f"/v1/banks/{_path_id(bank_id)}", None, bank_id))

    def history(self, bank_id: str, unit_id: str) -> History:
        """What happened to unit ``unit_id`` of ``bank_id`` (``Memory.history``), oldest first."""
        return self._get(History, self._history_call(bank_id, unit_id))

    def forget(self, bank_id: str, turn_ids: Sequence[str] | None = None) -> ForgetResult:
        """Forget turns ``turn_ids`` of ``bank_id`` (``POST /v1/banks/{bank_id}/forget``; ids the bank
        does not hold come back in ``missing``), or (``None``) the whole bank (``DELETE``)."""
        return self._get(ForgetResult, self._forget_call(bank_id, turn_ids))

    def export(self, bank_id: str, out, *, vectors: bool = False) -> int:
        """Bank ``bank_id`` as an export (``docs/export.md``; only the turns this key may read)
        written to ``out`` as it arrives (a path: renamed into place at the end; or a binary or
        text stream); ``vectors``: with each unit's vector. Returns its size in bytes."""
        call = _export_call(bank_id, out, vectors)
        with sunk(call.sink):
            self._send(call)
        return call.sink.size

    def import_(self, bank_id: str, source) -> ImportResult:
        """Import an export of bank ``bank_id`` alone (``source``: a path, bytes, or a stream) into
        it; answered per item (resending it is safe: turns held are ``already_stored``)."""
        return self._get(ImportResult, _import_call(bank_id, source))

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 (no retries; within ``timeout`` and ``deadline``)."""
        end = time.monotonic() + min(self.timeout, self._retry.deadline)
        try:
            with deadline_at(end), self._http.stream("GET", self.url + "/readyz", timeout=self.timeout) as r:
                return r.status_code == 200
        except httpx.HTTPError:
            return False


class AsyncClient(_Base):
    """The asynchronous client: :class:`Client`'s arguments and methods, as coroutines;
    ``async with AsyncClient() as c: ws = await c.select(...)``. Each call runs under
    ``asyncio.timeout`` of its ``deadline``, whatever the ``http`` client."""

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

    async def _attempt(self, call: _Call, end: float) -> _Answer:
        now = time.monotonic()
        if now >= end:
            raise _late(call)
        kw = self._request_kw(call, self._retry.timeout(self.timeout, end, now), aio=True)
        try:
            async with self._http.stream(call.method, self.url + call.path, **kw) as r:
                if call.sink is None or r.status_code >= 300:
                    return _Answer(r, await r.aread())
                async for chunk in r.aiter_bytes():
                    call.sink.write(chunk)
                return _Answer(r, b"")
        except httpx.HTTPError as e:
            raise _http_error(call, self.url, e, end) from None

    async def _retried(self, call: _Call, end: float) -> tuple[int, Any]:
        attempt = 0
        while True:
            a = await self._attempt(call, end)
            w = self._retry.wait(a, attempt, time.monotonic(), end)
            if w is None:
                return a.status, self._result(call, a)
            await self._sleep(w)
            attempt += 1

    async def _send(self, call: _Call, end: float | None = None) -> tuple[int, Any]:
        """:meth:`Client._send`, the whole of it under ``asyncio.timeout`` until ``end``."""
        end = self._end() if end is None else end
        bound = asyncio.timeout(max(0.0, end - time.monotonic()))
        try:
            async with bound:
                return await self._retried(call, end)
        except TimeoutError:
            if bound.expired():
                raise _late(call) from None
            raise

    async def _get(self, cls, call: _Call):
        status, doc = await self._send(call)
        return self._parse(cls, call, doc, status)

    async def select(self, bank_id: str, question: str, *, budget: int | None = None, hops: int | None = None,
                     token_budget: int | None = None, date: str | None = None,
                     question_vector: Sequence[float] | None = None, as_of: str | None = None,
                     where=None) -> SelectResult:
        return await self._get(SelectResult, self._select_call(bank_id, question, budget, hops, token_budget, date,
                                                               question_vector, as_of, where))

    async def select_many(self, pairs: Iterable[tuple[str, str]], *, budget: int | None = None,
                          hops: int | None = None, token_budget: int | None = None,
                          date: str | None = None, where=None) -> list[SelectResult]:
        params = {"budget": budget, "hops": hops, "token_budget": token_budget, "date": date, "where": where}
        calls, end, out = self._batch_calls(pairs, params), self._end(), []
        for call in calls:
            status, doc = await self._send(call, end)
            out += self._results(call, doc, status)
        return out

    async def append(self, bank_id: str, turns: Iterable | None = None, *, messages: Iterable | None = None,
                     speakers: dict | None = None, roles: Sequence[str] | None = None,
                     atomic: bool = False) -> AppendResult:
        return await self._get(AppendResult, self._append_call(bank_id, turns, messages, speakers, roles, atomic))

    async def banks(self) -> BankList:
        return await self._get(BankList, _Call("GET", "/v1/banks"))

    async def bank(self, bank_id: str) -> BankInfo:
        return await self._get(BankInfo, _Call("GET", f"/v1/banks/{_path_id(bank_id)}", None, bank_id))

    async def history(self, bank_id: str, unit_id: str) -> History:
        return await self._get(History, self._history_call(bank_id, unit_id))

    async def forget(self, bank_id: str, turn_ids: Sequence[str] | None = None) -> ForgetResult:
        return await self._get(ForgetResult, self._forget_call(bank_id, turn_ids))

    async def export(self, bank_id: str, out, *, vectors: bool = False) -> int:
        call = _export_call(bank_id, out, vectors)
        with sunk(call.sink):
            await self._send(call)
        return call.sink.size

    async def import_(self, bank_id: str, source) -> ImportResult:
        return await self._get(ImportResult, _import_call(bank_id, source))

    async def ready(self) -> bool:
        try:
            async with asyncio.timeout(min(self.timeout, self._retry.deadline)):
                async with self._http.stream("GET", self.url + "/readyz", timeout=self.timeout) as r:
                    return r.status_code == 200
        except (httpx.HTTPError, TimeoutError):
            return False
