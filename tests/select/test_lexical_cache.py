"""``lexical.CACHE_TEXTS``: an index over more texts than the token cache holds tokenizes them
without it (the cache would never hit on such a pass and only evicts smaller banks' entries); the
index is the same value for value as one built through the cache."""
from __future__ import annotations

import numpy as np

from trawmem_gpu.select import lexical
from trawmem_gpu.select.lexical import BM25Index


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = "dog cats hiking lake paris school painted music trips sister books garden piano running".split()
    return [" ".join(rng.choice(words, int(rng.integers(1, 9)))) + f" t{i % 7}" for i in range(n)]


def _same(a: BM25Index, b: BM25Index) -> None:
    assert a.vocab == b.vocab and a.n == b.n
    for k in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(a.model.scores[k], b.model.scores[k])
    for q in ("cat running to the lake", "books t3", "nothing here"):
        np.testing.assert_array_equal(a.scores(q), b.scores(q))


def test_an_index_past_the_cache_bound_bypasses_the_cache_and_is_the_same(monkeypatch):
    texts, more = _texts(41, 1), _texts(13, 2)
    lexical._unit_tokens.cache_clear()
    cached = BM25Index(texts)
    grown_cached = cached.appended(more)
    assert lexical._unit_tokens.cache_info().currsize > 0
    lexical._unit_tokens.cache_clear()
    monkeypatch.setattr(lexical, "CACHE_TEXTS", 12)  # 41 texts, then 13 new ones: both past it
    big = BM25Index(texts)
    grown = big.appended(more)
    assert lexical._unit_tokens.cache_info().currsize == 0  # nothing went through the cache
    _same(big, cached)
    _same(grown, grown_cached)
    _same(grown, BM25Index(texts + more))
    small = BM25Index(texts[:12])  # at the bound: cached as before
    assert lexical._unit_tokens.cache_info().currsize > 0
    monkeypatch.setattr(lexical, "CACHE_TEXTS", 1 << 18)
    _same(small, BM25Index(texts[:12]))
