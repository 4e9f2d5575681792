"""Tolerant reading of structured (JSON) model output."""
from __future__ import annotations

import ast
import json
import re
from typing import Any, Optional

MAX_PARSE_CHARS = 100_000
"""Longer outputs are cut before parsing (bounds the cost of hopeless inputs)."""

MAX_STARTS = 32
"""At most this many opening brackets are tried as the start of the JSON value."""

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE_RE = re.compile(r"```(?:json|JSON|javascript|js|python)?\s*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA_RE = re.compile(r",\s*([}\]])")
_PY_LITERALS = {"true": "True", "false": "False", "null": "None"}


def strip_reasoning(text: str) -> str:
    """Drop ``<think>...</think>`` blocks (and an unterminated leading one)."""
    s = _THINK_RE.sub("", text or "")
    low = s.lower()
    if "<think>" in low:  # reasoning cut off by max_tokens: nothing usable after it
        s = s[: low.index("<think>")]
    s = re.sub(r"(?i)</think>", "", s)
    return s.strip()


def _balanced(text: str, start: int) -> Optional[str]:
    """Substring from the bracket at ``start`` to its matching closer (strings respected)."""
    pairs = {"{": "}", "[": "]"}
    stack = [pairs[text[start]]]
    quote = None
    i = start + 1
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'":
            # an apostrophe inside a word ("Mel's") is not a quote
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < len(text) and text[i + 1].isalnum():
                pass
            else:
                quote = c
        elif c in pairs:
            stack.append(pairs[c])
        elif c in "}]":
            if c != stack[-1]:
                return None
            stack.pop()
            if not stack:
                return text[start: i + 1]
        i += 1
    return None


def _loads(candidate: str) -> Any:
    """Strict JSON, then JSON without trailing commas, then Python-literal syntax."""
    for attempt in (candidate, _TRAILING_COMMA_RE.sub(r"\1", candidate)):
        try:
            return json.loads(attempt)
        except (ValueError, RecursionError):
            pass
    py = re.sub(r"\b(true|false|null)\b", lambda m: _PY_LITERALS[m.group(1)], candidate)
    try:
        return ast.literal_eval(py)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def extract_json(text: Optional[str]) -> Any:
    """The first JSON object/array found in ``text``, or None when hopeless.

    Handles code fences, leading/trailing prose, trailing commas, single quotes and Python
    literals (True/None), and ``<think>`` blocks.
    """
    if not text:
        return None
    s = strip_reasoning(str(text)[:MAX_PARSE_CHARS])
    if not s:
        return None
    candidates = [s]
    candidates += [m.group(1).strip() for m in _FENCE_RE.finditer(s)]
    for cand in candidates:
        val = _loads(cand)
        if isinstance(val, (dict, list)):
            return val
        for k, m in enumerate(re.finditer(r"[{\[]", cand)):
            if k >= MAX_STARTS:
                break
            sub = _balanced(cand, m.start())
            if sub is None:
                continue
            val = _loads(sub)
            if isinstance(val, (dict, list)):
                return val
    return None


def _as_int(x: Any) -> Optional[int]:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str) and re.fullmatch(r"\s*\d+\s*", x):
        return int(x)
    return None


def parse_boundaries(text: Optional[str], n_turns: int) -> Optional[list[int]]:
    """Sorted unique thread-start indices (always with 0) or None when malformed.

    Accepts ``{"boundaries": [...]}`` or a bare list. Any non-integer item or an index outside
    ``[0, n_turns)`` makes the output malformed.
    """
    if n_turns <= 0:
        return []
    obj = extract_json(text)
    if isinstance(obj, dict):
        obj = obj.get("boundaries", obj.get("boundary"))
    if not isinstance(obj, list):
        return None
    out = set()
    for x in obj:
        v = _as_int(x)
        if v is None or not (0 <= v < n_turns):
            return None
        out.add(v)
    out.add(0)
    return sorted(out)


def parse_head(text: Optional[str], max_chars: int = 600) -> Optional[str]:
    """The ``head`` string of ``{"head": "..."}`` (whitespace collapsed), or None."""
    obj = extract_json(text)
    if not isinstance(obj, dict):
        return None
    head = obj.get("head", obj.get("summary"))
    if not isinstance(head, str):
        return None
    head = " ".join(head.split())
    if not head:
        return None
    return head[:max_chars]


_LABEL_RE = re.compile(r"\b(CORRECT|INCORRECT|WRONG)\b", re.IGNORECASE)


def _label_word(word: str) -> Optional[str]:
    w = word.strip().upper()
    if w == "CORRECT":
        return "CORRECT"
    if w in ("WRONG", "INCORRECT"):
        return "WRONG"
    return None


def parse_judge(text: Optional[str]) -> Optional[str]:
    """'CORRECT' / 'WRONG' from ``{"label": ...}`` or a bare word; None if absent or ambiguous."""
    obj = extract_json(text)
    if isinstance(obj, dict):
        lab = obj.get("label", obj.get("judgement", obj.get("judgment")))
        if isinstance(lab, str):
            v = _label_word(lab)
            if v is not None:
                return v
    s = strip_reasoning(str(text or "")[:MAX_PARSE_CHARS])
    found = {_label_word(m.group(1)) for m in _LABEL_RE.finditer(s)}
    if len(found) == 1:
        return found.pop()
    return None


_ANSWER_PREFIX_RE = re.compile(r"^\s*(?:final\s+answer|short\s+answer|answer|a)\s*[:：]\s*", re.IGNORECASE)


def clean_answer(text: Optional[str]) -> str:
    """Model answer without reasoning blocks, an 'Answer:' prefix, wrapping quotes or extra spaces."""
    s = strip_reasoning(str(text or ""))
    s = _ANSWER_PREFIX_RE.sub("", s)
    s = " ".join(s.split())
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'`":
        s = s[1:-1].strip()
    return s
