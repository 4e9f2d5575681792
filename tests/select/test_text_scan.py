"""The seventh pass's text work (issue 46 item 3) against its plain statements: the compiled demand
scan against ``demand_features`` and the regular-expression matrix, the compiled speaker scan
against the case-blind whole-word search, the BM25 columns over runs and a kept word map against
tokenizing each question, and the learned cues' dated queries against ``date_match`` (random
texts dense in the patterns' words, odd sizes, the empty batch, blank and repeated texts, names
repeated, non-ASCII text and newlines)."""
from __future__ import annotations

import random
from datetime import datetime

import numpy as np
import pytest

from trawmem_gpu.select import text_features, text_scan, word_table
from trawmem_gpu.select.lexical import BM25Index
from trawmem_gpu.select.steps import candidates, relevance
from trawmem_gpu.select.text_features import demand_features, demand_matrix, demand_matrix_re

PHRASES = ("when", "what year", "what  year", "what years", "what day", "what date", "what days", "how long",
           "how many years", "how many", "how  many days", "before", "first", "last", "recently", "ago", "week",
           "both", "and", "common", "share", "shared", "shares", "relationship", "between", "each other",
           "each  other", "also", "would", "likely", "might", "why", "what kinds", "what kind", "what kindly",
           "which", "Ana", "Ben", "Ana", "AnaBen", "Ana_", "_Ana", "9Ben", "McDonald", "I", "X", "Ab", "ab",
           "the", "a", "x", "WHEN", "Both", "AND", "Shared", "When's", "it's", "co-op", "2031", "1999", "_",
           "Caroline", "Melanie", "caroline", "MELANIE", "Caroline's", "Mel", "Melanies", "naïve", "café",
           "\u212aate", "ſhare", "İstanbul")
SEPS = (" ", " ", " ", ", ", "? ", "\n", "  ", "-", "'", "\t", "\x1c", "\x0b", "", ".", "!", "_")


def _texts(rng: random.Random, n: int, ascii_only: bool = False) -> list[str]:
    words = [w for w in PHRASES if w.isascii()] if ascii_only else PHRASES
    out = []
    for _ in range(n):
        k = rng.randint(0, rng.choice([4, 24]))
        t = "".join(rng.choice(words) + rng.choice(SEPS) for _ in range(k))
        out.append(t.strip() if rng.random() < 0.7 else t)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_demand_rows_are_demand_features(seed):
    rng = random.Random(seed)
    qs = _texts(rng, rng.choice([1, 2, 7, 129, 400]), ascii_only=True) + ["", " ", "\n", "Ana Ben Ana", "what kinds"]
    X = text_scan.demand_rows(qs)
    ref = np.stack([demand_features(q) for q in qs])
    assert X.dtype == np.float64 and X.shape == (len(qs), 4)
    assert X.tobytes() == ref.tobytes()
    assert len(qs) < 50 or len(set(map(tuple, X.tolist()))) >= 8  # not vacuous: many feature rows


@pytest.mark.parametrize("seed", range(4))
def test_demand_matrix_mixes_the_scan_and_the_patterns(seed):
    rng = random.Random(10 + seed)
    qs = _texts(rng, rng.choice([0, 1, 5, 300]))
    X = demand_matrix(qs)
    assert X.shape == (len(qs), 4) and X.tobytes() == demand_matrix_re(qs).tobytes()
    if qs:
        assert X.tobytes() == np.stack([demand_features(q) for q in qs]).tobytes()
    assert demand_matrix([]).shape == (0, 4)


def test_literals_keep_the_patterns_order_per_first_byte():
    for words in (text_scan.TEMPORAL_WORDS, text_scan.RELATIONAL_WORDS):
        lb, ptr, by_first, first_ptr = text_scan.literals(words)
        for c in range(256):
            ks = by_first[first_ptr[c]:first_ptr[c + 1]].tolist()
            assert ks == sorted(ks) and all(words[k].encode()[0] == c for k in ks)
        assert sorted(by_first.tolist()) == list(range(len(words)))


def _named_ref(questions, speakers):
    return np.array([v for q, s in zip(questions, speakers) for v in relevance._named(q, s)], dtype=np.float64)


