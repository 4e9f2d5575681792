"""The engine's fast paths against the reference and against each other.

* the compiled backend (both fronts), the tensor backend (lazy and plain greedy) and the no-table
  path pick exactly what ``select_reference`` picks, on synthetic banks with thread structure and
  BM25 overlap;
* the head index (``steps.seeds.HeadIndex``): faiss proposals with per-bank restriction, the GPU
  style "larger k, then filter" proposals (simulated on a CPU index) and the torch path return the
  same exact top-k, ties to the lower id, never a head of another bank;
* the batched BM25 is bit-identical to bm25s per query; the rank and top-k helpers equal a
  stable sort; synthetic banks' vectorized edges equal ``build_edges``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trawmem_gpu.select import _jit
from trawmem_gpu.select.config import PAPER_HOPS, SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine, plan
from trawmem_gpu.select.engine.batch import sim_mode
from trawmem_gpu.select.params import QueryParams, split_fields
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.steps import candidates as step3
from trawmem_gpu.select.steps import seeds as si
from trawmem_gpu.select.tensor_ops import ranks as _ranks
from trawmem_gpu.select.tensor_ops import ranks_positive as _ranks_positive
from trawmem_gpu.select.tensor_ops import topk_mask as _topk_mask

from benchmarks.synthetic_banks import make_banks, make_queries

HAS_NUMBA = _jit.HAS_NUMBA


@pytest.fixture(scope="module")
def syn():
    banks = make_banks(6, units=90, thread_len=6.0, d=32, seed=5) + make_banks(3, units=23, thread_len=3.0, d=32,
                                                                               seed=6, prefix="small")
    ids, qs, Z = make_queries(banks, 72, seed=9)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    return banks, ids, qs, Z, ctx


def _ref(ctx, cfg, ids, qs, Z, params=None):
    return [select_reference(ctx[b], q, z, cfg, params).units for b, q, z in zip(ids, qs, Z)]


CONFIGS = [
    pytest.param({}, id="default"),
    pytest.param(dict(neighborhood_cap=20, n_seeds=6), id="wide"),
    pytest.param(dict(hops=2, budget=24), id="hops2-B24"),
    pytest.param("paper", id="paper-head-seeds"),
    pytest.param(dict(seed_score="max", affinity="fused"), id="max-fused"),
    pytest.param(dict(ablation="identity_k"), id="identity-k"),
    pytest.param(dict(ablation="no_multi_thread"), id="no-multi-thread"),
    pytest.param(dict(lambda_r=0.5, w_role=1.0, cross_thread=True, w_thr=1.0), id="roles-and-multi-thread"),
    pytest.param(dict(greedy="plain", stop_coverage=0.5, budget=9), id="early-stop"),
]


@pytest.mark.parametrize("kw", CONFIGS)
def test_fast_paths_agree_with_reference(syn, kw):
    banks, ids, qs, Z, ctx = syn
    if kw == "paper":
        cfg, qp = SelectConfig.paper(), QueryParams(hops=PAPER_HOPS)
    else:
        method, query = split_fields(kw)
        cfg, qp = SelectConfig(**method), QueryParams(**query)
    ref = _ref(ctx, cfg, ids, qs, Z, qp)
    variants = [dict(backend="tensor"), dict(table_bytes=0), dict(backend="tensor", chunk_elems=5000),
                dict(backend="tensor", optimizer="plain"), dict(backend="tensor", table_max_units=50)]
    if HAS_NUMBA:  # table_max_units=50: the 90-unit banks without tables beside the 23-unit ones with
        variants[:0] = [dict(backend="compiled"), dict(backend="compiled", sim="dots"),
                        dict(backend="compiled", front="tensor"), dict(backend="compiled", table_max_units=50),
                        dict(backend="compiled", front="tensor", table_bytes=0)]
    for ekw in variants:
        got = SelectionEngine(banks, cfg, device="cpu", **ekw).select_units(ids, qs, Z, params=qp)
        bad = [(i, g, r) for i, (g, r) in enumerate(zip(got, ref)) if g != r]
        assert not bad, f"{ekw}: {len(bad)}/{len(ref)} differ, first {bad[:2]}"


@pytest.mark.skipif(not HAS_NUMBA, reason="needs numba")
def test_dots_similarity_is_bank_isolated():
    """The compiled own-bank dot products read only the query's bank: a decoy bank holding the
    query vector itself changes nothing and is never selected."""
    banks = make_banks(4, units=40, thread_len=4.0, d=16, seed=31)
    ids, qs, Z = make_queries(banks[:1], 6, seed=2)
    decoy = make_banks(1, units=30, thread_len=3.0, d=16, seed=32, prefix="decoy")[0]
    decoy.unit_vecs[:] = Z[0]
    alone = SelectionEngine(banks[:1], SelectConfig(), device="cpu", sim="dots").select_units(ids, qs, Z)
    eng = SelectionEngine([decoy] + banks, SelectConfig(), device="cpu", sim="dots")
    assert eng.select_units(ids, qs, Z) == alone
    snap, cpu = eng.snapshot, torch.device("cpu")
    assert sim_mode("auto", torch.arange(5), snap, cpu) == "dots"  # auto on CPU would pick it here too
    assert sim_mode("auto", torch.zeros(64, dtype=torch.int64), snap, cpu) == "grouped"


def test_auto_backend_without_numba(syn, monkeypatch):
    from trawmem_gpu.errors import ConfigError

    banks, ids, qs, Z, ctx = syn
    monkeypatch.setattr(plan, "HAS_NUMBA", False)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    assert eng.plan.backend == "tensor" and eng.plan.optimizer == "lazy"
    assert eng.select_units(ids[:10], qs[:10], Z[:10]) == _ref(ctx, SelectConfig(), ids[:10], qs[:10], Z[:10])
    with pytest.raises(ConfigError, match="backend='compiled' does not apply: it needs .*numba"):
        SelectionEngine(banks, SelectConfig(), device="cpu", backend="compiled")


def test_tables_and_memory_accounting(syn):
    banks = syn[0]
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    N = [b.n_units for b in banks]
    J = [b.n_threads for b in banks]
    snap = eng.snapshot
    assert snap.rows["ktab"] == sum(n * n for n in N) and snap.rows["btab"] == sum(n * j for n, j in zip(N, J))
    assert snap.rows["unit_vecs"] == sum(N) and snap.rows["head_vecs"] == 1 + sum(J)  # + the dummy thread
    itemsize = torch.float64.itemsize
    assert eng.table_nbytes() >= (snap.rows["ktab"] + snap.rows["btab"]) * itemsize
    assert eng.nbytes() == sum(t.element_size() * t.nelement() for t in snap.t.values()) > eng.table_nbytes()
    assert SelectionEngine(banks, SelectConfig(), device="cpu", table_bytes=0).table_nbytes() == 0


def test_candidate_helpers_match_reference(syn):
    banks, ids, qs, Z, ctx = syn
    cfg = SelectConfig(cross_thread=True)  # K across threads too (the defaults zero it there)
    eng = SelectionEngine(banks, cfg, device="cpu")
    no_tables = SelectionEngine(banks, cfg, device="cpu", table_bytes=0)
    cands = eng.candidate_sets(ids[:12], qs[:12], Z[:12])
    for b, q, z, c in zip(ids[:12], qs[:12], Z[:12], cands):
        sel = select_reference(ctx[b], q, z, cfg, keep_internals=True)
        np.testing.assert_array_equal(c, sel.candidates)
        E = ctx[b].bank.unit_vecs[c].astype(np.float64)
        K = np.clip((E @ E.T - cfg.k_shift) / (1 - cfg.k_shift), 0, 1)
        np.fill_diagonal(K, 1.0)
        np.testing.assert_allclose(eng.candidate_kernel(b, c), K, atol=1e-12)
        np.testing.assert_allclose(no_tables.candidate_kernel(b, c), K, atol=1e-12)


def test_batched_bm25_is_bit_identical(syn):
    banks, ids, qs, Z, ctx = syn
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    snap = eng.snapshot
    extra = ["", "???", "dog dog dog cat", "When did the the the paint happen"]
    qall = list(qs) + extra
    bidx = np.array([snap.index[b] for b in ids] + [0, 1, 2, 3])
    bm = snap.bm25
    ptr, cols, slow = step3.bm25_columns(bidx.tolist(), qall, bm.vocabs, bm.plain, bm.store.col0)
    assert not slow
    lex = step3.bm25_batch(bidx, (ptr, cols), bm.store, int(snap.off.nu.max()))
    for i, (b, q) in enumerate(zip(bidx, qall)):
        # bm25s itself, over the bank's texts (the reference context's index: the engine's own
        # keeps no score matrix, BM25Index.lean; its bm_* tables are what is tested here)
        ref = ctx[snap.infos[b].bank.bank_id].bm25.scores(q)
        assert np.array_equal(lex[i, :len(ref)], ref) and not lex[i, len(ref):].any()


def _stable_ranks(x, mask):
    key = torch.where(mask, -x + 0.0, float("inf"))
    order = torch.sort(key, dim=1, stable=True).indices
    r = torch.empty_like(order)
    r.scatter_(1, order, torch.arange(1, x.shape[1] + 1).expand_as(order).contiguous())
    return r.to(x.dtype)


@pytest.mark.parametrize("seed", range(4))
def test_rank_and_topk_helpers_equal_a_stable_sort(seed):
    g = torch.Generator().manual_seed(seed)
    Q, N = 9, 41
    x = (torch.randint(-2, 6, (Q, N), generator=g).float() / 3).double()  # many exact ties, zeros, -0.0
    x[0, :5] = -0.0
    mask = torch.rand(Q, N, generator=g) < 0.85
    assert torch.equal(_ranks(x, mask)[mask], _stable_ranks(x, mask)[mask])
    xp = torch.where(mask, x.float().double(), 0.0)
    pos = xp > 0
    assert torch.equal(_ranks_positive(xp)[pos], _stable_ranks(xp, pos)[pos])
    for k in (1, 3, 8, 60):
        key = torch.where(mask, -x, float("inf"))
        order = torch.sort(key, dim=1, stable=True).indices[:, :min(k, N)]
        want = torch.zeros(Q, N, dtype=torch.bool).scatter_(1, order, True) & mask
        assert torch.equal(_topk_mask(x, k, mask), want)


# ----------------------------------------------------------------------------------------------
# seed index
# ----------------------------------------------------------------------------------------------
def _heads(seed, sizes, d=24, dup=True):
    rng = np.random.default_rng(seed)
    H = rng.standard_normal((sum(sizes), d))
    if dup:  # exact duplicate heads: ties across the top-k cut
        H[3] = H[1]
        H[7:10] = H[6]
    H /= np.linalg.norm(H, axis=1, keepdims=True)
    H = H.astype(np.float32).astype(np.float64)
    off = torch.as_tensor(np.concatenate([[0], np.cumsum(sizes)]), dtype=torch.int64)
    return torch.from_numpy(H), off


def _index(vecs, off, mode):
    return si.HeadIndex(vecs, off[:-1], off[1:] - off[:-1], mode=mode)


@pytest.mark.parametrize("k", [1, 4, 9])
def test_head_index_modes_agree(k):
    vecs, off = _heads(0, [40, 3, 17, 60, 1])
    rng = np.random.default_rng(1)
    bidx = torch.as_tensor(rng.integers(0, 5, size=50))
    # queries: copies of heads (exact ties with duplicates) and random directions
    pick = off[bidx] + torch.as_tensor(rng.integers(0, 1 << 30, size=50)) % (off[bidx + 1] - off[bidx])
    Z = vecs[pick].clone()
    Z[::2] += 0.3 * torch.randn(25, vecs.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    Z = Z / Z.norm(dim=1, keepdim=True)
    idx = _index(vecs, off, "torch")
    c_t, i_t = idx.search(Z, bidx, k)
    # ground truth: stable sort over each own bank
    for q in range(50):
        a, e = int(off[bidx[q]]), int(off[bidx[q] + 1])
        cos = (vecs[a:e] @ Z[q]).numpy()
        want = sorted(range(e - a), key=lambda j: (-cos[j], j))[:k]
        got = [j for j in i_t[q].tolist() if j >= 0]
        assert got == want
    if not si.faiss_available():
        pytest.skip("faiss not installed")
    c_f, i_f = idx.search(Z, bidx, k, mode="faiss")
    assert torch.equal(i_f, i_t) and idx.stats.faiss_calls == len(torch.unique(bidx))
    idx._index()
    idx._faiss_gpu = True  # the GPU code path (one global search, filtered) on the CPU index
    c_g, i_g = idx.search(Z, bidx, k, mode="faiss")
    assert torch.equal(i_g, i_t)


def test_head_index_never_returns_another_bank():
    if not si.faiss_available():
        pytest.skip("faiss not installed")
    rng = np.random.default_rng(3)
    z = rng.standard_normal(16)
    z /= np.linalg.norm(z)
    own = rng.standard_normal((5, 16))
    own /= np.linalg.norm(own, axis=1, keepdims=True)
    decoy = np.tile(z, (50, 1))  # the other bank holds 50 exact copies of the query
    vecs = torch.from_numpy(np.concatenate([decoy, own, decoy]))
    off = torch.tensor([0, 50, 55, 105])
    idx = _index(vecs, off, "faiss")
    for gpu_style in (False, True):
        idx._index()
        idx._faiss_gpu = gpu_style
        cos, ids = idx.search(torch.from_numpy(np.tile(z, (4, 1))), torch.tensor([1, 1, 1, 1]), 3)
        assert ((ids >= 0) & (ids < 5)).all(), ids
        assert idx.stats.fallback_queries == 0 or gpu_style


def test_head_seeds_with_ties_across_the_cut_fall_back_exactly():
    """Heads that are exact copies make r_head tie across the n_seeds cut of the seed index's
    candidates: the engine must then score every head and still match the reference."""
    banks = make_banks(3, units=80, thread_len=2.0, d=16, seed=12)
    b = banks[0]
    b.head_vecs[:] = b.head_vecs[0]  # every head identical: all r_head tie
    ids, qs, Z = make_queries(banks, 12, seed=4)
    ctx = {x.bank_id: BankContext.of(x) for x in banks}
    cfg, qp = SelectConfig.paper(), QueryParams(hops=PAPER_HOPS, n_seeds=3, neighborhood_cap=5)
    ref = _ref(ctx, cfg, ids, qs, Z, qp)
    for mode in ("torch", "faiss"):
        eng = SelectionEngine(banks, cfg, device="cpu", seed_search=mode)
        assert eng.select_units(ids, qs, Z, params=qp) == ref


def test_synthetic_edges_match_build_edges():
    a = make_banks(8, units=70, thread_len=5.0, d=48, seed=21, edges="torch")
    b = make_banks(8, units=70, thread_len=5.0, d=48, seed=21, edges="build_edges")
    for x, y in zip(a, b):
        x.validate()
        assert np.array_equal(x.edge_src, y.edge_src) and np.array_equal(x.edge_dst, y.edge_dst)
        assert np.array_equal(x.edge_kind, y.edge_kind) and np.allclose(x.edge_w, y.edge_w, atol=1e-6)
        assert x.n_units == 70


# ----------------------------------------------------------------------------------------------
# CUDA (skipped without a GPU)
# ----------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", ["torch", "auto"])
def test_cuda_engine_with_tables_matches_reference_mostly(syn, impl):
    banks, ids, qs, Z, ctx = syn
    cfg, qp = SelectConfig(), QueryParams(hops=2)
    got = SelectionEngine(banks, cfg, device="cuda", kernels=impl).select_units(ids, qs, Z, params=qp)
    ref = _ref(ctx, cfg, ids, qs, Z, qp)
    same = sum(set(g) == set(r) for g, r in zip(got, ref))
    assert same >= 0.9 * len(ref), f"{same}/{len(ref)}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_head_index_modes_agree():
    vecs, off = _heads(4, [300, 5, 120], dup=False)
    vecs, off = vecs.float().cuda(), off.cuda()
    bidx = torch.tensor([0, 1, 2, 0, 2], device="cuda")
    Z = vecs[off[bidx]] + 0.1
    Z = Z / Z.norm(dim=1, keepdim=True)
    idx = _index(vecs, off, "torch")
    c_t, i_t = idx.search(Z, bidx, 6)
    if si.faiss_available():
        c_f, i_f = idx.search(Z, bidx, 6, mode="faiss")  # GPU index when faiss has GPUs, else CPU faiss
        assert torch.equal(i_f, i_t)


@pytest.mark.skipif(not HAS_NUMBA, reason="needs numba")
def test_learned_head_on_the_compiled_path(syn):
    """Per-query A, M(delta) and weights from a learned head reach the compiled steps 4-7 and the
    picks match the reference given the same head."""
    model = pytest.importorskip("trawmem_gpu.head.model")
    banks, ids, qs, Z, ctx = syn
    cfg, qp = SelectConfig(), QueryParams(hops=2)
    head = model.RoleHead(cfg)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name in ("dA", "dM0", "dMr", "s", "S"):
            if hasattr(head, name):
                p = getattr(head, name)
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    ref = [select_reference(ctx[b], q, z, cfg, qp, head=head).units for b, q, z in zip(ids, qs, Z)]
    for front in ("compiled", "tensor"):
        got = SelectionEngine(banks, cfg, head=head, device="cpu", backend="compiled", front=front).select_units(
            ids, qs, Z, params=qp)
        bad = [(i, a, r) for i, (a, r) in enumerate(zip(got, ref)) if a != r]
        assert not bad, f"{front}: {len(bad)}/{len(ref)} differ, first {bad[:3]}"
