"""`trawmem serve`: metadata and filters over HTTP. Turns carry metadata through the append route
and back in every selected unit; ``where`` in a select body (and in each request of a batch)
selects among the turns that pass, with errors naming the path inside the filter; a key bound to
a filter (``serve-key --where``) sees only what passes it, whatever the request asks, stores only
turns that pass it and forgets only those.

The real server in-process on 127.0.0.1 and a free port, driven with httpx.
"""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import running  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from trawmem_gpu.serve.keys import KeyStore, add_key  # noqa: E402

TOPICS = ["pottery class", "the harbour job", "Lyon flat", "a grey cat", "the marathon", "Clara's wedding"]


def _turns(user: str, start: int, n: int = 6) -> list[dict]:
    return [{"turn_id": f"{user}-{i}", "speaker": "Ana" if i % 2 else "Ben",
             "text": f"{user} talks about {TOPICS[i % len(TOPICS)]} ({i}).", "timestamp": f"2024-03-{start + i:02d}",
             "metadata": {"user_id": user, "importance": i % 3, "at": f"2024-03-{start + i:02d}"}}
            for i in range(n)]


def test_filters_and_key_bound_filters_over_http(tmp_path):
    keys = tmp_path / "keys.json"
    admin = add_key(keys, "admin", ["*"], writable=True)
    u1 = add_key(keys, "u1", ["*"], writable=True, where={"user_id": "u1"})
    assert KeyStore.load(keys).authenticate(u1).where.json == {"user_id": {"eq": "u1"}}
    cfg = ServeConfig(collection=str(tmp_path / "c"), keys_file=str(keys), max_wait_ms=1)
    with running(cfg) as (url, service, _):
        c = httpx.Client(base_url=url, timeout=120)
        call = lambda key, method, path, body=None: c.request(  # noqa: E731
            method, path, json=body, headers={"Authorization": f"Bearer {key}"})
        r = call(admin, "POST", "/v1/banks/shared/turns", {"turns": _turns("u1", 1) + _turns("u2", 10)})
        assert r.status_code == 200, r.text
        # bad metadata is refused at the door, naming the field (per item; atomic: the request)
        for bad, field, why in (({"user_id": ["u1"]}, "turns[0].metadata.user_id", "flat map"),
                                ({"n": None}, "turns[0].metadata.n", "null"), ({"user id": "u1"}, "turns[0]",
                                                                                "'user id'")):
            t = dict(_turns("u3", 20, 1)[0], metadata=bad)
            r = call(admin, "POST", "/v1/banks/shared/turns", {"turns": [t]})
            assert r.status_code == 200 and r.json()["stored"] == [], r.text
            (item,) = r.json()["refused"]
            assert item["field"].startswith(field) and why in item["reason"], r.text
            r = call(admin, "POST", "/v1/banks/shared/turns", {"turns": [t], "atomic": True})
            assert r.status_code == 422 and r.json()["detail"].startswith("turns[0]") and why in r.json()["detail"]
        sel = lambda key, **kw: call(key, "POST", "/v1/select",  # noqa: E731
                                     {"bank_id": "shared", "question": "What about the pottery class?", "budget": 12,
                                      **kw})
        # the admin key: every turn, or those a where passes; the units carry their metadata
        r = sel(admin)
        assert r.status_code == 200 and r.json()["where"] is None
        assert {u["metadata"]["user_id"] for u in r.json()["units"]} == {"u1", "u2"}
        r = sel(admin, where={"user_id": "u2", "importance": {"gte": 1}})
        units = r.json()["units"]
        assert units and all(u["metadata"]["user_id"] == "u2" and u["metadata"]["importance"] >= 1
                             for u in units), r.text
        r = sel(admin, where={"at": {"lt": "2024-03-03"}})  # a date compares as a date
        assert r.json()["units"] and {u["id"] for u in r.json()["units"]} <= {"u1-0", "u1-1"}
        # a key bound to user u1: what it asks is narrowed to u1, never widened
        for where in (None, {"user_id": "u2"}, {"or": [{"user_id": "u2"}, {"importance": {"gte": 0}}]},
                      {"not": {"user_id": "u1"}}):
            r = sel(u1, **({} if where is None else {"where": where}))
            assert r.status_code == 200, r.text
            units = r.json()["units"]
            assert all(u["metadata"]["user_id"] == "u1" for u in units), (where, r.text)
            assert bool(units) == (where != {"user_id": "u2"} and where != {"not": {"user_id": "u1"}})
            assert r.json()["where"]["and"][0] == {"user_id": {"eq": "u1"}} if where else \
                r.json()["where"] == {"user_id": {"eq": "u1"}}
        assert sel(u1, where={"user_id": "u2"}).json()["units"] == []
        r = call(u1, "POST", "/v1/select/batch", {"requests": [
            {"bank_id": "shared", "question": "pottery?", "where": {"importance": 2}},
            {"bank_id": "shared", "question": "pottery?", "where": {"importance": {"gt": "high"}}}]})
        assert r.status_code == 422 and r.json()["detail"].startswith("requests[1].where.importance.gt:"), r.text
        r = call(u1, "POST", "/v1/select/batch", {"requests": [
            {"bank_id": "shared", "question": "pottery?", "where": {"importance": 2}}]})
        got = {u["id"] for u in r.json()["results"][0]["units"]}
        assert got and got <= {"u1-2", "u1-5"}, r.text
        # it stores only turns that pass its filter, and forgets only those
        r = call(u1, "POST", "/v1/banks/shared/turns", {"turns": _turns("u2", 20, 1)})
        assert r.status_code == 403 and "turns[0].metadata" in r.json()["detail"], r.text
        new = dict(_turns("u1", 20, 1)[0], turn_id="u1-new")
        assert call(u1, "POST", "/v1/banks/shared/turns", {"turns": [new]}).status_code == 200
        assert call(u1, "DELETE", "/v1/banks/shared").status_code == 403
        r = call(u1, "POST", "/v1/banks/shared/forget", {"turn_ids": ["u2-0", "u1-0"]})
        assert r.status_code == 200 and r.json()["forgotten"] == ["u1-0"] and r.json()["missing"] == ["u2-0"], r.text
        assert call(u1, "DELETE", "/v1/banks/shared/turns/u2-1").status_code == 404  # another user's: as missing
        held = {t.turn_id for t in service.registry.get("shared").turns}
        assert "u2-0" in held and "u2-1" in held and "u1-0" not in held
        c.close()
        from trawmem_gpu.client import Client  # the Python client sends where and reads metadata back
        from trawmem_gpu.data.filters import parse_filter

        with Client(url, api_key=admin) as cl:
            res = cl.select("shared", "pottery?", budget=12, where=parse_filter({"user_id": "u2"}))
            assert res.units and all(u.metadata["user_id"] == "u2" for u in res.units)
            assert res.where == {"user_id": {"eq": "u2"}}
            many = cl.select_many([("shared", "pottery?")] * 2, where={"importance": 2})
            assert all(u.metadata["importance"] == 2 for r in many for u in r.units)
