"""The client's ``deadline`` is wall-clock time for the whole call (a trickling server, retries and
batches included), and a ``Retry-After`` it cannot believe falls back to the backoff, never to 0.

The time bounds here are correctness bounds, not speed claims: a call with ``deadline=1`` must end
in ``DeadlineExceeded`` in under 10 s against a stub that would hold it for 30 s or more."""
from __future__ import annotations

import asyncio
import email.utils
import json
import time

import httpx
import pytest

from stub_http import Answer, call, stub_http, timed
from trawmem_gpu import client as tc
from trawmem_gpu.client.transport import is_bounded

BANKS = {"banks": [{"bank_id": "b", "n_units": 3, "n_threads": 1}], "encoder": "e", "dim": 4}
SIDES = ("sync", "async")
BOUND_S = 10.0  # far under the stub's trickle, far over the deadline


def _trickle(part: str, seconds: float = 30.0) -> Answer:
    """200 with a bank list, one byte per 0.5 s: the whole answer (``headers``) or its body only;
    ``seconds`` of trickle in all."""
    body = json.dumps(BANKS).encode()
    body += b" " * max(0, int(seconds / 0.5) - len(body))
    a = Answer(200, body, trickle_s=0.5)
    if part == "body":
        a.trickle_from = len(a.raw()) - len(body)
    return a


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_trickling_server_cannot_hold_a_call_past_its_deadline(side, part):
    with stub_http([_trickle(part)]) as s:
        e, took = timed(call, side, s.url, "banks", deadline=1.0)
    assert isinstance(e, tc.DeadlineExceeded) and isinstance(e, tc.Unreachable), e
    assert took < BOUND_S and "deadline" in str(e) and "/v1/banks" in str(e)


@pytest.mark.parametrize("part", ["headers", "body"])
def test_the_clients_own_http_client_holds_the_bound(part):
    with tc.Client("http://127.0.0.1:1") as c:
        assert is_bounded(c._http._transport)  # an httpx upgrade that moved the pool's backend fails here
    with stub_http([_trickle(part)]) as s, tc.Client(s.url, deadline=1.0) as c:
        e, took = timed(c.banks)
    assert isinstance(e, tc.DeadlineExceeded) and took < BOUND_S


def test_a_user_http_client_is_bounded_between_chunks():
    """An ``httpx.Client`` of the caller's own has no cut reads, but a trickled body still stops
    at the deadline (checked between chunks), and ``deadline_transport`` restores the whole bound."""
    with stub_http([_trickle("body")]) as s, httpx.Client() as http, tc.Client(s.url, deadline=1.0, http=http) as c:
        e, took = timed(c.banks)
    assert isinstance(e, tc.DeadlineExceeded) and took < BOUND_S
    with stub_http([_trickle("headers")]) as s, httpx.Client(transport=tc.deadline_transport()) as http, \
            tc.Client(s.url, deadline=1.0, http=http) as c:
        e, took = timed(c.banks)
    assert isinstance(e, tc.DeadlineExceeded) and took < BOUND_S


@pytest.mark.parametrize("side", SIDES)
def test_ready_is_bounded_too(side):
    with stub_http([_trickle("headers")]) as s:
        t0 = time.monotonic()
        assert call(side, s.url, "ready", timeout=1.0) is False
    assert time.monotonic() - t0 < BOUND_S


@pytest.mark.parametrize("side", SIDES)
def test_retries_stay_within_the_deadline(side):
    """A slow 503 every time (0.4 s, then Retry-After 0): the retries end at the deadline, in an
    error of the package, after a bounded number of requests."""
    with stub_http([Answer(503, {"detail": "busy"}, {"Retry-After": "0"}, delay_s=0.4)]) as s:
        e, took = timed(call, side, s.url, "banks", deadline=1.5, max_retries=1000)
        n = len(s.seen)
    assert isinstance(e, (tc.Overloaded, tc.DeadlineExceeded)) and took < BOUND_S and 2 <= n <= 5


