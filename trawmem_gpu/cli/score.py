"""``trawmem score``: offline scoring of a batch of questions into a workspaces JSONL.

Two inputs: a benchmark file (LongMemEval or LoCoMo, picked from the content) whose banks are
built or reused automatically, or an existing collection (``--banks``) plus a questions JSONL
(``--questions``). See :mod:`trawmem_gpu.score`.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .args import banks_cache_dir
from ..errors import InputError, plural


def ks_list(text: str) -> tuple[int, ...]:
    """``--k 1,5,10`` -> (1, 5, 10): the k of the official metrics."""
    import argparse

    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1 or max(ks) > 100_000:
        raise argparse.ArgumentTypeError(f"expected integers in 1..100000, got {text!r}")
    return tuple(dict.fromkeys(ks))


def _spec(a):
    from .query import _select_config
    from ..score.job import ScoreSpec

    if a.head and not Path(a.head).exists():
        raise InputError(f"--head {a.head}: file not found")
    cfg, qp = _select_config(a)
    return ScoreSpec(method=a.method, select={**cfg.to_dict(), **qp.to_dict()}, engine=a.engine, head=a.head,
                     ks=a.k, threads=a.threads, answer_llm=a.answer_llm, layers=a.layers)


def _benchmark(a):
    """(conversations, items, collection dir, build stats) for ``--data``."""
    from ..ingest.config import BuildConfig
    from ..data import check_input_file, detect_format, load_conversations
    from ..data.longmemeval import load_longmemeval
    from ..ingest.cache import build_identity, default_bank_dir, ensure_collection
    from ..paths import file_sha256
    from ..score.items import items_from_conversations

    path = check_input_file(a.data)
    fmt = detect_format(path) if a.format == "auto" else a.format
    if fmt == "jsonl":
        raise InputError("--data takes a benchmark file (LongMemEval or LoCoMo); for your own histories build a "
                         "collection with `trawmem build` and pass --banks and --questions")
    convs = load_longmemeval(path, a.units, dayfirst=a.dayfirst) if fmt == "longmemeval" else \
        load_conversations(path, fmt, dayfirst=a.dayfirst)
    cats = None if fmt == "longmemeval" else a.categories
    items = _limit(items_from_conversations(convs, cats), a)
    if a.max_questions:  # only the sample's banks are built
        wanted = {it.bank_id for it in items}
        convs = [c for c in convs if c.bank_id in wanted]
    cfg = BuildConfig.from_dict({"encoder": a.encoder} if a.encoder else {})
    ident = build_identity(file_sha256(path), cfg, a.units if fmt == "longmemeval" else "all", dayfirst=a.dayfirst)
    bank_dir = Path(a.banks) if a.banks else default_bank_dir(ident)
    build_chunks = enc = None
    if a.ray:
        from ..score.ray_runner import ray_chunk_builder

        build_chunks = ray_chunk_builder(a.ray_address, a.ray_workers)
    else:
        from ..encode import get_encoder

        enc = get_encoder(cfg.encoder, cache=not a.no_cache)
    st = ensure_collection([c for c in convs if any(True for _ in c.turns)], bank_dir, ident, cfg, encoder=enc,
                           progress=not a.quiet, build_chunks=build_chunks, data_path=path)
    return items, bank_dir, st


def _limit(items, a):
    """``--max-questions N``: a stratified sample (by question type; reproducible with --seed)."""
    from collections import Counter

    from ..score.items import stratified_sample

    if not a.max_questions or a.max_questions >= len(items):
        return items
    out = stratified_sample(items, a.max_questions, a.seed)
    types = Counter(it.qtype for it in out if it.qtype)
    by_type = f" ({', '.join(f'{t} {n}' for t, n in sorted(types.items()))})" if types else ""
    print(f"--max-questions {a.max_questions}: {len(out)} of {len(items)} questions, stratified by type, "
          f"seed {a.seed}{by_type}", file=sys.stderr, flush=True)
    return out


def cmd_score(a) -> int:
    if a.encoder_runtime:
        os.environ["TRAWMEM_ENCODER_RUNTIME"] = a.encoder_runtime
    from ..score.items import read_questions
    from ..score.job import run_score
    from ..score.writer import answer_failures, summarize_output

    spec = _spec(a)
    if a.data and a.questions:
        raise InputError("give either --data (a benchmark file) or --banks with --questions, not both")
    build_stats = None
    if a.data:
        items, bank_dir, build_stats = _benchmark(a)
    elif a.questions:
        if not a.banks:
            raise InputError("--questions needs --banks (a collection built with `trawmem build`)")
        items, bank_dir = _limit(read_questions(a.questions, dayfirst=a.dayfirst), a), Path(a.banks)
    else:
        raise InputError("nothing to score: give --data FILE, or --banks DIR with --questions FILE")
    if a.ray:
        from ..score.ray_runner import ray_session, score_ray

        with ray_session(a.ray_address, a.ray_workers):
            summary = score_ray(items, bank_dir, spec, a.out, address=a.ray_address, workers=a.ray_workers,
                                group_size=a.group_size, progress=not a.quiet, overwrite=a.overwrite,
                                rescore_changed=a.rescore_changed)
    else:
        summary = run_score(items, bank_dir, spec, a.out, batch_size=a.batch_size, progress=not a.quiet,
                            overwrite=a.overwrite, rescore_changed=a.rescore_changed)
    summary["build"] = build_stats
    summary["banks"] = str(bank_dir)
    summary["metrics"] = summarize_output(a.out)
    summary["answer_errors"] = answer_failures(a.out) if spec.answer_llm else 0
    sp = Path(a.summary or (str(a.out) + ".summary.json"))
    tmp = sp.with_name(sp.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    os.replace(tmp, sp)
    tm = summary.get("timings") or summary.get("timings_summed_over_workers") or {}
    split = ", ".join(f"{k} {v:.2f}s" for k, v in tm.items())
    print(f"scored {plural(summary['scored_now'], 'question')} in {summary['wall_s']:.1f}s "
          f"({summary['questions_per_s']:.1f} questions/s, {summary['runner']}); "
          f"{summary['skipped_already_written']} already in {a.out}")
    if split:
        print(f"time split: {split}")
    if build_stats and build_stats.get("banks_built"):
        b = build_stats
        print(f"built {plural(b['banks_built'], 'bank')} ({plural(b['units_built'], 'unit')}, "
              f"{b['units_per_s']:.0f} units/s), reused {b['banks_reused']}")
    m = summary["metrics"]
    if m and m.get("macro"):
        print(f"{m['n_scored']} scored questions (skipped {m['skipped_abstention']} abstention, "
              f"{m['skipped_no_gold']} without gold): macro evidence recall {m['macro']['evidence_recall']:.3f}, "
              f"all-evidence hit {m['macro']['all_evidence_hit']:.3f}, tokens {m['macro']['context_tokens']:.0f}")
        for lvl in ("turn", "session"):
            row = m["official"].get(lvl, {})
            print(f"  official {lvl}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
    for k, what in (("rescored_changed", "changed since they were written, scored again"),
                    ("retried_answers", "whose answer had failed, answered again")):
        if summary.get(k):
            print(f"{plural(summary[k], 'record')} {what}")
    if summary.get("llm"):
        from ..llm.base import work_line

        print(work_line(summary["llm"]["totals"]))
    print(f"summary -> {sp}")
    failed = summary["answer_errors"]
    if failed:
        print(f"answers: {plural(failed, 'request')} of {summary['questions']} failed (answer null in {a.out}); "
              "rerun the same command to retry only them")
    if failed > a.allow_failures:
        print(f"trawmem score: error: {plural(failed, 'LLM request')} failed (more than --allow-failures "
              f"{a.allow_failures}); rerun the same command to retry only them, or raise --allow-failures",
              file=sys.stderr)
        return 1
    return 0


def configure(s) -> None:
    from .args import add_ablation, add_affinity_weights, add_dayfirst, add_engine, add_head, add_method, \
        add_query_params, categories, nonneg_int, positive_int
    s.describe("Select a workspace for every question of a benchmark file (--data: LongMemEval or LoCoMo, its "
               "banks built or reused automatically) or of a questions JSONL over a collection (--banks with "
               "--questions), appending one JSON line per question to --out. A rerun resumes: questions already "
               "in --out are skipped. Official retrieval metrics go to the summary JSON.")
    s.add_argument("--data", help="benchmark file: LongMemEval (.json/.json.gz) or LoCoMo; banks built automatically "
                                  "(default: none; give --data, or --banks with --questions)")
    s.add_argument("--format", choices=["auto", "longmemeval", "locomo"], default="auto",
                   help="format of --data; auto tells LongMemEval from LoCoMo by the content")
    s.add_argument("--units", choices=["user", "all"], default="user",
                   help="LongMemEval units: user turns (official) or all turns")
    from .args import units_list

    s.add_argument("--layers", type=units_list, default=("turns",), metavar="L,L,...",
                   help="the layers selection takes units from: turns, facts, profiles (what --units is on query, "
                        "eval, sweep and serve; here --units names LongMemEval's turns); the banks must hold them")
    s.add_argument("--categories", type=categories, default="1,2,3,4", metavar="C,C,...",
                   help="LoCoMo categories to score")
    add_dayfirst(s)
    s.add_argument("--banks", help="collection directory (with --questions), or where --data's banks go (default: "
                                   f"an automatic cache under {banks_cache_dir()})")
    s.add_argument("--questions", help="questions JSONL: {id, bank_id, question, date?} per line (default: none; "
                                       "the questions of --data)")
    s.add_argument("--out", required=True, help="workspaces JSONL (appended; a rerun skips written ids)")
    s.add_argument("--summary", help="summary JSON (default: OUT.summary.json)")
    s.add_argument("--overwrite", action="store_true", help="start --out afresh instead of resuming it")
    s.add_argument("--max-questions", type=positive_int, metavar="N",
                   help="score a sample of N questions, stratified by question type (only their banks are "
                        "built); the same N and --seed give the same sample, a larger N extends a smaller one "
                        "(default: every question)")
    s.add_argument("--seed", type=nonneg_int, default=0, help="seed of the --max-questions sample")
    s.add_argument("--rescore-changed", action="store_true",
                   help="on resume, score again the written records whose question, date, bank or config no longer "
                        "match the input (without it such a record is an error naming it)")
    add_method(s, trimem_llm=False)
    add_query_params(s, fill=True)
    add_ablation(s)
    s.add_argument("--paper", action="store_true", help="Section 4.2 exactly as written")
    add_engine(s)
    add_head(s)
    add_affinity_weights(s)
    s.add_argument("--k", type=ks_list, default="1,3,5,10,30,50", metavar="K,K,...",
                   help="k of the official metrics")
    s.add_argument("--encoder", help="encoder for banks built from --data: 'minilm' or 'hf:/local/dir' "
                                     "(default: minilm)")
    s.add_argument("--encoder-runtime", choices=["torch", "onnx", "auto"],
                   help="CPU encoder runtime: onnx = ONNX Runtime, same vectors within 1e-5, faster on CPUs "
                        "(pip install -e .[onnx]) (default: TRAWMEM_ENCODER_RUNTIME, else torch)")
    s.add_argument("--no-cache", action="store_true", help="do not use the on-disk embedding cache")
    s.add_argument("--answer-llm", help="answer each question: http://HOST:PORT/v1[@MODEL] or vllm:MODEL_PATH "
                                        "(default: none, workspaces only)")
    s.add_argument("--allow-failures", type=nonneg_int, default=0, metavar="N",
                   help="exit status 1 when more than N answer requests failed (they are written with answer null, "
                        "and a rerun retries them)")
    s.add_argument("--batch-size", type=positive_int, default=1024, help="questions per engine batch (whole banks)")
    s.add_argument("--threads", type=positive_int, help="engine worker threads (default: all cores)")
    s.add_argument("--ray", action="store_true", help="run on Ray Data (local instance unless --ray-address)")
    s.add_argument("--ray-address", help="address of a running Ray cluster, e.g. ray://HOST:10001 or auto (default: "
                                         "start a local one)")
    s.add_argument("--ray-workers", type=positive_int, default=2, help="scoring actors (and build actors)")
    s.add_argument("--group-size", type=positive_int, help="questions per Ray group (default: about 4 groups per worker)")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(fn=cmd_score)
