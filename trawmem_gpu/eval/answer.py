"""Answer questions from workspaces and judge them: one batched call per stage."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from trawmem_gpu.errors import InputError
from trawmem_gpu.eval.answer_metrics import aggregate, all_metrics
from trawmem_gpu.llm.base import LLMBackend, LLMResult, UsageMeter
from trawmem_gpu.llm.grounding import answer_problem
from trawmem_gpu.llm.prompts import ANSWER, ANSWER_TEMPORAL, JUDGE, answer_prompt
from trawmem_gpu.llm.structured import Outcome, ask, clean_answer, fell_back, parse_judge

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
    """answer_errors, answer_refused (echoes of the question, copies of the workspace's format:
    scored wrong, never judged), judge_errors, judge_unparsed, judge_skipped."""

    def metrics(self) -> dict:
        """``aggregate`` over the records (macro over categories 1-4 and per category)."""
        return aggregate(self.records)

    def summary(self) -> dict:
        """Everything except the records, for result files."""
        return {"usage": self.usage, "prompts": self.prompts, "models": self.models,
                "counts": self.counts, "metrics": self.metrics()}


def _refusals(raw: list[str], ans: list, items: list[dict], backend: LLMBackend, meter: UsageMeter) -> list:
    """Per answer, why it is refused (``llm.grounding.answer_problem``), or None; counted as
    refused and fallen back on ``meter`` and the backend's meter (an error under ``--strict-llm``)."""
    refused = [answer_problem(p, it["question"], it["context"]) if r.error is None else None
               for p, r, it in zip(raw, ans, items)]
    n = sum(w is not None for w in refused)
    checked = sum(r.error is None for r in ans)
    if checked:
        meter.note("answer", checked=checked)
        backend.usage.note("answer", checked=checked)
    if n:
        meter.note("answer", refused=n, fallbacks=n)
        backend.usage.note("answer", refused=n)
        fell_back(backend, "answer", [Outcome(status="refused", why=w) for w in refused if w], "answer")
    return refused


def _judge(judge_backend: LLMBackend, items: list[dict], preds: list[str], max_tokens: int,
           meter: UsageMeter) -> list[Outcome]:
    """The judge's structured verdict on each answer (its usage recorded on ``meter``)."""
    if not items:
        return []
    jconvs = [JUDGE.messages(question=it["question"], gold=it["gold"], prediction=p or "(empty)")
              for it, p in zip(items, preds)]
    t0 = time.perf_counter()
    before = judge_backend.usage.summary().get("judge", {})
    out = ask(judge_backend, JUDGE, jconvs, lambda j, t: parse_judge(t), desc="judge", max_tokens=max_tokens,
              retries=0)
    meter.stages["judge"] = _delta(before, judge_backend.usage.summary().get("judge", {}), time.perf_counter() - t0)
    return out


def _delta(before: dict, after: dict, wall_s: float):
    """The usage of one stage between two summaries of a backend's meter (a StageUsage)."""
    from trawmem_gpu.llm.base import StageUsage

    u = StageUsage()
    for k, v in after.items():
        if isinstance(v, int) and hasattr(u, k):
            setattr(u, k, v - int(before.get(k, 0)))
    u.latency_s = float(after.get("latency_s", 0.0)) - float(before.get("latency_s", 0.0))
    u.wall_s = wall_s
    return u


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
    prediction scored WRONG without being judged. An answer refused by its checks
    (``llm.grounding.answer_problem``: an echo of the question, a copy of the workspace's or the
    prompt's format, markup) is scored as an empty prediction, WRONG, and not judged: a judge's
    verdict on it is never counted (``answer_refused``; an error under ``--strict-llm``). An
    unreadable judgement scores as WRONG (``judge_label`` None) and is counted.
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

    raw = [clean_answer(r.text) if r.error is None else "" for r in ans]
    refused = _refusals(raw, ans, items, answer_backend, meter)
    n_ref = sum(w is not None for w in refused)
    preds = ["" if w else p for p, w in zip(raw, refused)]
    counts = {"answer_errors": sum(r.error is not None for r in ans), "answer_refused": n_ref, "judge_errors": 0,
              "judge_unparsed": 0, "judge_skipped": 0}

    judged: list[Optional[Outcome]] = [None] * len(items)
    if judge_backend is not None:
        todo = [i for i, r in enumerate(ans) if r.error is None and refused[i] is None]
        counts["judge_skipped"] = len(items) - len(todo)
        for i, o in zip(todo, _judge(judge_backend, [items[i] for i in todo], [preds[i] for i in todo],
                                     judge_max_tokens, meter)):
            judged[i] = o

    records = []
    for i, it in enumerate(items):
        a = ans[i]
        rec = {
            "qid": it["qid"], "category": it["category"], "question": it["question"], "gold": it["gold"],
            "prediction": preds[i], "answer_error": a.error, "answer_refused": refused[i],
        }
        if refused[i]:
            rec["refused_answer"] = raw[i]
        rec.update(all_metrics(preds[i], it["gold"], it["category"]))
        label, jerr = None, None
        if judge_backend is None:
            judge = None
        elif a.error is not None:
            judge, jerr = 0, "answer failed"
        elif refused[i]:
            judge, jerr = 0, f"answer refused ({refused[i]}): not judged"
        else:
            jr = judged[i]
            if jr is not None and jr.status == "failed":
                jerr = jr.why
                counts["judge_errors"] += 1
            else:
                label = jr.value if jr is not None and jr.ok else None
                if label is None:
                    counts["judge_unparsed"] += 1
                    jerr = "unparsed judgement"
            judge = 1 if label == "CORRECT" else 0
        rec.update({"judge_label": label, "judge": judge, "judge_error": jerr,
                    "usage": {"answer": _usage_of(a), "judge": _usage_of(judged[i].result if judged[i] else None)}})
        records.append(rec)

    prompts = {"answer": ANSWER.describe(), "judge": JUDGE.describe()}
    if use_session_dates_cat2:
        prompts["answer_cat2"] = ANSWER_TEMPORAL.describe()
    models = {"answer": answer_backend.describe(),
              "judge": judge_backend.describe() if judge_backend is not None else None}
    return AnswerJudgeRun(records=records, usage=meter.summary(), prompts=prompts, models=models, counts=counts)
