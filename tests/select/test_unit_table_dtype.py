"""The engine's ``unit_vecs`` table holds float32 vectors as float32 on a float64 CPU engine
(``Layout.vec_dtype``, issue 46 item 2: half the resident bytes of the float64 copy), and every
reader casts the rows it gathers (``engine.tables.unit_rows``). float32 -> float64 is exact, so an
engine over float32 banks must pick exactly what one over the same vectors held as float64 picks
(whose table is float64, as before): on the exact path and on the approximate one (a low
``ann_min_units``), on odd sizes, with tied vectors and with an empty question set."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine

from benchmarks.synthetic_banks import make_banks, make_queries


def _as64(bank):
    return replace(bank, unit_vecs=bank.unit_vecs.astype(np.float64), head_vecs=bank.head_vecs.astype(np.float64))


def _tied(bank):
    """``bank`` with its first units' vectors repeated (exact ties in every cosine)."""
    v = bank.unit_vecs.copy()
    v[1:40:2] = v[0:39:2]
    return replace(bank, unit_vecs=v)


@pytest.fixture(scope="module")
def banks():
    out = make_banks(3, units=257, thread_len=5.0, d=24, seed=21, prefix="odd")
    out += make_banks(1, units=1201, thread_len=7.0, d=24, seed=22, prefix="big")
    out[1] = _tied(out[1])
    assert all(b.unit_vecs.dtype == np.float32 for b in out)
    return out


@pytest.mark.parametrize("options", [{}, {"ann_min_units": 1000, "ann_shortlist": 32}, {"backend": "tensor"}],
                         ids=["exact", "approximate", "tensor"])
def test_float32_table_picks_what_the_float64_table_picks(banks, options):
    ids, qs, Z = make_queries(banks, 40, seed=23)
    e32 = SelectionEngine(banks, SelectConfig(), device="cpu", **options)
    e64 = SelectionEngine([_as64(b) for b in banks], SelectConfig(), device="cpu", **options)
    assert e32.snapshot.t["unit_vecs"].dtype == torch.float32
    assert e64.snapshot.t["unit_vecs"].dtype == torch.float64
    assert e32.snapshot.t["head_sim"].dtype == torch.float64
    p32, p64 = e32.select_units(ids, qs, Z), e64.select_units(ids, qs, Z)
    assert sum(len(p) for p in p64) > 0
    assert [list(p) for p in p32] == [list(p) for p in p64]
    c32, c64 = e32.candidate_sets(ids, qs, Z), e64.candidate_sets(ids, qs, Z)
    assert all(np.array_equal(a, b) for a, b in zip(c32, c64))
    assert e32.select_units([], [], np.zeros((0, 24))) == e64.select_units([], [], np.zeros((0, 24))) == []
    if "ann_min_units" in options:
        assert any(isinstance(k, tuple) and k[0] == "unit_index" for k in e32.snapshot.infos[3].cache)


def test_float32_table_halves_the_unit_table(banks):
    e32 = SelectionEngine(banks, SelectConfig(), device="cpu")
    e64 = SelectionEngine([_as64(b) for b in banks], SelectConfig(), device="cpu")
    assert 2 * e32.snapshot.nbytes(["unit_vecs"]) == e64.snapshot.nbytes(["unit_vecs"])


def test_an_append_keeps_the_float32_table_exact(banks):
    big = banks[3]
    head = replace(big, turns=big.turns, unit_vecs=big.unit_vecs)  # same bank, put again: rows written in place
    e32 = SelectionEngine(banks, SelectConfig(), device="cpu")
    e32.replace_bank(head)
    got = e32.snapshot.np["unit_vecs"][int(e32.snapshot.off.uo[3]):][:big.n_units]
    assert got.dtype == np.float32 and np.array_equal(got, big.unit_vecs)
