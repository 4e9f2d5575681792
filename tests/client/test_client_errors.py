"""The client raises only the package's errors on a bad server: a 200 whose JSON has the wrong
shape (or that is not JSON) is a :class:`ServerError` with status 200, for every method, sync
and async; an error status with any body is its status's class."""
from __future__ import annotations

import dataclasses

import pytest

from stub_http import Answer, call, stub_http
from trawmem_gpu import client as tc
from trawmem_gpu.errors import InputError, UnknownBank

TURN = {"turn_id": "t1", "speaker": "Ana", "text": "Hello", "timestamp": "2031-05-02T10:00:00"}
UNIT = {"id": "t1", "speaker": "Ana", "date": "2031-05-02", "timestamp": "2031-05-02T10:00:00", "text": "Hello",
        "caption": None, "thread": 0, "session": 1}
SELECT = {"bank_id": "b", "bank_n_units": 3, "question": "q", "budget": 4, "hops": 1, "token_budget": None,
          "date": None, "date_used": False, "units": [UNIT], "threads": [{"thread": 0, "head": None}],
          "text": "Ana: Hello", "n_tokens": 5, "tokenizer": "cl100k",
          "timings": {"queue_ms": 0.1, "encode_ms": 1.0, "select_ms": 2.0, "assemble_ms": 0.5, "batch_size": 1}}
INFO = {"bank_id": "b", "n_units": 3, "n_threads": 1, "n_sessions": 1, "first_date": "2031-05-02",
        "last_date": "2031-05-02"}

#: method -> (the client method, its arguments, a well-formed answer, its result class)
METHODS = {
    "select": ("select", ("b", "q"), SELECT, tc.SelectResult),
    "select_many": ("select_many", ([("b", "q"), ("b", "r")],), {"results": [SELECT, SELECT]}, None),
    "append": ("append", ("b", [TURN]), {**INFO, "created": True, "appended": 1, "timings": {"encode_ms": 1.0}},
               tc.AppendResult),
    "banks": ("banks", (), {"banks": [{"bank_id": "b", "n_units": 3, "n_threads": 1}], "encoder": "e", "dim": 4},
              tc.BankList),
    "bank": ("bank", ("b",), INFO, tc.BankInfo),
    "forget_turns": ("forget", ("b", ["t1"]), {"bank_id": "b", "forgotten": ["t1"], "missing": [], "deleted": False,
                                              "n_units": 2, "cache_rows": 1, "output_records": 0}, tc.ForgetResult),
    "forget_bank": ("forget", ("b",), {"bank_id": "b", "forgotten": ["t1"], "deleted": True}, tc.ForgetResult),
    "import": ("import_", ("b", b'{"format":"trawmem-export","version":1}\n'),
               {"bank_id": "b", "stored": 1, "already_stored": 0, "refused": [], "facts": 0}, tc.ImportResult),
}
WRONG = {"wrong": [1]}  # of no field's type
NOT_JSON = [b"<html>busy</html>", b"", b"\xff\xfe\x00", b"{\"banks\": [", b"[" * 100_000]
NOT_OBJECTS = [None, [], "text", 5, True, 1.5]


