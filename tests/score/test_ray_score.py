"""``trawmem score --ray``: the same job on Ray Data with a local instance of 2 workers. The
output equals the single-process run's; a worker killed mid-job loses and duplicates nothing
once the job (or its rerun) completes; banks built as Ray tasks equal a local build."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the optional extra `ray` is not installed (pip install -e .[ray])")
pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds Ray workers through /proc")

from lme_synthetic import instances, write  # noqa: E402
from trawmem_gpu.score import ScoreSpec, read_records, run_score  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N_Q = 8


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                                       "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def lme(tmp_path_factory):
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.data.longmemeval import load_longmemeval
    from trawmem_gpu.ingest.cache import build_identity, ensure_collection
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.score.items import items_from_conversations

    d = tmp_path_factory.mktemp("lme_ray")
    path = write(d / "lme.json", instances(N_Q, seed=9))
    convs = load_longmemeval(path)
    ensure_collection(convs, d / "banks", build_identity(file_sha256(path), BuildConfig(), "user"), BuildConfig(),
                      progress=False)
    return {"convs": convs, "banks": d / "banks", "items": items_from_conversations(convs)}


def _group_workers() -> list[int]:
    """PIDs of live Ray Data worker processes running GroupScorer (their process title)."""
    out = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if p.read_bytes().startswith(b"ray::MapWorker(MapBatches(GroupScorer))"):
                out.append(int(p.parent.name))
        except OSError:
            continue
    return out


def _by_id(path):
    return {r["id"]: r for r in read_records(path)}


def test_ray_output_equals_single_process(ray_local, lme, tmp_path):
    from trawmem_gpu.score.ray_runner import score_ray

    run_score(lme["items"], lme["banks"], ScoreSpec(), tmp_path / "single.jsonl", progress=False)
    s = score_ray(lme["items"], lme["banks"], ScoreSpec(), tmp_path / "ray.jsonl", workers=2, group_size=2,
                  progress=False)
    assert s["scored_now"] == N_Q and s["groups"] == N_Q // 2
    single, viaray = _by_id(tmp_path / "single.jsonl"), _by_id(tmp_path / "ray.jsonl")
    assert single.keys() == viaray.keys() and len(single) == N_Q
    for k in single:
        assert json.dumps(single[k], sort_keys=True) == json.dumps(viaray[k], sort_keys=True)


def test_ray_token_budget_equals_single_process(ray_local, lme, tmp_path):
    """A token budget reaches the Ray workers (it is part of the spec's selection config)."""
    from trawmem_gpu.score.ray_runner import score_ray

    spec = ScoreSpec(select={**ScoreSpec().select, "token_budget": 80, "budget": None})
    run_score(lme["items"], lme["banks"], spec, tmp_path / "single.jsonl", progress=False)
    score_ray(lme["items"], lme["banks"], spec, tmp_path / "ray.jsonl", workers=2, group_size=4, progress=False)
    single, viaray = _by_id(tmp_path / "single.jsonl"), _by_id(tmp_path / "ray.jsonl")
    assert single.keys() == viaray.keys() and len(single) == N_Q
    for k in single:
        assert viaray[k]["units"] == single[k]["units"] and viaray[k]["tokens"] <= 80
        assert viaray[k]["config"]["token_budget"] == 80


def test_rerun_after_killing_a_worker_loses_and_duplicates_nothing(ray_local, lme, tmp_path):
    import threading
    import time

    from trawmem_gpu.score.ray_runner import score_ray

    out = tmp_path / "ray.jsonl"
    killed, written, stop = [], [0], threading.Event()
    before = set(_group_workers())

    def killer():  # SIGKILL the first scoring worker process of this job that comes alive
        while not stop.is_set() and not killed:
            new = [p for p in _group_workers() if p not in before]
            if new:
                try:
                    os.kill(new[0], signal.SIGKILL)
                    killed.append((new[0], written[0]))
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    try:
        score_ray(lme["items"], lme["banks"], ScoreSpec(), out, workers=2, group_size=1, progress=False,
                  on_write=lambda n: written.__setitem__(0, n))
    except Exception:  # noqa: BLE001 - Ray may give up on the killed actor's group; the rerun must finish the job
        pass
    finally:
        stop.set()
        th.join(timeout=30)
    assert killed and killed[0][1] < N_Q, "the worker must be killed while the job runs"
    first = read_records(out) if out.exists() else []
    s = score_ray(lme["items"], lme["banks"], ScoreSpec(), out, workers=2, group_size=1, progress=False)
    ids = [r["id"] for r in read_records(out)]
    assert len(ids) == len(set(ids)) == N_Q, "lost or duplicated ids"
    assert s["skipped_already_written"] == len(first)
    assert sorted(ids) == sorted(it.id for it in lme["items"])


def test_bank_builds_as_ray_tasks_equal_a_local_build(ray_local, lme):
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.score.ray_runner import build_banks_ray

    convs = lme["convs"][:4]
    local, _ = build_banks(convs, BuildConfig(), progress=False)
    got = {}
    for banks, st in build_banks_ray([convs[:2], convs[2:]], BuildConfig(), workers=2):
        assert st["encode_units_s"] >= 0
        got.update({b.bank_id: b for b in banks})
    assert set(got) == {c.bank_id for c in convs}
    for b in local:
        r = got[b.bank_id]
        assert [t.turn_id for t in r.turns] == [t.turn_id for t in b.turns]
        np.testing.assert_array_equal(r.thread_offsets, b.thread_offsets)
        assert r.heads == b.heads
        # same encoder on the same CPU kind; batch composition may differ (float rounding only)
        np.testing.assert_allclose(r.unit_vecs, b.unit_vecs, atol=1e-5)


def test_the_bank_cache_builds_on_ray(ray_local, lme, tmp_path):
    """``trawmem score --ray`` builds missing banks through the bank cache's ``build_chunks``."""
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.ingest.cache import ensure_collection
    from trawmem_gpu.score.ray_runner import ray_chunk_builder
    from trawmem_gpu.store import Collection

    convs = lme["convs"][:4]
    st = ensure_collection(convs, tmp_path / "b", {"test": 1}, BuildConfig(), progress=False, chunk_units=20,
                           build_chunks=ray_chunk_builder(workers=2))
    assert st["runner"] == "ray" and st["banks_built"] == 4
    local = Collection(lme["banks"])
    for c in convs:
        assert Collection(tmp_path / "b").load(c.bank_id).heads == local.load(c.bank_id).heads
