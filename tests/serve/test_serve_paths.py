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
