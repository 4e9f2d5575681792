"""Generic text cues: temporal and relational demand of a question, temporal expressions in units.

The patterns are plain English function words and date forms, not lists fitted to any data
set's names or topics, so they transfer to users' own histories.
"""
from __future__ import annotations

import functools
import re

import numpy as np

SMALL_BATCH = 16
"""Calls of fewer questions take the plain forms of the text work (:func:`demand_matrix_re`,
``relevance._named_plain_batch``, ``word_table.question_columns``: the same values): the compiled
scans' fixed costs per call (the joined text, its bytes, the dispatch: ~10-70 us at one question)
exceed what they save on a few questions (the single-query text step measured 0.11 ms with the
plain forms and 0.20 ms with the scans on a one-bank engine)."""

_MONTHS = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*"
_DAYS = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
# Each question pattern starts with a lookahead on the first letters its alternatives can start
# with: it changes no match (tests/select/test_select.py checks both) and lets the scan skip other
# positions at once (Python's re would otherwise try every alternative at every position).
TEMPORAL_Q = re.compile(
    r"(?=[wbasfulrdymh])\b(when|what (?:year|month|day|date|time|week)|how long|how many (?:years|months|weeks|days)|"
    r"before|after|since|until|first|last|recently|ago|during|date|year|month|week)\b", re.I)
RELATIONAL_Q = re.compile(
    r"(?=[bacsrtewlmh])\b(both|and|common|share|shared|relationship|between|together|compare|each other|also|"
    r"would|likely|might|why|how many|what kinds?|which)\b", re.I)
TEMPORAL_UNIT = re.compile(
    rf"\b({_MONTHS}|{_DAYS}|yesterday|today|tomorrow|tonight|last (?:week|month|year|night|weekend)|"
    rf"next (?:week|month|year)|(?:19|20)\d\d|\d+ (?:days?|weeks?|months?|years?) ago|ago|weekend|"
    rf"morning|evening|since|recently)\b", re.I)
_NAME = re.compile(r"\b[A-Z][a-z]+\b")
# The two question patterns without re.I, for an ASCII question's lower case: their text has no
# upper-case letter, and on ASCII text lowering changes no word boundary, so they match there
# exactly where the case-blind ones match the question (and Python's re runs them ~1.7x faster).
_TEMPORAL_LOW = re.compile(TEMPORAL_Q.pattern)
_RELATIONAL_LOW = re.compile(RELATIONAL_Q.pattern)
# _NAME's matches with the letter class first (an upper-case letter with no word character before
# it is where ``\b[A-Z]`` starts), so Python's re looks for that class before trying a match (~2x)
_NAME_FIRST = re.compile(r"[A-Z](?<!\w[A-Z])[a-z]+\b")


def demand_features(question: str) -> np.ndarray:
    """x_q = (1, z_temp, z_rel, z_len) in [0, 1]^4 from the question text alone."""
    words = question.split()
    z_temp = min(1.0, len(TEMPORAL_Q.findall(question)) / 1.0)
    names = {m for m in _NAME.findall(question)[1:]}  # skip the sentence-initial word
    z_rel = min(1.0, 0.5 * len(RELATIONAL_Q.findall(question)) + 0.5 * max(0, len(names) - 1))
    z_len = min(1.0, len(words) / 25.0)
    return np.array([1.0, z_temp, z_rel, z_len])


def demand_matrix(questions: list[str]) -> np.ndarray:
    """``[Q, 4]`` float64: row q is ``demand_features(questions[q])``, bit for bit: the ASCII
    questions in one compiled scan (``text_scan.demand_rows``, when numba imports and the call holds
    at least :data:`SMALL_BATCH` questions), the others by :func:`demand_matrix_re`."""
    Q = len(questions)
    if Q < SMALL_BATCH:
        return demand_matrix_re(questions)
    from ._jit import HAS_NUMBA
    from .text_scan import demand_rows

    if not HAS_NUMBA:
        return demand_matrix_re(questions)

    if "".join(questions).isascii():
        return demand_rows(questions)
    slow = [i for i, q in enumerate(questions) if not q.isascii()]
    qs = list(questions)
    for i in slow:  # scanned as empty text, then overwritten
        qs[i] = ""
    X = demand_rows(qs)
    X[slow] = demand_matrix_re([questions[i] for i in slow])
    return X


