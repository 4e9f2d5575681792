"""Checks an LLM output must pass to be stored or used, none of which needs a second LLM.

* :func:`markup` finds what a reply copied from its prompt's format instead of writing content:
  tags (``</one sentence>``), braces, JSON keys, the workspace's turn ids (``[D1:4]``) and
  headings (``## 29 January 2023``), and runs of the prompt's own instruction words.
* :func:`lexical_support` is the share of an output's content words that its sources hold (a
  word counts when a source word has its stem: "hiking" / "hiked");
  :func:`embedding_support` the best cosine between the output's vector and its sources'.
* :func:`echoes` says whether an answer only restates its question.

The floors the callers hold outputs to are defined here, once (:data:`HEAD_LEXICAL_FLOOR`...).
"""
from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence

import numpy as np

STEM = 5
"""Letters two words must share, after one inflection is taken off, to count as the same word."""
HEAD_WORDS = (5, 60)
"""A head's length in words: fewer is a name or a label, more is not one sentence."""
HEAD_CONTENT_WORDS = 3
"""Distinct content words (besides numbers) a head needs to state an event (who did what)."""
HEAD_LEXICAL_FLOOR = 0.6
"""Share of a head's content words its thread's turns must hold."""
HEAD_EMBEDDING_FLOOR = 0.35
"""Cosine (normalized vectors) a head must reach with at least one turn of its thread."""
FACT_LEXICAL_FLOOR = 0.5
"""Share of a fact's content words its cited turns (with their speakers and dates) must hold."""
FACT_EMBEDDING_FLOOR = 0.3
"""Cosine a fact must reach with at least one of its cited turns."""
PROMPT_COPY_WORDS = 5
"""A run of this many words of the prompt's instructions (and not of its data) is copied format."""
ECHO_SHARE = 0.6
"""An answer whose content words all come from its question and cover this share of them echoes it."""

_STOP = frozenset("""a an the and or but if of to in on at by for with from as is are was were be been being it its
this that these those there here he she they them his her their we you i me my your our us do does did done
have has had not no yes so than then too very can could would should will shall may might must about into
over after before during up down out off again just also only what when where which who whom whose why how
all any each both few more most other some such own same s t don now""".split())
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’-]*")
_TAG = re.compile(r"</?[A-Za-z][^<>]{0,40}>")
_TURN_ID = re.compile(r"\[D\d+:\d+\]|\bD\d+:\d+\b")
_HEADING = re.compile(r"(?m)^\s*#{1,6}\s")
_JSONISH = re.compile(r"[{}]|\"\s*:\s*[\[{\"]|\b(?:source_turns|fact_ids|boundaries|queries)\b")


def words(text: str) -> list[str]:
    """The lower-case words of ``text`` (possessive 's dropped)."""
    out = []
    for w in _WORD.findall(text or ""):
        w = w.lower().replace("’", "'")
        if w.endswith("'s"):
            w = w[:-2]
        out.append(w.strip("'-"))
    return [w for w in out if w]


def content_words(text: str) -> list[str]:
    """:func:`words` less stop words and one-letter words."""
    return [w for w in words(text) if w not in _STOP and len(w) > 1]


_SUFFIX = re.compile(r"(?:ing|ed|es|s|e)$")


def _key(w: str) -> str:
    """A word's stem for matching: one inflection off ("hiking", "hiked", "hikes": "hik"), then
    its first :data:`STEM` letters."""
    if len(w) > 3:
        w = _SUFFIX.sub("", w, count=1)
    return w[:STEM]


def lexical_support(text: str, sources: Iterable[str]) -> float:
    """Share of ``text``'s content words found in ``sources`` (1.0 for a text without any)."""
    cw = content_words(text)
    if not cw:
        return 1.0
    have = {_key(w) for s in sources for w in words(s)}
    return sum(_key(w) in have for w in cw) / len(cw)


def embedding_support(vec, source_vecs) -> float:
    """Best cosine of normalized ``vec`` with the rows of ``source_vecs`` (-1.0 without any)."""
    m = np.asarray(source_vecs, dtype=np.float32)
    if m.size == 0:
        return -1.0
    v = np.asarray(vec, dtype=np.float32).reshape(-1)
    return float(np.max(m.reshape(-1, v.shape[0]) @ v))


def markup(text: str, prompt_text: str = "", data_text: str = "") -> Optional[str]:
    """Why ``text`` looks like format rather than content (None when it does not): a tag, JSON,
    a turn id, a heading, or :data:`PROMPT_COPY_WORDS` consecutive words of ``prompt_text`` (the
    prompt's instructions) that ``data_text`` (what it was given to read) does not hold."""
    if _TAG.search(text):
        return "holds markup (a tag)"
    if _JSONISH.search(text):
        return "holds JSON or the prompt's field names"
    if _TURN_ID.search(text):
        return "copies turn ids"
    if _HEADING.search(text):
        return "copies a heading"
    if prompt_text:
        tw, n = words(text), PROMPT_COPY_WORDS
        if len(tw) >= n:
            pw = words(prompt_text)
            grams = {tuple(pw[k:k + n]) for k in range(len(pw) - n + 1)}
            dw = words(data_text)
            data = {tuple(dw[k:k + n]) for k in range(len(dw) - n + 1)}
            if any(tuple(tw[k:k + n]) in grams - data for k in range(len(tw) - n + 1)):
                return "copies the prompt's instructions"
    return None


