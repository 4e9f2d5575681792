"""Issue 33 item 3, engine side: an append refreshes the bank's engine tables from what the
process already knows of its old turns (token counts, BM25 tokens, temporal flags kept per text),
and what it publishes is exactly what a fresh build of the same bank gives: the same table rows
and the same picks, on the compiled and the tensor backend."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.data import load_conversations, sample_path
from trawmem_gpu.data.jsonl import record_of
from trawmem_gpu.select.params import QueryParams

QUESTIONS = ["Where does Ben's sister live?", "Which cat did Clara adopt?", "What happened last week?",
             "When did they go hiking?"]
PARAMS = [QueryParams(), QueryParams(budget=3, hops=2), QueryParams(budget=None, token_budget=150)]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def _bank_rows(engine, bank_id: str) -> dict:
    """Every table's rows of ``bank_id`` in ``engine``'s current snapshot (NumPy)."""
    from trawmem_gpu.select.engine.tables import TABLES

    snap = engine.snapshot
    i = snap.bank_index(bank_id)
    groups = {"unit": (snap.off.uo[i], snap.off.nu[i]), "thread": (snap.off.to[i], snap.off.nt[i])}
    out = {}
    for name, group, _, _ in TABLES:
        if group in groups:
            a, n = (int(x) for x in groups[group])
            out[name] = snap.t[name][a:a + n].cpu().numpy()
    info = snap.infos[i]
    out["tok_unit_costs"], out["tok_head_costs"] = info.costs.unit, info.costs.heading
    out["bm25_vocab"] = np.array(sorted(info.vocab.items()), dtype=object)
    return out


def _picks(engine, bank_id: str, Z) -> list:
    return [engine.select_units([bank_id] * len(QUESTIONS), QUESTIONS, Z, params=[p] * len(QUESTIONS))
            for p in PARAMS]


def test_turns_added_one_at_a_time_publish_what_a_fresh_open_builds(tmp_path):
    from trawmem_gpu import Memory
    from trawmem_gpu.memory.core import forget_in_process_texts
    from trawmem_gpu.select.engine import SelectionEngine

    turns = list(load_conversations(sample_path())[0].turns)
    mem = Memory(tmp_path / "m")
    mem.add("ab", [record_of(t) for t in turns[:18]])
    core = mem._core
    z = core.encoder.encode(QUESTIONS, is_query=True)
    tensor = SelectionEngine([core.engines.views["ab"]], core.engines.cfg, backend="tensor")
    for t in turns[18:]:  # one turn per add: each add refreshes the engine's tables of the bank
        mem.add("ab", [record_of(t)])
        tensor.replace_bank(core.engines.views["ab"])
        assert mem.select("ab", QUESTIONS[0]).unit_ids  # a select sees the bank after each add
    live = core.engines.engine
    assert core.engines.banks["ab"].n_units == len(turns)
    got = _bank_rows(live, "ab")
    got_picks = _picks(live, "ab", z)
    got_tensor = _picks(tensor, "ab", z)
    got_ws = [mem.select("ab", q, token_budget=200).unit_ids for q in QUESTIONS]

    forget_in_process_texts()  # the fresh open counts, tokenizes and flags every text anew
    fresh = Memory(tmp_path / "m")
    f_engine = fresh._core.engines.engine
    want = _bank_rows(f_engine, "ab")
    assert got.keys() == want.keys()
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    assert got_picks == _picks(f_engine, "ab", z)
    assert got_ws == [fresh.select("ab", q, token_budget=200).unit_ids for q in QUESTIONS]
    f_tensor = SelectionEngine([fresh._core.engines.views["ab"]], fresh._core.engines.cfg, backend="tensor")
    assert got_tensor == _picks(f_tensor, "ab", z)
    assert tensor.plan.backend == "tensor"


def test_the_text_caches_count_and_tokenize_exactly():
    """The per-text caches an append reads return what the uncached functions return, for texts
    seen before and new ones, repeated texts included."""
    from trawmem_gpu.select.lexical import BM25Index, _unit_tokens, tokenize
    from trawmem_gpu.select.text_features import TEMPORAL_UNIT, temporal_flags
    from trawmem_gpu.tokens import count_tokens, count_tokens_many_cached

    texts = ["We met yesterday at 5pm.\n", "Hello there!\n", "Hello there!\n", "", "  spaced  \n\n", "Ünïcode ✓ 2024-01-02\n"]
    assert count_tokens_many_cached(texts[:2]) == [count_tokens(t) for t in texts[:2]]
    assert count_tokens_many_cached(texts) == [count_tokens(t) for t in texts]
    assert count_tokens_many_cached([]) == []
    for t in texts:
        assert list(_unit_tokens(t)) == tokenize(t)
    assert temporal_flags(texts).tolist() == [1.0 if TEMPORAL_UNIT.search(t) else 0.0 for t in texts]
    warm = BM25Index(texts)  # every text's tokens cached above
    _unit_tokens.cache_clear()
    cold = BM25Index(texts)
    assert warm.vocab == cold.vocab
    for q in ("hello", "met yesterday", "spaced unicode"):
        assert np.array_equal(warm.scores(q), cold.scores(q))


def test_the_bm25_index_is_bm25s_own():
    """``lexical._index`` (the array form of bm25s' index build) gives bm25s' own arrays, dtypes
    and vocabulary, on real turns and on odd texts: empty, repeated, one word, words repeated."""
    import bm25s

    from trawmem_gpu.select.lexical import BM25Index, _index, _unit_tokens

    turns = load_conversations(sample_path())[0].turns
    odd = ["", "word", "word word word", "the and of", "Hello there!", "Hello there!", "x", "Über café café 2024"]
    for texts in ([t.embed_text() for t in turns], odd, odd[1:2], [t.text for t in turns] + odd):
        got = BM25Index(texts)
        vocab: dict = {}
        ids = [[vocab.setdefault(w, len(vocab)) for w in _unit_tokens(t)] for t in texts]
        ref = bm25s.BM25(k1=1.5, b=0.75)
        ref.index((ids, vocab), show_progress=False)
        assert got.vocab == ref.vocab_dict == got.model.vocab_dict
        assert got.model.nonoccurrence_array is None and got.model.scores["num_docs"] == ref.scores["num_docs"]
        for k in ("data", "indices", "indptr"):
            a, b = got.model.scores[k], ref.scores[k]
            assert a.dtype == b.dtype and np.array_equal(a, b), k
        for q in ("word", "hello café", "sister", "the"):
            assert np.array_equal(got.scores(q), np.asarray(ref.get_scores([vocab[w] for w in _unit_tokens(q) if w in vocab]),
                                                             dtype=np.float64) if any(w in vocab for w in _unit_tokens(q))
                                  else np.zeros(len(texts)))
    for backend in ("scipy", "numpy"):  # whichever way this bm25s lays its matrices out
        texts = [t.text for t in turns] + odd
        vocab = {}
        ids = [[vocab.setdefault(w, len(vocab)) for w in _unit_tokens(t)] for t in texts]
        got, ref = bm25s.BM25(k1=1.5, b=0.75, csc_backend=backend), bm25s.BM25(k1=1.5, b=0.75, csc_backend=backend)
        mine = dict(vocab)
        _index(got, np.array([t for d in ids for t in d], dtype=np.int64), np.array([len(d) for d in ids]), mine)
        ref.index((ids, vocab), show_progress=False)
        assert mine == ref.vocab_dict
        for k in ("data", "indices", "indptr"):
            assert got.scores[k].dtype == ref.scores[k].dtype and np.array_equal(got.scores[k], ref.scores[k]), (backend, k)


def test_a_select_during_an_append_keeps_the_engines_copy_and_builds_no_tables(tmp_path, monkeypatch):
    """Issue 42 item 2: while an append runs to its publish (``MemoryCore.publishing``), a select's
    ``ensure`` keeps the bank the engine holds instead of building the registry's new bank's tables
    on the engine's thread (a server's batch worker: every tenant's queries waited behind that
    build); the append's own tables are then published, and one build per append is all there is."""
    from trawmem_gpu import Memory

    turns = list(load_conversations(sample_path())[0].turns)
    mem = Memory(tmp_path / "m")
    mem.add("ab", [record_of(t) for t in turns[:18]])
    mem.select("ab", QUESTIONS[0])
    core = mem._core
    builds = []
    real_prepare = core.engines.prepare
    monkeypatch.setattr(core.engines, "prepare", lambda bank: builds.append(bank) or real_prepare(bank))
    before = core.engines.banks["ab"]
    with core.publishing("ab"):
        res = core.append("ab", [record_of(t) for t in turns[18:22]])
        assert core.registry.get("ab") is res.bank and res.bank is not before
        core.ensure(["ab"])  # what a select does meanwhile
        assert core.engines.banks["ab"] is before and builds == []
        prepared = core.engines.prepare(res.bank)  # the append's own thread
        core.sync_engine("ab", prepared)
    assert core.engines.banks["ab"] is res.bank and builds == [res.bank]
    # outside an append, a select sees a bank the registry holds at once (built on its own thread)
    res2 = core.append("ab", [record_of(t) for t in turns[22:24]])
    core.ensure(["ab"])
    assert core.engines.banks["ab"] is res2.bank and builds[-1] is res2.bank
    # Memory.add: one build per append, done by the add itself
    builds.clear()
    mem.add("ab", [record_of(t) for t in turns[24:26]])
    assert len(builds) == 1 and core.engines.banks["ab"] is core.registry.get("ab")
