"""A bank's known question words for the compiled BM25 split (issue 46 item 3, seventh pass).

``steps.candidates.bm25_columns`` maps each raw word of a question (a maximal run of ASCII word
characters, lower-cased, 2 or more long: ``\\b\\w\\w+\\b``'s tokens) to its BM25 column, or -1 (a
stop word, a word the bank does not hold). A :class:`WordTable` keeps the words a bank's questions
have used, so a run of its questions is split and mapped in one compiled pass
(:func:`split_columns`): each word's 64-bit FNV-1a hash is looked up among the table's sorted
hashes and its bytes compared with the stored word's (words whose hashes collide are both kept
and told apart by their bytes, so the map is exact). Words the table lacks are reported; the
caller maps them (stop words, the stemmer, the vocabulary) and adds them, then splits again.
"""
from __future__ import annotations

import re
import threading

import numpy as np

from ._jit import HAS_NUMBA, njit
from .lexical import _TOKEN as TOKEN, _stem as stem, _stopwords as lexical_stopwords

TOKEN_ASCII = re.compile(TOKEN.pattern.replace("(?u)", ""), re.A)
r"""``lexical``'s token pattern with ASCII classes: on ASCII text ``\w`` is the same class, so the
same tokens (~1.5x faster)."""

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


@njit(cache=True)
def _word_byte(c):  # pragma: no cover - compiled
    return (97 <= c <= 122) or (65 <= c <= 90) or (48 <= c <= 57) or c == 95


@njit(cache=True)
def _low(c):  # pragma: no cover - compiled
    return c + 32 if 65 <= c <= 90 else c


@njit(cache=True)
def _find(t, p, L, hv, h, wpos, wlen, pool):  # pragma: no cover - compiled
    """Index of the word ``t[p:p + L]`` (lower-cased, hash ``hv``) in the table, or -1."""
    k = np.searchsorted(h, hv)
    while k < len(h) and h[k] == hv:
        if wlen[k] == L:
            same = True
            for i in range(L):
                if _low(t[p + i]) != pool[wpos[k] + i]:
                    same = False
                    break
            if same:
                return k
        k += 1
    return -1


@njit(cache=True)
def split_columns(t, h, col, wpos, wlen, pool, ids, counts, miss):  # pragma: no cover - compiled
    """Split the ASCII bytes ``t`` (questions separated by a newline byte, none inside one) into
    words and map them: the columns ``>= 0`` to ``ids`` in order, each question's number of them
    to ``counts``; the start and end of each word the table lacks to ``miss`` (``[2, >= words]``).
    Returns ``(len(ids) used, words missed)``."""
    n_ids = 0
    n_miss = 0
    qi = 0
    c0 = 0
    p = 0
    n = len(t)
    while p < n:
        c = t[p]
        if c == 10:  # the next question
            counts[qi] = n_ids - c0
            qi += 1
            c0 = n_ids
            p += 1
            continue
        if not _word_byte(c):
            p += 1
            continue
        q = p
        hv = _FNV_OFFSET
        while q < n and _word_byte(t[q]):
            hv = (hv ^ np.uint64(_low(t[q]))) * _FNV_PRIME
            q += 1
        if q - p >= 2:
            k = _find(t, p, q - p, hv, h, wpos, wlen, pool)
            if k < 0:
                miss[0, n_miss] = p
                miss[1, n_miss] = q
                n_miss += 1
            elif col[k] >= 0:
                ids[n_ids] = col[k]
                n_ids += 1
        p = q
    counts[qi] = n_ids - c0
    return n_ids, n_miss


@njit(cache=True)
def _hashes(pool, wpos, wlen, out):  # pragma: no cover - compiled
    for k in range(len(wpos)):
        hv = _FNV_OFFSET
        for i in range(wlen[k]):
            hv = (hv ^ np.uint64(pool[wpos[k] + i])) * _FNV_PRIME
        out[k] = hv


