"""A bank on the approximate path keeps its unit vectors in the bank (issue 46 item 2): on a
float64 CPU engine with the compiled front, a bank of at least ``ann_min_units`` units with float32
vectors has no ``unit_vecs`` rows (``BankInfo.mapped``: its rows are a hole of the table,
``tables.Hole``), and every reader gathers its rows from ``Bank.unit_vecs`` (a loaded bank's
memory-mapped file; ``tables.unit_block`` / ``unit_rows``). float32 -> float64 is exact, so the
picks must be those of an engine whose table holds the same vectors as float64 (no bank mapped):
with the mapped bank between table banks (their rows after its hole), masked queries, an append
(written in place, and appended whole) and a forget's purge."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.engine.bank_tables import Hole
from trawmem_gpu.select.engine.tables import _Segment

from benchmarks.synthetic_banks import make_banks, make_queries

OPTS = {"ann_min_units": 1000, "ann_shortlist": 32}


def _as64(bank):
    return replace(bank, unit_vecs=bank.unit_vecs.astype(np.float64), head_vecs=bank.head_vecs.astype(np.float64))


@pytest.fixture(scope="module")
def banks():
    small = make_banks(3, units=257, thread_len=5.0, d=24, seed=31, prefix="odd")
    big = make_banks(1, units=1203, thread_len=7.0, d=24, seed=32, prefix="big")[0]
    v = big.unit_vecs.copy()
    v[1:40:2] = v[0:39:2]  # exact ties in every cosine
    return [small[0], replace(big, unit_vecs=v), small[1], small[2]]


def _picks(eng, banks, seed=33, masks=None):
    ids, qs, Z = make_queries(banks, 40, seed=seed)
    return eng.select_units(ids, qs, Z, masks=masks), eng.candidate_sets(ids, qs, Z)


def _same(a, b):
    (pa, ca), (pb, cb) = a, b
    assert sum(len(p) for p in pb) > 0
    assert [list(p) for p in pa] == [list(p) for p in pb]
    assert all(np.array_equal(x, y) for x, y in zip(ca, cb))


def test_a_large_bank_holds_no_copy_and_picks_what_the_float64_table_picks(banks):
    mapped = SelectionEngine(banks, SelectConfig(), device="cpu", **OPTS)
    table = SelectionEngine([_as64(b) for b in banks], SelectConfig(), device="cpu", **OPTS)
    snap = mapped.snapshot
    assert snap.mapped.tolist() == [False, True, False, False] and not table.snapshot.mapped.any()
    a, n = int(snap.off.uo[1]), banks[1].n_units
    seg = mapped._store._segments["unit_vecs"]
    assert seg.in_hole(a, a + n) and not seg.in_hole(a - 1, a)
    assert not snap.np["unit_vecs"][a:a + n].any()  # never written: no copy of the vectors
    after = int(snap.off.uo[2])  # a table bank after the hole keeps its own rows
    assert np.array_equal(snap.np["unit_vecs"][after:after + banks[2].n_units], banks[2].unit_vecs)
    _same(_picks(mapped, banks), _picks(table, banks))
    assert any(isinstance(k, tuple) and k[0] == "unit_index" for k in snap.infos[1].cache)
    assert mapped.select_units([], [], np.zeros((0, 24))) == []
    assert snap.nbytes(["unit_vecs"]) == 4 * snap.t["unit_vecs"].nelement() - 4 * 24 * n  # the hole is not held


def test_masked_queries_read_the_mapped_rows(banks):
    ids, _, _ = make_queries(banks, 40, seed=34)
    rng = np.random.default_rng(35)
    n = {b.bank_id: b.n_units for b in banks}
    masks = [rng.random(n[i]) < 0.5 if k % 2 else None for k, i in enumerate(ids)]
    mapped = SelectionEngine(banks, SelectConfig(), device="cpu", **OPTS)
    table = SelectionEngine([_as64(b) for b in banks], SelectConfig(), device="cpu", **OPTS)
    got, want = _picks(mapped, banks, 34, masks)[0], _picks(table, banks, 34, masks)[0]
    assert sum(len(p) for p in want) > 0 and [list(p) for p in got] == [list(p) for p in want]


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


@pytest.mark.parametrize("last", [False, True], ids=["appended-whole", "in-place"])
def test_an_append_and_a_forget_keep_the_mapped_bank_exact(last):
    from word_encoder import WordEncoder

    from trawmem_gpu.ingest import build_banks, update_bank

    enc = WordEncoder()
    big = _conversation("c", 170, 5)
    convs = [_conversation("a", 40, 6), type(big)("c", big.turns[:120]), _conversation("b", 50, 7)]
    if last:
        convs = [convs[0], convs[2], convs[1]]
    start, _ = build_banks(convs, encoder=enc, progress=False)
    at = [b.bank_id for b in start].index("c")
    grown, _ = update_bank(start[at], list(big.turns[120:]), encoder=enc)
    opts = {"ann_min_units": 100, "ann_shortlist": 16}
    eng = SelectionEngine(start, SelectConfig(), device="cpu", **opts)
    assert eng.snapshot.mapped.tolist() == [b.bank_id == "c" for b in start]
    _picks(eng, start)  # builds the index, which the append grows
    eng.replace_bank(grown)
    now = [grown if b.bank_id == "c" else b for b in start]
    table = SelectionEngine([_as64(b) for b in now], SelectConfig(), device="cpu", **opts)
    _same(_picks(eng, now), _picks(table, now))
    eng.remove_bank(now[0].bank_id)  # a forget of a whole bank, then the purge's compaction
    eng.purge()
    rest = now[1:]
    table = SelectionEngine([_as64(b) for b in rest], SelectConfig(), device="cpu", **opts)
    _same(_picks(eng, rest), _picks(table, rest))
    assert eng._store._segments["unit_vecs"].holes  # the compacted table still holds no copy
    have = eng.snapshot.np["nbr"] >= 0  # thread rows packed after the append and the purge (assembly.packed_length)
    assert (have == np.cumprod(have, axis=1).astype(bool)).all()


def test_a_segment_never_writes_copies_or_clears_a_hole():
    seg = _Segment((3,), torch.float32, "cpu", 0, 2)
    seg.append(np.ones((2, 3)))
    seg.append(Hole(5))  # past the capacity: a regrow
    seg.append(np.full((1, 3), 2.0))
    assert seg.holes == [(2, 7)] and seg.end == 8 and seg.written() == [(0, 2), (7, 8)]
    assert seg.buf[:2].eq(1).all() and seg.buf[7].eq(2).all() and not seg.buf[2:7].any()
    seg._regrow(32, (3,))
    assert seg.buf[:2].eq(1).all() and seg.buf[7].eq(2).all() and not seg.buf[2:7].any()
    seg.append(Hole(0))
    assert seg.holes == [(2, 7)] and seg.in_hole(3, 6) and not seg.in_hole(1, 3) and seg.in_hole(4, 4)
    seg.clear()
    assert not seg.buf.any()


@pytest.mark.parametrize("sim", ["dots", "grouped"])
def test_a_mapped_bank_searched_exactly_reads_its_own_vectors(banks, sim):
    """The exact front's cosines read a mapped bank's vectors from the bank (its table rows are a
    hole of zeros): an engine built with the bank mapped and then searched exactly (its plan's
    ``ann_min_units`` None, as ``benchmarks/scale_bench/ann_recall.py`` does to compare both over
    one copy of the tables) picks what an exact engine picks, by per-query dots or one GEMM a bank."""
    mapped = SelectionEngine(banks, SelectConfig(), device="cpu", sim=sim, **OPTS)
    assert mapped.snapshot.mapped.any()
    mapped.plan = replace(mapped.plan, ann_min_units=None)
    exact = SelectionEngine(banks, SelectConfig(), device="cpu", sim=sim, ann_min_units=None)
    assert not exact.snapshot.mapped.any()
    _same(_picks(mapped, banks), _picks(exact, banks))


@pytest.mark.parametrize("masked", [False, True])
def test_the_tensor_front_reads_a_mapped_bank_from_its_own_vectors(banks, masked):
    """Only the compiled front maps a bank, but the tensor front's scan (``batch.similarity``) and
    masked bridge (``masks.chunk_bridge``) read a mapped bank's rows from the bank too: the same
    engine routed through the tensor front picks what the float64 table does, never the hole's
    zeros."""
    mapped = SelectionEngine(banks, SelectConfig(), device="cpu", **OPTS)
    table = SelectionEngine([_as64(b) for b in banks], SelectConfig(), device="cpu", **OPTS)
    assert mapped.snapshot.mapped.any()
    for eng in (mapped, table):
        eng.plan = replace(eng.plan, front="tensor")
    masks = None
    if masked:
        ids, _, _ = make_queries(banks, 40, seed=36)
        rng = np.random.default_rng(37)
        n = {b.bank_id: b.n_units for b in banks}
        masks = [rng.random(n[i]) < 0.5 if k % 2 else None for k, i in enumerate(ids)]
    _same(_picks(mapped, banks, 36, masks), _picks(table, banks, 36, masks))


@pytest.mark.parametrize("big_at", [1, 3])
def test_a_mapped_bank_without_tables_after_other_banks_reads_its_own_rows(banks, big_at):
    """A bank too large for K and bridge tables (``table_max_units``) has its candidates' products
    made per query (``pool.query_tables`` over ``unit_rows``): the rows of a mapped bank there are
    its own vectors at the bank-local ids, not at the global rows (they read other rows, or past
    the end, for any bank but the first one: a served collection's large bank crashed or picked
    from wrong vectors)."""
    order = [b for b in banks if b is not banks[1]]
    order.insert(big_at, banks[1])
    opts = {**OPTS, "table_max_units": 1000}
    mapped = SelectionEngine(order, SelectConfig(), device="cpu", **opts)
    table = SelectionEngine([_as64(b) for b in order], SelectConfig(), device="cpu", **opts)
    snap = mapped.snapshot
    assert snap.mapped.tolist() == [i == big_at for i in range(4)]
    assert int(snap.off.tab[big_at]) == 0 and int(snap.off.uo[big_at]) > 0  # no tables, not at row 0
    _same(_picks(mapped, order), _picks(table, order))


def test_unit_rows_read_a_mapped_banks_rows_from_its_vectors_in_any_shape(banks):
    """``tables.unit_rows`` on the mapped engine against the float64 table's rows: indices of the
    mapped bank and of table banks mixed, 1-D, 2-D (``[Q, U]`` as the pool gathers), a slice over the
    hole, table rows only, and none; the table's rows of the hole stay unwritten."""
    from trawmem_gpu.select.engine.tables import unit_rows

    mapped = SelectionEngine(banks, SelectConfig(), device="cpu", **OPTS)
    table = SelectionEngine([_as64(b) for b in banks], SelectConfig(), device="cpu", **OPTS)
    snap, ref = mapped.snapshot, table.snapshot
    a, n = int(snap.off.uo[1]), banks[1].n_units
    total = int(snap.off.uo[-1] + snap.off.nu[-1])
    rng = np.random.default_rng(36)
    mixed = torch.as_tensor(rng.integers(0, total, 301))
    for idx in (mixed, mixed[:300].reshape(20, 15), torch.as_tensor(rng.integers(0, a, 17)),
                torch.as_tensor(np.arange(a, a + n)[::-7].copy()), torch.zeros(0, dtype=torch.int64),
                slice(a - 5, a + 9), slice(None)):
        got, want = unit_rows(snap, idx), unit_rows(ref, idx)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
    assert not snap.np["unit_vecs"][a:a + n].any()
