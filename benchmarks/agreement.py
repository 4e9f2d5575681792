"""Agreement of the batched SelectionEngine with the reference selection on the LoCoMo dev data.

Runs ``run_eval(..., engine="reference")`` and ``run_eval(..., engine="batched")`` over every
category 1-4 question with the same banks and the same query vectors, and reports the fraction
of questions whose selected *sets* are identical, the macro evidence recall of each engine (4
decimals), the selection seconds per query of each and the speedup. The batched time is also
measured warm (a second call on the same engine), since the first call pays one-off costs.

    python -m benchmarks run agreement [--data PATH] [--threads 1] [--sweep] [--out FILE]

``--threads`` caps torch / BLAS threads for both engines (default 1: per-core throughput, and
the numbers stay stable on a shared machine). ``--sweep`` adds hops 2, 3, every selection
ablation and the token budgets T = 400, 800, 1,600 (no unit cap; the cost-aware knapsack greedy),
where every workspace is also checked to hold at most T tokens, T = 800 with gist headings, and
the rank-fusion affinity with the paper's w_aff = 1 (the defaults before the equal-token work).
Every config is a pair (method config ``SelectConfig``, query parameters ``QueryParams``); one
engine per method config serves all of its pairs, and, for a method config with several pairs,
one more call gives each query its own pair's parameters (cycling through them), which must pick
what the single-parameter calls picked. ``--only NAME,...`` runs just the named configs. Exit 1
when any set differs, any workspace exceeds T or the mixed call differs. Results go to
``benchmarks/results/agreement.json``.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import sys
from pathlib import Path

from . import harness


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sweep", action="store_true", help="also hops 2, 3, every selection ablation and T = 400, "
                                                          "800, 1600")
    ap.add_argument("--only", help="comma-separated config names to run (e.g. token_budget=800)")
    ap.add_argument("--out", help="result file (default: agreement.json in the results folder)")
    args = ap.parse_args(argv)
    harness.require_data(args.data)
    with harness.pin_threads(args.threads):
        return run(args, harness.out_file(args.out, "agreement.json"))


def configs_of(args):
    """``(methods, configs)``: the method configs by name, and the ``(name, method name,
    QueryParams)`` triples to check (``--sweep``: all; ``--only``: those named); None, with a
    one-line error, when ``--only`` names an unknown config."""
    from trawmem_gpu.select.config import ABLATIONS, SelectConfig
    from trawmem_gpu.select.params import QueryParams

    # every config is a (method config, QueryParams) pair; one engine per method config serves
    # all of its pairs (the query parameters are per call)
    methods = {"default": SelectConfig(), "headings=gist": SelectConfig(headings="gist"),
               "affinity=rrf,w_aff=1": SelectConfig(affinity="rrf", w_aff=1.0)}
    methods |= {f"ablation={a}": SelectConfig(ablation=a) for a in ABLATIONS if a not in ("none", "fixed_segmentation")}
    tb = lambda t: QueryParams(token_budget=t, budget=None)  # noqa: E731 - no unit cap
    every = [("default", "default", QueryParams())]
    every += [(f"hops={h}", "default", QueryParams(hops=h)) for h in (2, 3)]
    every += [(m, m, QueryParams()) for m in methods if m.startswith("ablation=")]
    every += [(f"token_budget={t}", "default", tb(t)) for t in (400, 800, 1600)]
    every += [("token_budget=800,headings=gist", "headings=gist", tb(800)),
              ("affinity=rrf,w_aff=1", "affinity=rrf,w_aff=1", QueryParams())]
    if args.only:
        want = set(args.only.split(","))
        unknown = want - {n for n, _, _ in every}
        if unknown:
            print(f"error: --only: unknown config {sorted(unknown)[0]!r}; choose from "
                  f"{', '.join(n for n, _, _ in every)}", file=sys.stderr)
            return None
        return methods, [c for c in every if c[0] in want]
    return methods, every if args.sweep else every[:1]


def mixed_params(engines: dict, configs: list, picks_of: dict, batch, failed: list) -> list[dict]:
    """Per method config with two or more query-parameter sets: one call in which each query
    carries its own set picks what the single-set calls picked (a config that differs is added to
    ``failed``)."""
    ids, qs, Z = batch
    mixed = []
    for mname, eng in engines.items():  # one call, each query with its own params: the same picks
        mine = [(n, p) for n, m, p in configs if m == mname]
        if len(mine) < 2:
            continue
        plist = [mine[i % len(mine)][1] for i in range(len(ids))]
        got = eng.select_units(ids, qs, Z, params=plist)
        n_differ = sum(g != picks_of[mine[i % len(mine)][0]][i] for i, g in enumerate(got))
        mixed.append({"method_config": mname, "configs": [n for n, _ in mine], "n_questions": len(ids),
                      "n_differ_from_single_params_calls": int(n_differ)})
        print(f"{mname:>28}: one call mixing {', '.join(n for n, _ in mine)} per query: {n_differ} of "
              f"{len(ids)} picks differ from the single-params calls", flush=True)
        if n_differ:
            failed.append(f"{mname} (mixed params)")
    return mixed


def record(args, cats, banks, eng, runs: list, mixed: list) -> dict:
    """The result file's record: the data, the last engine's device and dtype, every run."""
    import os

    out = {
        "data": os.path.basename(args.data), "categories": list(cats), "n_banks": len(banks),
        "units": int(sum(b.n_units for b in banks)), "threads_per_bank_max": int(max(b.n_threads for b in banks)),
        "device": str(eng.device), "dtype": str(eng.dtype), "torch_threads": args.threads,
        "machine": harness.machine(threads=args.threads),
        "note": "Reference = select_reference per query (NumPy float64); batched = SelectionEngine over all "
                "questions in one call (float64 on CPU, float32 on CUDA). Identical sets compare the selected "
                "turn ids as sets. Timings exclude engine construction and query encoding; the BM25 and "
                "question-feature stages run on the CPU in both.",
        "runs": runs, "mixed_params": mixed,
    }
    return out


def run(args, out_path: Path) -> int:
    import time

    import numpy as np

    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.retrieval import banks_for, run_eval
    from trawmem_gpu.select.engine import SelectionEngine

    build_cfg = BuildConfig()
    convs, banks, _ = banks_for(args.data, build_cfg, progress=False)
    cats = (1, 2, 3, 4)
    items = [(c.bank_id, q) for c in convs for q in c.questions if q.category in cats and q.evidence]
    Z = np.asarray(get_encoder(build_cfg.encoder).encode([q.question for _, q in items], is_query=True,
                                                         progress=False))
    chosen = configs_of(args)
    if chosen is None:
        return 2
    methods, configs = chosen
    ids, qs = [b for b, _ in items], [q.question for _, q in items]
    engines, picks_of, runs, failed = {}, {}, [], []
    for name, mname, params in configs:
        cfg = methods[mname]
        kw = dict(select_cfg=cfg, build_cfg=build_cfg, categories=cats, progress=False,
                  banks_and_convs=(convs, banks), query_vecs=Z, params=params)
        ref = run_eval(args.data, "trawmem", engine="reference", **kw)
        bat = run_eval(args.data, "trawmem", engine="batched", **kw)
        same = [set(a["selected"]) == set(b["selected"]) for a, b in zip(ref["records"], bat["records"])]
        in_order = [a["selected"] == b["selected"] for a, b in zip(ref["records"], bat["records"])]
        if mname not in engines:
            engines[mname] = SelectionEngine(banks, cfg)
        eng = engines[mname]
        eng.select_units(ids, qs, Z, params=params)
        t0 = time.perf_counter()
        picks_of[name] = eng.select_units(ids, qs, Z, params=params)
        warm = (time.perf_counter() - t0) / len(items)
        stages = {k: round(v / len(items) * 1e6, 1) for k, v in eng.last_timings.items()}
        over = None
        if params.token_budget is not None:  # every workspace, of both engines, within T
            over = sum(r["context_tokens"] > params.token_budget for r in ref["records"] + bat["records"])
        r_ref, r_bat = ref["macro"]["evidence_recall"], bat["macro"]["evidence_recall"]
        t_ref, t_bat = ref["selection_seconds_per_query"], bat["selection_seconds_per_query"]
        run = {
            "config": name, "method_config": mname, "params": params.to_dict(), "n_questions": len(same), "identical_sets": round(float(np.mean(same)), 6),
            "n_differ": int(len(same) - sum(same)),
            "differ_qids": [r["qid"] for r, s in zip(ref["records"], same) if not s][:20],
            "source_order_identical": round(float(np.mean(in_order)), 6),
            "macro_evidence_recall": {"reference": round(r_ref, 4), "batched": round(r_bat, 4),
                                      "agree_to_3_decimals": round(r_ref, 3) == round(r_bat, 3)},
            "selection_seconds_per_query": {"reference": t_ref, "batched_first_call": t_bat,
                                            "batched_warm": warm},
            "speedup": {"first_call": t_ref / t_bat, "warm": t_ref / warm},
            "batched_stage_us_per_query": stages,
        }
        if over is not None:
            run["token_budget"] = params.token_budget
            run["workspaces_over_token_budget"] = int(over)
            run["context_tokens_mean"] = {"reference": round(ref["macro"]["context_tokens"], 1),
                                          "batched": round(bat["macro"]["context_tokens"], 1)}
        runs.append(run)
        print(f"{name:>28}: identical sets {run['identical_sets']:.4f} ({run['n_differ']} differ) | recall "
              f"ref {r_ref:.4f} batched {r_bat:.4f} | s/query ref {t_ref * 1e3:.3f} ms, batched "
              f"{t_bat * 1e3:.3f} ms (warm {warm * 1e3:.3f} ms) | speedup {t_ref / t_bat:.1f}x "
              f"(warm {t_ref / warm:.1f}x)", flush=True)
        print(f"{'':>28}  batched stages (us/query): {stages}", flush=True)
        if over is not None:
            print(f"{'':>28}  workspaces over T={params.token_budget}: {over}; mean tokens "
                  f"{run['context_tokens_mean']}", flush=True)
        if run["n_differ"] or over:
            failed.append(name)
    mixed = mixed_params(engines, configs, picks_of, (ids, qs, Z), failed)
    out = record(args, cats, banks, eng, runs, mixed)
    print(f"wrote {harness.save(out_path.stem, out, out_dir=out_path.parent)}")
    if failed:
        print(f"error: the engine and the reference disagree in {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
