"""The compiled engine's batched question text work against its plain statements: the demand
matrix against ``demand_features`` per question, the BM25 columns against tokenizing each
question, and the speaker search's substring pre-check against the search alone (random texts,
odd sizes, the empty batch, repeated texts, non-ASCII text)."""
from __future__ import annotations

import random
import re

import numpy as np
import pytest

from trawmem_gpu.select.lexical import BM25Index
from trawmem_gpu.select.steps import relevance, roles
from trawmem_gpu.select.steps.candidates import bm25_columns, bm25_columns_reference
from trawmem_gpu.select.text_features import demand_features, demand_matrix

from engine_banks import banks, queries  # noqa: F401 - fixtures

WORDS = ("when", "what", "year", "how", "many", "days", "long", "and", "both", "which", "each", "other",
         "Ana", "Ben", "Clara", "Lyon", "the", "a", "cat", "moved", "running", "ran", "ago", "last",
         "shared", "share", "might", "Rotterdam", "why", "kinds", "kind", "ſtraße", "Kelvin", "\u212aate",
         "İstanbul", "naïve", "x", "it's", "co-op", "2031", "_", "WHEN", "Both", "between")


def _questions(rng: random.Random, n: int) -> list[str]:
    seps = (" ", " ", " ", ", ", "? ", "\n", "  ", "-", "'")
    out = []
    for _ in range(n):
        k = rng.randint(0, 30)
        out.append("".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(k)).strip())
    return out


@pytest.mark.parametrize("n", [0, 1, 7, 200])
def test_demand_matrix_is_demand_features(n):
    qs = _questions(random.Random(n), n) + ["", "   ", "When and both, which?", "Ana Ben Clara and Lyon"]
    X = demand_matrix(qs)
    ref = np.stack([demand_features(q) for q in qs]).reshape(len(qs), 4)
    assert X.dtype == np.float64 and X.shape == (len(qs), 4)
    assert X.tobytes() == ref.tobytes()
    assert demand_matrix([]).shape == (0, 4)


def test_lower_case_patterns_match_as_the_case_blind_ones():
    from trawmem_gpu.select import text_features as tf

    for low, blind in ((tf._TEMPORAL_LOW, tf.TEMPORAL_Q), (tf._RELATIONAL_LOW, tf.RELATIONAL_Q)):
        assert low.pattern == low.pattern.lower() and not low.flags & re.I  # no upper-case letter to miss
        rng = random.Random(1)
        for q in _questions(rng, 400):
            q = "".join(c.upper() if rng.random() < 0.3 else c for c in q)
            if q.isascii():
                assert low.findall(q.lower()) == [m.lower() for m in blind.findall(q)], q
    rng = random.Random(4)
    for q in _questions(rng, 400) + ["Ana", "xAna Ben", "_Ana", "9Ben", "AnaBen", "Ana_ Ben's", "éAna Ben", "Ärger Ana Ben"]:
        assert tf._NAME_FIRST.findall(q) == tf._NAME.findall(q), q
    X = demand_matrix(["WHEN did BOTH Ana and Ben go?", "what KINDS of Cats"])
    assert X[:, 1].tolist() == [1.0, 0.0] and X[:, 2].tolist() == [1.0, 0.5]


def test_demand_takes_the_matrix_and_checks_it():
    from trawmem_gpu.select.config import SelectConfig

    qs = _questions(random.Random(3), 33)
    cfg = SelectConfig()
    a, b = roles.demand(qs, cfg), roles.demand(qs, cfg, X=demand_matrix(qs))
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b))
    with pytest.raises(ValueError, match="expected"):
        roles.demand(qs, cfg, X=demand_matrix(qs[:-1]))


