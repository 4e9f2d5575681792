"""The compiled backend's steps 1-3 (``engine/compiled.py``: ``front_loop``) against their specification.

* the two sorts it ranks with equal a stable descending sort (ties to the lower position) on
  random values, exact ties, signed zeros, one crowded bucket, huge spans and tiny sizes;
* the engine with ``front="compiled"`` picks exactly what the tensor front and the reference
  pick, across configs, chunk sizes and both similarity modes; it is the default only where it
  applies and refuses configs it does not implement.
"""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.select._jit import HAS_NUMBA
from trawmem_gpu.select.config import MULTI_THREAD, ROLE_TERMS, SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine, compiled
from trawmem_gpu.select.params import QueryParams, split_fields
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.steps import candidates as step3

from benchmarks.synthetic_banks import make_banks, make_queries

pytestmark = pytest.mark.skipif(not HAS_NUMBA, reason="needs numba")


def _stable_desc(vals: np.ndarray) -> np.ndarray:
    """Spec: positions by value descending, ties to the lower position (-0.0 == 0.0)."""
    return np.argsort(-(vals + 0.0), kind="stable")


def _cases(rng):
    yield np.zeros(0)
    yield np.array([0.25])
    yield np.full(7, 0.5)                                          # all equal
    yield rng.normal(size=97)                                      # spread out
    yield np.round(rng.normal(size=200), 1)                        # many exact ties
    yield np.array([0.0, -0.0, 1.0, -0.0, 0.0, -1.0, 0.0])         # signed zeros tie
    yield np.concatenate([1e-9 * rng.random(120), [5.0], 1e-9 * rng.random(3)])  # one crowded bucket
    yield np.concatenate([np.full(80, 1e-3), 1e-3 + 1e-12 * rng.integers(0, 3, 60), [2.0]])  # crowded + ties
    yield np.array([1e308, -1e308, 0.0, 1e308, 3.0])               # span overflows to inf
    yield rng.random(64) * 1e-300                                   # denormal-scale span


def test_bucket_sort_equals_a_stable_sort():
    rng = np.random.default_rng(0)
    for vals in _cases(rng):
        m = len(vals)
        order = np.full(m + 1, -7, dtype=np.int64)
        step3.order_desc(np.concatenate([vals, [np.nan]]), m, order, np.empty(m + 1, np.int64),
                       np.empty(max(m + 1, 257), np.int64))
        np.testing.assert_array_equal(order[:m], _stable_desc(vals), err_msg=f"{vals[:8]}")
        assert order[m] == -7  # writes nothing past m


def test_radix_sort_of_float32_bits_equals_a_stable_sort():
    rng = np.random.default_rng(1)
    cases = [rng.random(50).astype(np.float32) + 0.01, np.full(9, 2.5, np.float32),
             np.concatenate([np.full(300, 0.7, np.float32), (0.7 + 1e-6 * rng.integers(0, 4, 200)).astype(np.float32),
                             np.array([31.0, 1e-30, 3e38], np.float32)]),
             np.array([1.0], np.float32), np.zeros(0, np.float32)]
    for v in cases:
        # positives spread over a longer array: pos lists where they sit
        arr = np.zeros(2 * len(v) + 1, np.float32)
        pos = np.arange(len(v), dtype=np.int64) * 2 + 1
        arr[pos] = v
        m = len(v)
        order = np.empty(m, np.int64)
        step3.order_desc_bits(arr.view(np.int32), pos, m, order, np.empty(max(m, 1), np.int64), np.empty(4 * 257, np.int64))
        np.testing.assert_array_equal(order, _stable_desc(v.astype(np.float64)))


@pytest.fixture(scope="module")
def syn():
    banks = make_banks(5, units=80, thread_len=5.0, d=24, seed=11) + make_banks(2, units=17, thread_len=2.5, d=24,
                                                                                seed=12, prefix="small")
    ids, qs, Z = make_queries(banks, 60, seed=13)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    return banks, ids, qs, Z, ctx