@pytest.mark.parametrize("seed", range(5))
def test_named_scan_is_the_search(seed):
    rng = random.Random(20 + seed)
    pool = [("Caroline", "Melanie"), ("Ana", "ben"), (" ", "Kate"), ("Straße",), ("Ana Maria", "co-op", "K"), (),
            ("Mel", "x", "_Ana"), ("-b", "2031", "Ab")]
    qs = _texts(rng, rng.choice([0, 1, 3, 200])) + ["KATE?", "\u212aate", "ana maria", "co-op!", "k", "x-ana", "Mel."]
    sp = [rng.choice(pool) for _ in qs]
    off = np.zeros(len(qs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in sp], out=off[1:])
    got = relevance._named_batch(qs, sp, off)
    ref = _named_ref(qs, sp)
    assert got.dtype == np.float64 and got.tobytes() == ref.tobytes()
    assert got.tobytes() == relevance._named_plain_batch(qs, sp).tobytes()
    assert ref.sum() > 0 and (ref == 0).any()


def test_learned_queries_of_dated_and_undated_queries():
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.objective import date_seconds

    qs = ["What did Ana do two weeks ago?", "when did Ben move", "What happened last month, Ana?", "yesterday"]
    sp = [("Ana", "Ben")] * len(qs)
    tm = [np.array([0.0, 1e9, np.nan, 1.7e9]) for _ in qs]
    now = np.array([date_seconds(datetime(2024, 5, 1)), np.nan, date_seconds(datetime(2024, 6, 1)), np.nan])
    lq = relevance.learned_queries(qs, sp, tm, now, SelectConfig(), np.ones(len(qs)))
    assert lq.named.tobytes() == _named_ref(qs, sp).tobytes() and lq.named_off.tolist() == [0, 2, 4, 6]
    assert lq.dm_off.tolist() == [0, -1, 4, -1]
    want = np.concatenate([relevance.date_match(tm[0], qs[0], now[0]), relevance.date_match(tm[2], qs[2], now[2])])
    assert lq.dm.tobytes() == want.tobytes()
    empty = relevance.learned_queries([], [], [], np.zeros(0), SelectConfig(), np.zeros(0))
    assert len(empty.named) == 0 and len(empty.named_off) == 0 and len(empty.dm_off) == 0
    k = text_features.SMALL_BATCH // len(qs) + 1  # a batch past SMALL_BATCH: the batch form, the same arrays
    big = relevance.learned_queries(qs * k, sp * k, tm * k, np.tile(now, k), SelectConfig(), np.ones(len(qs) * k))
    few = relevance._few_queries(qs * k, sp * k, tm * k, np.tile(now, k), SelectConfig(), np.ones(len(qs) * k))
    for a, b in zip(big, few):
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        else:
            assert a == b
    assert big.dm_off.tolist()[:4] == [0, -1, 4, -1] and len(big.dm) == k * len(lq.dm)


def _banks(rng: random.Random, n_banks: int):
    vocabs, col0, o = [], [], 0
    for _ in range(n_banks):
        texts = [" ".join(rng.choice(PHRASES) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(1, 9))]
        v = BM25Index(texts).vocab
        vocabs.append(v)
        col0.append(o)
        o += len(v)
    return vocabs, np.asarray(col0, dtype=np.int64)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_bm25_columns_over_runs_and_a_kept_word_map(seed, compiled, monkeypatch):
    rng = random.Random(30 + seed)
    n_banks = rng.randint(1, 4)
    vocabs, col0 = _banks(rng, n_banks)
    plain = [rng.random() > 0.2 for _ in range(n_banks)]
    if seed == 5:
        monkeypatch.setattr(word_table, "MAX_WORDS", 3)  # maps start again within the calls
    if not compiled:
        monkeypatch.setattr(word_table, "HAS_NUMBA", False)  # translate / split / map
    maps: dict = {}
    for call in range(3):  # the same maps across calls, as an engine keeps them
        qs = _texts(rng, rng.choice([0, 1, 6, 150]))
        bidx = sorted(rng.randrange(n_banks) for _ in qs) if call != 1 else [rng.randrange(n_banks) for _ in qs]
        ref = candidates.bm25_columns_reference(bidx, qs, vocabs, plain, col0)
        for m in (maps, None):
            got = candidates.bm25_columns(bidx, qs, vocabs, plain, col0, m)
            assert got[2] == ref[2]
            for g, r in zip(got[:2], ref[:2]):
                assert g.dtype == r.dtype == np.int64 and np.array_equal(g, r)
    assert all(m.get(word_table.SEP_WORD) == -2 for m, _ in maps.values())
    assert not compiled or any(len(table) for _, table in maps.values())


def test_joined_runs_split_where_a_question_cannot_join():
    qs = ["a b", "c\nd", "é e", "f", "g", ""]
    runs = list(word_table.joined_runs(qs, 0, len(qs)))
    assert runs == [(0, 1, "a b"), (1, 2, None), (2, 3, None), (3, 6, "f\ng\n")]
    assert list(word_table.joined_runs(qs, 3, 5)) == [(3, 5, "f\ng")]


