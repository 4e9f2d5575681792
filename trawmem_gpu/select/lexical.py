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

import numpy as np

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


@lru_cache(maxsize=1 << 18)
def _unit_tokens(text: str) -> tuple[str, ...]:
    """:func:`tokenize` of one unit's text, kept across calls: a bank's index is rebuilt on every
    append (BM25's weights depend on every text), but only the new texts are tokenized.
    ``memory.core.forget_in_process_texts`` clears it."""
    return tuple(tokenize(text))


class BM25Index:
    """BM25 (Lucene variant, k1 = 1.5, b = 0.75) over a fixed list of texts."""

    def __init__(self, texts: list[str]):
        import bm25s

        self.n = len(texts)
        toks = [_unit_tokens(t) for t in texts]
        # term ids in order of first occurrence (what bm25s' own vocabulary building gives)
        vocab: dict[str, int] = {w: i for i, w in enumerate(dict.fromkeys(chain.from_iterable(toks)))}
        self.vocab = vocab
        self.model = bm25s.BM25(k1=1.5, b=0.75)
        if vocab:
            flat = np.fromiter(map(vocab.__getitem__, chain.from_iterable(toks)), dtype=np.int64)
            _index(self.model, flat, np.fromiter(map(len, toks), dtype=np.int64, count=len(toks)), vocab)
        else:  # nothing to score: bm25s says what it says of that
            self.model.index(([[] for _ in toks], vocab), show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """[n] float64 BM25 scores of every text for ``query`` (0 where no term matches)."""
        q = [self.vocab[w] for w in tokenize(query) if w in self.vocab]
        if not q:
            return np.zeros(self.n)
        return np.asarray(self.model.get_scores(q), dtype=np.float64)


def _index(model, flat: np.ndarray, lens: np.ndarray, vocab: dict[str, int]) -> None:
    """``model.index((ids, vocab))`` for bm25s' Lucene BM25 (``ids``: the texts' term ids, here
    ``flat``, all of them text after text, and ``lens``, how many each text has), with its per-document loops as array
    operations: a bank's index is rebuilt on every append (every score depends on the number of
    units and their mean length), so its cost is the write's. The same values, operation by
    operation, as bm25s' ``build_index_from_ids`` (which the tests compare it with): the Lucene IDF
    ``log(1 + (N - df + 0.5) / (df + 0.5))`` per term in float32, the term-frequency part
    ``tf / (k1 * ((1 - b) + b * |d| / avgdl) + tf)`` in float64, their product rounded to float32,
    laid out as bm25s lays it out; then the empty token bm25s adds to ``vocab``."""
    n_docs, n_vocab, k1, b = len(lens), len(vocab), model.k1, model.b
    avg = lens.mean()
    key, tf = np.unique(np.repeat(np.arange(n_docs, dtype=np.int64), lens) * n_vocab + flat, return_counts=True)
    doc, term = key // n_vocab, key % n_vocab
    df = np.bincount(term, minlength=n_vocab)
    idf = np.zeros(n_vocab, dtype=model.dtype)
    for t in np.flatnonzero(df).tolist():
        f = int(df[t])
        idf[t] = math.log(1 + (n_docs - f + 0.5) / (f + 0.5))
    tf = tf.astype(model.dtype).astype(np.float64)
    tfc = tf / (k1 * ((1 - b) + b * lens / avg)[doc] + tf)
    scores = np.asarray(idf[term], dtype=np.float64) * tfc
    flat_scores, rows, cols = scores.astype(model.dtype), doc.astype(model.int_dtype), term.astype(model.int_dtype)
    if model.csc_backend == "scipy":  # bm25s' two ways to lay the matrix out (both sort by term, then unit)
        import scipy.sparse as sp

        m = sp.csc_matrix((flat_scores, (rows, cols)), shape=(n_docs, n_vocab), dtype=model.dtype)
        data, indices, indptr = m.data, m.indices, m.indptr
    else:
        data, indices, indptr = model._np_csc(data=flat_scores, rows=rows, cols=cols, shape=(n_docs, n_vocab))
        data = data.astype(model.dtype)
    model.nonoccurrence_array = None
    model.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n_docs}
    if "" not in vocab:
        vocab[""] = max(vocab.values()) + 1
    model.vocab_dict = vocab
    model.unique_token_ids_set = set(vocab.values())
