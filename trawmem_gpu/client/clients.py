"""The two clients, :class:`Client` and :class:`AsyncClient`, over one request plan (``_Base``)
and one retry rule (``_Retry``); see the package docstring."""
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
from ..errors import InputError
from .errors import ServerError, Unreachable, _error_of, retry_after_s
from .results import AppendResult, BankInfo, BankList, ForgetResult, SelectResult, _from

URL_ENV, KEY_ENV = "TRAWMEM_SERVE_URL", "TRAWMEM_SERVE_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = (429, 503)


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
            raise InputError(f"`deadline` must be > 0 seconds, got {deadline!r}")
        if max_retries < 0:
            raise InputError(f"`max_retries` must be >= 0, got {max_retries!r}")
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


def _path_id(x) -> str:
    return quote(str(x), safe="")


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
        return _Call("POST", f"/v1/banks/{_path_id(bank_id)}/turns", {"turns": [record_of(t, f"turns[{i}]", bank_id) for i, t in enumerate(turns)]}, bank_id)

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
        """Forget turns ``turn_ids`` of ``bank_id`` (``POST /v1/banks/{bank_id}/forget``; ids the bank
        does not hold come back in ``missing``), or (``None``) the whole bank (``DELETE``)."""
        return ForgetResult.from_json(self._send(self._forget_call(bank_id, turn_ids)))

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
        return ForgetResult.from_json(await self._send(self._forget_call(bank_id, turn_ids)))

    async def ready(self) -> bool:
        try:
            return (await self._http.get(self.url + "/readyz", timeout=self.timeout)).status_code == 200
        except httpx.HTTPError:
            return False
