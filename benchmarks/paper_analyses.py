"""The paper's retrieval-side analyses (Sections 5.4-5.8 and 6), with its numbers beside ours.

    python -m benchmarks run paper_analyses [--data PATH] [--modes default,paper] \
        [--parts fig7,fig8,fig9,fig10,fig12,table3] [--llm SPEC] [--out benchmarks/results]

On the LoCoMo file given (categories 1-4, questions with gold evidence), for the shipped
defaults (``SelectConfig()``, ``QueryParams()``) and the paper-faithful configuration
(``SelectConfig.paper()`` with ``QueryParams(hops=PAPER_HOPS)``), each at B = 16 and its own H
unless the figure varies it:

- Fig. 8, workspace compression: candidate and selected units per category and the reduction
  ratio c_q = 1 - |S_q| / |U_q| (mean, median), 95% intervals from 2,000 bootstrap resamples of
  whole conversations;
- Fig. 9, coverage and redundancy against B: distinct relevant facts retained and repeated
  fact mentions for Random, Top-B cosine, Top-B hybrid (RRF) and TrawMem, with LoCoMo's
  ``observation`` facts as the annotation (definitions in ``trawmem_gpu/eval/analyses.py``);
- Fig. 10, context length (CDF per category; tokenizer tiktoken ``cl100k_base``) and
  retrieval time per query by category;
- Fig. 12, distinct threads per workspace by category and units per used thread;
- Fig. 7, role shifts: for a unit that is the only gold turn of one question and one of several
  gold turns of another, and is selected by both, the change of its (anchor, bridge, context)
  weights rho between the two;
- Table 3, efficiency columns for H = 1, 2, 3: construction and retrieval time per conversation
  ("root") and answer-context tokens; construction with extractive heads, and with LLM
  segmentation and heads when ``--llm`` names a server.

Timing follows ``trawmem sweep`` (``trawmem_gpu/eval/sweep.py``): banks built one conversation
at a time with the embedding cache off, each question encoded alone with the cache off, each
query selected alone with the configurations interleaved query by query; BLAS / torch pools
at ``--threads`` (default 1) for all of it, builds included. Writes ``paper_<part>.json`` and ``.png`` per part and
``paper_vs_ours.json`` / ``.md`` under ``--out`` (default: the results folder, or
``TRAWMEM_BENCH_OUT``); metrics only, never data text. The parts live in ``benchmarks/paper_bench/``.
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import sys
import time

from . import harness
from .paper_bench.common import query_rows
from .paper_bench.figures import fig8, fig10, fig12
from .paper_bench.paper import CATS, FIG9_BUDGETS, HOPS, PARTS, WHY, B
from .paper_bench.roles import fig7, fig9
from .paper_bench.table3 import summary, table3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(harness.dev_data("locomo")))
    ap.add_argument("--modes", default="default,paper", help="default (SelectConfig()) and/or paper (SelectConfig.paper())")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--llm", help="LLM for the construction-time row with LLM segmentation and heads")
    ap.add_argument("--out", help="results folder (default: benchmarks/results or TRAWMEM_BENCH_OUT)")
    ap.add_argument("--fig9-budgets", default=",".join(map(str, FIG9_BUDGETS)))
    ap.add_argument("--random-draws", type=int, default=5)
    ap.add_argument("--max-conversations", type=int, help="only the first N conversations (quick runs)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS / torch threads of every timed path (builds too)")
    args = ap.parse_args(argv)

    from trawmem_gpu.eval.sweep import parse_int_list
    from trawmem_gpu.select.config import PAPER_HOPS, SelectConfig
    from trawmem_gpu.select.params import QueryParams

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"--parts: unknown part {bad[0]!r}; choose from {', '.join(PARTS)}")
    mode_names = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not mode_names or any(m not in ("default", "paper") for m in mode_names):
        ap.error("--modes: give default and/or paper")
    # each mode: its method config and its query parameters (the paper's H is a per-query choice)
    modes = {m: (SelectConfig.paper(), QueryParams(budget=B, hops=PAPER_HOPS)) if m == "paper"
             else (SelectConfig(), QueryParams(budget=B)) for m in mode_names}
    try:
        args.fig9_budgets = parse_int_list(args.fig9_budgets, 1)
    except ValueError as e:
        ap.error(f"--fig9-budgets: {e}")
    return run(args, parts, mode_names, modes)


def write_summary(out: Path, meta: dict, rows: list[dict], table: str) -> None:
    """``paper_vs_ours.json`` / ``.md`` under ``out``, and the table and the reasons printed."""
    harness.save("paper_vs_ours", {**meta, "rows": rows}, out_dir=out)
    harness.write_text(out / "paper_vs_ours.md", table + "\n")
    print(table)
    print("\nWhy our numbers differ:")
    for k, v in WHY.items():
        print(f"- {k}: {v}")
    print(f"\nwrote paper_*.json / .png and paper_vs_ours.json / .md under {out} "
          f"({meta['wall_s']:.0f} s)")


def run(args, parts: list[str], mode_names: list[str], modes: dict) -> int:
    """Build the banks (timed), select with every mode interleaved, run ``parts``, write the results."""
    from tqdm.auto import tqdm

    import trawmem_gpu
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.data import load_conversations
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.eval.sweep import (
        Cell,
        CellRunner,
        build_timed,
        encode_timed,
        interleave,
        question_items,
    )
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.tokens import TOKENIZER_NAME

    harness.require_data(args.data)
    out = harness.results_dir(args.out)
    t_start = time.perf_counter()
    load0 = harness.machine()["loadavg_1m"]

    convs = load_conversations(args.data)[:args.max_conversations]
    items = question_items(convs, CATS)
    build_cfg = BuildConfig()
    enc = get_encoder(build_cfg.encoder, cache=False)
    print(f"{len(convs)} conversations, {len(items)} questions; building banks (timed, embedding cache off)")
    llm_rows = None
    runners: dict[tuple[str, int], CellRunner] = {}
    with harness.pin_threads(args.threads):
        banks_list, build_rows = build_timed(convs, build_cfg, enc)
        if args.llm and "table3" in parts:
            from trawmem_gpu.llm.spec import backend_from_spec

            llm_cfg = BuildConfig(**(build_cfg.to_dict() | {"segmentation": "llm", "heads": "llm"}))
            _, llm_rows = build_timed(convs, llm_cfg, enc, llm=backend_from_spec(args.llm))
        banks = {b.bank_id: b for b in banks_list}
        ctxs = {b: BankContext.of(bank) for b, bank in banks.items()}
        need_runs = any(p in parts for p in ("fig7", "fig8", "fig10", "fig12", "table3"))
        hop_set = HOPS if "table3" in parts else ()
        Z, enc_s = encode_timed(enc, [q.question for _, q in items])
        if need_runs:
            for m, (cfg, params) in modes.items():
                for h in sorted(set(hop_set) | {params.hops}):
                    runners[(m, h)] = CellRunner(Cell("trawmem", B, h), banks, ctxs, cfg, "reference", args.threads,
                                                 base_params=params)
            interleave(list(runners.values()), items, Z, keep_selections=True,
                       desc=f"select B={B} ({len(runners)} configurations interleaved)")
        res: dict[str, dict] = {}
        own = {m: runners[(m, params.hops)] for m, (_, params) in modes.items()} if need_runs else {}
        rows_by_mode = {m: query_rows(r, items, banks, enc_s) for m, r in own.items()}
        for p in tqdm(parts, desc="analyses"):
            if p == "fig8":
                res[p] = fig8(rows_by_mode, out)
            elif p == "fig10":
                res[p] = fig10(rows_by_mode, out, TOKENIZER_NAME, enc.id)
            elif p == "fig12":
                res[p] = fig12(rows_by_mode, out)
            elif p == "fig7":
                res[p] = fig7(own, items, banks, out)
            elif p == "fig9":
                res[p] = fig9(args, modes, items, banks, ctxs, Z, out)
            elif p == "table3":
                res[p] = table3({k: v for k, v in runners.items() if k[1] in HOPS}, items, enc_s, build_rows,
                                llm_rows, out, args.llm)
    rows, table = summary(res, mode_names)
    meta = {"command": harness.command(),
            "dataset": {"path": str(args.data), "sha256": file_sha256(args.data)}, "questions": len(items),
            "categories": list(CATS), "budget": B, "encoder": enc.id, "tokenizer": TOKENIZER_NAME,
            "select_configs": {m: c.to_dict() for m, (c, _) in modes.items()},
            "query_params": {m: p.to_dict() for m, (_, p) in modes.items()}, "build_config": build_cfg.to_dict(),
            "package_version": trawmem_gpu.__version__, "query_threads": args.threads,
            "machine": harness.machine(loadavg_1m_before=load0),
            "wall_s": round(time.perf_counter() - t_start, 1), "why_numbers_differ": WHY}
    write_summary(out, meta, rows, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
