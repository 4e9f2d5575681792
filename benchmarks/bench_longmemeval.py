"""LongMemEval-S dev slice: quality of every method at B = 8 / 16 / 32, build cost, and scoring
throughput (batched vs reference selection; single process vs Ray with 2 workers), one run.

    python -m benchmarks run longmemeval [--data PATH] [--head HEAD.safetensors] [--budgets 8,16,32]
        [--token-budgets 400,800,1600] [--k 1,3,5,10,30,50] [--build-sample 4] [--rounds 3]
        [--ray-workers 2] [--ray-rounds 2] [--no-ray]

* Banks: one per question, user turns (the official corpus), built once into the cache
  (``trawmem score`` builds the same collection); ``--build-sample N`` builds N of them again
  cold (fresh embedding cache) and warm (same cache) for the time split and units/s.
* Quality: cosine, BM25, RRF hybrid (k = 60) and TrawMem (defaults; with ``--head``, the learned
  head too) at each B; official recall_any / recall_all / ndcg_any at each k (turn and
  turn-to-session) and evidence recall / all-evidence hit / context tokens (cl100k_base) macro
  over question types, per type too. Abstention questions and questions without gold user
  turns are skipped. The same methods also run at equal context tokens, T in
  ``--token-budgets`` (``QueryParams.token_budget``, no unit cap; the hybrid also with
  ``fill="stop"``, TrawMem also with only the gain-ranked run of its knapsack greedy): rows with
  ``token_budget`` set, in the same table.
* Selection rate: the batched engine vs ``select_reference`` over all questions, warm (engine
  and contexts built), ``--rounds`` interleaved rounds, ratio per round, median.
* Scoring throughput: the whole job (load banks, engine, encode, select, render, write) single
  process vs ``--ray`` with ``--ray-workers`` local workers, alternating rounds, medians.

Writes ``benchmarks/results/longmemeval.json`` and ``longmemeval.png`` (``--tag`` adds a suffix).
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import harness

BASELINES = ("cosine", "bm25", "hybrid")


def _spec(method, budget, ks, head=None, engine="batched", token_budget=None, **select):
    """A ``ScoreSpec``: ``select`` holds method fields (``SelectConfig``) and query fields
    (``QueryParams``, e.g. ``fill``) side by side, as the spec's flat ``select`` dict does."""
    from trawmem_gpu.score import ScoreSpec
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams, split_fields

    method_kw, query_kw = split_fields(select)
    cfg = SelectConfig(**method_kw)
    params = QueryParams(budget=budget, token_budget=token_budget, **query_kw)
    return ScoreSpec(method=method, select={**cfg.to_dict(), **params.to_dict()}, engine=engine, head=head, ks=ks)


