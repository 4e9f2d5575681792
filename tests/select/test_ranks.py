"""``engine/ranks.py``: the compiled cosine ranks equal the plain NumPy ones (the reference), on
random heads with ties, repeated proposal units, units of ``W`` among and outside the proposals,
cosines equal to the rank sample's float32 values, empty heads / samples / working sets, and the
fallbacks; the engine's candidates and picks are the same with either."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, ranks

from benchmarks.synthetic_banks import make_banks, make_queries


def _case(rng, H: int, m: int, S: int, coarse: bool, repeat: bool):
    """``(head, cos, W, edge, sample, n_bank)``: proposals ordered by cosine desc, ties to the lower
    unit; ``W`` ascending, about half of it proposals; coarse cosines tie often."""
    n_bank = 10_000
    units = rng.choice(n_bank, H, replace=False)
    if repeat and H > 3:
        units[rng.integers(0, H, 3)] = units[0]
    hc = rng.integers(0, 20, H) / 20.0 if coarse else rng.random(H)
    o = np.lexsort((units, -hc))
    head = np.stack([hc[o], units[o].astype(np.float64)])
    pick = rng.random(H) < 0.5
    W = np.unique(np.concatenate([units[pick], rng.choice(n_bank, m, replace=False)]))
    sample = np.sort(rng.random(S).astype(np.float32))
    cos = rng.integers(0, 20, len(W)) / 20.0 if coarse else rng.random(len(W))
    for j, u in enumerate(W):  # a proposal's own cosine for most of the units that are proposals
        hit = np.flatnonzero(head[1] == u)
        if len(hit) and rng.random() < 0.9:
            cos[j] = head[0, hit[0]]
    if S:
        k = rng.integers(0, len(W), max(1, len(W) // 5))
        cos[k] = sample[rng.integers(0, S, len(k))].astype(np.float64)  # exactly a sample's value
    edge = float(head[0, -1]) if H else np.inf
    return head, cos, W, edge, sample, n_bank


@pytest.mark.parametrize("coarse", [False, True])
@pytest.mark.parametrize("repeat", [False, True])
def test_compiled_cosine_ranks_equal_the_plain_ones(coarse, repeat):
    rng = np.random.default_rng(11 + 2 * coarse + repeat)
    for H, m, S in ((0, 0, 0), (0, 7, 5), (1, 1, 0), (5, 9, 16), (64, 100, 0), (1024, 1600, 4096), (3, 300, 1)):
        head, cos, W, edge, sample, n = _case(rng, H, m, S, coarse, repeat)
        want = ranks.cosine_ranks_plain(head, cos, W, edge, sample, n)
        got = ranks.cosine_ranks(head, cos, W, edge, sample, n)
        assert got.dtype == want.dtype == np.float64 and got.shape == (len(W),)
        np.testing.assert_array_equal(got, want, err_msg=f"H={H} m={m} S={S}")
        if H and len(W):  # every rank at least 1, a proposal's its place
            assert (got >= 1).all()


def test_the_plain_form_takes_what_the_compiled_one_does_not():
    rng = np.random.default_rng(5)
    head, cos, W, edge, sample, n = _case(rng, 50, 80, 64, False, False)
    cos_nan = cos.copy()
    cos_nan[3] = np.nan
    for args in ((head, cos_nan, W, edge, sample, n), (head, cos[::-1].copy(), W[::-1].copy(), edge, sample, n)):
        np.testing.assert_array_equal(ranks.cosine_ranks(*args), ranks.cosine_ranks_plain(*args))


def test_the_engine_picks_the_same_with_either(monkeypatch):
    banks = make_banks(1, units=2501, thread_len=5.0, d=24, seed=9, prefix="rk")
    ids, qs, Z = make_queries(banks, 24, seed=10)
    for affinity in ("learned", "rrf"):
        eng = SelectionEngine(banks, SelectConfig(affinity=affinity), device="cpu", ann_min_units=1, ann_shortlist=16)
        got = (eng.candidate_sets(ids, qs, Z), eng.select_units(ids, qs, Z),
               [eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])[0] for i in range(0, 24, 5)])
        monkeypatch.setattr(ranks, "COMPILED", False)
        want = (eng.candidate_sets(ids, qs, Z), eng.select_units(ids, qs, Z),
                [eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1])[0] for i in range(0, 24, 5)])
        monkeypatch.setattr(ranks, "COMPILED", True)
        assert all(np.array_equal(a, b) for a, b in zip(got[0], want[0]))
        assert got[1] == want[1] and got[2] == want[2]


@pytest.mark.parametrize("repeat", [False, True])
def test_a_held_order_by_unit_gives_the_same_ranks(repeat):
    """``cosine_ranks(by_unit=)``: the shortlist's held stable order of the proposals by unit ranks
    as the one sorted per call; one of another length (a head replaced since) is not read."""
    rng = np.random.default_rng(21 + repeat)
    for H, m, S in ((0, 5, 3), (1, 1, 0), (64, 100, 16), (1024, 1600, 4096)):
        head, cos, W, edge, sample, n = _case(rng, H, m, S, False, repeat)
        want = ranks.cosine_ranks_plain(head, cos, W, edge, sample, n)
        held = np.argsort(head[1].astype(np.int64), kind="stable")
        np.testing.assert_array_equal(ranks.cosine_ranks(head, cos, W, edge, sample, n, held), want)
        np.testing.assert_array_equal(ranks.cosine_ranks(head, cos, W, edge, sample, n, held[:-1]), want)
