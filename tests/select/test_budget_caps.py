"""The largest budget B a library caller may pass: capped by the candidate pool, in the reference and
on the batched engine, with no memory that grows with B."""
from __future__ import annotations

import pytest


def _growth(select, big: int) -> tuple[int, list, list]:
    """How much more memory ``select(B)`` allocates through Python and NumPy (``tracemalloc``
    sees NumPy's array buffers) at ``B = big`` than at ``B = 256`` (above every pool here), after an untraced warm-up;
    and both results."""
    import tracemalloc

    select(256)
    peak, got = {}, {}
    for B in (256, big):
        tracemalloc.start()
        try:
            got[B] = select(B)
            peak[B] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return peak[big] - peak[256], got[256], got[big]


def _library_problem():
    from engine_banks import make_bank

    import numpy as np

    banks = [make_bank("odd", [3, 1, 5, 2, 7, 4, 1, 6, 3], seed=1, n_semantic=5),
             make_bank("wide", [2, 3, 4, 5] * 8, seed=4, n_semantic=20)]
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(8, banks[0].unit_vecs.shape[1])).astype(np.float32)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    return banks, ["odd", "wide"] * 4, [f"when did we talk about {i}?" for i in range(8)], Z


def test_huge_budgets_in_the_library_are_capped_by_the_pool():
    """A library caller's B is bounded (``QueryParams``: at most ``MAX_BUDGET``, a clear error
    above); at that bound the reference selection takes the whole pool and allocates nothing
    that grows with B."""
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.select.params import MAX_BUDGET, QueryParams
    from trawmem_gpu.select.reference import select_reference

    with pytest.raises(ConfigError, match=r"^`budget` must lie in \[1, 4096\] \(got 1000000000\)"):
        QueryParams(budget=1_000_000_000)
    banks, ids, qs, Z = _library_problem()
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    grown, small, huge = _growth(lambda B: [select_reference(ctx[b], q, z, None, QueryParams(budget=B)).units
                                            for b, q, z in zip(ids, qs, Z)], MAX_BUDGET)
    assert grown < (1 << 20) and huge == small


def test_huge_budgets_on_the_batched_engine():
    """The batched engine (compiled, the CPU default) at the largest budget: the same picks as
    at B = 256 (both take the whole pool), and no memory that grows with B (buffers are sized by
    the candidate pool)."""
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.params import MAX_BUDGET, QueryParams

    banks, ids, qs, Z = _library_problem()
    eng = SelectionEngine(banks, None, device="cpu")
    grown, small, huge = _growth(lambda B: eng.select_units(ids, qs, Z, params=QueryParams(budget=B)), MAX_BUDGET)
    assert huge == small
    assert grown < (1 << 20), grown