CONFIGS = [
    pytest.param({}, id="default"),
    pytest.param(dict(neighborhood_cap=30, n_seeds=12, budget=24), id="wide-B24"),
    pytest.param(dict(hops=3, propagation="paper"), id="hops3-paper"),
    pytest.param(dict(hops=0, n_seeds=3, neighborhood_cap=3), id="hops0-cap-equals-seeds"),
    pytest.param(dict(ablation="identity_k"), id="identity-k"),
    pytest.param(dict(ablation="no_multi_thread"), id="no-multi-thread"),
    pytest.param(ROLE_TERMS | MULTI_THREAD, id="roles-and-multi-thread"),
    pytest.param(dict(budget=1, stop_coverage=0.3), id="B1-stop"),
]


@pytest.mark.parametrize("kw", CONFIGS)
def test_compiled_front_equals_tensor_front_and_reference(syn, kw, monkeypatch):
    banks, ids, qs, Z, ctx = syn
    method, query = split_fields(kw)
    cfg, qp = SelectConfig(**method), QueryParams(**query)
    ref = [select_reference(ctx[b], q, z, cfg, qp).units for b, q, z in zip(ids, qs, Z)]
    tensor_front = SelectionEngine(banks, cfg, device="cpu", front="tensor")
    assert tensor_front.plan.front == "tensor" and tensor_front.plan.backend == "compiled"
    want = tensor_front.select_units(ids, qs, Z, params=qp)
    assert want == ref
    monkeypatch.setattr(compiled, "FRONT_ROWS", 7 * 80)  # 7 queries per chunk: banks split across chunks
    for sim in ("grouped", "dots"):
        eng = SelectionEngine(banks, cfg, device="cpu", sim=sim)
        assert eng.plan.front == "compiled"
        got = eng.select_units(ids, qs, Z, params=qp)
        bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
        assert not bad, f"sim={sim}: {len(bad)}/{len(want)} differ, first {bad[:2]}"


def test_compiled_front_only_where_it_applies(syn):
    banks = syn[0]
    for kw in (dict(affinity="dense"), dict(seed_score="max"), dict(affinity="fused")):
        assert SelectionEngine(banks, SelectConfig(**kw), device="cpu").plan.front == "tensor"
        with pytest.raises(ConfigError, match="front='compiled' does not apply"):
            SelectionEngine(banks, SelectConfig(**kw), device="cpu", front="compiled")
    assert SelectionEngine(banks, SelectConfig(), device="cpu", backend="tensor").plan.front == "tensor"
    assert SelectionEngine(banks, SelectConfig(), device="cpu", sim="global").plan.front == "tensor"
    with pytest.raises(ConfigError, match="`front` must be one of"):
        SelectionEngine(banks, SelectConfig(), device="cpu", front="fast")
    with pytest.raises(ConfigError, match="greedy= option is now backend="):
        SelectionEngine(banks, SelectConfig(), device="cpu", greedy="numba")


def test_compiled_front_keeps_input_order_and_handles_one_query(syn):
    banks, ids, qs, Z, ctx = syn
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    full = eng.select_units(ids, qs, Z)
    rev = eng.select_units(ids[::-1], qs[::-1], Z[::-1])
    assert rev == full[::-1]
    assert eng.select_units(ids[5:6], qs[5:6], Z[5:6]) == [full[5]]
    assert eng.select_units([], [], Z[:0]) == []
    assert set(eng.last_timings) >= {"text", "similarity", "localize", "select"}


def test_exact_gain_ties_pick_like_the_reference():
    """Units drawn from 4 distinct vectors and texts from 3 words: K rows, bridge values and
    gains tie exactly, so the bound-started lazy greedy must break every tie to the lower
    index, as the reference's plain greedy does."""
    from engine_banks import make_bank

    rng = np.random.default_rng(21)
    pool = rng.normal(size=(4, 16))
    pool /= np.linalg.norm(pool, axis=1, keepdims=True)
    banks = []
    for i, lens in enumerate(([3, 3, 3, 3, 3, 3], [2, 4, 2, 4, 2, 4, 2], [5, 1, 5, 1, 5])):
        n = sum(lens)
        E = pool[rng.integers(0, 4, size=n)]
        texts = [" ".join(rng.choice(["dog", "cat", "lake"], size=2)) for _ in range(n)]
        banks.append(make_bank(f"tie{i}", lens, seed=40 + i, n_semantic=3, unit_vecs=E, texts=texts))
    ids = [b.bank_id for b in banks for _ in range(5)]
    qs = ["dog lake?", "cat?", "When did the dog swim?", "lake lake", "nothing matches here"] * 3
    Z = np.stack([pool[k % 4] if k % 5 else pool[0] + pool[1] for k in range(15)])
    Z = (Z / np.linalg.norm(Z, axis=1, keepdims=True)).astype(np.float32)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    for kw in ({}, dict(budget=5), dict(ablation="identity_k"), dict(hops=2, neighborhood_cap=4, n_seeds=2)):
        method, query = split_fields(kw)
        cfg, qp = SelectConfig(**method), QueryParams(**query)
        ref = [select_reference(ctx[b], q, z, cfg, qp).units for b, q, z in zip(ids, qs, Z)]
        eng = SelectionEngine(banks, cfg, device="cpu")
        assert eng.plan.front == "compiled"
        assert eng.select_units(ids, qs, Z, params=qp) == ref, kw


