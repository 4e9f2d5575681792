"""``trawmem score --ray``: the same job on Ray Data, and bank builds as Ray tasks.

Scoring: the pending questions are grouped by bank (:func:`~trawmem_gpu.score.job.plan_batches`),
each group becomes one row of a Ray dataset, and ``map_batches`` runs :class:`GroupScorer` (a
callable class on an actor pool) one group at a time: the actor loads only that group's banks
(keeping recently used ones), builds a :class:`~trawmem_gpu.score.job.Scorer` over them and
returns the group's output records. The driver streams the records back and appends them with
the same resumable writer as the single-process job, so the output file has one writer, a
rerun skips what is written, and a worker killed mid-job costs at most its groups in flight
(Ray restarts the actor and retries them; anything still missing is written by the rerun).

Why the driver writes instead of ``Dataset.write_json``: Ray's writers produce one file per
block and have no notion of "already written" ids; a single appending writer keeps the output
exactly-once across reruns. Records are a few KB each, so the driver is not the bottleneck.

Building: chunks of conversations go to build actors (``num_gpus=1`` each when the cluster
has GPUs, so the encoder runs on its GPU in fp16; one CPU each otherwise); the driver writes
the returned banks into the collection.

Ray is an optional extra (``pip install -e .[ray]``); nothing here is imported without it.
"""
from __future__ import annotations

import base64
import json
import math
import os
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..dictconfig import with_keywords
from ..errors import ConfigError, loads_json
from .items import ScoreItem
from .job import ScoreSpec, Scorer, check_banks, collection_encoder, encode_questions, job_meta, plan_batches
from .resume import RESUME_FIELDS, resume_todo, say_resume
from .writer import ResumableJsonl


def _ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise ConfigError("running on Ray needs Ray: pip install -e '.[ray]' (ray[data,serve])") from None
    return ray


@contextmanager
def ray_session(address: str | None = None, workers: int | None = None):
    """Connect to ``address`` (or start a local instance with ``workers`` CPUs) unless Ray is
    already initialized; shut down on exit only what this call started."""
    ray = _ray()
    started = False
    if not ray.is_initialized():
        kw = {"address": address} if address else {"num_cpus": workers or os.cpu_count()}
        ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                 runtime_env={"env_vars": {k: os.environ[k] for k in ("PYTHONPATH", "TRAWMEM_CACHE", "HF_HUB_OFFLINE")
                                           if k in os.environ}},
                 **kw)
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


