"""Loader for the LoCoMo layout (``locomo10.json``): a JSON list of samples.

Each sample holds ``conversation`` (``speaker_a``, ``speaker_b``, ``session_N_date_time`` and
``session_N`` lists of turns with ``speaker``, ``dia_id``, ``text`` and optional
``blip_caption``) and ``qa`` (``question``, ``answer``, ``evidence``, ``category``). Images
enter as their captions. Every malformed case stops with an ``InputError`` naming the file,
sample and field; turn fields follow the same rules as JSONL input
(:mod:`trawmem_gpu.data.fields`): turns with empty text and no caption are skipped and counted.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import InputError, loads_json
from .dates import parse_date
from .evidence import parse_evidence
from .fields import EmptyTurn, id_field, make_turn, str_field, valid_unicode
from .jsonl import JSONL_HINT
from .types import Conversation, EvidenceRepairs, Question, Turn

_SESSION = re.compile(r"^session_(\d+)$")


_NAMES = {"turn_id": "dia_id", "speaker": "speaker", "text": "text", "caption": "blip_caption",
          "timestamp": "timestamp"}


def _load_json(path: Path):
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(f"{path}: not UTF-8 (byte 0x{raw[e.start]:02x} on line {line})") from None
    try:
        return loads_json(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: bad JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except ValueError as e:  # nested too deeply
        raise InputError(f"{path}: bad JSON: {e}") from None


def _req(obj: dict, key: str, where: str, kind=str):
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise InputError(f"{where}: missing field {key!r}")
    v = obj[key]
    if kind is not None and not isinstance(v, kind):
        raise InputError(f"{where}: field {key!r} must be {getattr(kind, '__name__', kind)}, got {type(v).__name__}")
    return v


def _turn_like(obj) -> bool:
    """Whether ``obj`` looks like a JSONL turn record rather than a LoCoMo sample."""
    return isinstance(obj, dict) and "conversation" not in obj and "sample_id" not in obj and \
        ("turn_id" in obj or {"speaker", "text"} <= obj.keys())


def parse_sample(sample: dict, where: str, *, dayfirst: bool = False) -> Conversation:
    """One LoCoMo sample -> Conversation. ``where`` prefixes every error message."""
    if _turn_like(sample):
        raise InputError(f"{where}: a turn record (turn_id, speaker, text), not a LoCoMo sample: {JSONL_HINT}")
    sid = id_field(_req(sample, "sample_id", where, None), "sample_id", where)
    where = f"{where} (sample {sid!r})"
    conv = _req(sample, "conversation", where, dict)
    speakers = tuple(conv[k] for k in ("speaker_a", "speaker_b") if isinstance(conv.get(k), str))
    sessions = sorted(int(m.group(1)) for k in conv if (m := _SESSION.match(k)))
    turns: list[Turn] = []
    seen: set[str] = set()
    skipped = 0
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
        date = conv[dkey]
        if not isinstance(date, str):
            raise InputError(f"{where}: field 'conversation.{dkey}' must be a string")
        try:
            when = parse_date(date, dayfirst=dayfirst)
        except ValueError as e:
            raise InputError(f"{where}: field 'conversation.{dkey}': {e}") from None
        for i, t in enumerate(items):
            tw = f"{where}: conversation.{key}[{i}]"
            for f in ("dia_id", "speaker", "text"):
                _req(t, f, tw, None)
            try:
                turn = make_turn(tw, turn_id=t["dia_id"], speaker=t["speaker"], text=t["text"], session=n,
                                 timestamp=date, when=when, caption=t.get("blip_caption"), names=_NAMES)
            except EmptyTurn:
                skipped += 1
                continue
            if turn.turn_id in seen:
                raise InputError(f"{tw}: duplicate turn id {turn.turn_id!r} in field 'dia_id'")
            seen.add(turn.turn_id)
            turns.append(turn)
    if not turns:
        raise InputError(f"{where}: empty conversation (no session holds a turn)")
    repairs = EvidenceRepairs()
    questions: list[Question] = []
    qa = sample.get("qa", [])
    if not isinstance(qa, list):
        raise InputError(f"{where}: field 'qa' must be a list")
    for i, q in enumerate(qa):
        qw = f"{where}: qa[{i}]"
        question = str_field(_req(q, "question", qw, None), "question", qw, empty_ok=False)
        cat = _req(q, "category", qw, int)
        ans = q.get("answer")
        ans = None if ans is None else valid_unicode(str(ans), "answer", qw)
        ev = parse_evidence(q.get("evidence"), seen, repairs)
        questions.append(Question(f"{sid}/q{i}", question, None if ans is None else str(ans), ev, cat,
                                  q.get("adversarial_answer")))
    return Conversation(sid, turns, speakers, questions, repairs, skipped_empty=skipped)


def locomo_samples(path: Path) -> list:
    """The samples of a LoCoMo-layout file as JSON (one sample alone counts as a list of one);
    clear errors for a missing, non-UTF-8 or malformed file, or one that is not a list."""
    data = _load_json(path)
    if isinstance(data, dict) and "conversation" in data:
        data = [data]
    if not isinstance(data, list):
        hint = f" ({JSONL_HINT})" if _turn_like(data) else ""
        raise InputError(f"{path}: expected a JSON list of samples, got {type(data).__name__}{hint}")
    return data


def load_locomo(path: str | Path, *, dayfirst: bool = False) -> list[Conversation]:
    """Load a LoCoMo-layout file (the dev split or the public ``locomo10.json``)."""
    path = Path(path)
    data = locomo_samples(path)
    if not data:
        raise InputError(f"{path}: no samples")
    out = [parse_sample(s, f"{path}: sample {i}", dayfirst=dayfirst) for i, s in enumerate(data)]
    ids = [c.bank_id for c in out]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise InputError(f"{path}: duplicate sample_id {dup!r}")
    return out
