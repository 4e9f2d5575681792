"""``trawmem eval --answer-llm ... [--judge-llm ...]``: answer-level metrics and a cost table.

:func:`add_answer_metrics` takes the result of :func:`trawmem_gpu.eval.retrieval.run_eval` (with
its per-question ``records``), rebuilds for every question the exact workspace text the answer
model gets (same banks, same selected turns, heads only for TrawMem), answers and judges every
question through the configured backends (one batched call per stage, each resumable from the
on-disk response cache), and adds to the result:

* ``macro`` / ``per_category[c]``: ``f1_locomo``, ``f1_set``, ``bleu1`` and, with a judge,
  ``judge`` (macro over categories 1-4, as ``answer_metrics.aggregate`` defines);
* per record: question, gold answer, prediction, the three scores, judge label and score,
  errors and the per-request token usage;
* ``llm``: answer and judge backends and models, the prompts (name, version, sha256), usage per
  stage (requests sent, cache hits, tokens, wall seconds) and error counts;
* ``cost_table``: the shape of the paper's Table 3, per conversation and as means (construction
  time, retrieval time per conversation and per query, answer time, total time, answer-context
  tokens per question, LLM tokens per stage), with the definitions written beside the figures
  (``eval.costs``).

API keys (``TRAWMEM_API_KEY`` / ``OPENAI_API_KEY``) are never written: the backends describe
themselves without them, and every string added here is scrubbed of them as a last guard.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time

from ..errors import ConfigError, InputError
from ..notes import note
from .costs import build_config, cost_table

log = logging.getLogger(__name__)

ANSWER_KEYS = ("f1_locomo", "f1_set", "bleu1")
"""Answer metrics added to ``macro`` and ``per_category`` (``judge`` too when a judge ran)."""

REFUSAL_GOLD = "Not mentioned in the conversation."
"""Gold answer used for category 5 (adversarial; scored as a refusal check when opted in)."""

_KEY_ENV = ("TRAWMEM_API_KEY", "OPENAI_API_KEY")

def _secrets() -> list[str]:
    return [v for k in _KEY_ENV if (v := os.environ.get(k))]


def _scrub(obj, secrets: list[str]):
    """``obj`` with every occurrence of each secret in any string replaced by '***'."""
    if not secrets:
        return obj
    if isinstance(obj, str):
        for s in secrets:
            if s in obj:
                obj = obj.replace(s, "***")
        return obj
    if isinstance(obj, dict):
        return {_scrub(k, secrets): _scrub(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub(v, secrets) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_scrub(v, secrets) for v in obj)
    return obj


def workspace_texts(res: dict, data_path, bank_cache=None, progress: bool = True):
    """``(texts, banks)``: the rendered workspace of every record of ``res`` (in record order),
    rebuilt from the same banks ``run_eval`` used, and the banks by id.

    Raises InputError when a record names a bank or turn the banks do not hold (the banks
    changed since the retrieval run).
    """
    from tqdm.auto import tqdm

    from ..data import load_conversations
    from ..select.config import SelectConfig
    from ..select.workspace import assemble, headings_for
    from .retrieval import banks_for

    records = res["records"]
    given = res.get("_workspaces")
    dayfirst = bool((res.get("dataset") or {}).get("dayfirst", False))
    convs = load_conversations(data_path, dayfirst=dayfirst)
    _, banks, _ = banks_for(data_path, build_config(res), bank_cache, progress, dayfirst=dayfirst, convs=convs)
    bank_of = {b.bank_id: b for b in banks}
    if given is not None:
        return [given[r["qid"]] for r in records], bank_of
    questions = {q.qid: q for c in convs for q in c.questions}
    sel = (res.get("config") or {}).get("select") or {}
    if sel and "headings" not in sel:  # a run from before headings were an option rendered the gist
        sel = sel | {"headings": "gist"}
    sel_cfg = SelectConfig.from_dict(sel)
    headings = headings_for(res.get("method"), sel_cfg)  # as the retrieval run rendered them
    views = None
    if res.get("method") == "trimem":  # its workspaces are the unit views' (facts, turns, profiles)
        from ..select.trimem.method import TriMemRankers

        views = TriMemRankers(bank_of)
    index = {}
    texts = []
    for r in tqdm(records, desc="workspaces", disable=not progress or len(records) < 2, leave=False):
        b = bank_of.get(r["bank_id"])
        if b is None:
            raise InputError(f"record {r['qid']}: bank {r['bank_id']!r} is not in the bank cache")
        if views is not None:
            b = views[b.bank_id].view
        idx = index.setdefault(b.bank_id, b.index_of())
        try:
            units = [idx[t] for t in r["selected"]]
        except KeyError as e:
            raise InputError(f"record {r['qid']}: turn {e.args[0]!r} is not in bank {b.bank_id!r}") from None
        ws = assemble(b, questions[r["qid"]].question, units, headings)
        if ws.unit_ids != list(r["selected"]):
            raise InputError(f"record {r['qid']}: rebuilt workspace differs from the retrieval run")
        texts.append(ws.render())
    return texts, bank_of


def _merge_metrics(res: dict, metrics: dict, keys: tuple) -> None:
    res.setdefault("macro", {})
    for k in keys:
        res["macro"][k] = metrics["macro"].get(k)
    res["macro"]["answer_n"] = metrics["macro"].get("n")
    per = res.setdefault("per_category", {})
    for c, d in metrics["per_category"].items():
        row = per.setdefault(c, {"n": d["n"]})
        for k in keys:
            row[k] = d.get(k)


def open_backends(a, *, check: bool = True) -> tuple:
    """``(answer backend, judge backend or None)`` from the ``trawmem eval`` namespace: cached
    backends from ``--answer-llm`` / ``--judge-llm`` with ``--llm-timeout``, ``--llm-retries`` and
    ``--llm-deadline``, each checked against the server first (``GET /v1/models``: reachable, key
    accepted, model served) so a wrong key or URL stops the run before retrieval. The same spec
    for both stages shares one backend. Close them with :func:`close_backends`."""
    from ..llm.factory import llm_from_args, llm_options

    answer_spec = getattr(a, "answer_llm", None)
    judge_spec = getattr(a, "judge_llm", None)
    if not answer_spec:
        raise ConfigError("`judge_llm` needs `answer_llm`: the judge grades the answer model's answers "
                          "(give `answer_llm` as http://HOST:PORT/v1[@MODEL] or vllm:MODEL_PATH)")
    opts = llm_options(a)
    answer = llm_from_args(answer_spec, check=check, **opts)
    judge = None
    if judge_spec:
        try:
            judge = answer if judge_spec.strip() == answer_spec.strip() else llm_from_args(judge_spec, check=check,
                                                                                           **opts)
        except BaseException:
            answer.close()
            raise
    return answer, judge


def close_backends(*backends) -> None:
    seen = set()
    for b in backends:
        if b is not None and id(b) not in seen:
            seen.add(id(b))
            b.close()


def failed_requests(res: dict) -> int:
    """Answer and judge requests that failed after retries in ``res`` (0 without an LLM run)."""
    c = (res.get("llm") or {}).get("counts") or {}
    return int(c.get("answer_errors", 0)) + int(c.get("judge_errors", 0))


def add_answer_metrics(res: dict, a, *, answer_backend=None, judge_backend=None, progress: bool = True) -> None:
    """Answer (and judge) every record of ``res`` and add the metrics, ``llm`` and ``cost_table``.

    ``a`` is the ``trawmem eval`` namespace (``answer_llm``, ``judge_llm``, ``data``, ``banks``).
    ``answer_backend`` / ``judge_backend`` are used when given (``trawmem eval`` opens and checks
    them before retrieval, see :func:`open_backends`); else they are opened from the specs here.
    A judge needs an answer model; without a judge the ``judge`` metrics are absent. Requests
    that failed are counted in ``res["llm"]["counts"]`` and in the printed summary, scored as
    wrong, and never cached: a rerun sends them again.
    """
    from ..data import load_conversations
    from .answer import answer_and_judge

    if answer_backend is None and not getattr(a, "answer_llm", None):
        raise ConfigError("`judge_llm` needs `answer_llm`: the judge grades the answer model's answers "
                          "(give `answer_llm` as http://HOST:PORT/v1[@MODEL] or vllm:MODEL_PATH)")
    if "records" not in res:
        raise ConfigError("answer metrics need the per-question records of the retrieval run")
    records = res["records"]
    secrets = _secrets()

    t0 = time.perf_counter()
    texts, banks = workspace_texts(res, a.data, getattr(a, "banks", None), progress)
    t_ws = time.perf_counter() - t0
    dayfirst = bool((res.get("dataset") or {}).get("dayfirst", False))
    qs = {q.qid: q for c in load_conversations(a.data, dayfirst=dayfirst) for q in c.questions}
    items = []
    for r, text in zip(records, texts):
        q = qs.get(r["qid"])
        if q is None:
            raise InputError(f"record {r['qid']}: no such question in {a.data}")
        gold = q.answer if q.answer is not None else (REFUSAL_GOLD if q.category == 5 else "")
        items.append({"qid": q.qid, "question": q.question, "category": q.category, "gold": gold,
                      "context": text})

    own = ()
    if answer_backend is None:
        answer_backend, judge_backend = open_backends(a, check=False)
        own = (answer_backend, judge_backend)
    try:
        run = answer_and_judge(items, answer_backend, judge_backend)
    finally:
        close_backends(*own)

    keys = ANSWER_KEYS + (("judge",) if judge_backend is not None else ())
    for r, it, o in zip(records, items, run.records):
        r.update({
            "question": it["question"], "gold_answer": it["gold"], "prediction": o["prediction"],
            "f1_locomo": o["f1_locomo"], "f1_set": o["f1_set"], "bleu1": o["bleu1"],
            "answer_error": o["answer_error"], "answer_refused": o["answer_refused"], "llm_usage": o["usage"],
            "context_sha256": hashlib.sha256(it["context"].encode("utf-8")).hexdigest()[:16],
        })
        if o.get("refused_answer"):
            r["refused_answer"] = o["refused_answer"]
        if judge_backend is not None:
            r.update({"judge": o["judge"], "judge_label": o["judge_label"], "judge_error": o["judge_error"]})
    _merge_metrics(res, run.metrics(), keys)
    res["llm"] = {
        "answer": run.models["answer"], "judge": run.models["judge"], "prompts": run.prompts,
        "usage": run.usage, "counts": run.counts | {"questions": len(items)},
        "options": {"temperature": 0.0, "answer_max_tokens": 96, "judge_max_tokens": 48,
                    "use_session_dates_cat2": True},
        "workspace_rebuild_s": round(t_ws, 4),
    }
    res["cost_table"] = cost_table(res, banks, run.usage, progress)
    res.update(_scrub({k: res[k] for k in ("llm", "cost_table", "records")}, secrets))
    _print_summary(res, keys)


def _failure_line(res: dict) -> str | None:
    """``answer: 41 of 81 requests failed, ...`` or None when nothing failed."""
    c = res["llm"]["counts"]
    n = c.get("questions", 0)
    parts = []
    if c.get("answer_errors"):
        parts.append(f"{c['answer_errors']} of {n} answer requests failed (scored wrong, not judged)")
    if c.get("answer_refused"):
        parts.append(f"{c['answer_refused']} of {n} answers refused (an echo of the question or a copy of the "
                     f"workspace's format: scored wrong, not judged)")
    if c.get("judge_errors"):
        parts.append(f"{c['judge_errors']} of {n - c.get('judge_skipped', 0)} judge requests failed (scored wrong)")
    if c.get("judge_unparsed"):
        parts.append(f"{c['judge_unparsed']} judgements unreadable (scored wrong)")
    return "; ".join(parts) or None


def _print_summary(res: dict, keys: tuple) -> None:
    m = res["macro"]
    ct = res["cost_table"]
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    parts = [f"{k} {fmt(m.get(k))}" for k in keys]
    fails = _failure_line(res)
    note(log, f"answers ({res['llm']['answer'].get('model')}"
              + (f", judge {res['llm']['judge'].get('model')}" if res["llm"]["judge"] else "")
              + "): macro " + ", ".join(parts) + (f" -- FAILURES: {fails}" if fails else ""), "stdout")
    for stage in ("answer", "judge"):
        s = ct["llm_tokens"].get(stage)
        if s:
            note(log, f"  {stage}: {s['requests_sent']} requests sent, {s['cache_hits']} from cache, "
                      f"{s['errors']} failed, {s['prompt_tokens']} prompt + {s['completion_tokens']} completion tokens, "
                      f"{s['wall_s']:.2f}s", "stdout")
    c, tk = ct["construction_s_per_conversation"], ct["context_tokens_per_question"]
    note(log, f"  per conversation: construction {'n/a' if c is None else f'{c:.2f}s'}, retrieval "
              f"{ct['retrieval_s_per_conversation']:.3f}s ({ct['retrieval_s_per_query'] * 1000:.2f} ms/query), "
              f"context {'n/a' if tk is None else f'{tk:.0f}'} tokens/question ({ct['tokenizer']})", "stdout")
