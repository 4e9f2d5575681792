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

import re
from functools import lru_cache

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
