"""What ``trawmem score`` scores: one item per question, from a questions JSONL or a benchmark file.

Questions JSONL: one object per line with ``id``, ``bank_id``, ``question``, an optional
``date`` (when the question is asked, in any format ``parse_date`` reads: it is "now" for that
question) and an optional ``where`` (a filter over the turns' metadata, ``data.filters``: only turns
that pass are candidates for that question). Benchmark files (LongMemEval, LoCoMo) give their questions with gold evidence, so
the job can score them too.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from ..data.dates import parse_date
from ..data.fields import id_field, valid_unicode
from ..data.filters import parse_filter
from ..data.types import MAX_QUESTION_CHARS, Conversation
from ..errors import InputError, loads_json


@dataclass(frozen=True)
class ScoreItem:
    """One question to select a workspace for."""

    id: str
    bank_id: str
    question: str
    date: str | None = None
    """When the question is asked, as given (ISO 8601 after parsing a benchmark's own format)."""
    gold: tuple[str, ...] | None = None
    """Gold evidence unit ids, when the source has them (benchmarks)."""
    qtype: str | None = None
    """Question type or category name, for per-type tables."""
    answer: str | None = None
    """Reference answer, when the source has one."""
    where: dict | None = None
    """The question's filter over turn metadata (``data.filters``, canonical JSON), or None."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gold"] = list(self.gold) if self.gold is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ScoreItem":
        g = d.get("gold")
        return cls(d["id"], d["bank_id"], d["question"], d.get("date"), tuple(g) if g is not None else None,
                   d.get("qtype"), d.get("answer"), d.get("where"))


def _check_question(q, where: str) -> str:
    if not isinstance(q, str) or not q.strip():
        raise InputError(f"{where}: field 'question' is empty")
    if len(q) > MAX_QUESTION_CHARS:
        raise InputError(f"{where}: field 'question' is {len(q)} characters; the limit is {MAX_QUESTION_CHARS}")
    return valid_unicode(q, "question", where).strip()


def read_questions(path: str | Path, *, dayfirst: bool = False) -> list[ScoreItem]:
    """Parse a questions JSONL file; every malformed line is an ``InputError`` naming it.

    ``id`` and ``bank_id`` follow the one id rule of every input (:func:`~trawmem_gpu.data.fields.id_field`);
    ``date`` is read by ``parse_date`` with ``dayfirst`` (``--dayfirst``), as the histories' dates are.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e})") from None
    out: list[ScoreItem] = []
    seen: set[str] = set()
    for ln, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{ln}"
        try:
            r = loads_json(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: bad JSON at column {e.colno}: {e.msg}") from None
        except ValueError as e:  # nested too deeply
            raise InputError(f"{where}: bad JSON: {e}") from None
        if not isinstance(r, dict):
            raise InputError(f"{where}: expected a JSON object per line")
        for f in ("id", "bank_id", "question"):
            if f not in r:
                raise InputError(f"{where}: missing field {f!r}")
        qid = id_field(r["id"], "id", where)
        bank_id = id_field(r["bank_id"], "bank_id", where)
        if qid in seen:
            raise InputError(f"{where}: duplicate id {qid!r}")
        seen.add(qid)
        date = r.get("date")
        if date is not None:
            if not isinstance(date, str):
                raise InputError(f"{where}: field 'date' must be a string")
            valid_unicode(date, "date", where)
            try:
                date = parse_date(date, dayfirst=dayfirst).isoformat()
            except ValueError as e:
                raise InputError(f"{where}: field 'date': {e}") from None
        flt = parse_filter(r.get("where"), f"{where}: where")
        out.append(ScoreItem(qid, bank_id, _check_question(r["question"], where), date,
                             where=None if flt is None else flt.json))
    if not out:
        raise InputError(f"{path}: no questions")
    return out


def items_from_conversations(convs: list[Conversation], categories: tuple[int, ...] | None = None) -> list[ScoreItem]:
    """The questions of a benchmark file (all of them, or those of ``categories``), with gold."""
    out = []
    for c in convs:
        for q in c.questions:
            if categories is not None and q.category not in categories:
                continue
            out.append(ScoreItem(q.qid, c.bank_id, q.question, q.date.isoformat() if q.date else None,
                                 tuple(q.evidence), q.qtype or str(q.category), q.answer))
    return out


def stratified_sample(items: list[ScoreItem], n: int, seed: int = 0) -> list[ScoreItem]:
    """``n`` of ``items`` (all when there are no more), stratified by ``qtype``, in input order.

    Each type's questions are shuffled once with ``seed``; then questions are taken one at a
    time from the type furthest below its share of the whole (ties: the type seen first). The
    sample of ``n`` is the start of that one order, so it is reproducible, every type keeps its
    proportion within one question, and a larger ``n`` extends a smaller one (a rerun with a
    larger ``--max-questions`` resumes the same output).
    """
    if n >= len(items):
        return list(items)
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(it.qtype or "", []).append(i)
    for g in groups.values():
        rng.shuffle(g)
    taken = dict.fromkeys(groups, 0)
    chosen = []
    for step in range(1, n + 1):
        t = max((t for t in groups if taken[t] < len(groups[t])),
                key=lambda t: len(groups[t]) * step / len(items) - taken[t])
        chosen.append(groups[t][taken[t]])
        taken[t] += 1
    return [items[i] for i in sorted(chosen)]
