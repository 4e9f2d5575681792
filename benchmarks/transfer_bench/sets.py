"""The scored sets of the transfer table: each dev set under each real-chat view
(``trawmem_gpu.data.chat_views``), with its units two ways (bursts, messages)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = ("locomo", "longmemeval")
TITLE = {"locomo": "LoCoMo dev", "longmemeval": "LongMemEval-S dev"}


@dataclass
class ViewSet:
    """One source under one view: its labelled questions (features over the units selection sees:
    the burst view), their contexts, and the same banks as stored (one unit per message: ``raw``).

    ``name`` is the source (the metrics' rules: LoCoMo's multi-hop hit), ``label`` the column name."""

    name: str
    view: str
    path: Path
    questions: list
    ctxs: dict
    raw_ctxs: dict
    groups: list = field(default_factory=list)
    category_names: dict | None = None

    @property
    def label(self) -> str:
        return f"{self.name}/{self.view}"

    @property
    def banks(self) -> list:
        return [c.bank for c in self.ctxs.values()]

    def cat_name(self, c: int) -> str:
        return self.category_names.get(c, str(c)) if self.category_names else str(c)

    def units(self, kind: str) -> "ViewSet":
        """This set with ``kind`` units: ``bursts`` (itself) or ``messages`` (the stored banks)."""
        if kind == "bursts":
            return self
        return ViewSet(self.name, self.view, self.path, self.questions, self.raw_ctxs, self.raw_ctxs, self.groups,
                       self.category_names)

    def subset(self, bank_ids: set, view: str) -> "ViewSet":
        """This set restricted to the questions of ``bank_ids`` (named ``view``)."""
        qs = [q for q in self.questions if q.bank_id in bank_ids]
        keep = {b: c for b, c in self.ctxs.items() if b in bank_ids}
        return ViewSet(self.name, view, self.path, qs, keep, {b: self.raw_ctxs[b] for b in keep},
                       sorted({q.group for q in qs}), self.category_names)

    @property
    def has_bursts(self) -> bool:
        return any(c.bank is not self.raw_ctxs[b].bank for b, c in self.ctxs.items())

    def stats(self) -> dict:
        """Units, messages and words per unit (what the view did to the set)."""
        import numpy as np

        from trawmem_gpu.data.bursts import message_words

        msgs = [t for c in self.raw_ctxs.values() for t in c.bank.turns]
        units = [t for c in self.ctxs.values() for t in c.bank.turns]
        gaps = [(b.time - a.time).total_seconds() for c in self.raw_ctxs.values()
                for a, b in zip(c.bank.turns, c.bank.turns[1:]) if a.session == b.session and a.time and b.time]
        return {"messages": len(msgs), "units": len(units), "questions": len(self.questions),
                "message_words_median": float(np.median([message_words(t) for t in msgs])),
                "unit_words_median": float(np.median([message_words(t) for t in units])),
                "gap_s_median": float(np.median(gaps)) if gaps else None,
                "gold_messages_per_question": float(np.mean([len(q.extra["evidence"]) for q in self.questions]))}


def sample_banks(path: Path, n: int, seed: int = 36) -> set[str]:
    """A seeded sample of ``n`` bank ids of ``path`` among those with a scored question (the views
    of LongMemEval are scored on such a sample: encoding its whole slice again per view takes hours
    on the 2-core machine)."""
    import random

    from trawmem_gpu.data import load_conversations

    from trawmem_gpu.data.longmemeval import is_abstention

    ids = sorted(c.bank_id for c in load_conversations(path)
                 if any(q.evidence and not is_abstention(q.qid) for q in c.questions))
    return set(random.Random(seed).sample(ids, min(n, len(ids))))


def load_set(name: str, path: Path, view: str, only: set | None = None) -> ViewSet:
    """``name``'s dev file under ``view``: banks built once into the bank cache (encoded through the
    embedding cache), questions labelled over the burst view (its unit vectors in the form
    ``unit_vecs`` names for ``view``: shipped unless ``TRAWMEM_BENCH_UNIT_VECS`` is set);
    ``only``: these banks alone."""
    from trawmem_gpu.head.relevance import labelled_banks, load_labelled
    from trawmem_gpu.select.context import BankContext

    from .unit_vecs import unit_vectors

    t0 = time.perf_counter()
    loaded = labelled_banks(path, view=view, progress=True, only=only)
    with unit_vectors(view):  # the experiment switch (off: the shipped burst vectors)
        questions, ctxs = load_labelled(path, dataset=name, view=view, loaded=loaded)
    stored = loaded[1]
    raw = {b: (c if c.bank.n_units == stored[b].n_units else BankContext.of(stored[b])) for b, c in ctxs.items()}
    names = None
    if name == "longmemeval":
        from trawmem_gpu.data.longmemeval import QUESTION_TYPES

        names = {i + 1: t for i, t in enumerate(QUESTION_TYPES)}
    s = ViewSet(name, view, path, questions, ctxs, raw, sorted({q.group for q in questions}), names)
    print(f"{s.label}: {len(questions)} questions, {len(ctxs)} banks ({time.perf_counter() - t0:.0f}s): {s.stats()}",
          flush=True)
    return s
