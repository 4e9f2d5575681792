"""The engine's id tables ``nbr`` (each thread's neighbour threads), ``bm_idx`` (each BM25
posting's unit) and ``rel_idx`` (each unit's speaker, previous and next unit) are int32 (``engine.bank_tables.TABLES``, issue 46 item 2: half the bytes of
int64), and the edge weights ``nbw`` float32 where the banks' weights are float32
(``Layout.w_dtype``). The ids are bank-local, below 2^31 by ``build_bank``'s check, and the weights
the banks' own float32 values (float32 -> float64 exact), so every value is the wide table's; the
readers compute in float64 and the torch ones cast the rows they gather. An engine with the narrow
tables must pick exactly what the same engine with int64 / float64 tables (the wide kinds patched
back in) picks: on the exact path, the approximate one and the tensor backend, on odd sizes, tied
vectors, an empty question set, an append and a compaction."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, bank_tables, tables

from benchmarks.synthetic_banks import make_banks, make_queries

NARROW = {"nbr": torch.int32, "bm_idx": torch.int32, "rel_idx": torch.int32, "nbw": torch.float32,
          "temporal": torch.float32, "linked": torch.float32, "tok_unit": torch.float32}
WIDE = {"nbr": torch.int64, "bm_idx": torch.int64, "rel_idx": torch.int64, "nbw": torch.float64,
        "temporal": torch.float64, "linked": torch.float64, "tok_unit": torch.float64}


def _wide() -> tuple:
    """``TABLES`` as they were: the id tables int64, the weights the engine's float (float64)."""
    wide = {"nbr": "int", "bm_idx": "int", "rel_idx": "int", "nbw": "float", "flag": "float"}
    return tuple((name, group, wide.get(name, wide.get(kind, kind)), fill)
                 for name, group, kind, fill in bank_tables.TABLES)


@pytest.fixture
def wide_tables(monkeypatch):
    """Build engines with the int64 id tables while the fixture is active."""
    def use():
        monkeypatch.setattr(bank_tables, "TABLES", _wide())
        monkeypatch.setattr(tables, "TABLES", _wide())
    return use


def _tied(bank):
    v = bank.unit_vecs.copy()
    v[1:40:2] = v[0:39:2]
    return replace(bank, unit_vecs=v)


@pytest.fixture(scope="module")
def banks():
    out = make_banks(3, units=257, thread_len=5.0, d=24, seed=31, prefix="odd")
    out += make_banks(1, units=1201, thread_len=7.0, d=24, seed=32, prefix="big")
    out[1] = _tied(out[1])
    return out


@pytest.mark.parametrize("options", [{}, {"ann_min_units": 1000, "ann_shortlist": 32}, {"backend": "tensor"}],
                         ids=["exact", "approximate", "tensor"])
def test_int32_id_tables_pick_what_the_int64_tables_pick(banks, options, wide_tables):
    ids, qs, Z = make_queries(banks, 40, seed=33)
    narrow = SelectionEngine(banks, SelectConfig(), device="cpu", **options)
    wide_tables()
    wide = SelectionEngine(banks, SelectConfig(), device="cpu", **options)
    for name in NARROW:
        assert narrow.snapshot.t[name].dtype == NARROW[name] and wide.snapshot.t[name].dtype == WIDE[name]
        a, b = narrow.snapshot.np[name], wide.snapshot.np[name]
        assert a.shape == b.shape and np.array_equal(a.astype(b.dtype), b)
    assert (narrow.snapshot.np["nbr"] >= 0).any() and (narrow.snapshot.np["nbr"] == -1).any()
    n = narrow.snapshot.np  # the float32 flags and token costs: more than one value each
    assert len(np.unique(n["temporal"])) == 2 and len(np.unique(n["tok_unit"])) > 2
    rel = narrow.snapshot.np["rel_idx"]  # the learned affinity's: speaker, previous, next (-1: none)
    assert rel.shape[1] == 3 and (rel[:, 0] > 0).any() and (rel[:, 1:] == -1).any() and (rel[:, 1:] > 0).any()
    assert len(np.unique(narrow.snapshot.np["nbw"])) > 2  # weights other than 0 and 1
    assert 2 * narrow.snapshot.nbytes(list(NARROW)) == wide.snapshot.nbytes(list(NARROW))
    got, want = narrow.select_units(ids, qs, Z), wide.select_units(ids, qs, Z)
    assert sum(len(p) for p in want) > 0 and [list(p) for p in got] == [list(p) for p in want]
    cn, cw = narrow.candidate_sets(ids, qs, Z), wide.candidate_sets(ids, qs, Z)
    assert all(np.array_equal(a, b) for a, b in zip(cn, cw))
    assert narrow.select_units([], [], np.zeros((0, 24))) == wide.select_units([], [], np.zeros((0, 24))) == []


