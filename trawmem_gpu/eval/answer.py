"""Answer questions from workspaces and judge them: one batched call per stage."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from trawmem_gpu.errors import InputError
from trawmem_gpu.eval.answer_metrics import aggregate, all_metrics
from trawmem_gpu.llm.base import LLMBackend, LLMResult, UsageMeter
from trawmem_gpu.llm.prompts import ANSWER, ANSWER_TEMPORAL, JUDGE, answer_prompt
from trawmem_gpu.llm.structured import clean_answer, parse_judge

_REQUIRED = ("qid", "question", "category", "gold", "context")


@dataclass
class AnswerJudgeRun:
    """Output of :func:`answer_and_judge`."""

    records: list[dict]
    """One dict per item: qid, category, question, gold, prediction, judge_label, judge (1/0/None),
    f1_locomo, f1_set, bleu1, errors and per-item token usage."""
    usage: dict
    """Per stage ('answer', 'judge'): requests, cached, errors, prompt/completion tokens, wall_s."""
    prompts: dict
    """name/version/sha of each prompt used."""
    models: dict
    """Backend name and model of the answer and judge LLMs."""
    counts: dict = field(default_factory=dict)
    """answer_errors, judge_errors, judge_unparsed, judge_skipped."""

    def metrics(self) -> dict:
        """``aggregate`` over the records (macro over categories 1-4 and per category)."""
        return aggregate(self.records)

    def summary(self) -> dict:
        """Everything except the records, for result files."""
        return {"usage": self.usage, "prompts": self.prompts, "models": self.models,
                "counts": self.counts, "metrics": self.metrics()}


def _usage_of(r: Optional[LLMResult]) -> Optional[dict]:
    if r is None:
        return None
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "latency_s": round(r.latency_s, 4), "cached": r.cached}


def answer_and_judge(items: list[dict], answer_backend: LLMBackend, judge_backend: Optional[LLMBackend], *,
                     use_session_dates_cat2: bool = True, answer_max_tokens: int = 96,
                     judge_max_tokens: int = 48) -> AnswerJudgeRun:
    """Answer every item from its ``context`` (one batched call), then judge every answer (one call).

    ``items``: dicts with qid, question, category, gold, context (the rendered workspace).
    ``judge_backend`` None skips judging (judge = None). A failed answer request gives an empty
    prediction scored WRONG without being judged; an unreadable judgement scores as WRONG
    (``judge_label`` None) and is counted.
    """
    for n, it in enumerate(items):
        missing = [k for k in _REQUIRED if k not in it]
        if missing:
            raise InputError(f"answer item {n} (qid {it.get('qid')!r}): missing {missing}")
    meter = UsageMeter()

    convs = [answer_prompt(it["category"], use_session_dates_cat2).messages(
        context=it["context"], question=it["question"]) for it in items]
    t0 = time.perf_counter()
    ans = answer_backend.chat(convs, max_tokens=answer_max_tokens, temperature=0.0, desc="answer") if convs else []
    meter.record("answer", ans, time.perf_counter() - t0)

    preds = [clean_answer(r.text) if r.error is None else "" for r in ans]
    counts = {"answer_errors": sum(r.error is not None for r in ans), "judge_errors": 0,
              "judge_unparsed": 0, "judge_skipped": 0}

    judged: list[Optional[LLMResult]] = [None] * len(items)
    if judge_backend is not None:
        todo = [i for i, r in enumerate(ans) if r.error is None]
        counts["judge_skipped"] = len(items) - len(todo)
        jconvs = [JUDGE.messages(question=items[i]["question"], gold=items[i]["gold"], prediction=preds[i] or "(empty)")
                  for i in todo]
        t0 = time.perf_counter()
        jres = judge_backend.chat(jconvs, max_tokens=judge_max_tokens, temperature=0.0, json_mode=True,
                                  desc="judge", accept=lambda j, t: parse_judge(t) is not None) if jconvs else []
        meter.record("judge", jres, time.perf_counter() - t0)
        for i, r in zip(todo, jres):
            judged[i] = r

    records = []
    for i, it in enumerate(items):
        a = ans[i]
        rec = {
            "qid": it["qid"], "category": it["category"], "question": it["question"], "gold": it["gold"],
            "prediction": preds[i], "answer_error": a.error,
        }
        rec.update(all_metrics(preds[i], it["gold"], it["category"]))
        label, jerr = None, None
        if judge_backend is None:
            judge = None
        elif a.error is not None:
            judge, jerr = 0, "answer failed"
        else:
            jr = judged[i]
            if jr is not None and jr.error is not None:
                jerr = jr.error
                counts["judge_errors"] += 1
            else:
                label = parse_judge(jr.text if jr is not None else None)
                if label is None:
                    counts["judge_unparsed"] += 1
                    jerr = "unparsed judgement"
            judge = 1 if label == "CORRECT" else 0
        rec.update({"judge_label": label, "judge": judge, "judge_error": jerr,
                    "usage": {"answer": _usage_of(a), "judge": _usage_of(judged[i])}})
        records.append(rec)

    prompts = {"answer": ANSWER.describe(), "judge": JUDGE.describe()}
    if use_session_dates_cat2:
        prompts["answer_cat2"] = ANSWER_TEMPORAL.describe()
    models = {"answer": answer_backend.describe(),
              "judge": judge_backend.describe() if judge_backend is not None else None}
    return AnswerJudgeRun(records=records, usage=meter.summary(), prompts=prompts, models=models, counts=counts)
