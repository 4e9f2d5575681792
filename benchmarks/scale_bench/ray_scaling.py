"""``trawmem score`` on Ray Data against the number of workers (issue 33.7): 1 to 4 scoring actors on one
local Ray instance (several worker processes: the driver, Ray's raylet and workers, one actor per
scoring worker), beside the single-process job, on the LongMemEval-S dev questions over their
banks (built once into the cache ``trawmem score`` uses).

The Ray instance is started once with ``max(workers)`` CPUs, so its start-up is not in any figure;
then, for ``--ray-rounds`` rounds, the single-process job and the Ray job at each worker count run
in turn (the order rotates each round), each writing a fresh output. Reported per setting: the
median questions per second over the whole job (wall), the steady rate after the first result, and
the time to the first result. The machine's cores are recorded beside them: with 2 cores, more than
2 workers share them, and the curve says what that costs.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path


def run(data: Path, workers: list[int], rounds: int, log=print) -> dict:
    from trawmem_gpu.data.longmemeval import load_longmemeval
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.ingest.cache import build_identity, default_bank_dir, ensure_collection
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.score import ScoreSpec, run_score
    from trawmem_gpu.score.items import items_from_conversations
    from trawmem_gpu.score.ray_runner import ray_session, score_ray

    convs = load_longmemeval(data)
    ident = build_identity(file_sha256(data), BuildConfig(), "user")
    bank_dir = default_bank_dir(ident)
    ensure_collection(convs, bank_dir, ident, BuildConfig(), encoder=get_encoder(), progress=False)
    items = items_from_conversations(convs)
    spec = ScoreSpec(method="trawmem")
    runs: dict = {"single": []} | {f"ray{w}": [] for w in workers}
    with tempfile.TemporaryDirectory(prefix="trawmem-bench-ray-") as d, ray_session(None, max(workers)):
        run_score(items, bank_dir, spec, Path(d) / "warm.jsonl", progress=False)  # page cache, numba, tokenizer
        keys = list(runs)
        for r in range(rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            for k in order:
                out = Path(d) / f"{k}-{r}.jsonl"
                t0 = time.perf_counter()
                if k == "single":
                    s = run_score(items, bank_dir, spec, out, progress=False)
                else:
                    s = score_ray(items, bank_dir, spec, out, workers=int(k[3:]), progress=False)
                wall = time.perf_counter() - t0
                runs[k].append({"wall_s": wall, "qps": len(items) / wall, "first_result_s": s.get("first_result_s"),
                                "steady_qps": s.get("steady_questions_per_s"), "worker_pids": s.get("worker_pids")})
                log(f"  ray scaling round {r}: {k}: {len(items) / wall:.1f} q/s")
    out = {"questions": len(items), "banks": len(convs), "cpu_count": os.cpu_count(), "rounds": rounds,
           "settings": {}}
    for k, rs in runs.items():
        med = statistics.median(x["qps"] for x in rs)
        steady = [x["steady_qps"] for x in rs if x["steady_qps"]]
        first = [x["first_result_s"] for x in rs if x["first_result_s"] is not None]
        out["settings"][k] = {"median_qps": round(med, 2),
                              "median_steady_qps": round(statistics.median(steady), 2) if steady else None,
                              "median_first_result_s": round(statistics.median(first), 2) if first else None,
                              "runs": rs}
    base = out["settings"].get("ray1", {}).get("median_qps")
    if base:
        out["speedup_over_1_worker"] = {k: round(v["median_qps"] / base, 3) for k, v in out["settings"].items()
                                        if k.startswith("ray")}
    return out
