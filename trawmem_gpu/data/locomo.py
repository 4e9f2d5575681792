"""Loader for the LoCoMo layout (``locomo10.json``): a JSON list of samples.

Each sample holds ``conversation`` (``speaker_a``, ``speaker_b``, ``session_N_date_time`` and
``session_N`` lists of turns with ``speaker``, ``dia_id``, ``text`` and optional
``blip_caption``) and ``qa`` (``question``, ``answer``, ``evidence``, ``category``). Images
enter as their captions. Every malformed case stops with an ``InputError`` naming the file,
sample and field.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import InputError
from .dates import parse_date
from .evidence import parse_evidence
from .types import Conversation, EvidenceRepairs, Question, Turn

_SESSION = re.compile(r"^session_(\d+)$")


def _load_json(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: bad JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None


def _req(obj: dict, key: str, where: str, kind=str):
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise InputError(f"{where}: missing field {key!r}")
    v = obj[key]
    if kind is not None and not isinstance(v, kind):
        raise InputError(f"{where}: field {key!r} must be {getattr(kind, '__name__', kind)}, got {type(v).__name__}")
    return v


def parse_sample(sample: dict, where: str) -> Conversation:
    """One LoCoMo sample -> Conversation. ``where`` prefixes every error message."""
    sid = _req(sample, "sample_id", where)
    where = f"{where} (sample {sid!r})"
    conv = _req(sample, "conversation", where, dict)
    speakers = tuple(conv[k] for k in ("speaker_a", "speaker_b") if isinstance(conv.get(k), str))
    sessions = sorted(int(m.group(1)) for k in conv if (m := _SESSION.match(k)))
    turns: list[Turn] = []
    seen: set[str] = set()
    for n in sessions:
        key = f"session_{n}"
        items = conv[key]
        if not isinstance(items, list):
            raise InputError(f"{where}: field 'conversation.{key}' must be a list of turns")
        if not items:
            continue
        dkey = f"{key}_date_time"
        if dkey not in conv:
            raise InputError(f"{where}: missing field 'conversation.{dkey}'")
        try:
            when = parse_date(conv[dkey])
        except ValueError as e:
            raise InputError(f"{where}: field 'conversation.{dkey}': {e}") from None
        for i, t in enumerate(items):
            tw = f"{where}: conversation.{key}[{i}]"
            tid = _req(t, "dia_id", tw)
            speaker = _req(t, "speaker", tw)
            text = _req(t, "text", tw)
            if tid in seen:
                raise InputError(f"{tw}: duplicate turn id {tid!r} in field 'dia_id'")
            seen.add(tid)
            cap = t.get("blip_caption")
            turns.append(Turn(tid, speaker, text, n, conv[dkey], when, cap if isinstance(cap, str) and cap else None))
    if not turns:
        raise InputError(f"{where}: empty conversation (no session holds a turn)")
    repairs = EvidenceRepairs()
    questions: list[Question] = []
    qa = sample.get("qa", [])
    if not isinstance(qa, list):
        raise InputError(f"{where}: field 'qa' must be a list")
    for i, q in enumerate(qa):
        qw = f"{where}: qa[{i}]"
        question = _req(q, "question", qw)
        cat = _req(q, "category", qw, int)
        ans = q.get("answer")
        ev = parse_evidence(q.get("evidence"), seen, repairs)
        questions.append(Question(f"{sid}/q{i}", question, None if ans is None else str(ans), ev, cat,
                                  q.get("adversarial_answer")))
    return Conversation(sid, turns, speakers, questions, repairs)


def load_locomo(path: str | Path) -> list[Conversation]:
    """Load a LoCoMo-layout file (the dev split or the public ``locomo10.json``)."""
    path = Path(path)
    data = _load_json(path)
    if isinstance(data, dict) and "conversation" in data:
        data = [data]
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of samples, got {type(data).__name__}")
    if not data:
        raise InputError(f"{path}: no samples")
    out = [parse_sample(s, f"{path}: sample {i}") for i, s in enumerate(data)]
    ids = [c.bank_id for c in out]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise InputError(f"{path}: duplicate sample_id {dup!r}")
    return out
