"""``engine/rank_sample.py``: the rank sample's int8 codes. The compiled dots equal the plain NumPy
ones (float32 summation order apart); every dot lies within the codes' stated bound of the exact
float64 dot; a rank estimate moves by no more than the sampled cosines that lie within that bound
of the unit's; zero, odd-sized and empty samples; the engine keeps its sample as codes."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, ranks, shortlist
from trawmem_gpu.select.engine.rank_sample import CODE_MAX, RankSample, dots, dots_plain, rank_sample

from benchmarks.synthetic_banks import make_banks, make_queries


def _unit_rows(rng, S: int, d: int) -> np.ndarray:
    v = rng.standard_normal((S, d)).astype(np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def _bound(sample: RankSample, z: np.ndarray) -> np.ndarray:
    """The codes' bound on each dot's error: half a step per coordinate, plus float32 rounding."""
    z64 = np.abs(z.astype(np.float64))
    return 0.5 * sample.scale.astype(np.float64) * z64.sum() + 1e-5 * (1.0 + z64.sum())


@pytest.mark.parametrize("S,d", [(1, 1), (7, 3), (33, 17), (257, 64), (1000, 384)])
def test_codes_dots_match_the_plain_form_and_lie_within_the_bound(S, d):
    rng = np.random.default_rng(S * 31 + d)
    v = _unit_rows(rng, S, d)
    units = np.sort(rng.choice(10 * S, S, replace=False))
    s = rank_sample(units, v)
    assert s.codes.dtype == np.int8 and s.codes.flags.c_contiguous and s.scale.dtype == np.float32
    assert np.abs(s.codes.astype(int)).max() <= CODE_MAX and np.array_equal(s.units, units) and len(s.units) == S
    for _ in range(3):
        z = _unit_rows(rng, 1, d)[0]
        got, ref = dots(s, z), dots_plain(s, z)
        assert got.dtype == np.float32 and got.shape == (S,)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
        exact = v.astype(np.float64) @ z.astype(np.float64)
        assert (np.abs(got - exact) <= _bound(s, z)).all()


def test_a_zero_vector_codes_to_zero_and_an_empty_sample_has_no_dots():
    v = np.zeros((3, 5), np.float32)
    v[1] = [0.5, -0.25, 0, 0, 1]
    s = rank_sample(np.arange(3), v)
    assert (s.codes[0] == 0).all() and s.scale[0] == 1.0
    assert s.codes[1].tolist() == [64, -32, 0, 0, 127]
    z = np.ones(5, np.float32)
    assert dots(s, z)[0] == 0.0 and dots(s, z)[2] == 0.0
    e = rank_sample(np.zeros(0, np.int64), np.zeros((0, 4), np.float32))
    assert dots(e, np.ones(4, np.float32)).shape == (0,) and dots_plain(e, np.ones(4)).shape == (0,)
    with pytest.raises(ValueError, match="vecs must be"):
        rank_sample(np.arange(2), np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="codes must be"):
        rank_sample(np.arange(3), v, codes="float16")


def test_float32_codes_are_the_vectors_and_give_the_float32_loops_dots():
    """``codes="float32"`` (the form before int8 codes): the vectors as they are, scale 1, and the
    dots of a plain float32 loop (the former ``_sample_dots``), summation order apart."""
    rng = np.random.default_rng(9)
    v = _unit_rows(rng, 300, 48)
    s = rank_sample(np.arange(300), v, codes="float32")
    assert s.codes.dtype == np.float32 and np.array_equal(s.codes, v) and (s.scale == 1).all()
    z = _unit_rows(rng, 1, 48)[0]
    want = np.empty(300, np.float32)
    for i in range(300):
        acc = np.float32(0.0)
        for k in range(48):
            acc = np.float32(acc + v[i, k] * z[k])
        want[i] = acc
    np.testing.assert_allclose(dots(s, z), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(dots_plain(s, z), v @ z, rtol=0, atol=1e-6)


def test_a_rank_estimate_moves_only_by_the_sampled_cosines_within_the_bound():
    """Ranks from the codes' dots against ranks from the exact float32 dots: past the edge, each
    differs by at most n_bank / S per sampled cosine that lies within the codes' bound of the unit's
    cosine, and the typical change is well inside the sampling error of the estimate itself (here on
    isotropic vectors, whose dots crowd together: the hardest case for the codes)."""
    rng = np.random.default_rng(5)
    S, d, n_bank = 4096, 384, 1_000_000
    v = _unit_rows(rng, S, d)
    s = rank_sample(np.arange(S), v)
    z = _unit_rows(rng, 1, d)[0]
    exact = np.sort((v @ z).astype(np.float32))
    coded = np.sort(dots(s, z))
    W = np.arange(500)
    cos = np.sort(rng.uniform(exact[0], exact[-1], len(W)))
    cos[::7] = exact[rng.integers(0, S, len(cos[::7]))]  # some exactly on a sampled cosine
    head = np.zeros((2, 0))
    a = ranks.cosine_ranks_plain(head, cos, W, np.inf, exact, n_bank)
    b = ranks.cosine_ranks_plain(head, cos, W, np.inf, coded, n_bank)
    tol = _bound(s, z).max()
    near = np.array([np.count_nonzero(np.abs(exact.astype(np.float64) - c) <= tol) for c in cos])
    assert (np.abs(a - b) <= n_bank / S * near + 1e-9).all()
    p = np.clip((a - 1) / n_bank, 0, 1)  # the share above each cosine, and the sample's own error there
    sampling = n_bank / S * np.sqrt(S * p * (1 - p))
    assert np.median(np.abs(a - b)) < 0.25 * np.median(sampling), (np.median(np.abs(a - b)), np.median(sampling))


def test_the_engine_keeps_its_rank_sample_as_codes():
    banks = make_banks(1, units=600, d=32, seed=3)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1, ann_min_units=1)
    ids, qs, Z = make_queries(banks, 2, seed=4)
    eng.select_units(ids, qs, Z)
    index, sample = eng.snapshot.infos[0].cache[("unit_index", eng.plan.ann_kind)]
    assert isinstance(sample, RankSample) and len(sample.units) == min(600, shortlist.RANK_SAMPLE)
    got = shortlist.working_sets(eng.snapshot, eng.plan, np.asarray(Z, dtype=np.float64), np.zeros(2, np.int64),
                                 (np.zeros(3, np.int64), np.zeros(0, np.int64)), False)
    for q in range(2):
        np.testing.assert_allclose(got[q].sample, np.sort(dots_plain(sample, Z[q])), rtol=0, atol=1e-5)
        assert (np.diff(got[q].sample) >= 0).all()
