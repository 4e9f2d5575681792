"""BM25 over a bank's units (bm25s: a maintained, vectorized BM25 with sparse scoring).

Scores for *every* unit are needed (affinity fusion, seed scoring), which bm25s gives through
``get_scores``. The configuration is the standard one a user would reach for with bm25s, so
the BM25 and hybrid baselines are as strong as they are out of the box: bm25s' own tokenization
(lowercase, words of two or more word characters, its English stop-word list) with the Snowball
English stemmer of PyStemmer (a C implementation, the stemmer bm25s recommends), Lucene BM25
with k1 = 1.5, b = 0.75, over the same text the encoder embeds (``Turn.embed_text``: session
date, speaker, words, image caption). ``tests/select/test_select.py`` checks that ``tokenize`` gives
exactly ``bm25s.tokenize``'s tokens.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from itertools import chain
from typing import NamedTuple

import numpy as np

from .text_features import scan_cached

_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # bm25s' (and scikit-learn's) default token pattern


@lru_cache(maxsize=1)
def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("english")


@lru_cache(maxsize=1)
def _stopwords() -> frozenset:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


@lru_cache(maxsize=200_000)
def _stem(w: str) -> str:
    return _stemmer().stemWord(w)


def tokenize(text: str) -> list[str]:
    """Stemmed, stop-word-free tokens of ``text`` (what bm25s.tokenize gives with
    ``stopwords="en"`` and the Snowball stemmer)."""
    sw = _stopwords()
    return [_stem(w) for w in _TOKEN.findall(text.lower()) if w not in sw]


CACHE_TEXTS = 1 << 18
"""Texts :func:`_unit_tokens` keeps. An index over more texts than this tokenizes them without the
cache (:class:`BM25Index`): a least-recently-used cache read in order by more keys than it holds
evicts each before it is read again, so such a pass never hits on its next run, and it would only
push out every smaller bank's entries; at 10^6 units the full cache held about 80 MiB
(``docs/scaling.md``, compact vectors)."""


@lru_cache(maxsize=CACHE_TEXTS)
def _unit_tokens(text: str) -> tuple[str, ...]:
    """:func:`tokenize` of one unit's text, kept across calls: a bank's index is rebuilt on every
    append (BM25's weights depend on every text), but only the new texts are tokenized.
    ``memory.core.forget_in_process_texts`` clears it."""
    return tuple(tokenize(text))


def _texts_tokens(texts: list[str]) -> list[tuple[str, ...]]:
    """Each text's :func:`_unit_tokens`; past :data:`CACHE_TEXTS` texts without the cache
    (``text_features.scan_cached``)."""
    tok = scan_cached(_unit_tokens, len(texts), CACHE_TEXTS)
    return [tok(t) for t in texts]


class BM25Index:
    """BM25 (Lucene variant, k1 = 1.5, b = 0.75) over a fixed list of texts."""

    def __init__(self, texts: list[str]):
        import bm25s

        self.n = len(texts)
        toks = _texts_tokens(texts)
        # term ids in order of first occurrence (what bm25s' own vocabulary building gives)
        vocab: dict[str, int] = {w: i for i, w in enumerate(dict.fromkeys(chain.from_iterable(toks)))}
        self.vocab = vocab
        self.model = bm25s.BM25(k1=1.5, b=0.75)
        self._post: _Postings | None = None
        if vocab:
            flat = np.fromiter(map(vocab.__getitem__, chain.from_iterable(toks)), dtype=np.int64)
            self._post = _index(self.model, flat, np.fromiter(map(len, toks), dtype=np.int64, count=len(toks)), vocab)
        else:  # nothing to score: bm25s says what it says of that
            self.model.index(([[] for _ in toks], vocab), show_progress=False)

    def lean(self) -> "BM25Index":
        """This index without its score matrix's ``data`` and ``indices`` (4 + 4 bytes a posting:
        about 72 MiB at 10^6 units), for an owner that holds them elsewhere (the engine's
        ``bm_data`` / ``bm_idx`` tables, ``engine.bank_tables.build_bank``): what :meth:`appended`
        needs besides the postings' units is kept (vocabulary, ``indptr``, term frequencies,
        lengths), and it takes those units as its ``indices``. :meth:`scores` refuses. This
        index is left as it was."""
        if self._post is None:
            raise ValueError("an index without postings (no term, or bm25s' scipy layout) has no lean form")
        import bm25s

        out = BM25Index.__new__(BM25Index)
        out.n, out.vocab, out._post = self.n, self.vocab, self._post
        out.model = bm25s.BM25(k1=self.model.k1, b=self.model.b)
        out.model.nonoccurrence_array = None
        out.model.scores = {"indptr": self.model.scores["indptr"], "num_docs": self.n}
        out.model.vocab_dict = self.model.vocab_dict
        out.model.unique_token_ids_set = self.model.unique_token_ids_set
        return out

    @property
    def is_lean(self) -> bool:
        """:meth:`lean`'s index: no score matrix of its own."""
        return "data" not in self.model.scores

    def appended(self, texts: list[str], keep: int | None = None,
                 indices: np.ndarray | None = None) -> "BM25Index | None":
        """The index of this index's first ``keep`` texts (None: all) followed by ``texts``, equal
        value for value to ``BM25Index(those texts)`` (the same vocabulary, layout and scores;
        tested), from this index's postings: only ``texts`` are tokenized and counted, the old
        postings are moved into place (each term's new units come after its old ones) and every
        score is computed again (each depends on the number of units and their mean length). This
        index is left as it was (a snapshot may still read it). None where it cannot: the postings
        are not kept (no term yet, or bm25s' scipy layout), or a term first occurs in a text not
        kept (the vocabulary's order would change), or a :meth:`lean` index is given no
        ``indices`` (its postings' units, as its matrix held them): build the index whole."""
        import bm25s

        old = self._post
        m = self.n if keep is None else int(keep)
        if old is None or not 0 < m <= self.n or (indices is None and self.is_lean):
            return None
        doc0, ptr0 = self.model.scores["indices"] if indices is None else indices, self.model.scores["indptr"]
        if len(doc0) != ptr0[-1]:
            raise ValueError(f"{len(doc0)} postings' units for an index of {int(ptr0[-1])} postings")
        c0 = np.diff(ptr0)
        term0, tf0, lens0 = np.repeat(np.arange(len(c0), dtype=np.int64), c0), old.tf, old.lens
        if m < self.n:
            if (doc0[ptr0[:-1][c0 > 0]] >= m).any():  # a term first occurs in a text not kept
                return None
            sel = doc0 < m
            doc0, term0, tf0, lens0 = doc0[sel], term0[sel], tf0[sel], lens0[:m]
        vocab = dict(self.vocab)
        vocab.pop("", None)
        toks = _texts_tokens(texts)
        for w in chain.from_iterable(toks):
            if w not in vocab:
                vocab[w] = len(vocab)
        V, n0, k = len(vocab), m, len(texts)
        lens_new = np.fromiter(map(len, toks), dtype=np.int64, count=k)
        flat = np.fromiter(map(vocab.__getitem__, chain.from_iterable(toks)), dtype=np.int64)
        key, tf = np.unique(np.repeat(np.arange(k, dtype=np.int64), lens_new) * V + flat, return_counts=True)
        order = np.argsort(key % V, kind="stable")
        doc_n, term_n, tf_n = (key // V + n0)[order], (key % V)[order], tf[order]
        c_old = np.bincount(term0, minlength=V)
        c_new = np.bincount(term_n, minlength=V)
        ptr_old, ptr = _indptr(c_old), _indptr(c_old + c_new)
        nnz = int(ptr[-1])
        pos_old = np.arange(len(term0)) + (ptr - ptr_old)[term0]
        pos_new = ptr[term_n] + c_old[term_n] + (np.arange(len(term_n)) - _indptr(c_new)[term_n])
        doc, tf_all = np.empty(nnz, dtype=np.dtype(self.model.int_dtype)), np.empty(nnz, dtype=np.int64)
        doc[pos_old], doc[pos_new] = doc0, doc_n
        tf_all[pos_old], tf_all[pos_new] = tf0, tf_n
        lens = np.concatenate([lens0, lens_new])
        out = BM25Index.__new__(BM25Index)
        out.n, out.vocab, out._post = n0 + k, vocab, _Postings(_compact(tf_all), lens)
        out.model = bm25s.BM25(k1=self.model.k1, b=self.model.b)
        counts = c_old + c_new
        term = np.repeat(np.arange(V, dtype=np.int64), counts)
        _set_model(out.model, _scores(out.model, tf_all, doc, term, lens, counts), doc, ptr, n0 + k, vocab)
        return out

    def scores(self, query: str) -> np.ndarray:
        """[n] float64 BM25 scores of every text for ``query`` (0 where no term matches)."""
        if self.is_lean:
            raise RuntimeError("a lean BM25Index (BM25Index.lean) keeps no score matrix: score with its owner's tables")
        q = [self.vocab[w] for w in tokenize(query) if w in self.vocab]
        if not q:
            return np.zeros(self.n)
        return np.asarray(self.model.get_scores(q), dtype=np.float64)


def _index(model, flat: np.ndarray, lens: np.ndarray, vocab: dict[str, int]):
    """``model.index((ids, vocab))`` for bm25s' Lucene BM25 (``ids``: the texts' term ids, here
    ``flat``, all of them text after text, and ``lens``, how many each text has), with its per-document loops as array
    operations: a bank's index is rebuilt on every append (every score depends on the number of
    units and their mean length), so its cost is the write's. The same values, operation by
    operation, as bm25s' ``build_index_from_ids`` (which the tests compare it with): the Lucene IDF
    ``log(1 + (N - df + 0.5) / (df + 0.5))`` per term in float32, the term-frequency part
    ``tf / (k1 * ((1 - b) + b * |d| / avgdl) + tf)`` in float64, their product rounded to float32,
    laid out as bm25s lays it out (by term, then unit: one stable sort by term of the postings in
    unit order); then the empty token bm25s adds to ``vocab``. Returns the postings in that layout
    (:class:`_Postings`, what :meth:`BM25Index.appended` extends; None for scipy's layout)."""
    n_docs, n_vocab = len(lens), len(vocab)
    key, tf = np.unique(np.repeat(np.arange(n_docs, dtype=np.int64), lens) * n_vocab + flat, return_counts=True)
    doc, term = key // n_vocab, key % n_vocab
    if model.csc_backend == "scipy":  # bm25s' other layout of the matrix (also by term, then unit)
        import scipy.sparse as sp

        scores = _scores(model, tf, doc, term, lens, np.bincount(term, minlength=n_vocab))
        m = sp.csc_matrix((scores, (doc.astype(model.int_dtype), term.astype(model.int_dtype))),
                          shape=(n_docs, n_vocab), dtype=model.dtype)
        _set_model(model, m.data, m.indices, m.indptr, n_docs, vocab)
        return None
    order = np.argsort(term, kind="stable")
    doc, term, tf = doc[order], term[order], tf[order]
    counts = np.bincount(term, minlength=n_vocab)
    _set_model(model, _scores(model, tf, doc, term, lens, counts), doc.astype(model.int_dtype), _indptr(counts),
               n_docs, vocab)
    return _Postings(_compact(tf), lens)


class _Postings(NamedTuple):
    """What a numpy-laid index keeps besides its matrix (whose ``indices`` are the postings' units
    and ``indptr`` their terms) so that :meth:`BM25Index.appended` can extend it: each posting's
    term frequency in the matrix's layout (by term, then unit; one byte each where they fit), and
    each unit's length."""

    tf: np.ndarray
    lens: np.ndarray


def _compact(tf: np.ndarray) -> np.ndarray:
    return tf.astype(np.uint8 if not len(tf) or tf.max() < 256 else np.int32)


def _indptr(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _scores(model, tf, doc, term, lens, df) -> np.ndarray:
    """The postings' Lucene BM25 scores (float32; see :func:`_index`), ``df`` per term."""
    n_docs, k1, b = len(lens), model.k1, model.b
    avg = lens.mean()
    idf = np.zeros(len(df), dtype=model.dtype)
    for t in np.flatnonzero(df).tolist():
        f = int(df[t])
        idf[t] = math.log(1 + (n_docs - f + 0.5) / (f + 0.5))
    tf = tf.astype(model.dtype).astype(np.float64)
    tfc = tf / (k1 * ((1 - b) + b * lens / avg)[doc] + tf)
    return (np.asarray(idf[term], dtype=np.float64) * tfc).astype(model.dtype)


def _set_model(model, data, indices, indptr, n_docs: int, vocab: dict) -> None:
    model.nonoccurrence_array = None
    model.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n_docs}
    if "" not in vocab:
        vocab[""] = max(vocab.values()) + 1
    model.vocab_dict = vocab
    model.unique_token_ids_set = set(vocab.values())