class WordTable:
    """A bank's known words (lower-case ASCII, 2 or more word characters) and their columns, as
    sorted arrays :func:`split_columns` reads. Threads may share one (an engine's callers): the
    arrays are one tuple, replaced whole, so a split reads one consistent version; :meth:`add`
    builds the next version under a lock from the latest one, so no thread's words are lost."""

    def __init__(self):
        self.arrays = (np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                       np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint8))
        """``(h, col, wpos, wlen, pool)``: the words' hashes (sorted), columns, places and lengths in
        ``pool`` (their bytes)."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.arrays[0])

    def add(self, words: dict[str, int]) -> None:
        """Add ``{word: column}`` (lower-case ASCII words; one the table holds already is held twice,
        with the same column: the first is found)."""
        if not words:
            return
        enc = [w.encode("ascii") for w in words]
        cols = np.fromiter(words.values(), dtype=np.int64, count=len(words))
        new_len = np.array([len(b) for b in enc], dtype=np.int64)
        with self._lock:
            h0, col0, wpos0, wlen0, pool0 = self.arrays
            wpos = len(pool0) + np.concatenate([[0], np.cumsum(new_len)[:-1]]).astype(np.int64)
            pool = np.concatenate([pool0, np.frombuffer(b"".join(enc), dtype=np.uint8)])
            h = np.empty(len(enc), dtype=np.uint64)
            _hashes(pool, wpos, new_len, h)
            h_all = np.concatenate([h0, h])
            order = np.argsort(h_all, kind="stable")
            self.arrays = (h_all[order], np.concatenate([col0, cols])[order], np.concatenate([wpos0, wpos])[order],
                           np.concatenate([wlen0, new_len])[order], pool)

    def split(self, joined: str, n: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """``(ids, counts [n], the missed words)`` of ``n`` newline-joined ASCII questions (the
        missed words lower-cased, each once); ids and counts are complete only when none is missed."""
        t = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        ids = np.empty(len(t) // 2 + 1, dtype=np.int64)
        counts = np.zeros(n, dtype=np.int64)
        miss = np.empty((2, len(t) // 2 + 1), dtype=np.int64)
        n_ids, n_miss = split_columns(t, *self.arrays, ids, counts, miss)
        missed = {joined[p:q] for p, q in zip(miss[0, :n_miss].tolist(), miss[1, :n_miss].tolist())}
        return ids[:n_ids], counts, sorted({w.lower() for w in missed})


SEP_WORD = "\x00"
MAX_WORDS = 1 << 16
"""Most words a bank's word map keeps (past it the map starts again: a long-running engine asked
about ever new words holds at most this many per bank)."""
_WORDS = str.maketrans({c: (chr(c).lower() if chr(c).isalnum() or c == 95 else "\n" if c == 10 else " ")
                        for c in range(128)})
r"""ASCII text to its words: a word character to its lower case, a newline kept, any other
character to a space. ``str.split`` of the result gives the maximal runs of word characters,
``TOKEN_ASCII``'s tokens where they are 2 or more long (``\b\w\w+\b`` matches a whole run)."""


def joined_runs(questions: list[str], s: int, e: int):
    """``(a, z, joined)`` over ``questions[s:e]`` in order: runs of ASCII questions without a
    newline with their newline-joined text, and each other question alone (``joined`` None)."""
    joined = "\n".join(questions[s:e])
    if joined.isascii() and joined.count("\n") == e - s - 1:
        yield s, e, joined
        return
    a = s
    for q in range(s, e):
        t = questions[q]
        if not t.isascii() or "\n" in t:
            if a < q:
                yield a, q, "\n".join(questions[a:q])
            yield q, q + 1, None
            a = q + 1
    if a < e:
        yield a, e, "\n".join(questions[a:e])


def word_column(w: str, vocab: dict, o: int, sw) -> int:
    t = -1 if len(w) < 2 or w in sw else vocab.get(stem(w), -1)
    return -1 if t < 0 else o + t


def run_columns(joined: str, m: dict, vocab: dict, o: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, counts)`` of the newline-joined ASCII questions ``joined`` of one bank (``m``: its
    word map, ``SEP_WORD`` -> -2): its words by :data:`_WORDS` (a one-letter word maps to -1, as
    the token pattern never yields it) with ``SEP_WORD`` between questions."""
    toks = joined.translate(_WORDS).replace("\n", " " + SEP_WORD + " ").split()
    try:  # every word known (a warm map): no set of the words
        col = np.fromiter(map(m.__getitem__, toks), dtype=np.int64, count=len(toks))
    except KeyError:
        sw = lexical_stopwords()
        for w in set(toks).difference(m):
            m[w] = word_column(w, vocab, o, sw)
        col = np.fromiter(map(m.__getitem__, toks), dtype=np.int64, count=len(toks))
    sep = np.flatnonzero(col == -2)
    keep = col >= 0
    kept = np.zeros(len(col) + 1, dtype=np.int64)
    np.cumsum(keep, out=kept[1:])
    at = kept[np.append(sep, len(col))]
    return col[keep], np.diff(at, prepend=0)


def table_columns(joined: str, n: int, table: WordTable, vocab: dict, o: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`run_columns` by the compiled split over the bank's :class:`WordTable` (the words it
    lacks mapped and added, then split again)."""
    ids, counts, missed = table.split(joined, n)
    if missed:
        sw = lexical_stopwords()
        table.add({w: word_column(w, vocab, o, sw) for w in set(missed)})
        ids, counts, missed = table.split(joined, n)
        if missed:
            raise RuntimeError(f"words missed after they were added: {missed[:5]}")
    return ids, counts


def question_columns(text: str, m: dict, vocab: dict, o: int) -> list[int]:
    """One question's columns, word by word (``m``: its bank's word map)."""
    sw = lexical_stopwords()
    ids = []
    for w in (TOKEN_ASCII if text.isascii() else TOKEN).findall(text.lower()):
        c = m.get(w)
        if c is None:
            c = m[w] = word_column(w, vocab, o, sw)
        if c >= 0:
            ids.append(c)
    return ids