@pytest.mark.parametrize("side", SIDES)
def test_select_many_shares_one_deadline_across_its_batches(side):
    one = {"bank_id": "b", "bank_n_units": 3, "question": "q", "budget": 4, "hops": 1, "token_budget": None,
           "date": None, "date_used": False, "units": [], "threads": [], "text": "", "n_tokens": 0,
           "tokenizer": "cl100k"}
    pairs = [("b", f"q{i}") for i in range(6)]
    with stub_http([Answer(200, {"results": [one]}, delay_s=0.5)]) as s:
        e, took = timed(call, side, s.url, "select_many", pairs, deadline=1.2, batch_size=1)
        n = len(s.seen)
    assert isinstance(e, tc.DeadlineExceeded) and took < BOUND_S and n <= 4  # not 6 batches of 0.5 s
    with stub_http([Answer(200, {"results": [one]})]) as s:
        assert len(call(side, s.url, "select_many", pairs, deadline=5, batch_size=1)) == 6


# ----------------------------------------------------------------------------------------------
# Retry-After
# ----------------------------------------------------------------------------------------------
BAD_RETRY_AFTER = ["-5", "-0.5", "nan", "NaN", "inf", "-inf", "Infinity", "1e400", "1e308", "1e3", "0x10", "1_0",
                   "99999999999", "86401", "5 s", "soon", "Wed, 21 Oct 99999 07:28:00 GMT",
                   "Wed, 32 Oct 2031 07:28:00 GMT", email.utils.formatdate(time.time() + 10 * 86_400, usegmt=True)]


@pytest.mark.parametrize("value", BAD_RETRY_AFTER)
def test_an_unbelievable_retry_after_is_unreadable(value):
    assert tc.retry_after_s(value) is None


def test_readable_retry_afters():
    assert tc.retry_after_s("2") == 2.0 and tc.retry_after_s(" 0.25 ") == 0.25 and tc.retry_after_s("0") == 0.0
    assert tc.retry_after_s("86400") == 86_400.0
    assert tc.retry_after_s("Wed, 21 Oct 2031 07:28:00 GMT", now=1950334080.0 - 30) == 30.0
    assert tc.retry_after_s("Wed, 21 Oct 2031 07:28:00 -0000", now=1950334080.0 - 30) == 30.0
    assert tc.retry_after_s("Wed, 21 Oct 2031 07:28:00 GMT", now=1950334080.0 + 30) == 0.0  # past: now
    assert tc.retry_after_s(None) is None and tc.retry_after_s("") is None


def _waits(side: str, url: str, **kw) -> tuple[list[float], Exception | None]:
    """The waits a client (sleep recorded, not slept) takes against ``url``, and its error."""
    waits = []
    if side == "sync":
        with tc.Client(url, **kw) as c:
            c._sleep = waits.append
            e, _ = timed(c.banks)
        return waits, e

    async def go():
        async with tc.AsyncClient(url, **kw) as c:
            async def rec(w):
                waits.append(w)
            c._sleep = rec
            try:
                await c.banks()
            except Exception as e:  # noqa: BLE001
                return e
    return waits, asyncio.run(go())


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("value", BAD_RETRY_AFTER)
def test_a_bad_retry_after_uses_the_backoff(side, value):
    with stub_http([Answer(503, {"detail": "busy"}, {"Retry-After": value})] * 2 + [Answer(200, BANKS)]) as s:
        waits, e = _waits(side, s.url, max_retries=3)
    assert e is None and len(waits) == 2
    assert 0.05 <= waits[0] <= 0.1 and 0.1 <= waits[1] <= 0.2  # 0.1 s doubling, jittered down to half


@pytest.mark.parametrize("side", SIDES)
def test_a_retry_after_of_now_waits_the_floor(side):
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    with stub_http([Answer(429, {}, {"Retry-After": "0"}), Answer(429, {}, {"Retry-After": past}),
                    Answer(200, BANKS)]) as s:
        waits, e = _waits(side, s.url)
    assert e is None and waits == [0.05, 0.05]  # never 0: no back-to-back hammering


@pytest.mark.parametrize("side", SIDES)
def test_a_valid_retry_after_is_honoured_within_the_deadline(side):
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    with stub_http([Answer(503, {}, {"Retry-After": "2.5"}), Answer(503, {}, {"Retry-After": soon}),
                    Answer(200, BANKS)]) as s:
        waits, e = _waits(side, s.url, deadline=60)
    assert e is None and waits[0] == 2.5 and 27 <= waits[1] <= 31
    late = email.utils.formatdate(time.time() + 200, usegmt=True)
    for value in ("100", late):  # past the deadline: no wait at all, the server's word in the error
        with stub_http([Answer(503, {}, {"Retry-After": value})]) as s:
            waits, e = _waits(side, s.url, deadline=60)
        assert isinstance(e, tc.Overloaded) and waits == [] and len(s.seen) == 1 and e.retry_after >= 100
