"""`trawmem serve`: tenants and keys: the auth matrix, the keys file's errors and the serve key.

The real server in-process on 127.0.0.1 and a free port, driven with httpx.
"""
from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import KEYS, SAMPLE_BANK, keys_file, running  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402
from serve_cases import coll, sample_coll  # noqa: E402, F401, F811 (fixtures)
from serve_cases import QUESTION, _turn  # noqa: E402


# ----------------------------------------------------------------------------------------------
# tenants and keys
# ----------------------------------------------------------------------------------------------
def test_auth_matrix(coll, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    cfg = ServeConfig(collection=coll, keys_file=keys_file(tmp_path / "keys.json"), max_wait_ms=1)
    bodies = []
    with running(cfg) as (url, service, _):
        c = httpx.Client(base_url=url, timeout=60)

        def call(method, path, key=None, body=None, bearer=True):
            hdr = {} if key is None else ({"Authorization": f"Bearer {key}"} if bearer else {"X-API-Key": key})
            r = c.request(method, path, json=body, headers=hdr)
            bodies.append(r.text)
            return r

        sel = lambda b: {"bank_id": b, "question": QUESTION}  # noqa: E731

        def same_404(a, b, id_a, id_b):  # the foreign bank's answer is the missing bank's, but for the id
            assert a.status_code == b.status_code == 404
            assert a.json()["detail"].replace(repr(id_a), "ID") == b.json()["detail"].replace(repr(id_b), "ID")
            assert a.headers.get("content-type") == b.headers.get("content-type")
        # no key / wrong key: 401 everywhere a bank is touched
        for key in (None, "wrong-key", KEYS["rw"] + "x", KEYS["rw"][:-1]):
            assert call("POST", "/v1/select", key, sel("acme-1")).status_code == 401
            assert call("POST", "/v1/select/batch", key, {"requests": [sel("acme-1")]}).status_code == 401
            assert call("POST", "/v1/banks/acme-1/turns", key, {"turns": [_turn("x1")]}).status_code == 401
            assert call("GET", "/v1/banks", key).status_code == 401
            assert call("GET", "/v1/banks/acme-1", key).status_code == 401
        assert call("POST", "/v1/select", None, {"bank_id": "acme-1"}).status_code == 401  # auth before body checks
        # the owner reads with either header
        assert call("POST", "/v1/select", KEYS["rw"], sel("acme-1")).status_code == 200
        assert call("POST", "/v1/select", KEYS["rw"], sel("acme-1"), bearer=False).status_code == 200
        assert call("POST", "/v1/select", KEYS["ro"], sel("acme-1")).status_code == 200
        # a bank the key does not own answers exactly as a bank that does not exist
        for key, foreign, missing in ((KEYS["rw"], "other-1", "acme-zzz"), (KEYS["other"], "acme-1", "other-zzz"),
                                      (KEYS["rw"], SAMPLE_BANK, "nope")):
            for route, body in (("/v1/select", sel), ("/v1/select/batch", lambda b: {"requests": [sel(b)]})):
                same_404(call("POST", route, key, body(foreign)), call("POST", route, key, body(missing)), foreign,
                         missing)
            same_404(call("GET", f"/v1/banks/{foreign}", key), call("GET", f"/v1/banks/{missing}", key), foreign,
                     missing)
            # appends: neither an existing foreign bank nor a new bank outside the patterns
            for bank_id in (foreign, "zzz-" + missing):
                r = call("POST", f"/v1/banks/{bank_id}/turns", key, {"turns": [_turn("x1")]})
                assert r.status_code == 404 and r.json()["detail"] == f"unknown bank id {bank_id!r}"
        assert service.registry.get("acme-1").n_units == service.registry.get(SAMPLE_BANK).n_units
        assert "zzz-acme-zzz" not in service.registry and "zzz-other-zzz" not in service.registry
        # read-only key: 403 on its own bank, 404 on others
        assert call("POST", "/v1/banks/acme-1/turns", KEYS["ro"], {"turns": [_turn("x1")]}).status_code == 403
        assert call("POST", "/v1/banks/other-1/turns", KEYS["ro"], {"turns": [_turn("x1")]}).status_code == 404
        # read-write: append, and create a bank inside its patterns
        n0 = service.registry.get("acme-1").n_units
        r = call("POST", "/v1/banks/acme-1/turns", KEYS["rw"], {"turns": [_turn("x1")]})
        assert r.status_code == 200 and r.json()["n_units"] == n0 + 1 and r.json()["created"] is False
        r = call("POST", "/v1/banks/acme-new/turns", KEYS["rw"], {"turns": [_turn("n1"), _turn("n2", "Bye")]})
        assert r.status_code == 200 and r.json()["created"] is True and r.json()["n_units"] == 2
        # listings show only owned banks
        assert {b["bank_id"] for b in call("GET", "/v1/banks", KEYS["ro"]).json()["banks"]} == {"acme-1", "acme-new"}
        assert {b["bank_id"] for b in call("GET", "/v1/banks", KEYS["other"]).json()["banks"]} == {"other-1",
                                                                                                   SAMPLE_BANK}
        bodies.append(c.get("/metrics").text)
        c.close()
    # keys appear in no response, metric or log line
    logs = "\n".join(r.getMessage() for r in caplog.records)
    for k in KEYS.values():
        assert all(k not in b for b in bodies) and k not in logs


def test_keys_file_errors_and_serve_key(tmp_path):
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.serve.keys import KeyStore, add_key

    p = tmp_path / "k.json"
    for doc, msg in (({"keys": [{"sha256": "xyz", "tenant": "a", "banks": ["*"], "access": "read-only"}]}, "64 hex"),
                     ({"keys": [{"sha256": "0" * 64, "tenant": "a", "banks": [], "access": "read-only"}]}, "banks"),
                     ({"keys": [{"sha256": "0" * 64, "tenant": "a", "banks": ["*"], "access": "admin"}]}, "access"),
                     ({"nokeys": []}, "expected")):
        p.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match=msg):
            KeyStore.load(p)
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        KeyStore.load(p)
    p.unlink()
    k1 = add_key(p, "acme", ["acme-*"], writable=True)
    k2 = add_key(p, "acme", ["acme-*"], writable=False)
    assert k1 not in p.read_text() and k2 not in p.read_text()
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    ks = KeyStore.load(p)
    assert ks.authenticate(k1).writable and not ks.authenticate(k2).writable
    assert ks.authenticate(k1 + "x") is None and ks.authenticate(None) is None
    with pytest.raises(ConfigError, match="127.0.0.1 only"):
        ServeConfig(host="0.0.0.0")
    ServeConfig(host="0.0.0.0", keys_file=str(p))