class GroupScorer:
    """Ray Data callable class: one row = one group of questions over a few banks.

    Holds the encoder, head and LLM for its lifetime and an LRU of loaded banks, so groups that
    revisit a bank do not reload it.
    """

    def __init__(self, collection: str, spec: dict, threads: int = 1, max_banks: int = 4096):
        import torch

        from ..store import Collection

        torch.set_num_threads(max(1, threads))
        self.coll = Collection(collection)
        self.spec = ScoreSpec.from_dict(spec)
        self.head = None
        if self.spec.head:
            from ..head import load_head

            self.head = load_head(self.spec.head)
        from ..llm.factory import llm_from_args

        self.llm = llm_from_args(self.spec.answer_llm) if self.spec.answer_llm else None
        self.max_banks = max_banks
        self._banks: OrderedDict = OrderedDict()

    def _bank(self, bank_id: str):
        if bank_id in self._banks:
            self._banks.move_to_end(bank_id)
        else:
            self._banks[bank_id] = self.coll.load(bank_id)
            while len(self._banks) > self.max_banks:
                self._banks.popitem(last=False)
        return self._banks[bank_id]

    def __call__(self, batch: dict) -> dict:
        out, timings = [], []
        for payload, zb in zip(batch["items"], batch["z"]):
            items = [ScoreItem.from_dict(d) for d in loads_json(payload)]
            Z = np.frombuffer(base64.b64decode(zb), dtype=np.float32).reshape(len(items), -1)
            t0 = time.perf_counter()
            banks = [self._bank(b) for b in dict.fromkeys(it.bank_id for it in items)]
            load_s = time.perf_counter() - t0
            sc = Scorer(banks, self.spec, head=self.head, llm=self.llm)
            recs = sc.score(items, Z)
            out.extend(json.dumps(r, ensure_ascii=False) for r in recs)
            tm = json.dumps(sc.timings | {"load_banks": load_s, "pid": os.getpid()})
            timings.extend([tm] + [""] * (len(recs) - 1))
        return {"record": np.array(out, dtype=object), "timings": np.array(timings, dtype=object)}


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide :func:`score_ray` runs on Ray."""

    address: str | None = None
    """The Ray cluster to join (None: start a local one)."""
    workers: int = 2
    """Scoring actors (>= 1)."""
    group_size: int | None = None
    """Questions per Ray Data block (None: about four blocks per worker)."""
    threads_per_worker: int = 1
    """CPU threads (and Ray CPUs) of each actor."""


def score_ray(items: list[ScoreItem], collection: str | Path, spec: ScoreSpec, out: str | Path,
              cluster: RayOptions | None = None, *, progress: bool = True, overwrite: bool = False, on_write=None,
              rescore_changed: bool = False, **kw) -> dict:
    """The scoring job on Ray Data (same output and resume rules as :func:`run_score`);
    ``cluster``: :class:`RayOptions`, or its fields as keywords."""
    c = with_keywords("score_ray", RayOptions, cluster, kw)
    address, workers, group_size, threads_per_worker = c.address, c.workers, c.group_size, c.threads_per_worker
    from tqdm.auto import tqdm

    from ..store import Collection

    t_start = time.perf_counter()
    coll = Collection(collection)
    check_banks(items, coll)
    writer = ResumableJsonl(out, meta=job_meta(spec, collection, coll.encoder_id), overwrite=overwrite,
                            keep=RESUME_FIELDS)
    timings: dict[str, float] = {}
    n_done = 0
    first_s = t_last = None
    n_first = 0
    pids: set = set()
    try:
        todo, redo = resume_todo(writer, items, coll, spec, rescore_changed=rescore_changed)
        if progress:
            say_resume(out, len(items), len(todo))
        if workers < 1:
            raise ConfigError(f"`workers` must be >= 1, got {workers}")
        # several groups per worker: balance, and results stream back while others run
        gs = group_size or max(1, math.ceil(len(todo) / (workers * 4)))
        groups = plan_batches(todo, gs)
        # question vectors come from the driver (one cached batch): workers never load the encoder
        t0 = time.perf_counter()
        Z = encode_questions(todo, collection_encoder(coll)) if todo else None
        zrow = {it.id: i for i, it in enumerate(todo)}
        timings["encode"] = time.perf_counter() - t0
        with ray_session(address, workers) as ray:
            t_init = time.perf_counter()
            timings["ray_init"] = t_init - t0 - timings["encode"]
            if groups:
                rows = [{"items": json.dumps([it.to_dict() for it in g]),
                         "z": base64.b64encode(np.ascontiguousarray(Z[[zrow[it.id] for it in g]], np.float32)
                                               .tobytes()).decode()} for g in groups]
                ds = ray.data.from_items(rows, override_num_blocks=len(rows))
                ds = ds.map_batches(GroupScorer, batch_size=1, batch_format="numpy",
                                    compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=threads_per_worker,
                                    fn_constructor_kwargs={"collection": str(Path(collection).resolve()),
                                                           "spec": spec.to_dict(), "threads": threads_per_worker})
                bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=f"score ({spec.method}, ray)",
                           unit="q", disable=not progress)
                for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
                    recs = [loads_json(s) for s in b["record"]]
                    recs = [r for r in recs if r["id"] not in writer]  # a retried group may repeat an id
                    for tm in b["timings"]:
                        if tm:
                            d = loads_json(tm)
                            pids.add(d.pop("pid"))
                            for k, v in d.items():
                                timings[k] = timings.get(k, 0.0) + v
                    writer.write_many(recs)
                    if first_s is None and recs:
                        first_s = time.perf_counter() - t_init
                        n_first = len(recs)
                    t_last = time.perf_counter() - t_init
                    n_done += len(recs)
                    bar.update(len(recs))
                    if on_write is not None:
                        on_write(len(writer))
                bar.close()
            timings["pipeline_wall"] = time.perf_counter() - t_init
    finally:
        writer.close()
    wall = time.perf_counter() - t_start
    return {"out": str(out), "questions": len(items), "scored_now": n_done,
            "skipped_already_written": len(items) - len(todo), "torn_bytes_dropped": writer.torn_bytes,
            "wall_s": wall, "questions_per_s": n_done / wall if wall > 0 else float("nan"),
            "first_result_s": first_s,
            "steady_questions_per_s": (n_done - n_first) / (t_last - first_s) if first_s and t_last > first_s else None,
            "groups": len(groups), "workers": workers, "worker_pids": len(pids),
            "timings_summed_over_workers": timings, "runner": "ray", **redo}


class _BuildActor:
    """Builds chunks of conversations into banks with its own encoder (on its GPU if it has one)."""

    def __init__(self, cfg: dict, threads: int = 1):
        import torch

        from ..ingest.config import BuildConfig
        from ..encode import get_encoder

        torch.set_num_threads(max(1, threads))
        self.cfg = BuildConfig.from_dict(cfg)
        self.encoder = get_encoder(self.cfg.encoder)

    def build(self, convs):
        from ..ingest import build_banks

        h0, m0 = getattr(self.encoder, "hits", 0), getattr(self.encoder, "misses", 0)
        banks, st = build_banks(convs, self.cfg, self.encoder, progress=False)
        st["embedding_cache_hits"] = getattr(self.encoder, "hits", 0) - h0
        st["embedding_cache_misses"] = getattr(self.encoder, "misses", 0) - m0
        return banks, st


def ray_chunk_builder(address: str | None = None, workers: int | None = None):
    """The bank cache's ``build_chunks`` (:func:`trawmem_gpu.ingest.cache.ensure_collection`):
    chunks built on Ray actors."""
    def build(chunks: list, cfg):
        return build_banks_ray(chunks, cfg, address=address, workers=workers)

    build.runner = "ray"
    return build


def build_banks_ray(chunks: list, cfg, address: str | None = None, workers: int | None = None, threads: int = 1):
    """Yield ``(banks, stats)`` per chunk of conversations, built on Ray actors (unordered)."""
    from ray.util import ActorPool

    with ray_session(address, workers) as ray:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        n = max(1, min(len(chunks), workers or gpus or int(ray.cluster_resources().get("CPU", 1))))
        opts = {"num_gpus": 1, "num_cpus": 1} if gpus else {"num_cpus": threads}
        Actor = ray.remote(**opts)(_BuildActor)
        actors = [Actor.remote(cfg.to_dict(), threads) for _ in range(n)]
        pool = ActorPool(actors)
        yield from pool.map_unordered(lambda a, ch: a.build.remote(ch), chunks)
        for a in actors:
            ray.kill(a)
