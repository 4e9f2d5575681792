"""``DELETE /v1/banks/{bank_id}``, ``DELETE /v1/banks/{bank_id}/turns/{turn_id}`` and ``POST
/v1/banks/{bank_id}/forget`` against the real server: keys and tenants apply, the engine forgets
(no trace in the serving process's tables), selections keep answering meanwhile."""
from __future__ import annotations

import threading

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from serve_util import KEYS, build_sample_collection, keys_file, running  # noqa: E402
from forget_traces import _traces  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402

MARKER = "qpwk-serve-marker-51d0e7"


def test_forget_routes(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    coll = build_sample_collection(tmp_path / "coll", extra_ids=("acme-1", "other-1"))
    cfg = ServeConfig(collection=str(coll), keys_file=keys_file(tmp_path / "keys.json"), max_wait_ms=1)
    with running(cfg) as (url, service, _):
        c = httpx.Client(base_url=url, timeout=120)

        def call(method, path, key=None, body=None):
            return c.request(method, path, json=body, headers={} if key is None else {"Authorization": f"Bearer {key}"})

        turn = {"turn_id": "m1", "speaker": "Ana", "text": f"My bike lock code is {MARKER}.",
                "timestamp": "2031-06-01T10:00:00"}
        assert call("POST", "/v1/banks/acme-1/turns", KEYS["rw"], {"turns": [turn]}).status_code == 200
        q = {"bank_id": "acme-1", "question": "What is the bike lock code?", "budget": 64}
        assert "m1" in [u["id"] for u in call("POST", "/v1/select", KEYS["ro"], q).json()["units"]]
        bank = service.registry.get("acme-1")
        v = bank.unit_vecs[bank.index_of()["m1"]]
        needles = {"text": MARKER.encode(), "vector": v.tobytes(), "vector64": v.astype("float64").tobytes()}
        before = _traces([coll], needles, service.core)
        assert "vector in the engine's arrays" in before and len(before) >= 3, before  # float32 over float32 banks
        # no key: 401; a read-only key: 403 on its own bank; a foreign bank answers as a missing one
        for path in ("/v1/banks/acme-1", "/v1/banks/acme-1/turns/m1"):
            assert call("DELETE", path).status_code == 401
            assert call("DELETE", path, KEYS["ro"]).status_code == 403
            foreign, missing = call("DELETE", path, KEYS["other"]), call("DELETE", path.replace("acme-1", "other-9"),
                                                                         KEYS["other"])
            assert foreign.status_code == missing.status_code == 404
            assert foreign.json()["detail"].replace("'acme-1'", "ID") == missing.json()["detail"].replace("'other-9'",
                                                                                                        "ID")
        assert call("POST", "/v1/banks/acme-1/forget", KEYS["ro"], {"turn_ids": ["m1"]}).status_code == 403
        assert call("POST", "/v1/banks/acme-1/forget", KEYS["rw"], {"turn_ids": []}).status_code == 422
        assert "m1" in service.registry.get("acme-1").index_of()  # nothing refused was forgotten
        # selections keep answering while the turn is forgotten: a reader selects before, while and
        # after the forget runs (until it has done MIN_READS and the forget has finished; counted,
        # not timed: on a busy machine none may fall inside the forget, and every one must be 200)
        forgotten, first_read, codes = threading.Event(), threading.Event(), []
        MIN_READS, MAX_READS = 3, 10_000

        def reader():
            with httpx.Client(base_url=url, timeout=120) as rc:
                for _ in range(MAX_READS):
                    try:
                        r = rc.post("/v1/select", json=q, headers={"Authorization": f"Bearer {KEYS['ro']}"})
                        codes.append(r.status_code)
                    except httpx.HTTPError as e:  # recorded, never a hang: the assertion below names it
                        codes.append(repr(e))
                    first_read.set()
                    if forgotten.is_set() and len(codes) >= MIN_READS:
                        return

        t = threading.Thread(target=reader)
        t.start()
        try:
            while not first_read.wait(1.0):  # the reader is selecting before the forget starts
                assert t.is_alive(), codes
            r = call("DELETE", "/v1/banks/acme-1/turns/m1", KEYS["rw"])
        finally:
            forgotten.set()
            t.join()
        assert r.status_code == 200, r.text
        assert r.json()["forgotten"] == ["m1"] and r.json()["deleted"] is False
        assert len(codes) >= MIN_READS and set(codes) == {200}, codes
        assert "m1" not in [u["id"] for u in call("POST", "/v1/select", KEYS["ro"], q).json()["units"]]
        assert _traces([coll, tmp_path / "cache"], needles, service.core) == []
        again = call("DELETE", "/v1/banks/acme-1/turns/m1", KEYS["rw"])
        assert again.status_code == 404 and "holds no turn 'm1'" in again.json()["detail"]
        # a batch of turns, then the whole bank
        r = call("POST", "/v1/banks/acme-1/forget", KEYS["rw"], {"turn_ids": ["S1:1", "S1:2", "nope"]})
        assert r.status_code == 200 and r.json()["forgotten"] == ["S1:1", "S1:2"] and r.json()["missing"] == ["nope"]
        n = r.json()["n_units"]
        assert call("GET", "/v1/banks/acme-1", KEYS["rw"]).json()["n_units"] == n
        r = call("DELETE", "/v1/banks/acme-1", KEYS["rw"])
        assert r.status_code == 200 and r.json()["deleted"] is True
        assert call("GET", "/v1/banks/acme-1", KEYS["rw"]).status_code == 404
        assert call("POST", "/v1/select", KEYS["rw"], q).status_code == 404
        assert call("DELETE", "/v1/banks/acme-1", KEYS["rw"]).status_code == 404
        # the other banks are untouched and still served
        assert call("POST", "/v1/select", KEYS["other"], {"bank_id": "other-1", "question": "knee?"}).status_code == 200
        assert "acme-1" not in service.engines.banks and "acme-1" not in service.engines.engine.bank_ids
        c.close()
