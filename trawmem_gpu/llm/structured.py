"""Structured (JSON) model output: tolerant reading, and :func:`ask`, the one way every structured
call is sent, re-asked, checked and counted (:func:`fell_back` for what the caller falls back for)."""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

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


# -- structured calls: one home for sending, re-asking, refusing and counting ------------------------
@dataclass
class Outcome:
    """What one structured call gave for one item."""

    value: Any = None
    """The parsed reply (None unless ``status`` is ``ok`` or ``refused``)."""
    status: str = "ok"
    """``ok``; ``malformed`` (no usable JSON after the re-asks); ``refused`` (read, but its check
    refused it: ungrounded, degenerate, markup); ``cut`` (stopped at its token limit, incomplete);
    ``failed`` (the request failed: server error, timeout, context overflow)."""
    why: str = ""
    """Why it is not ``ok`` (one line)."""
    text: str = ""
    """The last reply's text."""
    error: Optional[str] = None
    """The request's error, for ``failed``."""
    asked: int = 0
    """Requests sent for this item (1 + its re-asks)."""
    first: str = ""
    """The status of the first reply (``malformed`` when a re-ask then mended it)."""
    result: Any = None
    """The last :class:`~trawmem_gpu.llm.base.LLMResult` (tokens, latency, cached)."""
    first_value: Any = None
    """The first reply's parsed value (None when it was malformed or failed)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def too_long(self) -> bool:
        """The request was too long for the model, or its reply stopped at its token limit: a
        shorter request (half the window) may succeed."""
        from .openai_wire import CONTEXT_EXCEEDED

        return self.status == "cut" or (self.status == "failed" and (self.error or "").startswith(CONTEXT_EXCEEDED))


STATUSES = ("ok", "malformed", "refused", "cut", "failed")


def ask(llm, prompt, convs: list, parse: Callable[[int, str], Any], *, desc: str, max_tokens: int,
        check: Optional[Callable[[int, Any], Optional[str]]] = None,
        again: Optional[Callable[[int, Any], Optional[str]]] = None, retries: int = 1,
        echo_chars: int = 4000) -> list[Outcome]:
    """Send structured conversations and read their replies (the one home of every structured call).

    ``prompt``: the :class:`~trawmem_gpu.llm.prompts.Prompt` whose reply schema goes with the
    requests (constrained decoding); ``parse(i, text)`` reads reply ``i`` (None: malformed);
    ``check(i, value)`` refuses a read value by returning why (grounding, degenerate output);
    ``again(i, value)`` may ask for one more try of a read value by returning the follow-up
    message (e.g. "use only the ids shown"): the new reply replaces it unless malformed.

    A malformed reply is re-asked ``retries`` times (the model is shown its reply and asked for the
    JSON again); a reply cut at its token limit is not re-asked whole (status ``cut``: the caller
    may send a shorter request). Every reply read, malformed, refused or cut is counted on
    ``llm.usage`` under ``desc`` (with the re-asks as retries); the caller reports what it falls
    back for with :func:`fell_back`.
    """
    from .prompts import RETRY_JSON, retry_messages

    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    schema = getattr(prompt, "schema", None)
    out: list[Optional[Outcome]] = [None] * len(convs)
    current, pending = list(convs), list(range(len(convs)))
    counts = {"replies": 0, "malformed": 0, "checked": 0, "refused": 0, "retries": 0}
    for attempt in range(retries + 1):
        if not pending:
            break
        res = llm.chat([current[i] for i in pending], max_tokens=max_tokens, temperature=0.0, json_mode=True,
                       schema=schema, desc=desc if attempt == 0 else f"{desc}-retry",
                       accept=lambda j, t, p=tuple(pending): parse(p[j], t) is not None)
        still = []
        for i, r in zip(pending, res):
            prev = out[i]
            got = _read(i, r, parse, check, counts)
            got.result = r
            got.asked, got.first = (prev.asked + 1, prev.first) if prev is not None else (1, got.status)
            got.first_value = prev.first_value if prev is not None else got.value
            if prev is not None and prev.status == "ok" and not got.ok:
                prev.asked = got.asked
                continue  # a follow-up (``again``) that did worse: keep the first reply
            out[i] = got
            msg = None
            if got.status == "malformed":
                msg = RETRY_JSON
            elif got.ok and again is not None and prev is None:
                msg = again(i, got.value)
            if msg and attempt < retries:
                current[i] = retry_messages(convs[i], r.text, msg, echo_chars)
                still.append(i)
        counts["retries"] += len(still)
        pending = still
    llm.usage.note(desc, **counts)
    return out  # type: ignore[return-value]


def _read(i: int, r, parse, check, counts: dict) -> Outcome:
    if r.error is not None:
        return Outcome(status="failed", why=f"request failed: {r.error[:200]}", error=r.error)
    counts["replies"] += 1
    val = parse(i, r.text)
    if val is None:
        if getattr(r, "cut", False):  # incomplete, not malformed (the result counts it as cut)
            return Outcome(status="cut", why="the reply stopped at its token limit", text=r.text)
        counts["malformed"] += 1
        return Outcome(status="malformed", why="malformed reply", text=r.text)
    counts["checked"] += 1
    why = check(i, val) if check is not None else None
    if why:
        counts["refused"] += 1
        return Outcome(val, "refused", str(why), r.text)
    return Outcome(val, "ok", "", r.text)


def reason(o: "Outcome") -> Optional[str]:
    """One line on why ``o`` is not used (``"refused: not supported by ..."``), None when it is ok."""
    if o.ok:
        return None
    return o.why if o.why.startswith(o.status) else f"{o.status}: {o.why}" if o.why else o.status


def fell_back(llm, desc: str, outcomes: list, what: str = "output") -> dict:
    """Count the items of ``outcomes`` (:class:`Outcome` or ``(status, why)`` pairs; the ok ones
    are skipped) that the caller falls back for, on ``llm.usage`` under ``desc``, and return
    why -> count. With ``llm.strict`` (``--strict-llm``) a fallback raises
    :class:`~trawmem_gpu.errors.LLMFallbackError` naming the step, how many and why."""
    from collections import Counter

    from ..errors import LLMFallbackError

    whys: Counter = Counter()
    for o in outcomes:
        o = o if isinstance(o, Outcome) else Outcome(status=o[0], why=o[1])
        if not o.ok:
            whys[reason(o)] += 1
    n = sum(whys.values())
    if n and llm is not None:
        llm.usage.note(desc, fallbacks=n)
        if getattr(llm, "strict", False):
            shown = "; ".join(f"{k} ({v})" for k, v in whys.most_common(3))
            raise LLMFallbackError(f"`strict`: {n} of {len(outcomes)} {desc} {what}(s) would fall back: {shown}")
    return dict(whys)