def test_word_table_splits_as_the_token_pattern():
    rng = random.Random(7)
    noise = ["".join(chr(rng.randrange(128)) for _ in range(rng.randint(0, 40))) for _ in range(300)]
    texts = [t for t in _texts(rng, 300) + noise if t.isascii() and "\n" not in t]
    texts += ["".join(chr(c) for c in range(128) if c != 10), "a_b 12 x9 __ I'm", "A\x00B\x00cd"]
    assert len(texts) > 400
    for t in texts:
        words = [w for w in t.translate(word_table._WORDS).split() if len(w) > 1]
        assert words == candidates._TOKEN_ASCII.findall(t.lower()), t


def _alternatives(pattern: str) -> tuple[str, ...]:
    """A question pattern's words in its order: inner groups expanded, ``s?`` greedy first."""
    body = pattern.split(r"\b(", 1)[1].rsplit(r")\b", 1)[0]
    alts, depth, cur = [], 0, ""
    for ch in body:
        depth += (ch == "(") - (ch == ")")
        if ch == "|" and depth == 0:
            alts.append(cur)
            cur = ""
        else:
            cur += ch
    out = []
    for a in alts + [cur]:
        if "(?:" in a:
            pre, inner = a.split("(?:")
            out += [pre + x for x in inner.rstrip(")").split("|")]
        elif a.endswith("s?"):
            out += [a[:-1], a[:-2]]
        else:
            out.append(a)
    return tuple(out)


def test_word_lists_are_the_patterns_alternatives():
    from trawmem_gpu.select import text_features as tf

    assert text_scan.TEMPORAL_WORDS == _alternatives(tf.TEMPORAL_Q.pattern)
    assert text_scan.RELATIONAL_WORDS == _alternatives(tf.RELATIONAL_Q.pattern)
    assert tf._NAME_FIRST.pattern == r"[A-Z](?<!\w[A-Z])[a-z]+\b"  # what demand_counts' names scan matches


def test_word_table_tells_equal_hashes_apart_by_their_bytes():
    table = word_table.WordTable()
    table.add({"ab": 3, "cd": -1, "ef": 7})
    h, col, wpos, wlen, pool = table.arrays
    h[:] = 5  # as if all three hashes collided (sorted still)
    t = np.frombuffer(b"xx EF cd AB", dtype=np.uint8)
    got = [word_table._find(t, p, 2, np.uint64(5), h, wpos, wlen, pool) for p in (3, 6, 9, 0)]
    assert [col[k] if k >= 0 else None for k in got] == [7, -1, 3, None]


def test_word_table_split_is_the_token_map():
    rng = random.Random(8)
    qs = [t for t in _texts(rng, 200) if t.isascii() and "\n" not in t] + ["", "a", "AB ab_c 9x"]
    table, m = word_table.WordTable(), {}
    for round_ in range(2):  # cold (every word missed, then added), then warm
        ids, counts, missed = table.split("\n".join(qs), len(qs))
        if round_ == 0:
            assert missed == sorted(set(missed)) and all(w == w.lower() for w in missed)
            new = {w: len(m) + i if i % 3 else -1 for i, w in enumerate(missed)}
            m.update(new)
            table.add(new)
            ids, counts, missed = table.split("\n".join(qs), len(qs))
        assert missed == []
        want = [[m[w] for w in word_table.TOKEN_ASCII.findall(q.lower()) if m[w] >= 0] for q in qs]
        assert counts.tolist() == [len(w) for w in want] and ids.tolist() == [c for w in want for c in w]


def test_word_table_shared_by_threads_loses_no_word():
    import threading

    rng = random.Random(12)
    vocab = {w.lower(): i for i, w in enumerate(sorted({w for w in PHRASES if w.isascii()}))}
    table, errors = word_table.WordTable(), []

    def worker(seed):
        r = random.Random(seed)
        for _ in range(30):
            qs = [t for t in _texts(r, 20) if t.isascii() and "\n" not in t]
            try:
                ids, counts = word_table.table_columns("\n".join(qs), len(qs), table, vocab, 0)
            except RuntimeError as e:
                errors.append(repr(e))
                return
            want = candidates.bm25_columns_reference([0] * len(qs), qs, [vocab], [True], np.zeros(1, np.int64))
            if ids.tolist() != want[1].tolist() or np.diff(want[0]).tolist() != counts.tolist():
                errors.append("wrong columns")
                return

    threads = [threading.Thread(target=worker, args=(rng.random(),)) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