def demand_matrix_re(questions: list[str]) -> np.ndarray:
    """:func:`demand_matrix` by the regular expressions (the form before the compiled scan, and its
    path for text that is not ASCII): z_temp only asks whether the temporal pattern occurs
    (``min(1, count)`` is 1 from the first match on), the names are not scanned when two
    relational matches already put z_rel at 1, an ASCII question is scanned in lower case by the
    patterns without re.I, and one array is built for the batch instead of one per question."""
    rows = []
    for question in questions:
        if question.isascii():
            low = question.lower()
            z_temp = 1.0 if _TEMPORAL_LOW.search(low) else 0.0
            n_rel = len(_RELATIONAL_LOW.findall(low))
        else:
            z_temp = 1.0 if TEMPORAL_Q.search(question) else 0.0
            n_rel = len(RELATIONAL_Q.findall(question))
        if n_rel >= 2:  # 0.5 * n_rel >= 1 and the names' part is >= 0
            z_rel = 1.0
        else:
            names = set(_NAME_FIRST.findall(question)[1:])
            z_rel = min(1.0, 0.5 * n_rel + 0.5 * max(0, len(names) - 1))
        rows.append((1.0, z_temp, z_rel, min(1.0, len(question.split()) / 25.0)))
    return np.array(rows, dtype=np.float64).reshape(len(rows), 4)


def scan_cached(fn, n: int, limit: int):
    """``fn`` (an ``functools.lru_cache`` function) for one in-order pass over ``n`` keys, or past
    ``limit`` (its cache's size) the same function uncached (``fn.__wrapped__``): an LRU cache
    filled by such a pass over more keys than it holds evicts each key before it comes round
    again, so the next pass hits nothing, and the cache would only keep the last keys alive (at
    10^6 units: 65,536 turns and their lines in ``workspace.token_costs``, 2^18 texts here, about
    80 MiB of tokens in ``lexical.BM25Index``)."""
    return fn if n <= limit else fn.__wrapped__


def temporal_flags(texts: list[str]) -> np.ndarray:
    """[n] float: 1 where a unit's text holds a temporal expression (more texts than
    ``TEMPORAL_CACHED`` without the cache: :func:`scan_cached`)."""
    flag = scan_cached(_temporal, len(texts), TEMPORAL_CACHED)
    return np.array([flag(t) for t in texts], dtype=np.float64)


TEMPORAL_CACHED = 1 << 16
"""Texts :func:`_temporal` keeps (a bank built again, e.g. an engine rebuilt over a small bank,
searches none of them twice; an append searches only its new units' texts)."""


@functools.lru_cache(maxsize=TEMPORAL_CACHED)
def _temporal(text: str) -> float:
    """One text's flag, kept across calls. ``memory.core.forget_in_process_texts`` clears it."""
    return 1.0 if TEMPORAL_UNIT.search(text) else 0.0


_COUNT = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
          "nine": 9, "ten": 10, "a couple of": 2, "a few": 3}
_SPAN_DAYS = {"day": 1.0, "week": 7.0, "month": 30.44, "year": 365.25}
RELATIVE_AGO = re.compile(r"\b(\d{1,3}|a couple of|a few|an?|one|two|three|four|five|six|seven|eight|nine|ten)\s+"
                          r"(day|week|month|year)s?\s+ago\b", re.I)
RELATIVE_LAST = re.compile(r"\b(yesterday|last\s+(?:week(?:end)?|month|year|" + _DAYS + r"))\b", re.I)


def relative_dates(question: str) -> list[tuple[float, float]]:
    """``[(age_days, tolerance_days)]``: the times a question points at relative to when it is
    asked ("two weeks ago", "last month", "yesterday", "last Friday"), as an age and how far off a
    memory's date may be and still match (a quarter of the span, at least a day and a half).
    Empty when the question names no relative time."""
    out = []
    for m in RELATIVE_AGO.finditer(question):
        n = m.group(1).lower()
        age = (int(n) if n.isdigit() else _COUNT[n]) * _SPAN_DAYS[m.group(2).lower()]
        out.append((age, max(1.5, 0.25 * age)))
    for m in RELATIVE_LAST.finditer(question):
        w = m.group(1).lower().split()
        unit = "day" if w[0] == "yesterday" else ("week" if w[1] not in ("month", "year") else w[1])
        age = _SPAN_DAYS[unit]  # "last Friday": about a week back
        out.append((age, max(1.5, 0.25 * age)))
    return out
