"""Turn ids with URL-special characters (``/``, ``?``, ``#``, ``%``, space) through the real server:
``DELETE /v1/banks/{bank_id}/turns/{turn_id}`` takes the id percent-encoded (a ``/`` as ``%2F``),
and the client's forget and append carry them as they are."""
from __future__ import annotations

from urllib.parse import quote

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from serve_util import running  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402

IDS = ("S1/2", "a/b/c", "q?x=1", "h#1", "p%2F", "sp ace")


def test_turn_ids_with_url_characters_can_be_forgotten(tmp_path, monkeypatch):
    from trawmem_gpu.client import Client

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    cfg = ServeConfig(collection=str(tmp_path / "coll"), max_wait_ms=1, warmup=False)
    turns = [{"turn_id": t, "speaker": "Ana", "text": f"turn number {i}", "timestamp": f"2031-06-01T10:0{i}:00"}
             for i, t in enumerate(("keep", *IDS))]
    with running(cfg) as (url, service, _):
        with Client(url, timeout=120, deadline=300) as c:
            assert c.append("acme-1", turns).appended == len(turns)
            with httpx.Client(base_url=url, timeout=120) as h:
                for t in IDS[:-1]:
                    r = h.delete(f"/v1/banks/acme-1/turns/{quote(t, safe='')}")
                    assert r.status_code == 200, (t, r.text)
                    assert r.json()["forgotten"] == [t] and not r.json()["deleted"]
                again = h.delete(f"/v1/banks/acme-1/turns/{quote(IDS[0], safe='')}")
                assert again.status_code == 404 and again.json()["detail"] == f"bank 'acme-1' holds no turn {IDS[0]!r}"
            res = c.forget("acme-1", [IDS[-1], "a/b/c"])
            assert list(res.forgotten) == [IDS[-1]] and list(res.missing) == ["a/b/c"]
            assert c.bank("acme-1").n_units == 1
        assert list(service.registry.get("acme-1").index_of()) == ["keep"]


BANK = "user-42/run-7"  # the docs' example: one path segment, sent as user-42%2Frun-7


def test_a_bank_id_with_a_slash_is_reached_and_removed_by_every_path_route(tmp_path, monkeypatch):
    """Every ``/v1/banks/{bank_id}...`` route takes a bank id with ``/`` (and ``%``, ``?``, space)
    percent-encoded, from the client and from raw HTTP; an unencoded ``/`` is no route; a path that
    is not UTF-8 once decoded is a 422 and creates no bank (issue 42)."""
    from trawmem_gpu.client import BankNotFound, Client

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    cfg = ServeConfig(collection=str(tmp_path / "coll"), max_wait_ms=1, warmup=False)
    turns = [{"turn_id": f"t/{i}", "speaker": "Ana", "text": f"turn number {i}",
              "timestamp": f"2031-06-01T10:0{i}:00"} for i in range(4)]
    odd = "a/turns/b%2F? x"  # looks like a sub-route once decoded
    with running(cfg) as (url, service, _), Client(url, timeout=120, deadline=300) as c, \
            httpx.Client(base_url=url, timeout=120) as h:
        assert c.append(BANK, turns[:3]).appended == 3 and c.bank(BANK).n_units == 3
        assert [e.event for e in c.history(BANK, "t/1").events] == ["added"]
        assert list(c.forget(BANK, ["t/0"]).forgotten) == ["t/0"]
        enc = f"/v1/banks/{quote(BANK, safe='')}"
        r = h.post(f"{enc}/turns", json={"turns": turns[3:]})
        assert r.status_code == 200 and r.json()["bank_id"] == BANK and r.json()["n_units"] == 3
        assert h.get(enc).json()["bank_id"] == BANK
        assert h.get(f"{enc}/units/{quote('t/3', safe='')}/history").json()["unit_id"] == "t/3"
        assert h.delete(f"{enc}/turns/{quote('t/1', safe='')}").json()["forgotten"] == ["t/1"]
        assert h.post(f"{enc}/forget", json={"turn_ids": ["t/2"]}).json()["forgotten"] == ["t/2"]
        assert h.get(f"/v1/banks/{BANK}").status_code == 404  # a bank id is one segment
        assert c.append(odd, turns[:1]).appended == 1 and h.get(f"/v1/banks/{quote(odd, safe='')}").status_code == 200
        bad = h.post("/v1/banks/%ff%fe%fd/turns", json={"turns": turns[:1]})
        assert bad.status_code == 422 and "UTF-8" in bad.json()["detail"]
        assert h.delete("/v1/banks/ok/turns/%ff").status_code == 422
        assert sorted(b.bank_id for b in c.banks().banks) == sorted([BANK, odd])
        assert c.forget(BANK).deleted and h.delete(f"/v1/banks/{quote(odd, safe='')}").json()["deleted"]
        with pytest.raises(BankNotFound, match=r"^HTTP 404: unknown bank id 'user-42/run-7'$"):
            c.bank(BANK)
        assert c.banks().banks == ()


def test_the_route_path_keeps_the_bank_segment_encoded_once():
    """``bank_paths.route_path``: from the raw path (a ``%2F`` stays inside the bank's segment, a
    ``%25`` is decoded once), from the decoded path when a server gives no ``raw_path``, nothing
    for other paths, ``BadPath`` for bytes that are not UTF-8."""
    from trawmem_gpu.serve.bank_paths import BadPath, BankIdConvertor, route_path

    conv = BankIdConvertor()
    got = route_path({"raw_path": b"/v1/banks/u%2Fr%2541/units/a%2Fb/history", "path": "ignored"})
    assert got == "/v1/banks/u%2Fr%2541/units/a/b/history" and conv.convert(got.split("/")[3]) == "u/r%41"
    got = route_path({"path": "/v1/banks/p%41/turns"})  # decoded already: encoded once, decoded once
    assert got == "/v1/banks/p%2541/turns" and conv.convert(got.split("/")[3]) == "p%41"
    assert route_path({"raw_path": b"/v1/select", "path": "/v1/select"}) is None
    assert route_path({"path": "/healthz"}) is None
    for raw in (b"/v1/banks/%ff/turns", b"/v1/banks/ok/turns/%c3%28"):
        with pytest.raises(BadPath, match="not UTF-8"):
            route_path({"raw_path": raw, "path": "x"})
