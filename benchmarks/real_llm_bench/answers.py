"""Answer F1 and judge with the real model as reader: TrawMem against the RRF hybrid at T = 800.

The questions: a fixed sample (seed 0) of 100 LoCoMo dev questions of categories 1-4 with
evidence, spread over the conversations (``n // conversations`` each, the remainder to the first
ones), written with their whole conversations into a LoCoMo-layout file in the work folder
(never committed). ``trawmem eval`` runs once per method with ``--answer-llm`` and ``--judge-llm``
the same real model, ``--token-budget 800``, one bank cache and one persistent LLM reply cache
(``TRAWMEM_CACHE`` in the work folder: a rerun resumes). The paired differences per question
(TrawMem minus hybrid) get a percentile bootstrap interval resampling whole conversations
(``eval.analyses.cluster_bootstrap``) and one resampling questions.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

METHODS = ("trawmem", "hybrid")
METRICS = ("f1_locomo", "judge")


def sample_file(dev: Path, out: Path, n: int = 100, seed: int = 0) -> dict:
    """Write the sample's LoCoMo-layout file; returns {sample_id: [question indices kept]}."""
    data = json.loads(Path(dev).read_text(encoding="utf-8"))
    rng = np.random.default_rng(seed)
    per = [n // len(data) + (k < n % len(data)) for k in range(len(data))]
    kept, out_data = {}, []
    for s, m in zip(data, per):
        ok = [i for i, q in enumerate(s["qa"]) if q.get("category") in (1, 2, 3, 4) and q.get("evidence")]
        pick = sorted(rng.choice(ok, size=min(m, len(ok)), replace=False).tolist())
        kept[s["sample_id"]] = pick
        out_data.append({**s, "qa": [s["qa"][i] for i in pick]})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(out_data), encoding="utf-8")
    return kept


def run_eval(method: str, data: Path, work: Path, url: str, tree: Path, token_budget: int = 800) -> dict:
    """``trawmem eval`` of ``method`` (the code of ``tree``), niced; returns its result and seconds."""
    out = work / f"eval_{method}.json"
    env = {**os.environ, "PYTHONPATH": str(tree), "TRAWMEM_CACHE": str(work / "cache"),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = ["nice", "-n", "5", sys.executable, "-m", "trawmem_gpu.cli", "eval", "--data", str(data), "--method", method,
           "--token-budget", str(token_budget), "--answer-llm", url, "--judge-llm", url, "--banks",
           str(work / "banks"), "--output", str(out), "--allow-failures", "1000"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if p.returncode != 0 or not out.exists():
        raise SystemExit(f"eval {method} failed ({p.returncode}): {p.stderr[-2000:]}")
    res = json.loads(out.read_text(encoding="utf-8"))
    return {"result": res, "seconds": secs, "stdout": p.stdout[-3000:]}


def paired(a: list[dict], b: list[dict], metric: str) -> dict:
    """Mean of ``a`` minus ``b`` on ``metric`` per question (matched by qid), with 95% intervals
    resampling conversations and resampling questions."""
    from trawmem_gpu.eval.analyses import cluster_bootstrap

    bq = {r["qid"]: r for r in b}
    rows = [(r, bq[r["qid"]]) for r in a if r["qid"] in bq and r.get(metric) is not None
            and bq[r["qid"]].get(metric) is not None]
    d = np.array([float(x[metric]) - float(y[metric]) for x, y in rows])
    conv = np.array([str(x.get("bank_id", "")) for x, _ in rows])
    est, lo, hi = cluster_bootstrap(d, conv, n_boot=5000)
    _, qlo, qhi = cluster_bootstrap(d, np.arange(len(d)), n_boot=5000)
    return {"n": int(len(d)), "mean_diff": round(est, 4), "ci95_conversations": [round(lo, 4), round(hi, 4)],
            "ci95_questions": [round(qlo, 4), round(qhi, 4)], "conversations": int(len(set(conv.tolist()))),
            "a_mean": round(float(np.mean([float(x[metric]) for x, _ in rows])), 4) if rows else None,
            "b_mean": round(float(np.mean([float(y[metric]) for _, y in rows])), 4) if rows else None}


def summary(res: dict) -> dict:
    """What one method's eval says: macro metrics, counts of failed and refused answers, LLM work."""
    recs = res["records"]
    return {"macro": {k: res["macro"].get(k) for k in ("f1_locomo", "judge", "context_tokens", "evidence_recall")},
            "mean": {k: round(float(np.mean([r[k] for r in recs if r.get(k) is not None])), 4) for k in METRICS},
            "counts": (res.get("llm") or {}).get("counts"), "llm_work": (res.get("llm_work") or {}).get("totals"),
            "refused_examples": [{"question": r["question"], "answer": r.get("refused_answer"),
                                  "why": r.get("answer_refused")} for r in recs if r.get("answer_refused")][:8]}


def main_answers(args) -> dict:
    """Run both methods and compare them (the module docstring); the record to save."""
    work = Path(args.work)
    data = work / "locomo_sample.json"
    kept = sample_file(Path(args.data), data, args.n)
    runs = {m: run_eval(m, data, work, args.url, Path(args.tree), args.token_budget) for m in METHODS}
    recs = {m: runs[m]["result"]["records"] for m in METHODS}
    return {"questions": sum(len(v) for v in kept.values()), "per_conversation": {k: len(v) for k, v in kept.items()},
            "token_budget": args.token_budget, "model": args.model, "url": args.url,
            "methods": {m: {**summary(runs[m]["result"]), "seconds": round(runs[m]["seconds"], 1)} for m in METHODS},
            "paired_trawmem_minus_hybrid": {k: paired(recs["trawmem"], recs["hybrid"], k) for k in METRICS}}
