"""The shortlist's front rounds with each thread space grown from the seeds (``engine/seeded_front.py``,
``seeded_front.SEEDED``) give the candidates of the space grown from every thread of the working
set (``front_loop`` over ``assembly.front_args``' space): every field, bit for bit, in every front
of every query (first and grown working sets, masked and not, both affinities, many hops, many
seeds, tied cosines), and the same picks."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, assembly, compiled, seeded_front
from trawmem_gpu.select.params import QueryParams

from test_assembly import _bank


def _valid(c, q):
    """Query ``q``'s written entries of ``Candidates`` ``c``."""
    n, h = int(c.n_cand[q]), int(c.n_h[q])
    return (c.cand[q, :n], c.lt[q, :n], c.alpha[q, :n], c.hthread[q, :h], c.rvec[q, :h], c.tpos[q], n, h)


def _spy(monkeypatch, seen: list):
    """Run each chunk's shortlist front both ways and compare what they wrote."""
    real = compiled._front_shortlist

    def both(snap, plan, cfg, Zc, bidx, text, sizes, c, lap, masks=None):
        want = type(c)(*(a.copy() for a in c))
        monkeypatch.setattr(seeded_front, "SEEDED", False)
        real(snap, plan, cfg, Zc, bidx, text, sizes, want, lap, masks)
        monkeypatch.setattr(seeded_front, "SEEDED", True)
        real(snap, plan, cfg, Zc, bidx, text, sizes, c, lap, masks)
        for q in range(len(bidx)):
            for i, (a, b) in enumerate(zip(_valid(c, q), _valid(want, q))):
                np.testing.assert_array_equal(a, b, err_msg=f"query {q}, field {i}")
            seen.append(int(c.n_cand[q]))
    monkeypatch.setattr(compiled, "_front_shortlist", both)


@pytest.mark.parametrize("affinity", ["learned", "rrf"])
@pytest.mark.parametrize("units,ties,hops,seeds", [(1999, False, 2, None), (2501, True, 1, None), (777, False, 3, None),
                                                   (1201, False, 1, 40), (903, True, 0, None)])
def test_grown_from_the_seeds_the_candidates_are_those_of_the_whole_space(monkeypatch, affinity, units, ties, hops,
                                                                          seeds):
    banks, (ids, qs, Z) = _bank(units, ties, seed=units)
    params = QueryParams(hops=hops, **({} if seeds is None else {"n_seeds": seeds}))
    eng = SelectionEngine(banks, SelectConfig(affinity=affinity), device="cpu", ann_min_units=1, ann_shortlist=16)
    seen: list = []
    _spy(monkeypatch, seen)
    got = eng.select_units(ids, qs, Z, params=params)
    for i in range(0, len(ids), 7):  # batches of one (the benchmark's) and of several
        eng.select_units(ids[i:i + 1], qs[i:i + 1], Z[i:i + 1], params=params)
    assert len(seen) >= len(ids) and max(seen) > 0
    monkeypatch.setattr(seeded_front, "SEEDED", False)
    assert got == eng.select_units(ids, qs, Z, params=params)


def test_masked_queries_take_the_same_candidates(monkeypatch):
    """Masks passing most units, few units (fewer seeds of a finite score than ``n_seeds``: the
    space of every thread) and whole threads."""
    banks, (ids, qs, Z) = _bank(1501, False, seed=8)
    n, rng = banks[0].n_units, np.random.default_rng(9)
    masks = [rng.random(n) < 0.6, np.isin(np.arange(n), rng.choice(n, 12, replace=False)),
             (rng.random(banks[0].n_threads) < 0.3)[banks[0].unit_thread], None] * 5
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=24)
    seen: list = []
    _spy(monkeypatch, seen)
    got = eng.select_units(ids, qs, Z, masks=masks)
    assert len(seen) == len(ids)
    assert all(m is None or all(m[u] for u in g) for g, m in zip(got, masks))


def test_the_seeds_are_kept_only_when_enough_score():
    """``_seeds``: the best ``k`` by (score, lower place) when ``k`` threads take part with a finite
    score; none (grow from every thread) when fewer do, or a seed's score is not finite."""
    from trawmem_gpu.select.engine.compiled_loops import front_scratch

    s = front_scratch(4, 6, False, 60.0)
    s.r0[:6] = [0.5, 0.9, 0.5, -np.inf, 0.1, 0.9]
    s.tlive[:6] = True
    assert seeded_front._seeds(s, 6, 3).tolist() == [1, 5, 0]
    assert seeded_front._seeds(s, 6, 5).tolist() == [1, 5, 0, 2, 4]
    assert seeded_front._seeds(s, 6, 6).tolist() == []  # the sixth seed scores -inf
    s.tlive[:6] = [True, True, False, False, False, False]
    assert seeded_front._seeds(s, 6, 3).tolist() == []  # two take part
    s.r0[1] = np.nan
    assert seeded_front._seeds(s, 6, 2).tolist() == []


def test_the_grown_space_is_smaller_and_the_scratch_left_all_minus_one(monkeypatch):
    """On a bank whose threads have many neighbours the seeds' space is a part of the whole one
    (both measured by ``_grown`` itself), and the level array is -1 after every query."""
    banks, (ids, qs, Z) = _bank(2501, False, seed=4)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=48)
    sizes = []
    real = seeded_front._grown

    def spy(sp, q, own, ult, seeds, hops):
        out = real(sp, q, own, ult, seeds, hops)
        whole = real(sp, q, own, ult, seeds[:0], hops)
        sizes.append((len(out[0]), len(whole[0]), len(seeds)))
        assert (sp.level == -1).all()
        return out
    monkeypatch.setattr(seeded_front, "_grown", spy)
    monkeypatch.setattr(seeded_front, "seeded_loop", seeded_front.seeded_loop.py_func)  # reads the module's _grown
    eng.select_units(ids[:4], qs[:4], Z[:4], params=QueryParams(hops=1))
    assert sizes and all(k > 0 for _, _, k in sizes)
    assert all(a <= b for a, b, _ in sizes) and sum(a for a, _, _ in sizes) < sum(b for _, b, _ in sizes)


def test_a_loop_cut_short_drops_the_level_array(monkeypatch):
    banks, (ids, qs, Z) = _bank(777, False, seed=2)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", ann_min_units=1, ann_shortlist=16)
    eng.select_units(ids[:1], qs[:1], Z[:1])
    before = assembly.levels(1)

    def boom(*a):
        a[5].level[3] = 7  # a cut-short call leaves an entry set
        raise KeyboardInterrupt
    monkeypatch.setattr(seeded_front, "seeded_loop", boom)
    with pytest.raises(KeyboardInterrupt):
        eng.select_units(ids[:1], qs[:1], Z[:1])
    after = assembly.levels(1)
    assert after is not before and (after == -1).all()
