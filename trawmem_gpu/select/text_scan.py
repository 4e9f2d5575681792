"""The question scans of a batch's text work compiled (issue 46 item 3, seventh pass): the demand
features (:func:`demand_rows`) and the learned affinity's speaker names (:func:`named_flat`).

``text_features.demand_matrix`` ran four scans per question in Python's ``re`` (the temporal and
relational patterns, the capitalized names, ``str.split``); at the target point they were about
7% of a batch call. Their patterns are lists of literal alternatives between word boundaries, so
on ASCII text they are matched here byte by byte, all questions in one compiled call, with the
semantics ``re`` gives them:

* a match starts where a word starts (the pattern's leading ``\\b`` before a letter: the byte
  before is no word byte), the alternatives are tried in the pattern's order (an inner group
  expanded in place, ``kinds?`` as ``kinds`` then ``kind``), the first one whose bytes are there
  and that ends at a word boundary wins, and the scan goes on after it (``findall``: matches do
  not overlap);
* names: ``[A-Z](?<!\\w[A-Z])[a-z]+\\b``, an upper-case letter after no word byte, the longest run
  of lower-case letters after it, then no word byte;
* words: ``str.split()``'s count (ASCII whitespace and the separators ``\\x1c``-``\\x1f``).

``\\w`` on ASCII text is ``[A-Za-z0-9_]``; the patterns are case-blind, so the text is compared in
lower case (ASCII case folding is ``str.lower``'s there). Questions that are not ASCII keep the
regular expressions (the caller). A speaker's name is searched as ``relevance._named`` does on
ASCII text: the lower-case name at a place with no word byte just before or after it.
``tests/select/test_text_scan.py`` compares both with their regular-expression forms.
"""
from __future__ import annotations

import numpy as np

from ._jit import njit

TEMPORAL_WORDS = ("when", "what year", "what month", "what day", "what date", "what time", "what week", "how long",
                  "how many years", "how many months", "how many weeks", "how many days", "before", "after", "since",
                  "until", "first", "last", "recently", "ago", "during", "date", "year", "month", "week")
"""``text_features.TEMPORAL_Q``'s alternatives in its order, groups expanded."""
RELATIONAL_WORDS = ("both", "and", "common", "share", "shared", "relationship", "between", "together", "compare",
                    "each other", "also", "would", "likely", "might", "why", "how many", "what kinds", "what kind",
                    "which")
"""``text_features.RELATIONAL_Q``'s alternatives in its order (``kinds?`` greedy: ``kinds`` first)."""