def _banks(rng: random.Random, n_banks: int):
    vocabs, col0, o = [], [], 0
    for b in range(n_banks):
        texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(1, 9))]
        v = BM25Index(texts).vocab
        vocabs.append(v)
        col0.append(o)
        o += len(v)
    return vocabs, np.asarray(col0, dtype=np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_bm25_columns_are_the_reference(seed):
    rng = random.Random(seed)
    n_banks = rng.randint(1, 5)
    vocabs, col0 = _banks(rng, n_banks)
    plain = [rng.random() > 0.2 for _ in range(n_banks)]
    Q = rng.choice([0, 1, 5, 64, 129])
    qs = _questions(rng, Q)
    qs += qs[: Q // 3]  # repeated texts
    bidx = sorted(rng.randrange(n_banks) for _ in qs) if seed % 2 else [rng.randrange(n_banks) for _ in qs]
    got, ref = bm25_columns(bidx, qs, vocabs, plain, col0), bm25_columns_reference(bidx, qs, vocabs, plain, col0)
    assert got[2] == ref[2]
    for g, r in zip(got[:2], ref[:2]):
        assert g.dtype == r.dtype == np.int64 and np.array_equal(g, r)
    if any(plain[b] for b in bidx):  # not vacuous: some column is listed where the bank has words
        assert len(got[0]) == len(qs) + 1


def test_ascii_token_pattern_is_the_token_pattern():
    from trawmem_gpu.select.lexical import _TOKEN
    from trawmem_gpu.select.steps.candidates import _TOKEN_ASCII

    rng = random.Random(2)
    texts = [q for q in _questions(rng, 600) if q.isascii()] + ["a_b 12 x9 __ I'm", "tab\there"]
    assert len(texts) > 100
    for t in texts:
        assert _TOKEN_ASCII.findall(t.lower()) == _TOKEN.findall(t.lower())


def test_bm25_columns_know_the_words():
    vocabs = [BM25Index(["the cat moved", "Clara ran"]).vocab, BM25Index(["cats running"]).vocab]
    o = len(vocabs[0])
    col0 = np.asarray([0, o], dtype=np.int64)
    ptr, ids, slow = bm25_columns([0, 1, 0], ["The CAT ran", "running cats, the cat", "nothing here"], vocabs,
                                  [True, True, True], col0)
    assert ptr.tolist() == [0, 2, 5, 5] and slow == []
    assert ids.tolist() == [vocabs[0]["cat"], vocabs[0]["ran"], o + vocabs[1]["run"], o + vocabs[1]["cat"],
                            o + vocabs[1]["cat"]]


def _named_plain(question, speakers):
    return [1.0 if s.strip() and re.search(r"(?<!\w)" + re.escape(s.strip()) + r"(?!\w)", question, re.I) else 0.0
            for s in speakers]


def test_speaker_precheck_is_the_search():
    rng = random.Random(11)
    speakers = ("Ana", "ben", " ", "Kate", "Straße", "ſtraße", "İstanbul", "Ana Maria", "co-op", "K")
    qs = _questions(rng, 300) + ["KATE?", "\u212aate", "ana maria", "Anaïs", "co-op!", "k"]
    for q in qs:
        assert relevance._named(q, speakers) == _named_plain(q, speakers), q
    assert sum(sum(relevance._named(q, speakers)) for q in qs) > 0


def test_learned_queries_take_z_temp():
    from trawmem_gpu.select.config import SelectConfig

    qs = _questions(random.Random(5), 17)
    cfg, now = SelectConfig(), np.full(len(qs), np.nan)
    sp, tm = [("Ana", "Ben")] * len(qs), [None] * len(qs)
    a = relevance.learned_queries(qs, sp, tm, now, cfg)
    b = relevance.learned_queries(qs, sp, tm, now, cfg, demand_matrix(qs)[:, 1])
    assert all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(a, b))
    with pytest.raises(ValueError, match="z_temp"):
        relevance.learned_queries(qs, sp, tm, now, cfg, np.zeros(3))


def test_query_vectors_are_checked_for_nan_and_inf(banks, queries):
    """The input check's finite-sum shortcut: a NaN or inf row is named, a batch of finite rows
    whose sum overflows is not refused."""
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine

    ids, qs, Z = queries
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    for bad in (np.nan, np.inf, -np.inf):
        Zb = np.array(Z, dtype=np.float64)
        Zb[3, 1] = bad
        with pytest.raises(ValueError, match=r"NaN or inf \(rows \[3\]\)"):
            eng.select_units(ids, qs, Zb)
    Zb = np.array(Z, dtype=np.float64)
    Zb[:, 0] = 1e308  # every entry finite, the sum is not
    assert len(eng.select_units(ids, qs, Zb)) == len(ids)