def _required(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def _nested(method: str) -> list:
    """Wrong shapes inside a well-formed top level."""
    good = METHODS[method][2]
    if method in ("select", "select_many"):
        sel = [{**SELECT, "units": [5]}, {**SELECT, "units": [{**UNIT, "session": "one"}]},
               {**SELECT, "units": [{}]}, {**SELECT, "units": {"a": 1}}, {**SELECT, "threads": [None]},
               {**SELECT, "timings": "fast"}, {**SELECT, "timings": {"batch_size": 1}},
               {**SELECT, "n_tokens": True}, {**SELECT, "units": [{**UNIT, "thread": 1.5}]},
               {**SELECT, "timings": {**SELECT["timings"], "encode_ms": 10 ** 400}}]
        if method == "select":
            return sel
        return [{"results": [s, SELECT]} for s in sel] + [
            {"results": 5}, {"results": [None, SELECT]}, {"results": [SELECT]}, {"results": [SELECT] * 3},
            {"result": [SELECT, SELECT]}]
    if method == "banks":
        return [{**good, "banks": [None]}, {**good, "banks": {"b": 1}}, {**good, "banks": [{"bank_id": "b"}]},
                {**good, "banks": "b"}]
    if method == "append":
        return [{**good, "timings": {"encode_ms": "slow"}}, {**good, "timings": [1]}, {**good, "n_units": "3"}]
    if method == "import":
        return [{**good, "refused": [{"id": 1, "reason": "r"}]}, {**good, "refused": [{}]}, {**good, "stored": "1"}]
    if method.startswith("forget"):
        return [{**good, "forgotten": [1, 2]}, {**good, "missing": "t1"}, {**good, "deleted": "yes"}]
    return [{**good, "n_units": None}, {**good, "first_date": 5}]


def _shapes(method: str) -> list:
    good, cls = METHODS[method][2], METHODS[method][3]
    out = NOT_JSON + NOT_OBJECTS + [WRONG] + _nested(method)
    out += [{**good, k: WRONG} for k in good]  # each field of the wrong type
    if cls is not None:
        # each required field missing
        out += [{k: v for k, v in good.items() if k != r} for r in sorted(_required(cls))]
    return out


CASES = [(m, i) for m in METHODS for i in range(len(_shapes(m)))]


def _call(side):
    def run(url, method, **kw):
        name, args = METHODS[method][:2]
        return call(side, url, name, *args, **kw)
    return run


CALLS = {"sync": _call("sync"), "async": _call("async")}


@pytest.fixture(scope="module")
def stub():
    with stub_http([Answer()]) as s:
        yield s


@pytest.mark.parametrize("side", CALLS)
@pytest.mark.parametrize("method", METHODS)
def test_a_well_formed_answer_is_typed(stub, side, method):
    stub.answers[:] = [Answer(200, METHODS[method][2])]
    r = CALLS[side](stub.url, method)
    if method == "select_many":
        assert [w.unit_ids for w in r] == [["t1"], ["t1"]] and isinstance(r[0].timings, tc.Timings)
    else:
        assert isinstance(r, METHODS[method][3])
    if method == "forget_bank":
        assert r == tc.ForgetResult("b", ("t1",), (), True, 0, 0, 0)


@pytest.mark.parametrize("side", CALLS)
@pytest.mark.parametrize("method,i", CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_a_200_of_the_wrong_shape_is_a_server_error(stub, side, method, i):
    body = _shapes(method)[i]
    stub.answers[:] = [Answer(200, body)]
    with pytest.raises(tc.ServerError) as e:
        CALLS[side](stub.url, method)
    assert type(e.value) is tc.ServerError and e.value.status == 200
    assert "/v1/" in e.value.detail  # names the call it answered
    assert len(str(e.value)) < 1000  # the body is not echoed whole


ERROR_BODIES = [None, [], ["detail"], "text", 5, {}, {"detail": None}, {"detail": [{"loc": ["budget"]}]},
                {"other": "x"}, {"detail": "the bank holds nothing"}, b"not json", b"", b"\xff\xfe", b"[" * 100_000,
                b"x" * 100_000]
STATUSES = [400, 401, 403, 404, 409, 413, 422, 429, 500, 502, 503, 504, 418]
ERROR_CASES = [(s, i) for s in STATUSES for i in range(len(ERROR_BODIES))]


@pytest.mark.parametrize("side", CALLS)
@pytest.mark.parametrize("status,i", ERROR_CASES, ids=[f"{s}-{i}" for s, i in ERROR_CASES])
def test_every_error_body_maps_to_its_status_class(stub, side, status, i):
    stub.answers[:] = [Answer(status, ERROR_BODIES[i])]
    with pytest.raises(tc.ServerError) as e:
        CALLS[side](stub.url, "bank", max_retries=0)
    assert type(e.value) is tc.STATUS_ERRORS.get(status, tc.ServerError) and e.value.status == status
    assert isinstance(e.value.detail, str) and len(e.value.detail) <= 4000
    if status == 404:
        assert isinstance(e.value, UnknownBank) and e.value.bank_id == "b"
    if status in (409, 413, 422):
        assert isinstance(e.value, InputError)


def test_an_error_detail_is_kept():
    with stub_http([Answer(422, {"detail": "budget: must be at least 1"})]) as s, tc.Client(s.url) as c:
        with pytest.raises(tc.InvalidRequest, match="budget: must be at least 1"):
            c.select("b", "q")
    with stub_http([Answer(404, b"no such bank")]) as s, tc.Client(s.url) as c:
        with pytest.raises(tc.BankNotFound, match="no such bank"):
            c.bank("b")


def test_a_404_says_the_servers_words_once():
    """A ``BankNotFound`` reads ``HTTP 404: <detail>``, not the detail wrapped as a bank id
    (``unknown bank id 'HTTP 404: Not Found'``, issue 42)."""
    answers = [Answer(404, {"detail": "unknown bank id 'b'"}), Answer(404, {"detail": "Not Found"})]
    with stub_http(answers) as s, tc.Client(s.url) as c:
        for want in ("HTTP 404: unknown bank id 'b'", "HTTP 404: Not Found"):
            with pytest.raises(tc.BankNotFound) as e:
                c.bank("b")
            assert str(e.value) == want and e.value.bank_id == "b" and e.value.detail == want.split(": ", 1)[1]


def test_a_404_is_classed_by_the_error_its_body_names():
    """``"error": "unknown_unit"`` / ``"unknown_turn"``: ``UnitNotFound``; ``"unknown_bank"``, a kind
    this client does not know, or none (an older server, a path that is no route): ``BankNotFound``."""
    kinds = ["unknown_unit", "unknown_turn", "unknown_bank", "unknown_galaxy", None, ["unknown_unit"]]
    answers = [Answer(404, {"detail": "gone", "error": k}) for k in kinds]
    with stub_http(answers) as s, tc.Client(s.url) as c:
        got = []
        for _ in kinds:
            with pytest.raises(tc.ServerError) as e:
                c.history("b", "u")
            got.append(type(e.value))
            assert e.value.status == 404 and e.value.detail == "gone"
    assert got == [tc.UnitNotFound, tc.UnitNotFound] + [tc.BankNotFound] * 4
