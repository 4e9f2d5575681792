"""`trawmem serve --ray`: the app as a Ray Serve application on a local Ray instance, 2 shards.

Each shard (one replica) owns the banks whose id hashes to it; the router sends each request
to its bank's shard. The shards run with a resident budget of about two banks (``--max-resident-bytes``):
they open banks lazily and let them go, so every request below also goes through a shard's
eviction. Bounded: one local Ray instance with 4 logical CPUs, torn down at the end.
"""
from __future__ import annotations

import socket

import pytest

pytest.importorskip("ray", reason="the ray extra (ray[data,serve]) is not installed")
pytest.importorskip("ray.serve", reason="the ray extra (ray[data,serve]) is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import NO_DEADLINE_S, build_sample_collection  # noqa: E402

QUESTION = "Why did Ana walk home during her long run?"
RESIDENT_BYTES = 300_000
"""Each shard's budget: about two of these banks (one is ~150 KB with its tables), fewer than it owns."""
BAD = "bad-0"
"""A bank whose tensors file is truncated on disk: quarantined by the shard that owns it."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory):
    import ray
    from ray import serve

    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.serve.ray_app import shard_of, start_app

    ids = [f"user-{i}" for i in range(6)]
    assert {shard_of(b, 2) for b in ids} == {0, 1}  # both shards own banks
    path = build_sample_collection(tmp_path_factory.mktemp("ray") / "coll", extra_ids=(*ids, BAD))
    tensors = path / "banks" / BAD / "tensors.safetensors"
    tensors.write_bytes(tensors.read_bytes()[: tensors.stat().st_size // 2])
    port = _free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    try:
        # no per-query deadline that a busy machine could reach (the default 10 s failed with both cores busy)
        cfg = ServeConfig(collection=str(path), port=port, max_batch=16, max_wait_ms=20, threads=1,
                          max_resident_bytes=RESIDENT_BYTES, timeout_s=NO_DEADLINE_S)
        start_app(cfg, shards=2, shard_cpus=1)  # waits for the proxy as long as a loaded machine needs
        yield f"http://127.0.0.1:{port}", ids
    finally:
        serve.shutdown()
        ray.shutdown()


def test_ray_shards_route_by_bank_id(ray_server):
    from concurrent.futures import ThreadPoolExecutor

    from serve_util import SAMPLE_BANK
    from trawmem_gpu.serve.ray_app import shard_of

    url, ids = ray_server
    with httpx.Client(base_url=url, timeout=120) as c:
        listed = {b["bank_id"]: b for b in c.get("/v1/banks").json()["banks"]}
        assert set(listed) == {SAMPLE_BANK, *ids, BAD}  # fanned out to both shards, read from each bank's metadata
        assert c.post("/v1/select", json={"bank_id": BAD, "question": QUESTION}).status_code == 409  # opened: bad
        listed = {b["bank_id"]: b for b in c.get("/v1/banks").json()["banks"]}
        assert listed[BAD]["quarantined"] and listed[SAMPLE_BANK]["n_units"] > 0
        # the same bank content on every shard gives the same workspace wherever it lives
        base = c.post("/v1/select", json={"bank_id": SAMPLE_BANK, "question": QUESTION, "budget": 6}).json()
        with ThreadPoolExecutor(8) as ex:
            rs = list(ex.map(lambda b: c.post("/v1/select", json={"bank_id": b, "question": QUESTION, "budget": 6}),
                             ids * 2))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200][:2]
        for r in rs:
            assert [u["id"] for u in r.json()["units"]] == [u["id"] for u in base["units"]]
        assert max(r.json()["timings"]["batch_size"] for r in rs) >= 1
        r = c.post("/v1/select/batch", json={"requests": [{"bank_id": b, "question": QUESTION} for b in ids]})
        assert r.status_code == 200 and [x["bank_id"] for x in r.json()["results"]] == ids
        # unknown bank, bad input: the app's own answers
        r = c.post("/v1/select", json={"bank_id": "nope", "question": QUESTION})
        assert r.status_code == 404 and r.json()["detail"] == "unknown bank id 'nope'"
        assert c.post("/v1/select", json={"bank_id": ids[0], "question": ""}).status_code == 422
        # each replica holds only its own slice of the banks
        from ray import serve

        owned = [{x["bank_id"] for x in serve.get_deployment_handle(f"trawmem-shard-{i}", app_name="trawmem")
                  .bank_list.remote().result()} for i in range(2)]
        assert owned[0] and owned[1] and not owned[0] & owned[1] and owned[0] | owned[1] == set(listed)
        assert all(shard_of(b, 2) == i for i in range(2) for b in owned[i])
        # appends go to the owning shard (one bank on each); the next read there sees them
        for b in (min(owned[0] - {SAMPLE_BANK, BAD}), min(owned[1] - {SAMPLE_BANK, BAD})):
            n0 = listed[b]["n_units"]
            turn = {"turn_id": f"{b}-new", "speaker": "Ana", "text": "We adopted a puppy called Biscuit.",
                    "timestamp": "2030-01-01T10:00:00"}
            r = c.post(f"/v1/banks/{b}/turns", json={"turns": [turn]})
            assert r.status_code == 200 and r.json()["n_units"] == n0 + 1, r.text
            assert c.get(f"/v1/banks/{b}").json()["n_units"] == n0 + 1
            r = c.post("/v1/select", json={"bank_id": b, "question": "What is the puppy called?", "budget": 4})
            assert f"{b}-new" in [u["id"] for u in r.json()["units"]]
            again = c.post(f"/v1/banks/{b}/turns", json={"turns": [turn]})  # a retry: stored once
            assert again.status_code == 200 and again.json()["already_stored"] == [f"{b}-new"], again.text
            assert c.post(f"/v1/banks/{b}/turns", json={"turns": [{**turn, "text": "Other words."}],
                                                         "atomic": True}).status_code == 409
            # a forget goes to the owning shard too, and its engine forgets
            r = c.delete(f"/v1/banks/{b}/turns/{b}-new")
            assert r.status_code == 200 and r.json()["n_units"] == n0, r.text
            r = c.post("/v1/select", json={"bank_id": b, "question": "What is the puppy called?", "budget": 4})
            assert f"{b}-new" not in [u["id"] for u in r.json()["units"]]
        b = min(owned[1] - {SAMPLE_BANK, BAD})
        assert c.delete(f"/v1/banks/{b}").json()["deleted"] is True
        assert c.get(f"/v1/banks/{b}").status_code == 404 and c.delete(f"/v1/banks/{b}").status_code == 404
        assert c.get("/readyz").status_code == 200
        # each shard held what its budget holds, opening and letting go as requests came
        held = [serve.get_deployment_handle(f"trawmem-shard-{i}", app_name="trawmem").resident.remote().result()
                for i in range(2)]
        assert all(h["lazy"] and (h["bytes"] <= RESIDENT_BYTES or h["banks"] == 1) for h in held), held
        assert sum(h["evicted"] for h in held) >= 2 and sum(h["opened"] for h in held) >= 6, held


def test_a_quarantined_bank_answers_409_through_its_shard_and_can_be_deleted(ray_server):
    """The shards answer a quarantined bank as the single-process app does: 409 naming the bank and
    the cause on select (alone and in a batch), append, forget and GET; DELETE removes it."""
    url, ids = ray_server
    turn = {"turn_id": "n1", "speaker": "Ana", "text": "A note.", "timestamp": "2031-06-01T10:00:00"}
    with httpx.Client(base_url=url, timeout=120) as c:
        calls = [c.post("/v1/select", json={"bank_id": BAD, "question": QUESTION}),
                 c.post("/v1/select/batch", json={"requests": [{"bank_id": ids[0], "question": QUESTION},
                                                               {"bank_id": BAD, "question": QUESTION}]}),
                 c.post(f"/v1/banks/{BAD}/turns", json={"turns": [turn]}),
                 c.post(f"/v1/banks/{BAD}/forget", json={"turn_ids": ["S1:1"]}),
                 c.get(f"/v1/banks/{BAD}")]
        for r in calls:
            assert r.status_code == 409 and f"bank {BAD!r} is quarantined" in r.json()["detail"], r.text
        assert calls[1].json()["detail"].startswith("requests[1]: ")
        assert c.post("/v1/select", json={"bank_id": ids[0], "question": QUESTION}).status_code == 200
        r = c.delete(f"/v1/banks/{BAD}")
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
        assert c.get(f"/v1/banks/{BAD}").status_code == 404


def test_a_bank_id_with_a_slash_routes_like_the_fastapi_server(ray_server):
    """A bank id holding ``/`` (the docs' ``user-42/run-7``), percent-encoded as one path segment,
    goes through the Ray proxy to the router's app and to the shard of the whole id: append, read,
    history, select by body, forget a turn and the bank (issue 42 item 5); ``/v1/banks/a/b`` is no
    bank, and no shard holds a bank named after a piece of the id."""
    from urllib.parse import quote

    from ray import serve

    from trawmem_gpu.serve.ray_app import shard_of

    def held() -> list[set]:
        return [{x["bank_id"] for x in serve.get_deployment_handle(f"trawmem-shard-{i}", app_name="trawmem")
                 .bank_list.remote().result()} for i in range(2)]

    url, _ = ray_server
    bank = "user-42/run-7"
    seg = quote(bank, safe="")
    turns = [{"turn_id": f"t{i}", "speaker": "Ana", "text": text, "timestamp": f"2031-06-0{i + 1}T10:00:00"}
             for i, text in enumerate(["We adopted a puppy called Biscuit.", "Biscuit chewed my running shoes."])]
    # a generous bound, not a speed check: a shard's first query on a machine with busy cores is slow
    with httpx.Client(base_url=url, timeout=NO_DEADLINE_S) as c:
        r = c.post(f"/v1/banks/{seg}/turns", json={"turns": turns})
        assert r.status_code == 200 and r.json()["bank_id"] == bank and r.json()["stored"] == ["t0", "t1"], r.text
        owner = shard_of(bank, 2)
        shards = held()
        assert bank in shards[owner] and bank not in shards[1 - owner]
        assert not any(b.startswith("user-42") and b != bank for b in shards[0] | shards[1]), shards
        info = c.get(f"/v1/banks/{seg}")
        assert info.status_code == 200 and info.json()["bank_id"] == bank and info.json()["n_units"] == 2, info.text
        assert bank in {b["bank_id"] for b in c.get("/v1/banks").json()["banks"]}
        hist = c.get(f"/v1/banks/{seg}/units/t0/history")
        assert hist.status_code == 200 and hist.json()["events"], hist.text
        r = c.post("/v1/select", json={"bank_id": bank, "question": "What is the puppy called?", "budget": 4})
        assert r.status_code == 200 and "t0" in [u["id"] for u in r.json()["units"]], r.text
        assert c.get("/v1/banks/user-42/run-7").status_code == 404  # two segments: no route, whatever exists
        r = c.delete(f"/v1/banks/{seg}/turns/t1")
        assert r.status_code == 200 and r.json()["forgotten"] == ["t1"], r.text
        r = c.delete(f"/v1/banks/{seg}")
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
        assert c.get(f"/v1/banks/{seg}").status_code == 404
    assert bank not in held()[owner]