def _conversation(cid: str, n: int, seed: int):
    from datetime import datetime, timedelta

    from trawmem_gpu.data.types import Conversation, Turn

    rng = np.random.default_rng(seed)
    words = "dog cat hike lake paris school paint music trip sister book garden piano beach yoga race".split()
    t, out = datetime(2024, 1, 1, 9), []
    for i in range(n):
        t += timedelta(minutes=15) if i % 9 else timedelta(days=1)
        out.append(Turn(f"m{i}", "Ann" if i % 2 else "Bob", " ".join(rng.choice(words, 6)), 1 + i // 9,
                        t.strftime("%d %B %Y"), t))
    return Conversation(cid, out)


def test_an_append_keeps_the_int32_tables_equal(wide_tables):
    """An append (120 turns, then 50 more: new postings and threads written by ``engine/extend.py``)
    and the removal of a bank with its compaction, in both engines: same tables, same picks."""
    from word_encoder import WordEncoder

    from trawmem_gpu.ingest import build_banks, update_bank

    enc = WordEncoder()
    big = _conversation("c", 170, 5)
    start, _ = build_banks([_conversation("a", 40, 6), type(big)("c", big.turns[:120])], encoder=enc, progress=False)
    grown, _ = update_bank(start[1], list(big.turns[120:]), encoder=enc)
    qs = ["When did they hike to the lake?", "Which book did her sister paint?", "piano"]
    Z = enc.encode(qs)
    engines = []
    for wide in (False, True):
        if wide:
            wide_tables()
        e = SelectionEngine(start, SelectConfig(), device="cpu")
        e.replace_bank(grown)
        engines.append(e)
    for name in NARROW:
        b = engines[1].snapshot.np[name]
        assert engines[0].snapshot.t[name].dtype == NARROW[name] and np.array_equal(engines[0].snapshot.np[name].astype(b.dtype), b)
    assert not any(i.arrays for i in engines[0].snapshot.infos)  # the int32 rows are the store's: no copy kept
    got = [e.select_units(["c"] * 3, qs, Z) for e in engines]
    assert sum(map(len, got[1])) > 0 and got[0] == got[1]
    for e in engines:
        e.remove_bank("a")
        e.purge()
    assert engines[0].select_units(["c"] * 3, qs, Z) == engines[1].select_units(["c"] * 3, qs, Z) == got[1]


def test_a_bank_past_the_int32_ids_is_refused(banks, monkeypatch):
    monkeypatch.setattr(bank_tables, "ID_LIMIT", 257)
    with pytest.raises(ValueError, match="int32 ids hold fewer than 257"):
        SelectionEngine(banks[:1], SelectConfig(), device="cpu")
    monkeypatch.setattr(bank_tables, "ID_LIMIT", 258)
    SelectionEngine(banks[:1], SelectConfig(), device="cpu")


def test_token_costs_float32_cannot_hold_are_refused(banks, monkeypatch):
    """``tok_unit`` is float32: a cost at or past ``FLAG_LIMIT`` (not every whole number there is a
    float32 value) is refused, never rounded."""
    monkeypatch.setattr(bank_tables, "FLAG_LIMIT", 3)
    with pytest.raises(ValueError, match="token cost that the float32 table cannot hold exactly"):
        SelectionEngine(banks[:1], SelectConfig(), device="cpu")
    monkeypatch.setattr(bank_tables, "FLAG_LIMIT", 1 << 24)
    assert SelectionEngine(banks[:1], SelectConfig(), device="cpu").snapshot.t["tok_unit"].dtype == torch.float32


def test_float64_weights_keep_a_float64_table_and_a_later_inexact_bank_is_refused(banks):
    as64 = [replace(b, edge_w=b.edge_w.astype(np.float64)) for b in banks]
    assert SelectionEngine(as64, SelectConfig(), device="cpu").snapshot.t["nbw"].dtype == torch.float64
    eng = SelectionEngine(banks[:2], SelectConfig(), device="cpu")
    assert eng.snapshot.t["nbw"].dtype == torch.float32
    eng.replace_bank(as64[2])  # float64, but every weight a float32 value: exact, accepted
    w = as64[3].edge_w.copy()
    w[0] = np.nextafter(np.float64(w[0]), 2.0)  # one weight float32 would round
    with pytest.raises(ValueError, match="edge weights that float32 cannot hold exactly"):
        eng.replace_bank(replace(as64[3], edge_w=w))


