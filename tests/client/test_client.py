"""``trawmem_gpu.client``: the sync and async clients against the real server (keys, typed
results, batches, appends, errors), and their retries against a stub that answers 429 / 503."""
from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, build_sample_collection, copy_collection, running  # noqa: E402
from trawmem_gpu import client as tc  # noqa: E402
from trawmem_gpu.errors import InputError, TrawmemError, UnknownBank  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402

QUESTIONS = ["Why did Ana walk home during her long run?", "Where does Ben's sister live?", "Who is Pixel?"]


def _turn(tid: str, text: str = "Hello there") -> dict:
    return {"turn_id": tid, "speaker": "Ana", "text": text, "timestamp": "2031-05-02T10:00:00"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The real server over the sample (as ``ana-ben`` and ``zed-1``), with a keys file: ``rw``
    and ``ro`` own ``ana-*``, ``zed`` owns ``zed-*``."""
    from trawmem_gpu.serve.keys import add_key

    root = tmp_path_factory.mktemp("client")
    coll = copy_collection(build_sample_collection(root / "src", extra_ids=("zed-1",)), root / "coll")
    keys_file = root / "keys.json"
    keys = {"rw": add_key(keys_file, "ana", ["ana-*"], True), "ro": add_key(keys_file, "ana-ro", ["ana-*"], False),
            "zed": add_key(keys_file, "zed", ["zed-*"], True)}
    with running(ServeConfig(collection=coll, keys_file=str(keys_file), max_wait_ms=1)) as (url, service, _):
        yield url, keys, service


def test_select_is_typed_and_field_for_field_the_servers_answer(server):
    url, keys, _ = server
    body = {"bank_id": SAMPLE_BANK, "question": QUESTIONS[0], "token_budget": 300}
    raw = httpx.post(url + "/v1/select", json=body, headers={"Authorization": f"Bearer {keys['rw']}"},
                     timeout=60).json()
    with tc.Client(url, keys["rw"]) as c:
        ws = c.select(SAMPLE_BANK, QUESTIONS[0], token_budget=300)
    assert isinstance(ws, tc.SelectResult) and all(isinstance(u, tc.Unit) for u in ws.units)
    assert ws.unit_ids == [u["id"] for u in raw["units"]] and ws.text == raw["text"]
    assert ws.tokens == raw["n_tokens"] <= 300 and ws.token_budget == 300 and ws.budget is None
    assert [(t.thread, t.head) for t in ws.threads] == [(t["thread"], t["head"]) for t in raw["threads"]]
    assert ws.units[0].text in ws.text and ws.units[0].speaker in ws.text
    assert isinstance(ws.timings, tc.Timings) and ws.timings.batch_size == raw["timings"]["batch_size"] >= 1
    with tc.Client(url, keys["rw"]) as c:
        assert c.ready()
    with tc.Client("http://127.0.0.1:1", timeout=5) as c:
        assert not c.ready()


def test_select_many_batches_in_order_and_matches_single_selects(server, monkeypatch):
    url, keys, _ = server
    sent = []
    http = httpx.Client(event_hooks={"request": [lambda r: sent.append(r.url.path)]})
    with tc.Client(url, keys["rw"], batch_size=2, http=http) as c:
        pairs = [(SAMPLE_BANK, q) for q in QUESTIONS]
        many = c.select_many(pairs, budget=6)
        assert sent == ["/v1/select/batch", "/v1/select/batch"]  # 3 questions, 2 per request
        single = [c.select(b, q, budget=6) for b, q in pairs]
    http.close()
    assert [w.question for w in many] == QUESTIONS
    assert [w.unit_ids for w in many] == [w.unit_ids for w in single]
    assert all(1 <= len(w.units) <= 6 for w in many)


def test_keys_and_address_come_from_the_environment(server, monkeypatch):
    url, keys, _ = server
    monkeypatch.setenv(tc.URL_ENV, url)
    monkeypatch.setenv(tc.KEY_ENV, keys["zed"])
    monkeypatch.setenv("TRAWMEM_API_KEY", "the-llm-key")  # an LLM server's key is never sent here
    with tc.Client() as c:
        assert [b.bank_id for b in c.banks().banks] == ["zed-1"]
        assert "the-llm-key" not in repr(c) and keys["zed"] not in repr(c)
    monkeypatch.delenv(tc.KEY_ENV)
    with tc.Client() as c, pytest.raises(tc.Unauthorized) as e:
        c.banks()
    assert e.value.status == 401 and isinstance(e.value, TrawmemError)


def test_append_banks_and_the_errors_are_the_packages(server):
    url, keys, _ = server
    with tc.Client(url, keys["rw"]) as c:
        r = c.append("ana-new", [_turn("n1"), _turn("n2", "See you on Friday")])
        assert isinstance(r, tc.AppendResult) and r.created and r.appended == 2 and r.n_units == 2
        listing = c.banks()
        assert {b.bank_id for b in listing.banks} == {SAMPLE_BANK, "ana-new"} and listing.dim > 0
        assert c.bank("ana-new").n_units == 2
        with pytest.raises(tc.Conflict) as e:  # the same turn ids again, atomic: nothing appended
            c.append("ana-new", [_turn("n2")], atomic=True)
        assert isinstance(e.value, InputError) and e.value.status == 409 and c.bank("ana-new").n_units == 2
        r = c.append("ana-new", [_turn("n2"), _turn("n3", "Bring the map")])  # per item: n2 refused, n3 stored
        assert r.stored == ("n3",) and [(x.index, x.status, x.field) for x in r.refused] == [(0, "refused",
                                                                                              "turns[0].turn_id")]
        assert [x.status for x in r.items] == ["refused", "stored"] and c.bank("ana-new").n_units == 3
        r = c.append("ana-new", messages=[{"role": "user", "content": "Hi there", "id": "m1"}], speakers={"user": "Ana"})
        assert r.stored == ("m1",)
        with pytest.raises(tc.InvalidRequest) as e:
            c.select(SAMPLE_BANK, QUESTIONS[0], budget=0)
        assert "budget" in e.value.detail and isinstance(e.value, InputError)
        # a foreign bank and a missing one are the same error, an UnknownBank as locally
        for bank_id in ("zed-1", "ana-missing"):
            with pytest.raises(tc.BankNotFound) as e:
                c.select(bank_id, QUESTIONS[0])
            assert isinstance(e.value, UnknownBank) and e.value.bank_id == bank_id and e.value.status == 404
        with pytest.raises(tc.BankNotFound):
            c.select_many([(SAMPLE_BANK, QUESTIONS[0]), ("zed-1", QUESTIONS[1])])
        with pytest.raises(InputError, match="pair"):
            c.select_many([SAMPLE_BANK])
    with tc.Client(url, keys["ro"]) as c, pytest.raises(tc.Forbidden):
        c.append("ana-new", [_turn("n3")])


def test_forget_turns_and_banks_on_the_real_server(server):
    url, keys, service = server
    marker = "Quillfeather marmalade 7723"
    with tc.Client(url, keys["rw"]) as c:
        c.append("ana-forget", [_turn("f1", "We met at the station."), _turn("f2", f"The safe word is {marker}."),
                                _turn("f3", "See you next week.")])
        assert marker in c.select("ana-forget", "What is the safe word?", budget=3).text
        with tc.Client(url, keys["ro"]) as ro, pytest.raises(tc.Forbidden):
            ro.forget("ana-forget", ["f2"])
        with tc.Client(url, keys["zed"]) as zed, pytest.raises(tc.BankNotFound):
            zed.forget("ana-forget")  # another tenant's bank: as a missing one, nothing forgotten
        r = c.forget("ana-forget", ["f2", "nope"])
        assert r.forgotten == ("f2",) and r.missing == ("nope",) and not r.deleted and r.n_units == 2
        ws = c.select("ana-forget", "What is the safe word?", budget=3)
        assert marker not in ws.text and "f2" not in ws.unit_ids and c.bank("ana-forget").n_units == 2
        assert c.forget("ana-forget").deleted
        assert "ana-forget" not in {b.bank_id for b in c.banks().banks}
        with pytest.raises(tc.BankNotFound):
            c.select("ana-forget", "What is the safe word?")


def test_a_missing_unit_or_turn_is_not_a_missing_bank(server):
    """Every 404 was a ``BankNotFound`` (``unknown bank id``), a missing unit's history and a missing
    turn's DELETE included: the server's body now names what is missing (``"error"``) and the client
    raises by it: ``UnitNotFound`` (an ``UnknownUnit``, as ``Memory.history`` raises) with the
    server's message for a unit or turn, ``BankNotFound`` for a bank (missing or another key's)."""
    from trawmem_gpu.client.errors import _error_of
    from trawmem_gpu.errors import UnknownUnit

    url, keys, _ = server
    with tc.Client(url, keys["rw"]) as c:
        assert c.history(SAMPLE_BANK, "S1:1").events  # a unit it holds
        with pytest.raises(tc.UnitNotFound) as e:
            c.history(SAMPLE_BANK, "no/such unit")
        assert isinstance(e.value, UnknownUnit) and isinstance(e.value, KeyError)
        assert not isinstance(e.value, UnknownBank) and e.value.status == 404
        assert (e.value.bank_id, e.value.unit_id) == (SAMPLE_BANK, "no/such unit")
        assert e.value.detail == f"bank {SAMPLE_BANK!r} holds no unit 'no/such unit' and has no history of one"
        for bank_id in ("ana-missing", "zed-1"):  # missing, and another key's: the bank is what is missing
            with pytest.raises(tc.BankNotFound) as e:
                c.history(bank_id, "S1:1")
            assert not isinstance(e.value, UnknownUnit) and e.value.bank_id == bank_id
    headers = {"Authorization": f"Bearer {keys['rw']}"}
    r = httpx.delete(f"{url}/v1/banks/{SAMPLE_BANK}/turns/no-such-turn", headers=headers, timeout=60)
    assert r.status_code == 404 and r.json() == {"detail": f"bank {SAMPLE_BANK!r} holds no turn 'no-such-turn'",
                                                 "error": "unknown_turn"}
    err = _error_of(r, SAMPLE_BANK)
    assert type(err) is tc.UnitNotFound and err.detail == r.json()["detail"]
    r = httpx.delete(f"{url}/v1/banks/ana-missing/turns/S1:1", headers=headers, timeout=60)
    assert r.json()["error"] == "unknown_bank" and type(_error_of(r, "ana-missing")) is tc.BankNotFound

    async def go():
        async with tc.AsyncClient(url, keys["rw"]) as ac:
            with pytest.raises(tc.UnitNotFound):
                await ac.history(SAMPLE_BANK, "no-such-unit")

    asyncio.run(go())


def test_async_client_answers_as_the_sync_one(server):
    url, keys, _ = server

    async def go():
        async with tc.AsyncClient(url, keys["rw"], batch_size=2) as c:
            one = await c.select(SAMPLE_BANK, QUESTIONS[1], budget=4)
            many = await c.select_many([(SAMPLE_BANK, q) for q in QUESTIONS], budget=4)
            listing = await c.banks()
            with pytest.raises(tc.BankNotFound):
                await c.select("zed-1", QUESTIONS[0])
            return one, many, listing

    one, many, listing = asyncio.run(go())
    with tc.Client(url, keys["rw"]) as c:
        assert one.unit_ids == c.select(SAMPLE_BANK, QUESTIONS[1], budget=4).unit_ids
    assert [w.question for w in many] == QUESTIONS and many[1].unit_ids == one.unit_ids
    assert SAMPLE_BANK in {b.bank_id for b in listing.banks}


def test_unreachable_server_is_one_error():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with tc.Client(f"http://127.0.0.1:{port}", timeout=5) as c, pytest.raises(tc.Unreachable):
        c.banks()


def test_bad_client_arguments_name_the_field():
    for kw, name in (({"deadline": 0}, "deadline"), ({"timeout": -1}, "timeout"), ({"max_retries": -1},
                                                                                     "max_retries"),
                     ({"batch_size": 0}, "batch_size")):
        with pytest.raises(InputError, match=name):
            tc.Client("http://127.0.0.1:1", **kw)
    with tc.Client("http://127.0.0.1:1") as c:
        with pytest.raises(InputError, match="turn_ids"):
            c.forget("b", "S1:1")
        with pytest.raises(InputError, match="turn_ids"):
            c.forget("b", [])
        # turns are checked before anything is sent (the address has no server)
        with pytest.raises(InputError, match=r"turns\[1\]\.bank_id: 'c' is not the bank"):
            c.append("b", [_turn("n1"), {**_turn("n2"), "bank_id": "c"}])
        with pytest.raises(InputError, match=r"turns\[0\]: expected a dict or an object with turn_id"):
            c.append("b", [3])


# ----------------------------------------------------------------------------------------------
# retries, against a stub that answers a script of statuses
# ----------------------------------------------------------------------------------------------
@contextmanager
def stub(script: list[tuple[int, dict]], ok: dict | None = None):
    """A server on 127.0.0.1 that answers request i with ``script[i]`` (status, headers), then 200
    with ``ok`` (default: a bank list)."""
    seen = []

    class H(BaseHTTPRequestHandler):
        def _answer(self):
            n = int(self.headers.get("content-length") or 0)
            seen.append((self.command, self.path, self.rfile.read(n)))
            status, headers = script[len(seen) - 1] if len(seen) <= len(script) else (200, {})
            body = json.dumps({"detail": "busy"} if status != 200 else ok or
                              {"banks": [{"bank_id": "b", "n_units": 3, "n_threads": 1}], "encoder": "e", "dim": 4})
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def _recording(c):
    waits = []
    c._sleep = waits.append
    return waits


def test_429_then_200_waits_the_retry_after():
    with stub([(429, {"Retry-After": "2"})]) as (url, seen), tc.Client(url) as c:
        waits = _recording(c)
        listing = c.banks()
    assert waits == [2.0] and len(seen) == 2
    assert listing.banks == (tc.BankSummary("b", 3, 1),) and listing.dim == 4


def test_a_retry_after_past_the_deadline_gives_up_at_once():
    with stub([(429, {"Retry-After": "100"})]) as (url, seen), tc.Client(url, deadline=5) as c:
        waits = _recording(c)
        with pytest.raises(tc.Overloaded) as e:
            c.banks()
    assert waits == [] and len(seen) == 1 and e.value.retry_after == 100 and e.value.status == 429


def test_503_without_retry_after_backs_off_until_max_retries():
    with stub([(503, {})] * 5) as (url, seen), tc.Client(url, max_retries=2) as c:
        waits = _recording(c)
        with pytest.raises(tc.Overloaded) as e:
            c.append("b", [_turn("t1")])
    assert len(seen) == 3 and len(waits) == 2 and e.value.status == 503
    assert 0.05 <= waits[0] <= 0.1 and 0.1 <= waits[1] <= 0.2  # 0.1 s doubling, jittered down to half
    assert all(m == "POST" and p == "/v1/banks/b/turns" and json.loads(b)["turns"][0]["turn_id"] == "t1"
               for m, p, b in seen)  # the same append each time


def test_retry_after_as_an_http_date_and_other_statuses_are_not_retried():
    assert tc.retry_after_s("Wed, 21 Oct 2031 07:28:00 GMT", now=1950334080.0 - 30) == 30.0
    assert tc.retry_after_s("soon") is None and tc.retry_after_s("-3") is None  # negative: unreadable
    with stub([(500, {"Retry-After": "1"})]) as (url, seen), tc.Client(url) as c:
        waits = _recording(c)
        with pytest.raises(tc.ServerError) as e:
            c.banks()
    assert waits == [] and len(seen) == 1 and e.value.status == 500


def test_async_client_retries_the_same_way():
    async def go(url):
        async with tc.AsyncClient(url) as c:
            waits = []

            async def rec(w):
                waits.append(w)
            c._sleep = rec
            return await c.banks(), waits

    with stub([(429, {"Retry-After": "1"}), (503, {"Retry-After": "3"})]) as (url, seen):
        listing, waits = asyncio.run(go(url))
    assert waits == [1.0, 3.0] and len(seen) == 3 and listing.encoder == "e"


def test_ids_are_escaped_in_paths():
    answer = {"bank_id": "a/b c", "forgotten": ["S1:6"], "missing": ["x/y"], "deleted": False, "n_units": 5,
              "cache_rows": 2, "output_records": 0}
    with stub([], answer) as (url, seen), tc.Client(url) as c:
        r = c.forget("a/b c", ["S1:6", "x/y"])
        c.forget("a/b c")
    assert r == tc.ForgetResult("a/b c", ("S1:6",), ("x/y",), False, 5, 2, 0)
    assert [(m, p) for m, p, _ in seen] == [("POST", "/v1/banks/a%2Fb%20c/forget"), ("DELETE", "/v1/banks/a%2Fb%20c")]
    assert json.loads(seen[0][2]) == {"turn_ids": ["S1:6", "x/y"]}