def literals(words: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(bytes, ptr, by_first, first_ptr)``: the words as one uint8 array and their offsets
    (CSR), and the words' indices grouped by their first byte (``by_first[first_ptr[c]:first_ptr[c
    + 1]]``: the words that start with byte ``c``, in the pattern's order: only words with the same
    first byte can both match at one place, so their order is the order that matters)."""
    enc = [w.encode("ascii") for w in words]
    ptr = np.zeros(len(enc) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(b) for b in enc])
    by_first = np.array(sorted(range(len(enc)), key=lambda k: (enc[k][0], k)), dtype=np.int64)
    first_ptr = np.searchsorted(np.array([enc[k][0] for k in by_first], dtype=np.int64), np.arange(257), "left")
    return np.frombuffer(b"".join(enc), dtype=np.uint8).copy(), ptr, by_first, first_ptr.astype(np.int64)


_TEMPORAL = literals(TEMPORAL_WORDS)
_RELATIONAL = literals(RELATIONAL_WORDS)


@njit(cache=True)
def _is_word(c):  # pragma: no cover - compiled
    return (97 <= c <= 122) or (65 <= c <= 90) or (48 <= c <= 57) or c == 95


@njit(cache=True)
def _is_space(c):  # pragma: no cover - compiled
    return (9 <= c <= 13) or (28 <= c <= 32)


@njit(cache=True)
def _lower(c):  # pragma: no cover - compiled
    return c + 32 if 65 <= c <= 90 else c


@njit(cache=True)
def _match(t, p, e, c, lit):  # pragma: no cover - compiled
    """Length of the first alternative of ``lit`` (:func:`literals`) that matches at ``t[p]``
    (lower-cased first byte ``c``) and ends at a word boundary before ``e``, or 0."""
    lb, lptr, by_first, first_ptr = lit
    for f in range(first_ptr[c], first_ptr[c + 1]):
        k = by_first[f]
        a, b = lptr[k], lptr[k + 1]
        L = b - a
        if p + L <= e and _word_rest(t, p, e, lb, a, L):
            return L
    return 0


@njit(cache=True)
def _word_rest(t, p, e, lb, a, L):  # pragma: no cover - compiled
    """Whether ``t[p + 1:p + L]`` (lower-cased) is ``lb[a + 1:a + L]`` and a word ends there (its
    first byte compared by the caller; ``p + L <= e``)."""
    for i in range(1, L):
        if _lower(t[p + i]) != lb[a + i]:
            return False
    return p + L == e or not _is_word(t[p + L])


@njit(cache=True)
def _distinct_after_first(t, ns, nl, m):  # pragma: no cover - compiled
    """Distinct names among ``(ns[i], nl[i])``, ``1 <= i < m`` (the first, sentence-initial, skipped)."""
    d = 0
    for i in range(1, m):
        seen = False
        for j in range(1, i):
            if nl[j] == nl[i]:
                same = True
                for k in range(nl[i]):
                    if t[ns[j] + k] != t[ns[i] + k]:
                        same = False
                        break
                if same:
                    seen = True
                    break
        if not seen:
            d += 1
    return d


@njit(cache=True)
def demand_counts(t, off, temporal, relational, out):  # pragma: no cover - compiled
    """For each text ``i`` (``t[off[i]:off[i + 1]]``, ASCII bytes): ``out[i] = (temporal match or
    not, relational matches, distinct names after the first, words)``, in one pass over its bytes:
    each pattern keeps the place its scan may next match at (past its last match, as ``findall``
    goes on after one); the temporal one stops at its first match."""
    Q = len(off) - 1
    ns = np.empty(max(1, len(t)), np.int64)
    nl = np.empty(max(1, len(t)), np.int64)
    for i in range(Q):
        s, e = off[i], off[i + 1]
        t_hit = 0
        n_rel = 0
        m = 0
        w = 0
        r_next = s
        n_next = s
        prev_word = False
        prev_space = True
        for p in range(s, e):
            c = t[p]
            space = _is_space(c)
            if prev_space and not space:
                w += 1
            if not prev_word:  # a match of any pattern starts only after no word byte
                lc = _lower(c)
                if t_hit == 0 and _match(t, p, e, lc, temporal) > 0:
                    t_hit = 1
                if p >= r_next:
                    L = _match(t, p, e, lc, relational)
                    if L > 0:
                        n_rel += 1
                        r_next = p + L
                if p >= n_next and 65 <= c <= 90:
                    q = p + 1
                    while q < e and 97 <= t[q] <= 122:
                        q += 1
                    if q > p + 1 and (q == e or not _is_word(t[q])):
                        ns[m] = p
                        nl[m] = q - p
                        m += 1
                        n_next = q
            prev_word = _is_word(c)
            prev_space = space
        out[i, 0] = t_hit
        out[i, 1] = n_rel
        out[i, 2] = _distinct_after_first(t, ns, nl, m)
        out[i, 3] = w


def demand_rows(questions: list[str]) -> np.ndarray:
    """``[Q, 4]`` float64 demand features of ASCII ``questions`` (``demand_features``' values, bit
    for bit: the same float64 operations on the same counts)."""
    Q = len(questions)
    off = np.zeros(Q + 1, dtype=np.int64)
    np.cumsum([len(q) for q in questions], out=off[1:])
    t = np.frombuffer("".join(questions).encode("ascii"), dtype=np.uint8)
    cnt = np.empty((Q, 4), dtype=np.int64)
    demand_counts(t, off, _TEMPORAL, _RELATIONAL, cnt)
    X = np.empty((Q, 4), dtype=np.float64)
    X[:, 0] = 1.0
    X[:, 1] = cnt[:, 0] > 0
    n_rel = cnt[:, 1]
    X[:, 2] = np.where(n_rel >= 2, 1.0, np.minimum(1.0, 0.5 * n_rel + 0.5 * np.maximum(0, cnt[:, 2] - 1)))
    X[:, 3] = np.minimum(1.0, cnt[:, 3] / 25.0)
    return X


@njit(cache=True)
def named_counts(t, off, names, nptr, qn0, qn1, out_off, out):  # pragma: no cover - compiled
    """``out[out_off[q] + k] = 1.0`` where text ``q`` (``t[off[q]:off[q + 1]]``, ASCII) holds name
    ``qn0[q] + k`` (``names[nptr[i]:nptr[i + 1]]``, lower-case ASCII, ``k < qn1[q] - qn0[q]``) as a
    whole word in any case: at a place with no word byte just before or just after it (the
    case-blind ``(?<!\\w)name(?!\\w)`` of ``relevance._named``), else 0.0."""
    for q in range(len(off) - 1):
        s, e = off[q], off[q + 1]
        for k in range(qn1[q] - qn0[q]):
            a, b = nptr[qn0[q] + k], nptr[qn0[q] + k + 1]
            L = b - a
            hit = 0.0
            for p in range(s, e - L + 1):
                if _lower(t[p]) != names[a] or (p > s and _is_word(t[p - 1])):
                    continue
                if _word_rest(t, p, e, names, a, L):
                    hit = 1.0
                    break
            out[out_off[q] + k] = hit


def named_flat(questions: list[str], speakers: list[tuple], named_off: np.ndarray, size: int, one) -> np.ndarray:
    """Flat float64 ``[size]``: query ``q``'s ``one(questions[q], speakers[q])`` (``relevance._named``)
    at ``named_off[q]:``, the ASCII questions against speakers whose names are all ASCII and not
    blank in one :func:`named_counts` call, the others by ``one``."""
    Q = len(questions)
    out = np.empty(size, dtype=np.float64)
    kinds: dict = {}  # each distinct speakers tuple -> its number
    kind = np.array([kinds.setdefault(sp, len(kinds)) for sp in speakers], dtype=np.int64).reshape(Q)
    flat: list[bytes] = []
    r0 = np.zeros(len(kinds) + 1, dtype=np.int64)
    r1 = np.zeros(len(kinds) + 1, dtype=np.int64)
    good = np.zeros(len(kinds), dtype=bool)
    for sp, k in kinds.items():
        low = [s.strip().lower() for s in sp]
        if all(x and x.isascii() and s.strip().isascii() for x, s in zip(low, sp)):
            good[k] = True
            r0[k], r1[k] = len(flat), len(flat) + len(low)
            flat += [x.encode("ascii") for x in low]
    ascii_all = "".join(questions).isascii()
    fast = good[kind] if Q else np.zeros(0, dtype=bool)
    if not ascii_all:
        fast &= np.fromiter((q.isascii() for q in questions), dtype=bool, count=Q)
    for q in np.flatnonzero(~fast).tolist():
        out[named_off[q]:named_off[q] + len(speakers[q])] = one(questions[q], speakers[q])
    rows = np.flatnonzero(fast)
    if len(rows):
        texts = questions if len(rows) == Q else [questions[q] for q in rows.tolist()]
        off = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in texts], out=off[1:])
        nptr = np.zeros(len(flat) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in flat], out=nptr[1:])
        named_counts(np.frombuffer("".join(texts).encode("ascii"), dtype=np.uint8), off,
                     np.frombuffer(b"".join(flat), dtype=np.uint8), nptr, r0[kind[rows]], r1[kind[rows]],
                     np.asarray(named_off, dtype=np.int64)[rows], out)
    return out
