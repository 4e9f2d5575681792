"""The server with a quarantined bank (``test_quarantine``'s poisoned files): it starts, serves
every other tenant, answers 409 naming the bank and the cause for the quarantined one (404 for a
key that does not own it), lists it, and removes it on ``DELETE /v1/banks/{id}``."""
from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from serve_util import KEYS, keys_file, running  # noqa: E402
from poisoned_banks import BAD, POISONS, QUESTION, _poisoned, base  # noqa: E402,F401 - the fixture
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402


@pytest.mark.parametrize("kind", ["session 2**63", "session 10**30", "truncated tensors", "nested units"])
def test_the_server_serves_every_other_tenant_and_deletes_the_quarantined_bank(base, tmp_path, monkeypatch, kind):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = _poisoned(base, tmp_path, kind)
    cfg = ServeConfig(collection=str(coll), keys_file=keys_file(tmp_path / "keys.json"), max_wait_ms=1)
    with running(cfg) as (url, service, _), httpx.Client(base_url=url, timeout=120) as c:
        def call(method, path, key="rw", body=None):
            return c.request(method, path, json=body, headers={"Authorization": f"Bearer {KEYS[key]}"})

        words = POISONS[kind][1]
        for key, bank in (("rw", "acme-1"), ("other", "other-1"), ("other", "ana-ben")):  # the other tenants
            r = call("POST", "/v1/select", key, {"bank_id": bank, "question": QUESTION})
            assert r.status_code == 200 and r.json()["units"], r.text
            assert call("GET", f"/v1/banks/{bank}", key).status_code == 200
        turn = {"turn_id": "n1", "speaker": "Ana", "text": "A new note.", "timestamp": "2031-06-01T10:00:00"}
        assert call("POST", "/v1/banks/acme-1/turns", "rw", {"turns": [turn]}).status_code == 200
        # the quarantined bank: 409 naming it and the cause, wherever it is asked for
        for method, path, body in (("GET", f"/v1/banks/{BAD}", None),
                                   ("POST", "/v1/select", {"bank_id": BAD, "question": QUESTION}),
                                   ("POST", "/v1/select/batch", {"requests": [{"bank_id": BAD, "question": "q?"}]}),
                                   ("POST", f"/v1/banks/{BAD}/turns", {"turns": [turn]}),
                                   ("POST", f"/v1/banks/{BAD}/forget", {"turn_ids": ["S1:1"]}),
                                   ("DELETE", f"/v1/banks/{BAD}/turns/S1:1", None)):
            r = call(method, path, "rw", body)
            assert r.status_code == 409, (path, r.status_code, r.text)
            assert f"bank {BAD!r} is quarantined" in r.json()["detail"] and words in r.json()["detail"]
            assert str(tmp_path) not in r.json()["detail"]
        assert call("GET", f"/v1/banks/{BAD}", "other").status_code == 404  # not that key's bank: as missing
        listed = {b["bank_id"]: b for b in call("GET", "/v1/banks", "rw").json()["banks"]}
        assert sorted(listed) == ["acme-1", BAD] and words in listed[BAD]["quarantined"]
        assert listed["acme-1"].get("quarantined") is None
        # DELETE removes it; the id is then free for a new bank
        r = call("DELETE", f"/v1/banks/{BAD}", "rw")
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
        assert call("GET", f"/v1/banks/{BAD}", "rw").status_code == 404
        assert not service.registry.quarantined and not (coll / "banks" / BAD).exists()
        r = call("POST", f"/v1/banks/{BAD}/turns", "rw", {"turns": [turn]})
        assert r.status_code == 200 and r.json()["created"] is True
        r = call("POST", "/v1/select", "rw", {"bank_id": BAD, "question": "What note?"})
        assert r.status_code == 200 and [u["id"] for u in r.json()["units"]] == ["n1"]
