"""TextGrad-style evolution of TriMem's extraction and profile prompts (``trawmem evolve-prompts``).

One step, for the current prompt set (version ``v``):

1. **memory**: the dev split's banks (turn layer built once) get facts by the extraction prompt
   and profiles by the profile prompt (their build steps, ``ingest.layers.steps.build_layers``);
2. **answers**: every question with a gold answer (categories 1-4) gets TriMem's workspace
   (``select.trimem.method``; the question is the only search) and an answer (``eval.answer``), judged
   when a judge is given; the **score** is the macro LLM-judge accuracy, else the macro F1;
3. **critique** (the textual gradient): for each evolvable prompt, the LLM criticizes it in the
   light of up to ``max_failures`` wrong answers (question, gold, prediction, what memory showed);
4. **apply** (the step): the LLM rewrites the prompt to address the critiques. A rewrite that
   loses or adds a placeholder is refused (counted) and the prompt stays as it was.

Every version is written with its score (``v<k>.json``: the prompts, their shas, the metrics, the
wrong questions, the critiques that led to the next version, usage), the best so far as
``best_prompts.json`` (a prompts file for ``build --prompts``; ties keep the earlier version), and
the run's state in ``state.json`` after every stage, atomically, under a lock: a killed run,
rerun with the same arguments, continues where it stopped (and the LLM response cache answers
what was already asked). A state written for another configuration is refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..errors import ConfigError, InputError, read_json_object
from ..paths import file_sha256
from ..store.files import write_json_atomic
from ..ingest.layers.prompts import APPLY_CRITIQUE, CRITIQUE, PromptSet, prompt_set_from_dict, prompt_set_to_dict, save_prompt_set

STATE_FORMAT = 1
EVOLVED = ("extract", "profile")
"""The prompts evolution edits (the paper: extraction and profile construction)."""
MAX_FAILURES = 8
NO_FACTS = "(nothing: the extraction prompt kept no fact from this conversation)"
"""The memory shown for a question whose bank kept no fact under the prompts being scored."""
MAX_CONTEXT_CHARS = 1500
"""Characters of a wrong answer's workspace shown to the critic."""


@dataclass
class EvolveConfig:
    """What identifies an evolution run (a state of another config is refused)."""

    data: str
    steps: int = 4
    max_failures: int = MAX_FAILURES
    budget: int = 4096
    token_budget: Optional[int] = None
    profiles: bool = True
    wrong_f1: float = 0.5
    """Without a judge, an answer with LoCoMo F1 below this is wrong."""

    def identity(self, llm_desc: dict, judge_desc: Optional[dict]) -> dict:
        return {"data_sha256": file_sha256(self.data), "steps": self.steps, "max_failures": self.max_failures,
                "budget": self.budget, "token_budget": self.token_budget, "profiles": self.profiles,
                "wrong_f1": self.wrong_f1, "llm": llm_desc.get("model"), "judge": (judge_desc or {}).get("model")}


def _critique_of(text) -> str | None:
    """The critique of a critique reply (``{"critique": "..."}``, whitespace collapsed), or None."""
    from ..llm.structured import extract_json

    obj = extract_json(text)
    c = obj.get("critique") if isinstance(obj, dict) else None
    return " ".join(c.split()) if isinstance(c, str) and c.strip() else None


def _prompt_of(text):
    """The ``prompt`` of an apply reply (``{"prompt": "..."}``), or None."""
    from ..llm.structured import extract_json

    obj = extract_json(text)
    return obj.get("prompt") if isinstance(obj, dict) else None


def _score(metrics: dict, judged: bool) -> float:
    m = metrics["macro"]
    v = m.get("judge") if judged else m.get("f1_locomo")
    return float(v or 0.0)


