"""Issue 23, `trawmem serve` limits: bounded fields (never echoed), a trickled body, the connection
cap and header timeout, and the thread default.

No assertion here is on a latency: batches are read from a controlled queue, blocking is shown
by holding an encoder at an event while other requests are answered.
"""
from __future__ import annotations

import socket

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, running  # noqa: E402
from trawmem_gpu.data.types import MAX_TEXT_CHARS  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig, default_threads  # noqa: E402

from serve_limits_cases import coll, sample_coll  # noqa: E402, F401, F811 (fixtures)
from serve_limits_cases import QUESTION, _turn, _wait_for  # noqa: E402


# ----------------------------------------------------------------------------------------------
# bounded fields
# ----------------------------------------------------------------------------------------------
def test_every_field_is_bounded_and_never_echoed(coll):
    cfg = ServeConfig(collection=coll, max_wait_ms=0, max_body_bytes=8 << 20)
    big = "7" * 3_500_000
    ok = {"bank_id": SAMPLE_BANK, "question": QUESTION}
    cases = [
        ("/v1/select", {**ok, "date": big[:500_000]}, "date: String should have at most 64 characters"),
        ("/v1/select/batch", {"requests": [{**ok, "date": big}]}, "date: String should have at most 64 characters"),
        ("/v1/select", {**ok, "question": "why " * 20000}, "question: String should have at most 65536"),
        ("/v1/select", {**ok, "question": "why " * 2000}, "question is 8000 characters; the limit is 4000"),
        ("/v1/select", {**ok, "bank_id": "b" * 300}, "bank_id: String should have at most 256"),
        ("/v1/select", {**ok, "question_vector": [0.5] * 9000}, "question_vector: List should have at most 8192"),
        ("/v1/select/batch", {"requests": [ok] * 5000}, "requests: List should have at most 4096"),
        ("/v1/select/batch", {"requests": [ok] * 300}, "requests holds 300 requests; the limit is 256"),
        (f"/v1/banks/{SAMPLE_BANK}/turns", {"turns": [{**_turn("n1"), "timestamp": big}]},
         "turns[0].timestamp: String should have at most 64"),
        (f"/v1/banks/{SAMPLE_BANK}/turns", {"turns": [_turn("n1", text="x" * (MAX_TEXT_CHARS + 1))]},
         f"turns[0].text: String should have at most {MAX_TEXT_CHARS}"),
        (f"/v1/banks/{SAMPLE_BANK}/turns", {"turns": [{**_turn("n1"), "speaker": "s" * 300}]},
         "turns[0].speaker: String should have at most 256"),
        (f"/v1/banks/{SAMPLE_BANK}/turns", {"turns": [_turn("x" * 300)]}, "turns[0].turn_id"),
    ]
    with running(cfg) as (url, service, _), httpx.Client(base_url=url, timeout=60) as c:
        n0 = service.registry.get(SAMPLE_BANK).n_units
        for path, body, msg in cases:
            r = c.post(path, json={**body, "atomic": True} if path.endswith("/turns") else body)
            assert r.status_code == 422 and msg in r.json()["detail"], (path, r.status_code, r.text[:300])
            assert len(r.content) < 2000  # the value is never echoed back
            assert c.get("/healthz").status_code == 200
            if path.endswith("/turns"):  # answered per item: refused, naming the field, never echoing it
                r = c.post(path, json=body)
                (item,) = r.json()["refused"]
                assert r.status_code == 200 and msg.startswith(item["field"]) and len(r.content) < 2000, r.text[:300]
        r = c.post("/v1/select", content=b'{"bank_id": "ana-ben", "question": "q", "date": "' + b"1" * (9 << 20) + b'"}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 413 and "single select" in r.json()["detail"]
        r = c.post("/v1/select/batch", content=b'{"requests": [{"bank_id": "ana-ben", "question": "q", "date": "'
                   + b"1" * (9 << 20) + b'"}]}', headers={"content-type": "application/json"})
        assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]
        assert c.post("/v1/select", json={**ok, "date": "2031-05-09"}).status_code == 200
        assert service.registry.get(SAMPLE_BANK).n_units == n0


def test_a_trickled_body_gets_408(coll):
    cfg = ServeConfig(collection=coll, max_wait_ms=0, body_timeout_s=0.5, warmup=False)
    with running(cfg) as (url, service, srv):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        s.sendall(b"POST /v1/select HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"bank_id\"")  # then nothing more
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        s.close()
        assert data.startswith(b"HTTP/1.1 408"), data[:200]
        assert httpx.get(url + "/healthz", timeout=30).status_code == 200


# ----------------------------------------------------------------------------------------------
# connection limits, threads
# ----------------------------------------------------------------------------------------------
def _read_until_closed(s: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = s.recv(4096)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def test_connection_cap_and_header_timeout(coll):
    cfg = ServeConfig(collection=coll, max_connections=4, header_timeout_s=0.5, warmup=False)
    with running(cfg) as (url, service, srv), httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/healthz").status_code == 200  # an open keep-alive connection: 1 of 4
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=30) for _ in range(3)]
        _wait_for(lambda: len(srv.server.server_state.connections) == 4)
        extra = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        assert _read_until_closed(extra) == b""  # over the cap: closed at once
        assert c.get("/healthz").status_code == 200  # the open connection is still served
        idle[0].sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # slow headers: never finished
        for s in idle:  # idle and slow-header connections get 408 and are closed
            assert _read_until_closed(s).startswith(b"HTTP/1.1 408")
            s.close()
        extra.close()


