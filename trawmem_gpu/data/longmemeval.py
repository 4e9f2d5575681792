"""Loader for LongMemEval (Wu et al., ICLR 2025) instance files: one bank per question.

A LongMemEval file (``.json`` or ``.json.gz``) is a JSON list of instances with
``question_id``, ``question_type``, ``question``, ``question_date``, ``answer``,
``answer_session_ids``, ``haystack_session_ids``, ``haystack_dates`` (e.g.
``"2031/05/13 (Tue) 04:17"``) and ``haystack_sessions`` (lists of ``{role, content,
has_answer?}``). Every instance brings its own haystack, so every question becomes its own bank
whose bank id is the question id, and the question's ``question_date`` is "now" for it
(``Question.date``).

Units follow the official retrieval setup at turn granularity (``src/retrieval/run_retrieval.py``
of the authors' repository), reimplemented here:

* the corpus is every ``user`` turn of every haystack session, in haystack order
  (``units="all"`` also indexes the assistant turns);
* a unit's id is ``f"{session_id}_{i + 1}"`` with ``i`` the turn's position among *all* turns of
  its session; inside a session whose id contains ``answer``, a unit that is not gold has
  ``answer`` replaced by ``noans`` in its id (so ``id.rsplit("_", 1)[0]`` is the session the
  official turn-to-session metric sees);
* a session id placed twice in one haystack (it happens) gets ``~2`` on its second placement;
* gold evidence is the user turns marked ``has_answer`` in answer sessions, i.e. exactly the
  corpus ids that contain ``answer``.

Session ids and dates stay on the units (``Turn.turn_id`` and ``Turn.timestamp`` / ``time``;
``Turn.session`` is the 1-based haystack position). Every malformed instance stops with an
``InputError`` naming the file, the instance and the field.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Literal

from ..errors import InputError, loads_json
from .dates import parse_date
from .fields import check_len, id_field, valid_unicode
from .types import MAX_ID_CHARS, MAX_TEXT_CHARS, Conversation, EvidenceRepairs, Question, Turn

QUESTION_TYPES = ("single-session-user", "single-session-assistant", "single-session-preference",
                  "multi-session", "knowledge-update", "temporal-reasoning")
"""The six LongMemEval question types; ``Question.category`` is 1 + the index here."""
Units = Literal["user", "all"]
SNIFF_BYTES = 1 << 16
DUP_MARK = "~"
"""A session id that repeats in one haystack gets ``~2``, ``~3``... on its later occurrences."""


def session_of(unit_id: str) -> str:
    """The session the official turn-to-session metric gives a unit id: the id without its last
    ``_`` part (and without the repeat mark, so repeated sessions stay one session, as there)."""
    return unit_id.rsplit("_", 1)[0].split(DUP_MARK, 1)[0] if "_" in unit_id else ""


def is_abstention(question_id: str) -> bool:
    """Abstention questions (``_abs`` in the id) are left out of the retrieval metrics."""
    return "_abs" in question_id


def _read(path: Path):
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise InputError(f"{path}: corrupt gzip data ({e})") from None
    try:
        return loads_json(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e})") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: bad JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except ValueError as e:  # nested too deeply
        raise InputError(f"{path}: bad JSON: {e}") from None


_LME_KEY = re.compile(rb'(?:^|[{,])\s*"(?:haystack_session_ids|haystack_dates|haystack_sessions)"\s*:')
"""A LongMemEval-only key *as a key* (after ``{`` or ``,``, before ``:``): a text that merely
mentions the name sits inside a string, where its quotes are escaped."""


def sniff_longmemeval(head: bytes) -> bool:
    """True when ``head`` (the first bytes of a decompressed file) holds a key only LongMemEval
    has. ``question_id`` alone is no sign: LoCoMo-layout files may carry it in their ``qa``."""
    return bool(_LME_KEY.search(head))


def read_head(path: str | Path, n: int = SNIFF_BYTES) -> bytes:
    """The first ``n`` bytes of ``path``, decompressed when it is gzip (b"" when unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(n)
        if head[:2] == b"\x1f\x8b":
            with gzip.open(path, "rb") as g:
                head = g.read(n)
    except (OSError, EOFError):
        return b""
    return head


def _field(obj, key: str, where: str, kind=str):
    if key not in obj:
        raise InputError(f"{where}: missing field {key!r}")
    v = obj[key]
    if kind is not None and (not isinstance(v, kind) or isinstance(v, bool)):
        name = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        raise InputError(f"{where}: field {key!r} must be {name}, got {type(v).__name__}")
    return valid_unicode(v, key, where) if isinstance(v, str) else v


def parse_instance(inst: dict, where: str, units: Units = "user", dayfirst: bool = False) -> Conversation:
    """One LongMemEval instance -> one Conversation (bank id = question id) with its question."""
    if not isinstance(inst, dict):
        raise InputError(f"{where}: expected an object, got {type(inst).__name__}")
    qid = id_field(_field(inst, "question_id", where), "question_id", where)  # the bank id: the one id rule
    where = f"{where} (question {qid!r})"
    qtype = _field(inst, "question_type", where)
    question = _field(inst, "question", where)
    if not question.strip():
        raise InputError(f"{where}: field 'question' is empty")
    try:
        now = parse_date(_field(inst, "question_date", where), dayfirst=dayfirst)
    except ValueError as e:
        raise InputError(f"{where}: field 'question_date': {e}") from None
    answer = inst.get("answer")
    if answer is not None:
        answer = valid_unicode(str(answer), "answer", where)
    sids = _field(inst, "haystack_session_ids", where, list)
    dates = _field(inst, "haystack_dates", where, list)
    sessions = _field(inst, "haystack_sessions", where, list)
    if not (len(sids) == len(dates) == len(sessions)):
        raise InputError(f"{where}: fields 'haystack_session_ids', 'haystack_dates' and 'haystack_sessions' "
                         f"differ in length ({len(sids)}, {len(dates)}, {len(sessions)})")
    turns: list[Turn] = []
    gold: list[str] = []
    seen: dict[str, int] = {}
    for si, (sid, date, sess) in enumerate(zip(sids, dates, sessions)):
        sw = f"{where}: haystack_sessions[{si}]"
        if not isinstance(sid, str):
            raise InputError(f"{where}: haystack_session_ids[{si}] must be a non-empty string")
        id_field(sid, f"haystack_session_ids[{si}]", where)  # unit ids are built from it
        if DUP_MARK in sid:
            raise InputError(f"{where}: haystack_session_ids[{si}] {sid!r} holds {DUP_MARK!r}, which marks "
                             "repeated sessions")
        seen[sid] = seen.get(sid, 0) + 1
        if seen[sid] > 1:  # the same session placed twice (real files do this): unit ids stay unique
            sid = f"{sid}{DUP_MARK}{seen[sid]}"
        if not isinstance(sess, list):
            raise InputError(f"{sw} must be a list of turns, got {type(sess).__name__}")
        if not isinstance(date, str):
            raise InputError(f"{where}: haystack_dates[{si}] must be a string")
        valid_unicode(date, f"haystack_dates[{si}]", where)
        try:
            when = parse_date(date, dayfirst=dayfirst)
        except ValueError as e:
            raise InputError(f"{where}: haystack_dates[{si}]: {e}") from None
        answer_session = "answer" in sid
        for ti, t in enumerate(sess):
            tw = f"{sw}[{ti}]"
            if not isinstance(t, dict):
                raise InputError(f"{tw}: expected an object, got {type(t).__name__}")
            role = _field(t, "role", tw)
            content = _field(t, "content", tw)
            if role not in ("user", "assistant"):
                raise InputError(f"{tw}: field 'role' must be 'user' or 'assistant', got {role!r}")
            has = t.get("has_answer", False)
            if not isinstance(has, bool):
                raise InputError(f"{tw}: field 'has_answer' must be true or false")
            if role != "user" and units == "user":
                continue
            check_len(content, "content", tw, MAX_TEXT_CHARS)  # the turn bounds of every door (data.fields)
            tid = check_len(f"{sid}_{ti + 1}", f"haystack_session_ids[{si}]", where, MAX_ID_CHARS)
            is_gold = answer_session and role == "user" and has
            if answer_session and not is_gold:
                tid = tid.replace("answer", "noans")
            if is_gold:
                gold.append(tid)
            turns.append(Turn(tid, role, content, si + 1, date, when))
    if not turns:
        raise InputError(f"{where}: empty haystack (no {'user ' if units == 'user' else ''}turn in any session)")
    ids = [t.turn_id for t in turns]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InputError(f"{where}: two units get the id {dup!r} (session ids collide after 'answer' -> 'noans')")
    category = QUESTION_TYPES.index(qtype) + 1 if qtype in QUESTION_TYPES else 0
    q = Question(qid, question, None if answer is None else str(answer), tuple(gold), category,
                 date=now, qtype=qtype)
    speakers = ("user", "assistant") if units == "all" else ("user",)
    return Conversation(qid, turns, speakers, [q], EvidenceRepairs())


def load_longmemeval(path: str | Path, units: Units = "user", *, dayfirst: bool = False) -> list[Conversation]:
    """Load a LongMemEval file (``.json`` or ``.json.gz``): one Conversation per instance.

    :param units: ``user`` (the official turn corpus) or ``all`` (assistant turns too; gold
        stays the ``has_answer`` user turns)
    :param dayfirst: passed to ``parse_date`` (LongMemEval's own ``YYYY/MM/DD`` dates read the same either way)
    """
    if units not in ("user", "all"):
        raise InputError(f"unknown `units` {units!r} (expected 'user' or 'all')")
    path = Path(path)
    data = _read(path)
    if isinstance(data, dict) and "question_id" in data:
        data = [data]
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of LongMemEval instances, got {type(data).__name__}")
    if not data:
        raise InputError(f"{path}: no instances")
    out = [parse_instance(inst, f"{path}: instance {i}", units, dayfirst) for i, inst in enumerate(data)]
    seen: set[str] = set()
    for c in out:
        if c.bank_id in seen:
            raise InputError(f"{path}: duplicate question_id {c.bank_id!r}")
        seen.add(c.bank_id)
    return out