def test_worker_threads_pick_the_same(syn, monkeypatch):
    """Chunks on a thread pool (the compiled loops release the GIL) give the single-thread
    picks, in input order, for any chunking."""
    banks, ids, qs, Z, ctx = syn
    one = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1).select_units(ids, qs, Z)
    for threads, rows in ((2, 1 << 20), (3, 80 * 5), (4, 1)):
        monkeypatch.setattr(compiled, "FRONT_ROWS", rows)
        eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=threads)
        assert eng.select_units(ids, qs, Z) == one, (threads, rows)
        assert eng.select_units(ids[:1], qs[:1], Z[:1]) == one[:1]
    with pytest.raises(ConfigError, match="`threads` must be >= 1"):
        SelectionEngine(banks, SelectConfig(), device="cpu", threads=0)


def test_candidate_buffer_bound_is_tight_enough_and_checked(syn):
    """The front writes candidates into ``[Qc, unit_cap]`` buffers (``Snapshot.unit_cap``: the
    units of a bank's max(cap, n_seeds) longest threads, from ``BankInfo.long_threads``); a
    too-narrow buffer raises instead of writing out of bounds."""
    banks, ids, qs, Z, ctx = syn
    qp = QueryParams(neighborhood_cap=4, n_seeds=4)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=1)
    want = eng.select_units(ids, qs, Z, params=qp)
    snap = eng.snapshot
    bidx = np.array([snap.index[b] for b in ids])
    cap = snap.unit_cap(bidx, np.full(len(ids), 4))
    bank_of = {b.bank_id: b for b in banks}
    assert cap.tolist() == [int(np.sort(np.diff(bank_of[b].thread_offsets))[::-1][:4].sum()) for b in ids]
    cs = eng.candidate_sets(ids, qs, Z, params=qp)  # the tensor steps' candidate sets
    assert max(len(c) for c in cs) <= int(cap.max())
    assert all(len(c) <= int(k) for c, k in zip(cs, cap))
    saved = [info.long_threads.copy() for info in snap.infos]
    for info in snap.infos:  # a wrong bound must fail loudly
        info.long_threads[:] = np.minimum(info.long_threads, 1)
    snap._lazy.pop("long_threads", None)  # the snapshot's table of the bounds, rebuilt from them
    try:
        with pytest.raises(IndexError, match="candidate buffer"):
            eng.select_units(ids, qs, Z, params=qp)
    finally:
        for info, lt in zip(snap.infos, saved):
            info.long_threads[:] = lt
        snap._lazy.pop("long_threads", None)
    assert eng.select_units(ids, qs, Z, params=qp) == want


def test_one_engine_shared_by_caller_threads(syn):
    """Serving threads may share one engine: concurrent calls return their own picks."""
    from concurrent.futures import ThreadPoolExecutor

    banks, ids, qs, Z, ctx = syn
    eng = SelectionEngine(banks, SelectConfig(), device="cpu", threads=2)
    want = eng.select_units(ids, qs, Z)
    spans = [(0, 60), (5, 17), (30, 60), (0, 1)] * 3
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda ab: eng.select_units(ids[ab[0]:ab[1]], qs[ab[0]:ab[1]], Z[ab[0]:ab[1]]), spans))
    for (a, b), g in zip(spans, got):
        assert g == want[a:b]
