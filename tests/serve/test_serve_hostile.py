"""The short form of ``benchmarks/bench_serve.py --hostile`` (issues 23, 42), run in CI.

The same victim / hostile code as the benchmark (``benchmarks/serve_bench/hostile.py``), with
small counts, against the real server in-process (keys file, two tenants), bounded as a whole
(``asyncio.wait_for``). It asserts what must hold whatever the machine's speed: the victim gets
no error alone, beside every attack at once, and beside a large append; every attack kind ran;
the oversized requests get 413 / 422; the large filter, the distinct-parameter batch, the append
and the large batches are answered (200, or 429 for a tenant over its queue share); slow and
idle connections are closed by the server (408); the result holds the fields the benchmark's
JSON reports. No latency is asserted (the benchmark reports them).

Issue 42: the event loop that reads every tenant's requests is never held by one tenant's
large request: a body over ``OFF_LOOP_BYTES`` is parsed, and a batch's items built, on a thread.
Shown without timing: the parse of such a request's filter is held at an event that only a
second tenant's answer sets.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from benchmarks.serve_bench.hostile import Spec, hostile_got_4xx, keys_doc, run_phases  # noqa: E402
from serve_util import SAMPLE_BANK, build_sample_collection, running  # noqa: E402
from trawmem_gpu.serve.config import ServeConfig  # noqa: E402

HOSTILE_BANK = "mallory-1"
VICTIM_KEY, HOSTILE_KEY = "tmk_victim_0123456789", "tmk_hostile_0123456789"


def test_victim_is_served_beside_every_attack(tmp_path):
    coll = build_sample_collection(tmp_path / "coll", extra_ids=(HOSTILE_BANK,))
    sha = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(keys_doc(sha(VICTIM_KEY), sha(HOSTILE_KEY), [SAMPLE_BANK], [HOSTILE_BANK])))
    questions = ["Why did Ana walk home during her long run?", "What does Ben cook?", "Where did they travel?"]
    bodies = [json.dumps({"bank_id": SAMPLE_BANK, "question": q}).encode() for q in questions]
    spec = Spec(victim_rate_hz=8.0, phase_s=2.0, settle_s=0.5, append_turns=20, big_batches=1, batch_size=256,
                slow=20, idle=10, oversized_rounds=1, big_append_turns=40, where_bytes=200_000)
    # timeout_s: the per-query deadline (504) far above what any batch takes, however loaded the
    # machine: a 256-query batch took over the default 10 s on a 2-core machine at load 12 (CI of
    # stop 39), and what this test checks is who is served, never how fast
    cfg = ServeConfig(collection=str(coll), keys_file=str(keys), header_timeout_s=1.0, max_wait_ms=2, timeout_s=300.0)
    with running(cfg) as (url, service, srv):
        n0 = service.registry.get(HOSTILE_BANK).n_units
        res = asyncio.run(asyncio.wait_for(
            run_phases(srv.port, VICTIM_KEY, bodies, HOSTILE_KEY, HOSTILE_BANK, spec, tag="ci"), 300))
        n_after = service.registry.get(HOSTILE_BANK).n_units
    h = res["hostile"]
    for field in ("spec", "unloaded", "loaded", "hostile", "append_phase", "p99_loaded_over_unloaded",
                  "loadavg_start", "loadavg_end"):
        assert field in res, field
    # the victim's load generator ran in its own process, not in the attacker's event loop
    assert res["unloaded"]["pid"] == res["loaded"]["pid"] != os.getpid()
    for phase in ("unloaded", "loaded"):
        assert {"n", "errors", "p50_ms", "p99_ms", "max_ms", "lat_ms"} <= set(res[phase]), res[phase].keys()
    assert res["p99_loaded_over_unloaded"] > 0
    # every attack kind ran: oversized fields, the large filter, the distinct-parameter batch, the
    # append, the 256-query batches, slow and idle connections, then the append phase
    assert set(h["oversized"]) == {"date_3.5MB", "question_1MB", "vector_9000", "bank_id_300", "batch_5000",
                                   "body_over_cap"}
    # the large filter: refused by the filter's byte bound (data.filters.MAX_FILTER_BYTES), never an error
    assert len(h["big_where"]) == 1 and h["big_where"][0]["status"] == 422, h["big_where"]
    assert res["unloaded"]["errors"] == 0 and res["unloaded"]["n"] == 16, res["unloaded"]["error_statuses"]
    assert res["loaded"]["errors"] == 0 and res["loaded"]["n"] == 16, res["loaded"]["error_statuses"]
    assert res["append_phase"]["victim"]["errors"] == 0
    assert hostile_got_4xx(res), h["oversized"]
    # over the single select's byte bound (serve.models.SELECT_BODY_BYTES): refused before its parse
    assert h["oversized"]["date_3.5MB"] == [413] and h["oversized"]["body_over_cap"] == [413]
    assert h["param_batch"]["status"] == 200
    assert h["append"]["status"] == 200 and h["append"]["appended"] == 20
    assert res["append_phase"]["append"]["status"] == 200 and res["append_phase"]["append"]["appended"] == 40
    assert set(h["big_batches"]) <= {"200", "429"} and h["big_batches"].get("200", 0) >= 1, h["big_batches"]
    for kind, n in (("slow", spec.slow), ("idle", spec.idle)):
        assert h[kind]["closed_by_server"] >= n and h[kind]["got_408"] >= n, (kind, h[kind])
    assert n_after == n0 + 20 + 40  # every acknowledged turn stored, once


def _held_parse(monkeypatch, held: threading.Event, victim_done: threading.Event, seen: list):
    """``parse_filter`` waits for ``victim_done`` (at most 60 s) on a filter that starts with the
    ``hold`` marker, and records whether it was set and whether it ran on an event loop."""
    from trawmem_gpu.data import filters

    real = filters.parse_filter

    def parse(where, *a, **k):
        if isinstance(where, dict) and (where.get("and") or [None])[0] == {"hold": {"eq": "yes"}}:
            held.set()
            on_loop = True
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                on_loop = False
            seen.append({"on_loop": on_loop, "victim_answered_meanwhile": victim_done.wait(60)})
            where = {"hold": {"eq": "yes"}}
        return real(where, *a, **k)

    monkeypatch.setattr(filters, "parse_filter", parse)


@pytest.mark.parametrize("route", ["/v1/select", "/v1/select/batch"])
def test_one_tenants_large_request_does_not_hold_the_others(tmp_path, monkeypatch, route):
    import httpx

    coll = build_sample_collection(tmp_path / "coll", extra_ids=(HOSTILE_BANK,))
    sha = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(keys_doc(sha(VICTIM_KEY), sha(HOSTILE_KEY), [SAMPLE_BANK], [HOSTILE_BANK])))
    held, victim_done, seen = threading.Event(), threading.Event(), []
    _held_parse(monkeypatch, held, victim_done, seen)
    # a single select's filter padded past OFF_LOOP_BYTES (a batch goes to a thread whatever its size)
    where = {"and": [{"hold": {"eq": "yes"}}] + [{}] * (30_000 if route == "/v1/select" else 1)}
    q = {"bank_id": HOSTILE_BANK, "question": "What did they talk about?", "where": where}
    body = q if route == "/v1/select" else {"requests": [q, {**q, "where": None}]}
    cfg = ServeConfig(collection=str(coll), keys_file=str(keys), timeout_s=300.0)
    with running(cfg) as (url, service, srv):
        out = {}

        def hostile():
            out["hostile"] = httpx.post(url + route, json=body, timeout=120,
                                        headers={"Authorization": f"Bearer {HOSTILE_KEY}"})

        t = threading.Thread(target=hostile)
        t.start()
        assert held.wait(60), "the large request's filter was never parsed"
        r = httpx.post(url + "/v1/select", json={"bank_id": SAMPLE_BANK, "question": "What does Ben cook?"},
                       headers={"Authorization": f"Bearer {VICTIM_KEY}"}, timeout=120)
        victim_done.set()
        t.join(120)
    assert r.status_code == 200, r.text
    assert seen == [{"on_loop": False, "victim_answered_meanwhile": True}], seen
    assert out["hostile"].status_code == 200, out["hostile"].text
    if route == "/v1/select/batch":
        assert len(out["hostile"].json()["results"]) == 2
