"""`trawmem serve`: bad inputs (4xx, nothing half-applied, the server keeps serving), sessions across
appends, and concurrent appends beside queries (no lost turns, readers see one bank version).

The real server in-process on 127.0.0.1 and a free port, driven with httpx.
"""
from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import SAMPLE_BANK, running  # noqa: E402
from trawmem_gpu.select.params import QueryLimits  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from serve_cases import coll, sample_coll  # noqa: E402, F401, F811 (fixtures)
from serve_cases import QUESTION, _post, _turn  # noqa: E402


# bad input
# ----------------------------------------------------------------------------------------------
def _bank_files(coll: str, bank_id: str) -> dict:
    from trawmem_gpu.store import Collection

    d = Collection(coll).bank_path(bank_id)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_bad_inputs_get_4xx_and_leave_banks_unchanged(coll):
    cfg = ServeConfig(collection=coll, max_body_bytes=64 * 1024, limits=QueryLimits(max_budget=32, max_hops=3),
                      max_batch_request=4, max_wait_ms=1)
    before = _bank_files(coll, SAMPLE_BANK)
    with running(cfg) as (url, service, _):
        c = httpx.Client(base_url=url, timeout=60)
        dim = service.dim
        ok = {"bank_id": SAMPLE_BANK, "question": QUESTION}
        n0 = service.registry.get(SAMPLE_BANK).n_units
        cases = [
            ({**ok, "question": ""}, 422, "question is empty"),
            ({**ok, "question": "   "}, 422, "question is empty"),
            ({**ok, "question": "x" * 4001}, 422, "the limit is 4000"),
            ({**ok, "bank_id": "nope"}, 404, "unknown bank id 'nope'"),
            ({**ok, "budget": 0}, 422, "budget must lie in 1..32"),
            ({**ok, "budget": 33}, 422, "budget must lie in 1..32"),
            ({**ok, "budget": 2.5}, 422, "budget"),
            ({**ok, "hops": -1}, 422, "hops must lie in 0..3"),
            ({**ok, "hops": 4}, 422, "hops must lie in 0..3"),
            ({**ok, "date": "sometime"}, 422, "date"),
            ({**ok, "question_vector": [0.1] * (dim - 1)}, 422, f"gives {dim}"),
            ({**ok, "question_vector": [0.0] * dim}, 422, "all zeros"),
            ({**ok, "question_vector": ["a"] * dim}, 422, "question_vector"),
            ({**ok, "question_vector": ["0.5"] * dim}, 422, "question_vector"),  # numbers only, strictly
            ({**ok, "question_vector": [True] * dim}, 422, "question_vector"),
            ({**ok, "extra": 1}, 422, "extra"),
            ({"question": QUESTION}, 422, "bank_id: Field required"),
        ]
        for body, status, msg in cases:
            r = _post(c, "/v1/select", body)
            assert r.status_code == status and msg in r.json()["detail"], (body.keys(), r.status_code, r.text)
        # NaN / inf cannot be written in strict JSON but Python clients send them
        for bad in ("NaN", "Infinity"):
            vec = ", ".join(["0.1"] * (dim - 1) + [bad])
            r = c.post("/v1/select", content=f'{{"bank_id": "{SAMPLE_BANK}", "question": "q", "question_vector": '
                                             f'[{vec}]}}', headers={"content-type": "application/json"})
            assert r.status_code == 422 and "NaN or infinite" in r.json()["detail"]
        r = c.post("/v1/select", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422
        # batch: limits and the index of the bad request
        r = _post(c, "/v1/select/batch", {"requests": [ok] * 5})
        assert r.status_code == 422 and "limit is 4" in r.json()["detail"]
        r = _post(c, "/v1/select/batch", {"requests": [ok, {**ok, "question": ""}]})
        assert r.status_code == 422 and r.json()["detail"].startswith("requests[1].")
        r = _post(c, "/v1/select/batch", {"requests": [ok, {**ok, "bank_id": "nope"}]})
        assert r.status_code == 404 and r.json()["detail"] == "requests[1]: unknown bank id 'nope'"
        assert _post(c, "/v1/select/batch", {"requests": []}).status_code == 422
        # oversized bodies: with a Content-Length, and chunked without one
        big = {**ok, "question": "y" * (70 * 1024)}
        r = _post(c, "/v1/select", big)
        assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]
        r = c.post("/v1/select", content=iter([json.dumps(big).encode()[i:i + 8192] for i in range(0, 80000, 8192)]),
                   headers={"content-type": "application/json"})
        assert r.status_code == 413
        small = json.dumps(ok).encode()
        r = c.post("/v1/select", content=iter([small[:10], small[10:]]), headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        # malformed turns in an atomic request: nothing appended, the bank's files untouched
        T = "/v1/banks/ana-ben/turns"
        turn_cases = [
            ({"turns": []}, 422, "turns"),
            ({"turns": [_turn("n1"), _turn("n2", text="")]}, 422, "turns[1]: turn 'n2' has empty 'text'"),
            ({"turns": [_turn("n1"), _turn("n2", ts="not a date")]}, 422, "turns[1]: field 'timestamp'"),
            ({"turns": [_turn("n1"), _turn("n1")]}, 422, "duplicate turn id 'n1'"),
            ({"turns": [_turn("n1", session=9), _turn("n2")]}, 422, "on every turn of a request or on none"),
            ({"turns": [_turn("n1", session=1)]}, 422, "turns[0]: field 'session' goes backwards"),
            ({"turns": [{"turn_id": "n1", "speaker": "A", "text": "hi"}]}, 422, "turns[0].timestamp: Field required"),
            ({"turns": [{**_turn("n1"), "bank_id": "x"}]}, 422, "turns[0].bank_id: Extra inputs are not permitted"),
            ({"turns": [_turn("S1:1")]}, 409, "already holds turn ids ['S1:1']"),
        ]
        for body, status, msg in turn_cases:
            r = _post(c, T, {**body, "atomic": True})  # one refused turn refuses the request
            assert r.status_code == status and msg in r.json()["detail"], (body, r.status_code, r.text)
        r = _post(c, "/v1/banks/bad%01id/turns", {"turns": [_turn("n1")]})
        assert r.status_code == 422 and "bank id" in r.json()["detail"], r.text
        assert service.registry.get(SAMPLE_BANK).n_units == n0
        assert _bank_files(coll, SAMPLE_BANK) == before
        # and the server still serves
        assert _post(c, "/v1/select", ok).status_code == 200
        assert c.get("/readyz").status_code == 200
        c.close()


def test_turn_sessions_continue_across_appends(coll):
    with running(ServeConfig(collection=coll, max_wait_ms=1)) as (url, service, _):
        c = httpx.Client(base_url=url, timeout=60)
        last = service.registry.get(SAMPLE_BANK).turns[-1]
        same_day = last.time.isoformat()
        r = _post(c, "/v1/banks/ana-ben/turns", {"turns": [_turn("a1", ts=same_day), _turn("a2", ts="2031-01-02")]})
        assert r.status_code == 200, r.text
        turns = service.registry.get(SAMPLE_BANK).turns
        assert turns[-2].session == last.session and turns[-1].session == last.session + 1
        r = _post(c, "/v1/banks/fresh/turns", {"turns": [_turn("f1", ts="2031-01-01"), _turn("f2", ts="2031-01-03")]})
        assert r.status_code == 200 and r.json()["n_sessions"] == 2
        # the new turns are selectable at once (read-your-writes)
        r = _post(c, "/v1/select", {"bank_id": "fresh", "question": "What is the puppy called?"})
        assert r.status_code == 200 and {u["id"] for u in r.json()["units"]} == {"f1", "f2"}
        c.close()


# ----------------------------------------------------------------------------------------------
# appends beside queries
# ----------------------------------------------------------------------------------------------
def test_concurrent_appends_and_queries_lose_nothing(coll):
    from trawmem_gpu.store import Collection

    cfg = ServeConfig(collection=coll, max_wait_ms=2)
    banks = (SAMPLE_BANK, "acme-1")
    with running(cfg) as (url, service, _):
        versions: dict[tuple[str, int], object] = {}
        for b in banks:
            bank = service.registry.get(b)
            versions[(b, bank.n_units)] = bank
        orig = service.registry.append

        def recording_append(*a, **k):
            res = orig(*a, **k)
            versions[(res.bank.bank_id, res.bank.n_units)] = res.bank
            return res

        service.registry.append = recording_append
        n0 = {b: service.registry.get(b).n_units for b in banks}
        stop = threading.Event()
        answers, failures = [], []

        def writer(w):
            with httpx.Client(base_url=url, timeout=60) as c:
                for i in range(4):
                    b = banks[(w + i) % 2]
                    # one date for every writer: the appends race, and an append never goes back in time
                    body = {"turns": [_turn(f"w{w}-{i}-{j}", f"Writer {w} says item {i}.{j}: we bought a kayak.",
                                            ts="2030-01-10T10:00:00") for j in range(2)]}
                    r = _post(c, f"/v1/banks/{b}/turns", body)
                    (answers if r.status_code == 200 else failures).append(r)

        def reader(k):
            with httpx.Client(base_url=url, timeout=60) as c:
                while not stop.is_set():
                    r = _post(c, "/v1/select", {"bank_id": banks[k % 2], "question": "What did they buy?",
                                                "budget": 8})
                    (answers if r.status_code == 200 else failures).append(r)

        with ThreadPoolExecutor(8) as ex:
            rf = [ex.submit(reader, k) for k in range(4)]
            wf = [ex.submit(writer, w) for w in range(4)]
            for f in wf:
                f.result()
            stop.set()
            for f in rf:
                f.result()
        assert not failures, [(r.status_code, r.text) for r in failures[:3]]
        selects = [r.json() for r in answers if "units" in r.json()]
        assert len(selects) >= 8
        # every answer was read from exactly one bank version: ids, threads and heads agree with it
        for s in selects:
            v = versions[(s["bank_id"], s["bank_n_units"])]
            idx = v.index_of()
            for u in s["units"]:
                assert u["thread"] == int(v.unit_thread[idx[u["id"]]])
            assert all(t["head"] == v.heads[t["thread"]] for t in s["threads"])
        # no lost turns: 4 writers x 4 appends x 2 turns, in memory, through the API and on disk
        final = {b: service.registry.get(b) for b in banks}
        assert sum(final[b].n_units - n0[b] for b in banks) == 32
        ids = {t.turn_id for b in banks for t in final[b].turns}
        assert all(f"w{w}-{i}-{j}" in ids for w in range(4) for i in range(4) for j in range(2))
        with httpx.Client(base_url=url, timeout=60) as c:
            for b in banks:
                assert c.get(f"/v1/banks/{b}").json()["n_units"] == final[b].n_units
    disk = Collection(coll)
    for b in banks:
        assert [t.turn_id for t in disk.load(b).turns] == [t.turn_id for t in final[b].turns]


def test_an_item_that_is_not_an_object_is_refused_alone(tmp_path, monkeypatch):
    """A batch with a non-object item stores its valid items and refuses that one, per item, as
    documented (it refused the whole request, issue 42); with ``atomic`` the request is refused."""
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    cfg = ServeConfig(collection=str(tmp_path / "c"), max_wait_ms=1, warmup=False)
    with running(cfg) as (url, service, _), httpx.Client(base_url=url, timeout=120) as c:
        r = _post(c, "/v1/banks/b/turns", {"turns": [_turn("n1"), 7, "text", None, [_turn("x")], _turn("n2")]})
        assert r.status_code == 200, r.text
        got = [(x["status"], x.get("field")) for x in r.json()["items"]]
        assert got == [("stored", None), *[("refused", f"turns[{i}]") for i in range(1, 5)], ("stored", None)]
        assert r.json()["stored"] == ["n1", "n2"]
        r = _post(c, "/v1/banks/b/turns", {"messages": [{"role": "user", "content": "Hello"}, 5]})
        assert r.status_code == 200 and [x["status"] for x in r.json()["items"]] == ["stored", "refused"], r.text
        assert "expected a message" in r.json()["items"][1]["reason"]
        r = _post(c, "/v1/banks/b/turns", {"turns": [_turn("n3", ts="2099-01-01T00:00:00"), 7], "atomic": True})
        assert r.status_code == 422 and r.json()["detail"].startswith("turns[1]"), r.text
        assert service.registry.get("b").n_units == 3