def build_sample(convs, n: int) -> dict:
    """Builds of ``n`` banks (every len/n-th question) in a scratch directory: cold with the
    torch encoder, cold with ONNX Runtime (when installed; same scratch cache kept apart), and
    warm (the torch run's cache), so the time split, units/s and both speedups come from one run."""
    import importlib.util

    import numpy as np

    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.encode import CachedEncoder, EmbeddingCache, get_encoder

    pick = convs[:: max(1, len(convs) // n)][:n]
    out = {"banks": len(pick), "units": sum(len(c.turns) for c in pick)}
    kinds = ["cold", "warm"]
    if importlib.util.find_spec("onnxruntime") is not None:
        kinds.insert(1, "cold_onnx")
    vecs = {}
    with tempfile.TemporaryDirectory(prefix="trawmem-lme-build-") as d:
        for kind in kinds:
            enc = get_encoder(BuildConfig().encoder, cache=False)
            if kind == "cold_onnx":
                from trawmem_gpu.encode.onnx import OnnxEncoder

                enc = OnnxEncoder(enc)
            enc = CachedEncoder(enc, EmbeddingCache(Path(d) / f"emb-{kind.removeprefix('cold_')}.sqlite"
                                                    if kind != "warm" else Path(d) / "emb-cold.sqlite"))
            t0 = time.perf_counter()
            banks, st = build_banks(pick, BuildConfig(), enc, progress=False)
            wall = time.perf_counter() - t0
            vecs[kind] = np.concatenate([b.unit_vecs for b in banks])
            out[kind] = {k: round(v, 3) for k, v in st.items() if k.endswith("_s")} | {
                "wall_s": round(wall, 3), "units_per_s": round(out["units"] / wall, 1),
                "embedding_cache_hits": enc.hits, "embedding_cache_misses": enc.misses}
            print(f"build sample {kind}: {out[kind]['units_per_s']} units/s", flush=True)
    if "cold_onnx" in out:
        out["onnx_speedup"] = round(out["cold"]["wall_s"] / out["cold_onnx"]["wall_s"], 3)
        out["onnx_max_abs_diff"] = float(np.abs(vecs["cold"] - vecs["cold_onnx"]).max())
    return out


def sharing(convs) -> dict:
    """How much unit text repeats across questions: as embedded (with the session date) and raw."""
    emb = [t.embed_text() for c in convs for t in c.turns]
    raw = [t.lexical_text() for c in convs for t in c.turns]
    return {"units": len(emb), "distinct_embed_texts": len(set(emb)), "distinct_raw_texts": len(set(raw)),
            "repeat_fraction_embed": round(1 - len(set(emb)) / len(emb), 4),
            "repeat_fraction_raw": round(1 - len(set(raw)) / len(raw), 4)}


def quality(banks, items, Z, args, head, enc) -> list[dict]:
    from trawmem_gpu.eval.longmemeval import aggregate_lme
    from trawmem_gpu.score import Scorer

    ctxs: dict = {}
    rows = []
    methods = [(m, None, {}) for m in BASELINES] + [("trawmem", None, {})] + \
        ([("trawmem", args.head, {})] if args.head else [])
    runs = [(m, h, kw, B, None) for m, h, kw in methods for B in args.budgets]
    t_methods = methods + [("hybrid", None, {"fill": "stop"}), ("trawmem", None, {"knapsack": "gain"})]
    runs += [(m, h, kw, None, T) for T in args.token_budgets for m, h, kw in t_methods]
    for m, h, kw, B, T in runs:
        spec = _spec(m, B, args.k, head=h, token_budget=T, **kw)
        t0 = time.perf_counter()
        sc = Scorer(banks, spec, encoder=enc, contexts=ctxs)
        recs = sc.score(items, Z)
        agg = aggregate_lme([r["eval"] for r in recs])
        name = m if m != "trawmem" else ("trawmem+head" if h else "trawmem")
        name += "".join(f" [{k}={v}]" for k, v in kw.items())
        over = sum(r["tokens"] > T for r in recs) if T is not None else None
        rows.append({"method": name, "budget": B, "token_budget": T, **agg, "workspaces_over_token_budget": over,
                     "wall_s": round(time.perf_counter() - t0, 2)})
        mm = agg["macro"]
        size = f"B={B:<4}" if T is None else f"T={T:<4}"
        print(f"{name:>28} {size} recall {mm['evidence_recall']:.3f} hit {mm['all_evidence_hit']:.3f} "
              f"tokens {mm['context_tokens']:.0f} | official turn recall_any@10 "
              f"{agg['official']['turn'].get('recall_any@10', float('nan')):.3f}", flush=True)
    return rows


def token_table(rows) -> str:
    """Markdown: evidence recall per question type, each method at each T (then B)."""
    types = list(next(iter(rows))["per_type"]) if rows else []
    head = "| method | budget | macro recall | all-hit | tokens | " + " | ".join(types) + " |"
    lines = [head, "|" + "|".join("---" for _ in range(5 + len(types))) + "|"]
    for r in sorted(rows, key=lambda r: (r["token_budget"] is None, r["token_budget"] or 0, r["budget"] or 0)):
        size = f"T={r['token_budget']}" if r["token_budget"] is not None else f"B={r['budget']}"
        m = r["macro"]
        lines.append(f"| {r['method']} | {size} | {m['evidence_recall']:.3f} | {m['all_evidence_hit']:.3f} | "
                     f"{m['context_tokens']:.0f} | " + " | ".join(f"{r['per_type'][t]['evidence_recall']:.3f}"
                                                              for t in types) + " |")
    return "\n".join(lines)


def selection_rate(banks, items, Z, args, enc) -> dict:
    """Batched engine vs reference, warm, interleaved rounds over all questions."""
    from trawmem_gpu.score import Scorer

    bat = Scorer(banks, _spec("trawmem", 16, args.k), encoder=enc)
    ref = Scorer(banks, _spec("trawmem", 16, args.k, engine="reference"), encoder=enc)
    for it in items:
        ref.context(it.bank_id)
    picks_b = bat.select(items, Z)  # warm-up (numba load, caches)
    picks_r = ref.select(items, Z)
    agree = sum(list(a) == list(b) for a, b in zip(picks_b, picks_r))
    rounds = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        bat.select(items, Z)
        tb = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref.select(items, Z)
        tr = time.perf_counter() - t0
        rounds.append({"batched_qps": len(items) / tb, "reference_qps": len(items) / tr, "ratio": tr / tb})
        print(f"selection: batched {len(items) / tb:.0f} q/s, reference {len(items) / tr:.0f} q/s, {tr / tb:.1f}x",
              flush=True)
    return {"questions": len(items), "identical_sets": agree, "engine_setup_s": round(bat.timings["setup"], 3),
            "reference_setup_s": round(ref.timings["setup"], 3), "rounds": rounds,
            "median_ratio": statistics.median(r["ratio"] for r in rounds),
            "median_batched_qps": statistics.median(r["batched_qps"] for r in rounds),
            "median_reference_qps": statistics.median(r["reference_qps"] for r in rounds)}


def throughput(items, bank_dir, args) -> dict:
    """The whole job, single process vs Ray with ``--ray-workers`` local workers, alternating."""
    from trawmem_gpu.score import run_score

    spec = _spec("trawmem", 16, args.k)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="trawmem-lme-score-") as d:
        run_score(items, bank_dir, spec, Path(d) / "warm.jsonl", progress=False)  # warm: numba, tokenizer, page cache
        for r in range(args.ray_rounds):
            s = run_score(items, bank_dir, spec, Path(d) / f"single{r}.jsonl", progress=False)
            row = {"single_qps": s["questions_per_s"], "single_wall_s": s["wall_s"], "single_timings": s["timings"]}
            if not args.no_ray:
                from trawmem_gpu.score.ray_runner import ray_session, score_ray

                t0 = time.perf_counter()
                with ray_session(None, args.ray_workers):
                    init = time.perf_counter() - t0
                    s2 = score_ray(items, bank_dir, spec, Path(d) / f"ray{r}.jsonl", workers=args.ray_workers,
                                   progress=False)
                row |= {"ray_qps": s2["questions_per_s"], "ray_wall_s": s2["wall_s"], "ray_init_s": init,
                        "ray_steady_qps": s2["steady_questions_per_s"],
                        "ray_first_result_s": s2["first_result_s"], "ray_groups": s2["groups"],
                        "ray_timings_summed": s2["timings_summed_over_workers"],
                        "ratio": s2["questions_per_s"] / s["questions_per_s"],
                        "ratio_with_cluster_start": len(items) / (s2["wall_s"] + init) / s["questions_per_s"]}
                a = {x["id"]: x["units"] for x in _records(Path(d) / f"single{r}.jsonl")}
                b = {x["id"]: x["units"] for x in _records(Path(d) / f"ray{r}.jsonl")}
                row["ray_identical_sets"] = sum(a[k] == b.get(k) for k in a)
            rounds.append(row)
            print("throughput: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if isinstance(v, float)),
                  flush=True)
    out = {"questions": len(items), "workers": args.ray_workers, "rounds": rounds,
           "median_single_qps": statistics.median(r["single_qps"] for r in rounds)}
    if not args.no_ray:
        out |= {"median_ray_qps": statistics.median(r["ray_qps"] for r in rounds),
                "median_ratio": statistics.median(r["ratio"] for r in rounds),
                "median_ratio_with_cluster_start": statistics.median(r["ratio_with_cluster_start"] for r in rounds),
                "median_ray_first_result_s": statistics.median(r["ray_first_result_s"] for r in rounds)}
    return out


def _records(p):
    from trawmem_gpu.score import read_records

    return read_records(p)


def plot(res: dict):
    """The figure: recall against B, recall against tokens, selection rate and job throughput."""
    fig, ax = harness.figure(1, 3, figsize=(16, 4.5))
    by = {}
    for r in res["quality"]:
        by.setdefault(r["method"], []).append(r)
    for i, (m, rs) in enumerate(by.items()):
        b = [r for r in rs if r.get("token_budget") is None]
        t = [r for r in rs if r.get("token_budget") is not None]
        if b:
            ax[0].plot([r["budget"] for r in b], [r["macro"]["evidence_recall"] for r in b], "o-", label=m,
                       color=f"C{i}")
            ax[1].plot([r["macro"]["context_tokens"] for r in b], [r["macro"]["evidence_recall"] for r in b], "s--",
                       color=f"C{i}", ms=4)
        if t:
            ax[1].plot([r["macro"]["context_tokens"] for r in t], [r["macro"]["evidence_recall"] for r in t], "o-",
                       color=f"C{i}", label=m, ms=4)
    ax[0].set(xlabel="B (units)", ylabel="macro evidence recall", title="LongMemEval-S dev: recall vs B")
    ax[1].set(xlabel="context tokens (cl100k_base)", ylabel="macro evidence recall",
              title="recall vs tokens (dashed: B runs, solid: T runs)")
    ax[0].legend(fontsize=8)
    ax[1].legend(fontsize=7)
    names, vals = [], []
    sr = res.get("selection")
    if sr:
        names += ["reference", "batched"]
        vals += [sr["median_reference_qps"], sr["median_batched_qps"]]
    tp = res.get("throughput")
    if tp:
        names += ["job: single"]
        vals += [tp["median_single_qps"]]
        if "median_ray_qps" in tp:
            names += [f"job: ray x{tp['workers']}"]
            vals += [tp["median_ray_qps"]]
    ax[2].bar(names, vals)
    ax[2].set(ylabel="questions / s", title="selection rate and scoring throughput")
    ax[2].set_yscale("log")
    fig.tight_layout()
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(harness.dev_data("longmemeval")))
    ap.add_argument("--banks", help="collection directory (default: the cache directory `trawmem score` uses)")
    ap.add_argument("--head", help="learned role head (trawmem train-head); adds a trawmem+head row per B")
    ap.add_argument("--budgets", default="8,16,32")
    ap.add_argument("--token-budgets", default="400,800,1600", help="equal-token rows (empty: none)")
    ap.add_argument("--k", default="1,3,5,10,30,50")
    ap.add_argument("--build-sample", type=int, default=4, help="banks built cold and warm for the time split")
    ap.add_argument("--rounds", type=int, default=3, help="selection-rate rounds")
    ap.add_argument("--ray-workers", type=int, default=2)
    ap.add_argument("--ray-rounds", type=int, default=2, help="alternating single / Ray job rounds")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: build,quality,selection,throughput")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out-dir", help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    args = ap.parse_args()
    harness.require_data(args.data, "longmemeval")
    args.budgets = [int(x) for x in args.budgets.split(",")]
    args.token_budgets = [int(x) for x in args.token_budgets.split(",") if x.strip()]
    args.k = tuple(int(x) for x in args.k.split(","))
    skip = set(filter(None, args.skip.split(",")))

    import trawmem_gpu
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.data.longmemeval import load_longmemeval
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.ingest.cache import build_identity, build_log, default_bank_dir, ensure_collection
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.score.items import items_from_conversations
    from trawmem_gpu.store import Collection

    data = Path(args.data)
    convs = load_longmemeval(data)
    items = items_from_conversations(convs)
    ident = build_identity(file_sha256(data), BuildConfig(), "user")
    bank_dir = Path(args.banks) if args.banks else default_bank_dir(ident)
    enc = get_encoder(BuildConfig().encoder)
    res: dict = {"dataset": {"path": str(data), "sha256": ident["data_sha256"], "questions": len(items),
                             "banks": len(convs)},
                 "encoder": enc.id, "tokenizer": "tiktoken/cl100k_base", "package_version": trawmem_gpu.__version__,
                 "machine": harness.machine(),
                 "head": args.head, "budgets": args.budgets, "ks": list(args.k)}
    res["full_build"] = ensure_collection(convs, bank_dir, ident, BuildConfig(), encoder=enc)
    res["full_build_log"] = build_log(bank_dir)
    res["sharing"] = sharing(convs)
    if "build" not in skip:
        res["build_sample"] = build_sample(convs, args.build_sample)
        print("build sample:", json.dumps(res["build_sample"]), flush=True)
    t0 = time.perf_counter()
    coll = Collection(bank_dir)
    banks = [coll.load(c.bank_id) for c in convs]
    res["load_banks_s"] = round(time.perf_counter() - t0, 3)
    Z = enc.encode([it.question for it in items], is_query=True)
    head = args.head
    if "quality" not in skip:
        res["quality"] = quality(banks, items, Z, args, head, enc)
        res["token_budgets"] = args.token_budgets
        print("\n" + token_table(res["quality"]) + "\n", flush=True)
    if "selection" not in skip:
        res["selection"] = selection_rate(banks, items, Z, args, enc)
    if "throughput" not in skip:
        res["throughput"] = throughput(items, bank_dir, args)
    stem = "longmemeval" + (f"-{args.tag}" if args.tag else "")
    with harness.locked(stem, args.out_dir) as old:
        if skip:  # a partial rerun keeps the sections it skipped
            res = {**{k: v for k, v in old.items() if k not in res}, **res}
        path = harness.save(stem, res, plot(res) if res.get("quality") else None, out_dir=args.out_dir)
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