class Evolution:
    """One resumable run in ``out`` (see the module docstring)."""

    def __init__(self, cfg: EvolveConfig, out: str | Path, llm, *, judge=None, encoder=None, init: PromptSet = None,
                 progress: Callable[[str], None] = lambda s: None):
        if cfg.steps < 1:
            raise ConfigError(f"`steps` must be >= 1 (got {cfg.steps})")
        self.cfg, self.out, self.llm, self.judge, self.say = cfg, Path(out), llm, judge, progress
        self.out.mkdir(parents=True, exist_ok=True)
        self.ident = cfg.identity(llm.describe(), judge.describe() if judge is not None else None)
        self._encoder, self._base = encoder, None
        self.state_path = self.out / "state.json"
        self.state = self._load_state(init or PromptSet())

    # -- state ------------------------------------------------------------------------------
    def _load_state(self, init: PromptSet) -> dict:
        if self.state_path.exists():
            st = read_json_object(self.state_path, str(self.state_path), "not an evolve-prompts state")
            if st.get("format") != STATE_FORMAT:
                raise InputError(f"{self.state_path}: not an evolve-prompts state (format {STATE_FORMAT})")
            if st.get("identity") != self.ident:
                diff = sorted(k for k in self.ident if st.get("identity", {}).get(k) != self.ident[k])
                raise InputError(f"{self.out} holds an evolve-prompts run with another configuration "
                                 f"({', '.join(diff)} differ); give a new output directory")
            return st
        return {"format": STATE_FORMAT, "identity": self.ident, "versions": [],
                "next": {"version": 0, "prompts": prompt_set_to_dict(init)}, "best": None, "done": False}

    def _save(self) -> None:
        write_json_atomic(self.state, self.state_path, indent=1)

    # -- stages -----------------------------------------------------------------------------
    def _banks(self):
        if self._base is None:
            from ..ingest import build_banks
            from ..data import load_conversations, require_locomo

            require_locomo(self.cfg.data, "evolve-prompts")
            convs = load_conversations(self.cfg.data)
            banks, _ = build_banks(convs, encoder=self.encoder, progress=False)
            self._base = (convs, banks)
        return self._base

    @property
    def encoder(self):
        if self._encoder is None:
            from ..encode import get_encoder

            self._encoder = get_encoder()
        return self._encoder

    def memory(self, ps: PromptSet) -> list:
        """The dev banks with facts (and profiles) by ``ps``."""
        from ..ingest.layers.steps import StepRun, build_layers

        convs, banks = self._banks()
        sources = {"facts": "llm", "profiles": "llm" if self.cfg.profiles else "none"}
        banks, _ = build_layers(banks, sources, StepRun(self.encoder, self.llm, ps))
        return banks

    def answer(self, banks: list) -> tuple[dict, list[dict], dict]:
        """``(metrics, per-question records with their workspace, usage)`` of TriMem over ``banks``."""
        from .answer import answer_and_judge
        from .answer_metrics import aggregate
        from ..select.params import QueryParams
        from ..select.workspace import assemble
        from ..select.trimem.method import TriMemRankers, trimem_select

        convs, _ = self._banks()
        by_id = {b.bank_id: b for b in banks if b.facts}
        asked = [(c.bank_id, q) for c in convs for q in c.questions if q.category in (1, 2, 3, 4) and q.answer]
        if not asked:
            raise InputError(f"{self.cfg.data}: no question with a gold answer")
        items = [(b, q) for b, q in asked if b in by_id]
        # a bank where these prompts kept no fact (a small model's are all refused) has nothing to
        # show: its questions score 0 and reach the critique with that said, not an error
        empty = [{"qid": q.qid, "question": q.question, "category": q.category, "gold": str(q.answer),
                  "prediction": "", "f1_locomo": 0.0, "judge": 0.0 if self.judge is not None else None,
                  "context": NO_FACTS} for b, q in asked if b not in by_id]
        recs, usage = [], {}
        if items:
            qp = QueryParams(budget=self.cfg.budget, token_budget=self.cfg.token_budget)
            Z = self.encoder.encode([q.question for _, q in items], is_query=True)
            picks = trimem_select(TriMemRankers(by_id), [(b, q.question) for b, q in items], Z, qp,
                                  encode=lambda xs: self.encoder.encode(xs, is_query=True))
            ctx = [assemble(p.view, q.question, p.units, "none").render() for p, (_, q) in zip(picks, items)]
            run = answer_and_judge([{"qid": q.qid, "question": q.question, "category": q.category,
                                     "gold": str(q.answer), "context": c} for (_, q), c in zip(items, ctx)],
                                   self.llm, self.judge)
            recs, usage = [{**r, "context": c} for r, c in zip(run.records, ctx)], run.usage
        recs += empty
        return aggregate(recs), recs, usage

    def _wrong(self, recs: list[dict]) -> list[dict]:
        if self.judge is not None:
            return [r for r in recs if r.get("judge") == 0]
        return [r for r in recs if (r.get("f1_locomo") or 0.0) < self.cfg.wrong_f1]

    def critique(self, ps: PromptSet, wrong: list[dict]) -> tuple[PromptSet, dict]:
        """The next prompt set from critiques of ``wrong`` answers, and what was said and done."""
        shown = wrong[:self.cfg.max_failures]
        fails = ["Question: {question}\nGold answer: {gold}\nGiven answer: {prediction}\nMemory shown:\n{ctx}".format(
            ctx=r["context"][:MAX_CONTEXT_CHARS], **{k: r.get(k) for k in ("question", "gold", "prediction")})
            for r in shown]
        convs, keys = [], []
        for name in EVOLVED:
            p = getattr(ps, name)
            for f in fails:
                convs.append(CRITIQUE.messages(prompt_name=p.name, prompt=p.template, failures=f))
                keys.append(name)
        from ..llm.structured import ask, fell_back

        # a critique may quote the prompt and its JSON (no markup check); a word or two says nothing
        res = ask(self.llm, CRITIQUE, convs, lambda i, t: _critique_of(t), desc="trimem-critique", max_tokens=512,
                  check=lambda i, c: None if len(c.split()) >= 3 else "degenerate: no critique")
        fell_back(self.llm, "trimem-critique", res, "critique")
        crit: dict[str, list[str]] = {n: [] for n in EVOLVED}
        for k, o in zip(keys, res):
            if o.ok:
                crit[k].append(o.value)
        todo = [n for n in EVOLVED if crit[n]]
        convs = [APPLY_CRITIQUE.messages(prompt_name=getattr(ps, n).name, prompt=getattr(ps, n).template,
                                         critiques="\n".join(f"- {c}" for c in crit[n]),
                                         placeholders=", ".join("$" + f for f in getattr(ps, n).fields))
                 for n in todo]
        res = ask(self.llm, APPLY_CRITIQUE, convs, lambda i, t: p if isinstance(p := _prompt_of(t), str) else None,
                  desc="trimem-apply", max_tokens=4096) if convs else []
        nxt, applied, refused = ps, [], []
        version = f"evolved-{self.state['next']['version'] + 1}"
        for n, o in zip(todo, res):
            new = o.value if o.ok else None
            try:
                if not isinstance(new, str):
                    raise InputError("no prompt in the reply")
                if new.strip() == getattr(ps, n).template.strip():
                    continue
                nxt = nxt.with_template(n, new, version)
                applied.append(n)
            except InputError as e:
                refused.append({"prompt": n, "why": str(e) if o.ok else o.why})
        if refused:
            fell_back(self.llm, "trimem-apply", [("refused", r["why"]) for r in refused], "rewrite")
        return nxt, {"critiques": crit, "applied": applied, "refused": refused, "failures_shown": len(shown)}

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> dict:
        """Run (or continue) the evolution; returns the final state."""
        from filelock import FileLock, Timeout

        try:
            lock = FileLock(str(self.out / ".lock"), timeout=0)
            lock.acquire()
        except Timeout:
            raise InputError(f"{self.out}: another evolve-prompts run holds it") from None
        try:
            while not self.state["done"]:
                self._step()
        finally:
            lock.release()
        return self.state

    def _step(self) -> None:
        st = self.state
        nxt = st["next"]
        v = nxt["version"]
        ps = prompt_set_from_dict(nxt["prompts"], f"{self.state_path} (version {v})")
        self.say(f"version {v}: building memory with prompts {ps.sha[:12]}")
        metrics, recs, usage = self.answer(self.memory(ps))
        score = _score(metrics, self.judge is not None)
        wrong = self._wrong(recs)
        rec = {"version": v, "score": score, "metric": "judge" if self.judge is not None else "f1_locomo",
               "prompts": prompt_set_to_dict(ps), "described": ps.describe(), "metrics": metrics,
               "wrong": [{k: r.get(k) for k in ("qid", "question", "gold", "prediction", "f1_locomo", "judge")}
                         for r in wrong], "usage": usage}
        self.say(f"version {v}: score {score:.4f}, {len(wrong)} wrong of {len(recs)}")
        if st["best"] is None or score > st["versions"][st["best"]]["score"]:
            st["best"] = len(st["versions"])
            save_prompt_set(ps, self.out / "best_prompts.json", {"version": v, "score": score})
        last = v >= self.cfg.steps or not wrong
        if not last:
            following, how = self.critique(ps, wrong)
            rec["to_next"] = how
            st["next"] = {"version": v + 1, "prompts": prompt_set_to_dict(following)}
        write_json_atomic(rec, self.out / f"v{v}.json", indent=1)
        st["versions"].append({"version": v, "score": score, "file": f"v{v}.json", "sha": ps.sha,
                               "wrong": len(wrong), "questions": len(recs)})
        st["done"] = last
        self._save()

