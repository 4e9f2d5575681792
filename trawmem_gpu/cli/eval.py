"""``trawmem eval``: retrieval (and optionally answer) quality over LoCoMo-layout data."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .args import add_ablation, add_affinity_weights, add_dayfirst, add_engine, add_head, add_llm_options, \
    add_method, add_query_params, add_units, banks_cache_dir, categories, nonneg_int
from ..errors import plural


def cmd_eval(a) -> int:
    from ..eval.end_to_end import add_answer_metrics, close_backends, failed_requests, open_backends
    from ..eval.retrieval import run_eval
    from .query import _load_head, _plan_llm, _select_config

    cfg, qp = _select_config(a)
    head = _load_head(a.head)
    answer = judge = None
    if a.answer_llm or a.judge_llm:  # checked first: a wrong URL, key or model stops here, before retrieval
        answer, judge = open_backends(a)
    from ..llm.base import LLMWork, work_line

    plan = None
    try:
        plan = _plan_llm(a)
        with LLMWork(plan, answer, judge) as work:
            res = run_eval(a.data, a.method, cfg, categories=a.categories, engine=a.engine, head=head,
                           bank_cache=a.banks, keep_records=True, dayfirst=a.dayfirst, params=qp, units=a.units,
                           facts=a.facts, plan_llm=plan, follow_up=a.follow_up)
            if answer is not None:
                add_answer_metrics(res, a, answer_backend=answer, judge_backend=judge)
        res["llm_work"] = work.report()
    finally:
        close_backends(answer, judge, plan)
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    m = res["macro"]
    mh = res["per_category"].get("1", {}).get("all_evidence_hit")
    size = f"B={qp.budget}" if qp.token_budget is None else \
        f"T={qp.token_budget}" + (f" B={qp.budget}" if qp.budget is not None else "")
    print(f"{a.method} {size} H={qp.hops} ablation={cfg.ablation}: macro evidence recall "
          f"{m['evidence_recall']:.3f}, all-evidence hit {m['all_evidence_hit']:.3f}, "
          f"multi-hop hit {'n/a' if mh is None else f'{mh:.3f}'}, context tokens {m['context_tokens']:.0f} over "
          f"{plural(res['n_questions'], 'question')} -> {out}")
    if "evidence_recall_cited" in m:
        what = "trimem" if a.method == "trimem" else f"units {','.join(a.units)}"
        print(f"{what}: macro evidence recall with citations {m['evidence_recall_cited']:.3f}, "
              f"per workspace {m['n_turns']:.1f} turns, {m['n_facts']:.1f} facts, {m['n_profiles']:.1f} profile "
              f"sections")
    if res.get("llm_work"):
        print(work_line(res["llm_work"]["totals"]))
    failed = failed_requests(res)
    if failed > a.allow_failures:
        print(f"trawmem eval: error: {plural(failed, 'LLM request')} failed (more than --allow-failures "
              f"{a.allow_failures}); they are scored wrong in {out}. Rerun the same command to retry only them "
              f"(answers that succeeded come from the cache), or raise --allow-failures", file=sys.stderr)
        return 1
    return 0


def configure(e) -> None:
    from ..llm.spec import SPEC_HELP

    e.describe("Select for every question with gold evidence and score evidence recall, "
               "all-evidence hit and context tokens per category; with --answer-llm also "
               "answer F1 / BLEU-1 and, with --judge-llm, LLM-judge accuracy. Exit status 1 "
               "when more LLM requests failed than --allow-failures (results are still "
               "written; a rerun retries only the failed requests).")
    e.add_argument("--data", required=True, help="LoCoMo-layout JSON with questions and evidence")
    add_dayfirst(e)
    add_method(e)
    add_query_params(e, fill=True)
    add_ablation(e)
    e.add_argument("--paper", action="store_true", help="Section 4.2 exactly as written")
    add_engine(e)
    add_head(e)
    add_affinity_weights(e)
    add_units(e, facts=True)
    e.add_argument("--categories", type=categories, default="1,2,3,4", metavar="C,C,...",
                   help="LoCoMo question categories to score")
    e.add_argument("--banks", help="bank directory: built into when new or empty, else used only if its banks "
                                   f"match the data (default: an automatic cache under {banks_cache_dir()})")
    e.add_argument("--answer-llm", help=f"answer model: {SPEC_HELP} (default: none, retrieval metrics only)")
    e.add_argument("--judge-llm", help=f"judge model: {SPEC_HELP} (default: none, no judge accuracy)")
    add_llm_options(e)
    e.add_argument("--allow-failures", type=nonneg_int, default=0, metavar="N",
                   help="LLM requests that may fail (after retries) before the exit status turns 1")
    e.add_argument("--output", required=True, help="result JSON to write")
    e.set_defaults(fn=cmd_eval)
