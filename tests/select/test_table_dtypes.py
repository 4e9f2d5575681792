"""The engine's id tables ``nbr`` (each thread's neighbour threads) and ``bm_idx`` (each BM25
posting's unit) are int32 (``engine.bank_tables.TABLES``, issue 46 item 2: half the bytes of
int64). They hold bank-local ids, below 2^31 by ``build_bank``'s check, so every value is the int64
table's; the torch readers cast the rows they gather to int64. An engine with the int32 tables must
pick exactly what the same engine with the int64 tables (the wide kinds patched back in) picks: on
the exact path, the approximate one, the tensor backend and a GPU-shaped masked query, on odd
sizes, tied vectors, an empty question set and an append."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, bank_tables, tables

from benchmarks.synthetic_banks import make_banks, make_queries

NARROW = {"nbr", "bm_idx"}


def _wide() -> tuple:
    """``TABLES`` as they were: the id tables int64."""
    return tuple((name, group, "int" if name in NARROW else kind, fill)
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
        assert narrow.snapshot.t[name].dtype == torch.int32 and wide.snapshot.t[name].dtype == torch.int64
        a, b = narrow.snapshot.np[name], wide.snapshot.np[name]
        assert a.shape == b.shape and np.array_equal(a.astype(np.int64), b)
    assert (narrow.snapshot.np["nbr"] >= 0).any() and (narrow.snapshot.np["nbr"] == -1).any()
    assert 2 * narrow.snapshot.nbytes(["nbr", "bm_idx"]) == wide.snapshot.nbytes(["nbr", "bm_idx"])
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
        assert np.array_equal(engines[0].snapshot.np[name].astype(np.int64), engines[1].snapshot.np[name])
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
