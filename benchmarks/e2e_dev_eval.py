"""One full dev-set ``trawmem eval`` with answers and judging, against the local test server.

Starts the OpenAI-compatible test server of ``tests/support/llm_server.py`` in this process (its answers
are deterministic functions of the prompt, so the answer metrics say nothing about any model;
the point is the pipeline's requests, tokens and wall time), then runs exactly what
``trawmem eval --answer-llm URL --judge-llm URL@judge-model`` runs (``run_eval`` then
``add_answer_metrics``) twice: once with an empty LLM response cache, and once more to show the
resume (zero requests). Embeddings and banks come from the user's cache (``TRAWMEM_CACHE`` or
~/.cache/trawmem_gpu) unless ``--cold``, which puts every cache in a fresh temporary directory
(then construction and question encoding are timed from scratch).

    python -m benchmarks run e2e_dev_eval [--data PATH] [--method trawmem] [--cold] [--keep-records]

Writes ``benchmarks/results/e2e_dev_testserver.json`` (``--out`` to change).
"""
from __future__ import annotations

if not __package__:  # python benchmarks/NAME.py: run as the module benchmarks.NAME (_boot.py)
    import _boot
    _boot.run_file(__file__)

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from . import harness


def _one_run(args, server, llm_cache: Path) -> tuple[dict, dict]:
    from trawmem_gpu.eval.end_to_end import add_answer_metrics
    from trawmem_gpu.eval.retrieval import run_eval
    from trawmem_gpu.llm.cache import CachedBackend
    from trawmem_gpu.llm.spec import backend_from_spec
    from trawmem_gpu.notes import said_by
    from trawmem_gpu.select.config import SelectConfig

    ns = SimpleNamespace(data=str(args.data), banks=args.banks, answer_llm=server.base_url,
                         judge_llm=f"{server.base_url}@judge-model", method=args.method)
    answer = CachedBackend(backend_from_spec(ns.answer_llm, concurrency=args.concurrency), llm_cache)
    judge = CachedBackend(backend_from_spec(ns.judge_llm, concurrency=args.concurrency), llm_cache)
    server.reset_counts()
    t0 = time.perf_counter()
    with said_by(lambda line: print(line, file=sys.stderr, flush=True), lambda line: print(line, flush=True)):
        res = run_eval(args.data, args.method, SelectConfig(), categories=(1, 2, 3, 4), bank_cache=args.banks,
                       keep_records=True)  # the library's notes and summary shown as the command shows them
        t_retr = time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            add_answer_metrics(res, ns, answer_backend=answer, judge_backend=judge)
        finally:
            answer.close()
            judge.close()
    t_ans = time.perf_counter() - t1
    bench = {"retrieval_run_s": round(t_retr, 3), "answer_metrics_s": round(t_ans, 3),
             "total_s": round(t_retr + t_ans, 3),
             "server": {"chat_requests": server.requests, "model_list_requests": server.model_requests,
                        "max_in_flight": server.max_in_flight}}
    return res, bench


def _print(label: str, res: dict, bench: dict) -> None:
    ct = res["cost_table"]
    print(f"\n== {label}: {res['n_questions']} questions, {ct['n_conversations']} conversations, "
          f"method {res['method']} ==")
    print(f"server saw {bench['server']['chat_requests']} chat requests "
          f"(+{bench['server']['model_list_requests']} GET /models), peak {bench['server']['max_in_flight']} in flight")
    for stage in ("answer", "judge"):
        s = ct["llm_tokens"][stage]
        print(f"  {stage:6s}: {s['requests_sent']:5d} sent, {s['cache_hits']:5d} cached, "
              f"{s['prompt_tokens']:8d} prompt + {s['completion_tokens']:6d} completion tokens "
              f"({s['prompt_tokens_sent']} + {s['completion_tokens_sent']} sent), wall {s['wall_s']:.2f}s")
    c = ct["construction_s_per_conversation"]
    print(f"  retrieval run {bench['retrieval_run_s']:.1f}s (questions encoded "
          f"{res['timing']['encode_questions_s']:.1f}s, {ct['construction_detail']['question_embedding_cache_hits']} "
          f"from cache), answer+judge {bench['answer_metrics_s']:.1f}s, total {bench['total_s']:.1f}s")
    print(f"  per conversation: construction {'n/a' if c is None else f'{c:.2f}s'} "
          f"({ct['construction_source']}), retrieval {ct['retrieval_s_per_conversation']:.2f}s, "
          f"{ct['retrieval_s_per_query'] * 1000:.1f} ms/query; context {ct['context_tokens_per_question']:.0f} "
          f"tokens/question ({ct['tokenizer']}), answer prompt {ct['answer_prompt_tokens_per_question']:.0f}")
    m = res["macro"]
    print("  macro (test-server answers, not a model's): " + ", ".join(
        f"{k} {m[k]:.3f}" for k in ("f1_locomo", "f1_set", "bleu1", "judge")))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=harness.dev_data("locomo"))
    p.add_argument("--method", default="trawmem", choices=["trawmem", "cosine", "bm25", "hybrid", "full"])
    p.add_argument("--banks", help="bank cache directory (default: the user's cache)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--cold", action="store_true", help="every cache (embeddings, banks, LLM) in a fresh temp dir")
    p.add_argument("--keep-records", action="store_true", help="keep the per-question records in the output")
    p.add_argument("--out", type=Path, help="result file (default: e2e_dev_testserver.json in the results folder)")
    args = p.parse_args(argv)
    harness.require_data(args.data)
    out_path = harness.out_file(args.out, "e2e_dev_testserver.json")
    LLMServer = harness.tests_module("llm_server").LLMServer

    import trawmem_gpu

    tmp = Path(tempfile.mkdtemp(prefix="trawmem-e2e-"))
    if args.cold:
        os.environ["TRAWMEM_CACHE"] = str(tmp / "cache")
    server = LLMServer().start()
    try:
        res, bench = _one_run(args, server, tmp / "llm.sqlite")
        _print("run 1 (empty LLM cache)", res, bench)
        res2, bench2 = _one_run(args, server, tmp / "llm.sqlite")
        _print("run 2 (same run again: resume from the LLM cache)", res2, bench2)
    finally:
        server.stop()

    same = all(res2["macro"][k] == res["macro"][k] for k in ("f1_locomo", "f1_set", "bleu1", "judge"))
    out = {k: v for k, v in res.items() if args.keep_records or k != "records"}
    out["benchmark"] = {
        "what": "trawmem eval with --answer-llm/--judge-llm against tests/support/llm_server.py (deterministic fake "
                "answers: the answer metrics are pipeline checks, not model quality)",
        "command": "python -m benchmarks run e2e_dev_eval" + (" --cold" if args.cold else ""),
        "run1": bench, "run2_resume": bench2 | {"usage": res2["llm"]["usage"], "same_metrics": same},
        "caches": "cold (fresh temp dir)" if args.cold else "user's embedding and bank caches; fresh LLM cache",
        "package_version": trawmem_gpu.__version__,
    }
    for r in out.get("records", []):
        r.pop("llm_usage", None)
    path = harness.save(out_path.stem, out, out_dir=out_path.parent)
    print(f"\nsecond run sent {bench2['server']['chat_requests']} chat requests; metrics identical: {same}")
    print(f"wrote {path}")
    return 0 if bench2["server"]["chat_requests"] == 0 and same else 1


if __name__ == "__main__":
    sys.exit(main())
