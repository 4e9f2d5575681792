"""Resuming a scoring job (``score.job``): which written records still hold, and which items are
left to score.

**Resume checks content** (:func:`resume_todo`): a written record is kept only while its
``bank_id``, ``question``, ``date``, ``bank_digest`` and ``config`` equal what the input would
give now; a mismatch is refused, naming the id and the difference, or, with
``rescore_changed``, the record is taken out and scored again. A record whose answer failed is
always taken out and answered again, as ``trawmem eval`` retries its failed requests.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from ..errors import InputError, plural
from ..notes import note
from ..store.verify import stored_digest
from .items import ScoreItem
from .writer import ResumableJsonl

log = logging.getLogger(__name__)


def say_resume(out: str | Path, n_items: int, n_todo: int) -> None:
    """A note (on stderr, from a command), what a rerun found in ``out``: ``lme.jsonl: 17 answers already in, 133 to score``
    (said only when something was there: a first run needs no such line)."""
    if n_items > n_todo:
        note(log, f"{out}: {plural(n_items - n_todo, 'answer')} already in, {n_todo or 'none'} to score")


RESUME_FIELDS = ("bank_id", "question", "date", "where", "bank_digest", "config", "answer_error")
"""Fields of each written record the resume check reads (``ResumableJsonl(keep=...)``)."""


def _short(v, n: int = 40) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def record_change(old: dict, it: ScoreItem, digest: str, tag: dict) -> str | None:
    """How the written record ``old`` (its ``RESUME_FIELDS``) differs from what ``it`` would get
    now, in words (``"question 'a' -> 'b'"``), or None when it does not."""
    if old.get("bank_id") != it.bank_id:
        return f"bank_id {_short(old.get('bank_id'))} -> {_short(it.bank_id)}"
    if old.get("question") != it.question:
        return f"question {_short(old.get('question'))} -> {_short(it.question)}"
    if old.get("date") != it.date:
        return f"date {_short(old.get('date'))} -> {_short(it.date)}"
    if old.get("where") != it.where:
        return f"where {_short(old.get('where'))} -> {_short(it.where)}"
    if old.get("bank_digest") != digest:
        return (f"bank {it.bank_id!r} changed since (digest {old.get('bank_digest') or 'not recorded'} -> "
                f"{digest})")
    want = json.loads(json.dumps(tag))
    have = old.get("config") or {}
    if have != want:
        keys = sorted(k for k in set(want) | set(have) if have.get(k) != want.get(k))
        return "config " + ", ".join(f"{k} {_short(have.get(k), 20)} -> {_short(want.get(k), 20)}" for k in keys)
    return None


def resume_todo(writer: ResumableJsonl, items: list[ScoreItem], coll, spec: "ScoreSpec", *,
                rescore_changed: bool = False) -> tuple[list[ScoreItem], dict]:
    """The items still to score, after checking every written record against its input.

    A record that no longer matches (:func:`record_change`) is an ``InputError`` naming its id
    and the difference, unless ``rescore_changed``: then it is taken out of the file and scored
    again. A record whose answer failed is taken out and answered again (with ``--answer-llm``).

    :returns: ``(todo, {"rescored_changed": n, "retried_answers": n})``
    """
    tag = spec.tag(coll.encoder_id)
    digests, changed, failed = {}, {}, []  # bank id -> digest, item id -> why it changed, item ids to answer again
    for it in items:
        old = writer.written.get(it.id)
        if old is None:
            continue
        if it.bank_id not in digests:
            digests[it.bank_id] = stored_digest(coll.bank_path(it.bank_id))
        why = record_change(old, it, digests[it.bank_id], tag)
        if why:
            changed[it.id] = why
        elif spec.answer_llm and old.get("answer_error"):
            failed.append(it.id)
    if changed and not rescore_changed:
        first = next(iter(changed))
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise InputError(f"{writer.path}: the written record of {first!r} no longer matches the input: "
                         f"{changed[first]}{more}; rerun with `rescore_changed` to score the changed ones again, "
                         "or `overwrite` to start afresh")
    writer.drop(list(changed) + failed)
    todo = [it for it in items if it.id not in writer]
    return todo, {"rescored_changed": len(changed), "retried_answers": len(failed)}
