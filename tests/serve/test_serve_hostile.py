"""The short form of ``benchmarks/bench_serve.py --hostile`` (issue 23), run in CI.

The same victim / hostile code as the benchmark (``benchmarks/serve_bench/hostile.py``), with
small counts, against the real server in-process (keys file, two tenants), bounded as a whole
(``asyncio.wait_for``). It asserts what must hold whatever the machine's speed: the victim gets
no error alone, beside every attack at once, and beside a large append; the oversized requests
get 413 / 422; the distinct-parameter batch, the append and the large batches are answered (200,
or 429 for a tenant over its queue share); slow and idle connections are closed by the server
(408). No latency is asserted (the benchmark reports them).
"""
from __future__ import annotations

import asyncio
import hashlib
import json

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
                slow=20, idle=10, oversized_rounds=1, big_append_turns=40)
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
    assert res["unloaded"]["errors"] == 0 and res["unloaded"]["n"] == 16, res["unloaded"]["error_statuses"]
    assert res["loaded"]["errors"] == 0 and res["loaded"]["n"] == 16, res["loaded"]["error_statuses"]
    assert res["append_phase"]["victim"]["errors"] == 0
    assert hostile_got_4xx(res), h["oversized"]
    assert h["oversized"]["date_3.5MB"] == [422] and h["oversized"]["body_over_cap"] == [413]
    assert h["param_batch"]["status"] == 200
    assert h["append"]["status"] == 200 and h["append"]["appended"] == 20
    assert res["append_phase"]["append"]["status"] == 200 and res["append_phase"]["append"]["appended"] == 40
    assert set(h["big_batches"]) <= {"200", "429"} and h["big_batches"].get("200", 0) >= 1, h["big_batches"]
    for kind, n in (("slow", spec.slow), ("idle", spec.idle)):
        assert h[kind]["closed_by_server"] >= n and h[kind]["got_408"] >= n, (kind, h[kind])
    assert n_after == n0 + 20 + 40  # every acknowledged turn stored, once