def head_problem(head: str, turn_texts: Sequence[str], prompt_text: str = "") -> Optional[str]:
    """Why a thread head is refused before its vector is known (None: it passes): markup or prompt
    text, its length outside :data:`HEAD_WORDS`, or lexical support by its thread's turns under
    :data:`HEAD_LEXICAL_FLOOR`."""
    why = markup(head, prompt_text, "\n".join(turn_texts))
    if why:
        return why
    n = len(words(head))
    if not HEAD_WORDS[0] <= n <= HEAD_WORDS[1]:
        return f"{n} words (a head has {HEAD_WORDS[0]} to {HEAD_WORDS[1]})"
    if len({w for w in content_words(head) if w.isalpha()}) < HEAD_CONTENT_WORDS:  # "Ben Ben Ben Ben Ben"
        return f"states nothing (fewer than {HEAD_CONTENT_WORDS} distinct content words besides numbers)"
    s = lexical_support(head, turn_texts)
    if s < HEAD_LEXICAL_FLOOR:
        return f"not supported by its thread (lexical support {s:.2f} < {HEAD_LEXICAL_FLOOR})"
    return None


def fact_problem(text: str, cited_texts: Sequence[str], prompt_text: str = "") -> Optional[str]:
    """Why a fact is refused on its text (None: it passes): markup or prompt text, or lexical
    support by its cited turns (their speakers and dates included) under :data:`FACT_LEXICAL_FLOOR`."""
    why = markup(text, prompt_text, "\n".join(cited_texts))
    if why:
        return why
    if len(content_words(text)) < 2:
        return "too short to state a fact"
    s = lexical_support(text, cited_texts)
    if s < FACT_LEXICAL_FLOOR:
        return f"not supported by its cited turns (lexical support {s:.2f} < {FACT_LEXICAL_FLOOR})"
    return None


def echoes(answer: str, question: str) -> bool:
    """True when every content word of ``answer`` is one of ``question``'s and together they cover
    at least :data:`ECHO_SHARE` of the question's: the answer restates the question (an answer
    that picks one option of an "A or B" question covers less and passes)."""
    aw = {_key(w) for w in content_words(answer)}
    qw = {_key(w) for w in content_words(question)}
    if len(aw) < 2 or not qw:
        return False
    return aw <= qw and len(aw) / len(qw) >= ECHO_SHARE


_DATE_WORDS = frozenset("""january february march april may june july august september october november december
jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday today
yesterday tomorrow""".split())


def search_problem(search: str) -> Optional[str]:
    """Why a planned search is refused (None: it passes): blank, markup, or no content word
    besides numbers and date words (a bare date such as "2 March 2024" is no question for the
    memory: it is an answer)."""
    if not search or not search.strip():
        return "blank search"
    why = markup(search)
    if why:
        return why
    if not any(w.isalpha() and w not in _DATE_WORDS for w in content_words(search)):
        return "not a question (no content word besides numbers and dates)"
    return None


_LINE_ID = re.compile(r"(?m)^\[([^\]\s]{1,40})\]\s+(?:\([^)]*\)\s+)?([^:\n]{1,60}):")
_PROMPT_LABELS = re.compile(r"(?i)\b(?:memory|question|gold answer|generated answer)\s*:")


def answer_problem(answer: str, question: str, context: str = "") -> Optional[str]:
    """Why an answer is refused (None: it passes): empty; markup (a tag, a ``##`` heading, a turn
    id, JSON); an id or a ``speaker:`` label copied from the workspace lines of ``context``
    (``[id] speaker: text``); the prompt's labels (``Question:``); or an echo of the question
    (:func:`echoes`). "Not mentioned in the conversation" and short answers pass."""
    a = (answer or "").strip()
    if not a:
        return "empty answer"
    why = markup(a)
    if why:
        return why
    ids = {m.group(1) for m in _LINE_ID.finditer(context or "")}
    if any(f"[{i}]" in a for i in ids):
        return "copies the workspace's format (a turn id)"
    speakers = {m.group(2).strip() for m in _LINE_ID.finditer(context or "")}
    head = a.split(":", 1)[0].strip() if ":" in a[:62] else None
    if head and head in speakers:
        return "copies the workspace's format (a speaker's line)"
    if _PROMPT_LABELS.search(a):
        return "copies the prompt's format"
    if echoes(a, question):
        return "echoes the question"
    return None
