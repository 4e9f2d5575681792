"""BM25 over a bank's units (bm25s: a maintained, vectorized BM25 with sparse scoring).

Scores for *every* unit are needed (affinity fusion, seed scoring), which bm25s gives through
``get_scores``. Tokens are lowercased, English stop words removed, Porter-stemmed (nltk),
so that "running" matches "runs".
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

_TOKEN = re.compile(r"[a-z0-9]+")


@lru_cache(maxsize=1)
def _stemmer():
    from nltk.stem import PorterStemmer

    return PorterStemmer()


@lru_cache(maxsize=1)
def _stopwords() -> frozenset:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


@lru_cache(maxsize=200_000)
def _stem(w: str) -> str:
    return _stemmer().stem(w)


def tokenize(text: str) -> list[str]:
    sw = _stopwords()
    return [_stem(w) for w in _TOKEN.findall(text.lower()) if w not in sw]


class BM25Index:
    """BM25 (Lucene variant, k1 = 1.5, b = 0.75) over a fixed list of texts."""

    def __init__(self, texts: list[str]):
        import bm25s

        self.n = len(texts)
        toks = [tokenize(t) for t in texts]
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(w, len(vocab)) for w in ts] for ts in toks]
        self.vocab = vocab
        self.model = bm25s.BM25(k1=1.5, b=0.75)
        self.model.index((ids, vocab), show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """[n] float64 BM25 scores of every text for ``query`` (0 where no term matches)."""
        q = [self.vocab[w] for w in tokenize(query) if w in self.vocab]
        if not q:
            return np.zeros(self.n)
        return np.asarray(self.model.get_scores(q), dtype=np.float64)