def test_a_lean_bm25_index_appends_what_the_whole_one_appends():
    """``BM25Index.lean`` (the engine's copy: no score matrix of its own) with its postings' units
    handed back gives the very index the whole one appends; without them it declines (None: build
    whole); it refuses to score and refuses units of another length."""
    from trawmem_gpu.select.lexical import BM25Index

    rng = np.random.default_rng(7)
    words = "dog cat hike lake paris school paint music trip sister book garden piano beach yoga".split()
    texts = [" ".join(rng.choice(words, int(rng.integers(1, 9)))) for _ in range(301)]
    whole = BM25Index(texts[:250])
    lean = whole.lean()
    assert lean.is_lean and not whole.is_lean and "indices" not in lean.model.scores
    units = whole.model.scores["indices"].copy()
    for keep in (250, 249, 1):
        want, got = whole.appended(texts[250:], keep), lean.appended(texts[250:], keep, units)
        if want is None:
            assert got is None
            continue
        assert got.vocab == want.vocab and got.n == want.n
        for k in ("data", "indices", "indptr"):
            assert got.model.scores[k].dtype == want.model.scores[k].dtype
            assert np.array_equal(got.model.scores[k], want.model.scores[k])
        assert np.array_equal(got.scores("cat lake"), want.scores("cat lake"))
    assert lean.appended(texts[250:]) is None
    with pytest.raises(ValueError, match="postings' units"):
        lean.appended(texts[250:], None, units[:-1])
    with pytest.raises(RuntimeError, match="keeps no score matrix"):
        lean.scores("cat")
    assert np.array_equal(BM25Index(texts).model.scores["data"], lean.appended(texts[250:], None, units).model.scores["data"])


def test_the_engine_keeps_one_copy_of_bm25_and_appends_from_the_tables(monkeypatch):
    """The engine's bank infos keep lean BM25 indexes (the ``bm_*`` tables hold the matrix once);
    an append reads the postings' units back from the store and extends the index (not rebuilt
    whole): the same BM25 tables and picks as an engine built over the grown bank."""
    from word_encoder import WordEncoder

    from trawmem_gpu.ingest import build_banks, update_bank
    from trawmem_gpu.select import lexical

    enc = WordEncoder()
    big = _conversation("c", 170, 5)
    start, _ = build_banks([_conversation("a", 40, 6), type(big)("c", big.turns[:120])], encoder=enc, progress=False)
    grown, _ = update_bank(start[1], list(big.turns[120:]), encoder=enc)
    eng = SelectionEngine(start, SelectConfig(), device="cpu")
    assert all(i.bm25.is_lean for i in eng.snapshot.infos)
    assert all(not i.arrays for i in eng.snapshot.infos)  # the unit rows an append extends: the store's
    made, real = [], lexical.BM25Index.appended
    monkeypatch.setattr(lexical.BM25Index, "appended", lambda self, *a: made.append(real(self, *a)) or made[-1])
    ext, real_ext = [], bank_tables.extend_arrays
    monkeypatch.setattr(bank_tables, "extend_arrays", lambda *a: ext.append(real_ext(*a)) or ext[-1])
    eng.replace_bank(grown)
    assert len(made) == 1 and made[0] is not None and made[0].is_lean is False
    assert len(ext) == 1 and ext[0] is not None  # extended from the stored rows, not built whole
    fresh = SelectionEngine([start[0], grown], SelectConfig(), device="cpu")
    for e in (eng, fresh):
        e.remove_bank("a")
        e.purge()
    for name in ("bm_data", "bm_idx", "bm_ptr"):
        assert np.array_equal(eng.snapshot.np[name], fresh.snapshot.np[name])
    qs = ["When did they hike to the lake?", "Which book did her sister paint?", "piano"]
    Z = enc.encode(qs)
    got = eng.select_units(["c"] * 3, qs, Z)
    assert sum(map(len, got)) > 0 and got == fresh.select_units(["c"] * 3, qs, Z)


def test_an_engine_whose_tables_round_keeps_its_own_arrays(banks):
    """``BankInfo.arrays`` is empty only where the store's rows are the arrays value for value
    (``bank_tables.store_holds``): a float32 engine's ``head_sim`` table rounds them, so its infos
    keep their float64 arrays (and its appends extend from them, as before)."""
    from trawmem_gpu.select.engine.bank_tables import Layout, store_holds

    f32 = SelectionEngine(banks[:2], SelectConfig(), device="cpu", dtype="float32")
    assert all(i.arrays["head_sim"].dtype == np.float64 for i in f32.snapshot.infos)
    assert all(f32.snapshot.unit_rows(i) is None for i in range(2))
    f64 = SelectionEngine(banks[:2], SelectConfig(), device="cpu")
    rows = f64.snapshot.unit_rows(1)
    assert not f64.snapshot.infos[1].arrays and np.array_equal(rows["head_sim"], f32.snapshot.infos[1].arrays["head_sim"])

    a = {"head_sim": np.zeros(3), "rel_idx": np.zeros((3, 3), dtype=np.int32)}
    cpu64 = Layout(torch.device("cpu"), torch.float64, 8, False, True, False)
    assert store_holds(a, cpu64) and store_holds({}, cpu64)
    assert not store_holds(a, cpu64._replace(dtype=torch.float32))
    assert not store_holds({"rel_idx": a["rel_idx"].astype(np.int64)}, cpu64)
    assert not store_holds({"head_sim": torch.zeros(3, dtype=torch.float64)}, cpu64)
    assert not store_holds(a, cpu64._replace(device=torch.device("meta")))