def test_a_single_select_body_is_bounded_below_the_body_limit(coll):
    """Issue 42 item 2: ``POST /v1/select`` takes at most ``SELECT_BODY_BYTES`` (413 before any
    parse), which a body with every field at its bound fits in; a batch keeps ``max_body_bytes``."""
    from trawmem_gpu.data.filters import MAX_FILTER_BYTES
    from trawmem_gpu.serve.models import MAX_QUESTION_FIELD_CHARS, MAX_VECTOR_DIMS, SELECT_BODY_BYTES

    # every field at its bound, written as wastefully as JSON allows: the question's characters
    # escaped, the vector's numbers at 17 digits, the filter at its byte bound plus 3x white space
    where_at_bound = b'{"and": [' + b", ".join([b'{"k": {"eq": "' + b"v" * 990 + b'"}}'] * 64) + b"]}"
    assert len(where_at_bound) <= MAX_FILTER_BYTES
    widest = (b'{"bank_id": "' + b"b" * 256 + b'", "question": "' + b"\\u00e9" * MAX_QUESTION_FIELD_CHARS
              + b'", "question_vector": [' + b", ".join([b"-0.12345678901234567"] * MAX_VECTOR_DIMS)
              + b'], "where": ' + where_at_bound + b" " * (3 * MAX_FILTER_BYTES)
              + b', "date": "2031-05-09", "as_of": "2031-05-09", "budget": 8, "hops": 2, "token_budget": 500}')
    assert len(widest) < SELECT_BODY_BYTES
    cfg = ServeConfig(collection=coll, warmup=False)
    with running(cfg) as (url, service, srv), httpx.Client(base_url=url, timeout=60) as c:
        h = {"content-type": "application/json"}
        r = c.post("/v1/select", content=widest, headers=h)
        assert r.status_code == 422, r.text[:300]  # read and parsed: refused by a field's own bound
        over = b'{"bank_id": "ana-ben", "question": "q", "date": "' + b"7" * SELECT_BODY_BYTES + b'"}'
        r = c.post("/v1/select", content=over, headers=h)
        assert r.status_code == 413 and f"{SELECT_BODY_BYTES}-byte limit of a single select" in r.json()["detail"]
        r = c.post("/v1/select/batch", content=b'{"requests": [' + over + b"]}", headers=h)
        assert r.status_code == 422, r.text[:300]  # a batch's body may be as large: parsed, then refused
        assert c.get("/healthz").status_code == 200


def test_header_timers_are_spread_below_the_timeout(coll, monkeypatch):
    """Issue 42 item 2: slow connections opened together are not all closed at once at the header
    timeout (one pause of the event loop for every tenant, and a reconnect storm after it): each
    connection's timer is the timeout shortened by a random share of at most ``HEADER_SPREAD``."""
    from trawmem_gpu.serve import conn

    assert conn.header_delay(10.0, lambda: 0.0) == 10.0
    assert conn.header_delay(10.0, lambda: 1.0) == pytest.approx(10.0 * (1 - conn.HEADER_SPREAD))
    draws = [conn.header_delay(10.0) for _ in range(2000)]
    assert 10.0 * (1 - conn.HEADER_SPREAD) <= min(draws) and max(draws) <= 10.0
    assert max(draws) - min(draws) > 10.0 * conn.HEADER_SPREAD * 0.9  # spread, not one value
    armed = []
    real = conn.header_delay
    monkeypatch.setattr(conn, "header_delay", lambda t, *a: armed.append(t) or real(t, *a))
    cfg = ServeConfig(collection=coll, header_timeout_s=0.5, warmup=False)
    with running(cfg) as (url, service, srv):
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=30) for _ in range(3)]
        for s in idle:  # every idle connection's timer was drawn, and it still ends in a 408
            assert _read_until_closed(s).startswith(b"HTTP/1.1 408")
            s.close()
    assert armed.count(0.5) >= 3


def test_accepted_connections_send_without_delay(coll):
    """Every accepted connection has Nagle's algorithm off: uvicorn writes a response's head and body
    apart, and with Nagle on the body waited for the client's delayed acknowledgement (40 ms or more
    per kept-alive request, ``/healthz`` included)."""
    cfg = ServeConfig(collection=coll, warmup=False)
    with running(cfg) as (url, service, srv), httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/healthz").status_code == 200
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        _wait_for(lambda: len(srv.server.server_state.connections) == 2)
        socks = [p.transport.get_extra_info("socket") for p in list(srv.server.server_state.connections)]
        assert [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0 for s in socks] == [True, True]
        raw.close()


def test_default_threads_suit_the_host_and_workers():
    assert default_threads(0, cores=2) == 1
    assert default_threads(2, cores=2) == 1
    assert default_threads(0, cores=16) == 8
    assert default_threads(2, cores=16) == 6
    assert ServeConfig().threads is None  # the default is computed at start; --threads overrides
