"""The batched SelectionEngine against the per-query reference (``select_reference``).

Synthetic banks are built directly (random unit vectors, a few threads, adjacent and semantic
edges, words from a small vocabulary so BM25 matches), with odd thread lengths, a one-thread
bank, a bank with fewer units than the budget and banks with exact ties in seed and
neighbourhood scores. On CPU the engine computes in float64 like the reference, so picks must
agree exactly, in pick order.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from trawmem_gpu.store.graph import ADJACENT, SEMANTIC
from trawmem_gpu.select.config import ABLATIONS, MULTI_THREAD, PAPER_HOPS, ROLE_TERMS, SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.objective import CoverageWeights
from trawmem_gpu.select.params import QueryParams, split_fields
from trawmem_gpu.select.steps.greedy import GreedyProblem, StopRule, greedy_lazy_torch, greedy_select_torch
from trawmem_gpu.select.steps.priority import in_thread_distances
from trawmem_gpu.select.reference import select_reference
from engine_banks import _unit, banks, D, make_bank, queries, reference  # noqa: F401 - fixtures


def check_agrees(banks, cfg, ids, qs, Z, variants=({},), params=None, **engine_kw):
    """Every engine variant (EngineConfig options) picks what the reference picks, in pick order,
    every query with ``params`` (one ``QueryParams``; None = the defaults)."""
    ref = reference(banks, cfg, ids, qs, Z, params)
    for v in variants:
        got = SelectionEngine(banks, cfg, device="cpu", **engine_kw, **v).select_units(ids, qs, Z, params=params)
        bad = [(i, g, r) for i, (g, r) in enumerate(zip(got, ref)) if g != r]
        assert not bad, f"{v or 'default'}: {len(bad)}/{len(ref)} queries differ from the reference, first: {bad[:3]}"


CONFIGS = [pytest.param(dict(ablation=a), id=f"ablation-{a}") for a in ABLATIONS if a != "fixed_segmentation"]
CONFIGS += [pytest.param(dict(hops=h), id=f"hops-{h}") for h in (0, 2, 3)]
CONFIGS += [
    pytest.param(dict(affinity="dense"), id="dense"),
    pytest.param(dict(affinity="fused"), id="fused"),
    pytest.param(dict(affinity="fused", lexical_weight=0.0, propagation="paper", hops=3), id="fused0-paper-h3"),
    pytest.param(dict(seed_score="max", d_idx="cosine", hops=2, ablation="no_cross_edges"), id="max-cosine"),
    pytest.param(dict(n_seeds=2, neighborhood_cap=3, budget=5, hops=2), id="small-cap"),
    pytest.param(dict(greedy="plain", budget=7, stop_coverage=0.6), id="early-stop"),
    pytest.param(dict(budget=1), id="budget-1"),
    pytest.param(ROLE_TERMS | MULTI_THREAD, id="roles-and-multi-thread"),
    pytest.param(ROLE_TERMS | MULTI_THREAD | dict(ablation="no_multi_thread", hops=2), id="roles-no-multi-thread-h2"),
    pytest.param("paper", id="paper"),
]


@pytest.mark.parametrize("kw", CONFIGS)
def test_agrees_with_reference(banks, queries, kw):
    if kw == "paper":
        cfg, qp = SelectConfig.paper(), QueryParams(hops=PAPER_HOPS)
    else:
        method, query = split_fields(kw)
        cfg, qp = SelectConfig(**method), QueryParams(**query)
    check_agrees(banks, cfg, *queries, variants=({}, dict(backend="tensor")), params=qp)


@pytest.mark.parametrize("sim", ["grouped", "global", "gather"])
def test_similarity_modes_agree(banks, queries, sim):
    check_agrees(banks, SelectConfig(), *queries, params=QueryParams(hops=2), sim=sim)


def test_tiny_chunks_and_plain_greedy(banks, queries):
    """Size buckets of one or two queries, the plain greedy op instead of the lazy one, and no
    per-bank tables change nothing."""
    cfg, qp = SelectConfig(), QueryParams(hops=2)
    check_agrees(banks, cfg, *queries, params=qp, chunk_elems=1, backend="tensor", optimizer="plain")
    check_agrees(banks, cfg, *queries, params=qp, chunk_elems=2000, table_bytes=0)


def test_seed_and_cap_ties_go_to_lower_thread(queries):
    """Threads 1 and 3 are exact copies (same units, same head): equal r0, so the seed is the
    lower one. Threads 4 and 5 hang off seed 1 with equal edge weights: equal r~, so a cap of 3
    keeps the seed, thread 0 (weight 1) and the lower of 4 and 5."""
    rng = np.random.default_rng(11)
    base = _unit(rng, 3)
    other = _unit(rng, 9)
    lens = [2, 3, 2, 3, 4, 1]
    E = np.concatenate([other[:2], base, other[2:4], base, other[4:9]])
    texts = ["dog cat", "paint music", "hike paris school", "art camp", "book yoga", "beach trip", "sister game",
             "hike paris school", "art camp", "book yoga", "race garden", "cook piano", "movie friend", "lake bike",
             "sunday dog"]
    pairs = {(0, 1): (1.0, ADJACENT), (1, 4): (0.6, SEMANTIC), (1, 5): (0.6, SEMANTIC), (2, 3): (1.0, ADJACENT)}
    bank = make_bank("ties", lens, seed=12, unit_vecs=E, texts=texts, pairs=pairs)
    z = base[0].astype(np.float64)
    ids, qs, Z = ["ties"] * 3, ["hike paris school?", "When art camp?", "book"], np.stack([z, z, base[1]])
    for kw in (dict(n_seeds=1, neighborhood_cap=1, hops=0), dict(n_seeds=1, neighborhood_cap=2, hops=1),
               dict(n_seeds=2, neighborhood_cap=3, hops=2), dict(affinity="dense", n_seeds=1, neighborhood_cap=2)):
        method, query = split_fields(kw)
        check_agrees([bank], SelectConfig(**method), ids, qs, Z, params=QueryParams(**query))
    eng = SelectionEngine([bank], SelectConfig(affinity="dense"), device="cpu")
    picks = eng.select_units(["ties"], ["x"], z[None], params=QueryParams(n_seeds=1, neighborhood_cap=1, hops=0))[0]
    assert set(picks) == {2, 3, 4}, picks  # thread 1, not its copy thread 3 (units 7-9)
    picks = eng.select_units(["ties"], ["x"], z[None], params=QueryParams(n_seeds=1, neighborhood_cap=3, hops=1))[0]
    assert set(picks) == {0, 1, 2, 3, 4, 10, 11, 12, 13}, picks  # threads 0, 1, 4 (not 5: unit 14)


def test_bank_isolation():
    """The other bank holds exact copies of the query vector and of the question text; none of
    its units may ever be picked, and its presence must not change the selection at all."""
    rng = np.random.default_rng(21)
    target = make_bank("target", [3, 4, 2, 5], seed=22)
    z = rng.normal(size=D)
    z /= np.linalg.norm(z)
    question = "When did Ann paint the lake?"
    qp = QueryParams(hops=2)
    decoy = make_bank("decoy", [6, 6, 6], seed=23, unit_vecs=np.tile(z, (18, 1)), texts=[question] * 18)
    for sim in ("grouped", "global", "gather"):
        for order in ([decoy, target], [target, decoy]):
            eng = SelectionEngine(order, SelectConfig(), device="cpu", sim=sim)
            ws = eng.select(["target", "decoy", "target"], [question] * 3, np.stack([z, z, z]), params=qp)
            for w in (ws[0], ws[2]):
                assert w.bank_id == "target"
                assert w.unit_ids and all(u.startswith("target:") for u in w.unit_ids), w.unit_ids
            assert all(u.startswith("decoy:") for u in ws[1].unit_ids)
            alone = SelectionEngine([target], SelectConfig(), device="cpu").select_units(["target"], [question],
                                                                                         z[None], params=qp)
            assert eng.select_units(["target"], [question], z[None], params=qp) == alone


def test_select_returns_workspaces(banks, queries):
    ids, qs, Z = queries
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    units = eng.select_units(ids, qs, torch.as_tensor(Z))
    ws = eng.select(ids, qs, Z)
    bank_of = {b.bank_id: b for b in banks}
    for w, b, q, u in zip(ws, ids, qs, units):
        assert w.bank_id == b and w.question == q
        assert w.unit_ids == [bank_of[b].turns[i].turn_id for i in sorted(u)]
        assert len(u) == len(set(u)) <= QueryParams().budget


def test_errors_and_empty(banks, queries):
    ids, qs, Z = queries
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    assert eng.select_units([], [], np.zeros((0, D))) == []
    assert eng.select([], [], np.zeros((0, D))) == []
    with pytest.raises(KeyError, match="no-such-bank"):
        eng.select_units(["odd", "no-such-bank"], qs[:2], Z[:2])
    Zn = Z[:3].copy()
    Zn[1, 4] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        eng.select_units(ids[:3], qs[:3], Zn)
    with pytest.raises(ValueError):
        eng.select_units(ids[:3], qs[:2], Z[:3])
    with pytest.raises(ValueError):
        eng.select_units(ids[:3], qs[:3], Z[:3, :5])


def test_head_hook(banks, queries):
    """A head with ``role_matrices`` replaces delta and M(delta); one returning the hand-set
    values changes nothing; an object without the method is ignored (roles on: without role
    conditioning, the defaults, delta and M change no pick)."""
    ids, qs, Z = queries
    cfg = SelectConfig(**ROLE_TERMS)
    A, M = np.array(cfg.A), np.array(cfg.M)

    class SameHead:
        def role_matrices(self, x):
            d = x.numpy() @ A.T
            d = d / d.sum(1, keepdims=True)
            return torch.as_tensor(d), torch.as_tensor(M[None] * (1.0 + d)[:, :, None])

    class AnchorOnly:
        def role_matrices(self, x):
            d = torch.zeros(len(x), 3, dtype=torch.float64)
            d[:, 0] = 1.0
            return d, torch.as_tensor(M)[None].repeat(len(x), 1, 1)

    base = SelectionEngine(banks, cfg, device="cpu").select_units(ids, qs, Z)
    assert SelectionEngine(banks, cfg, head=SameHead(), device="cpu").select_units(ids, qs, Z) == base
    assert SelectionEngine(banks, cfg, head=object(), device="cpu").select_units(ids, qs, Z) == base
    other = SelectionEngine(banks, cfg, head=AnchorOnly(), device="cpu").select_units(ids, qs, Z)
    assert other != base


def test_in_thread_distances_match_context(banks):
    for b in banks:
        ctx = BankContext.of(b)
        ref = ctx.in_thread_dist(np.arange(b.n_units), 1.0, 0.25)
        np.testing.assert_array_equal(in_thread_distances(ctx.head_sim, b.thread_offsets, 1.0, 0.25), ref)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lazy_greedy_equals_plain_with_ties(seed):
    """Dyadic inputs (exact arithmetic) with many exact ties: the lazy batched greedy picks
    exactly what the plain torch greedy picks, ties to the lowest index, early stop included."""
    g = torch.Generator().manual_seed(seed)
    Q, U, T, R = 6, 37, 5, 3
    d = lambda *s: torch.randint(0, 4, s, generator=g).double() / 4  # values in {0, .25, .5, .75}
    valid = torch.rand(Q, U, generator=g) < 0.8
    valid[0] = True
    valid[1, 3:] = False  # U smaller than the budget
    thread = torch.where(valid, torch.randint(0, T, (Q, U), generator=g), -1)
    K = d(Q, U, U)
    K = torch.where(torch.eye(U, dtype=torch.bool)[None], 1.0, K)
    K = torch.where(valid[:, :, None] & valid[:, None, :], K, 0.0)
    pi = torch.where(valid, d(Q, U) / 8, 0.0)
    rho, delta, modular, mass = d(Q, U, R), d(Q, R), d(Q, U) / 4, d(Q, T) / 4
    budget = torch.tensor([16, 16, 4, 1, 16, 9])
    p = GreedyProblem(pi, K, rho, delta, modular, thread, mass, valid)
    w = CoverageWeights(1.0, 0.5, 1.0)
    for stop in (2.0, 0.25):
        rule = StopRule(budget, stop, 16)
        s1, _, n1 = greedy_select_torch(p, w, rule)
        for k in (1, 4, 8):
            s2, _, n2 = greedy_lazy_torch(p, w, rule, k=k)
            assert torch.equal(n1, n2) and torch.equal(s1, s2)


def test_config_ablation_is_applied_once(banks, queries):
    """The engine applies ``resolved()``; passing an already-resolved config is the same."""
    cfg = SelectConfig(ablation="no_multi_thread")
    a = SelectionEngine(banks, cfg, device="cpu").select_units(*queries)
    b = SelectionEngine(banks, replace(cfg.resolved(), ablation="none"), device="cpu").select_units(*queries)
    assert a == b


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_float32_matches_reference_mostly(banks, queries):
    """On CUDA the engine runs in float32 through the Triton kernels; float32 may break
    near-ties differently, so require agreement on nearly every query, not all."""
    ids, qs, Z = queries
    cfg, qp = SelectConfig(), QueryParams(hops=2)
    got = SelectionEngine(banks, cfg, device="cuda").select_units(ids, qs, Z, params=qp)
    ref = reference(banks, cfg, ids, qs, Z, qp)
    same = sum(set(g) == set(r) for g, r in zip(got, ref))
    assert same >= 0.9 * len(ref), f"{same}/{len(ref)}"


def test_learned_head_agrees_with_reference(banks, queries):
    """A learned RoleHead with non-zero parameters (per-query A, M(delta) and weights): the
    engine and the reference, both given the head, pick the same units."""
    model = pytest.importorskip("trawmem_gpu.head.model")
    ids, qs, Z = queries
    cfg, qp = SelectConfig(), QueryParams(hops=2)
    head = model.RoleHead(cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name in ("dA", "dM0", "dMr", "s", "S"):
            p = getattr(head, name)
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    ref = [select_reference(ctx[b], q, z, cfg, qp, head=head).units for b, q, z in zip(ids, qs, Z)]
    for kw in (dict(backend="tensor"), dict(backend="tensor", optimizer="plain"), {}):
        got = SelectionEngine(banks, cfg, head=head, device="cpu", **kw).select_units(ids, qs, Z, params=qp)
        bad = [(i, a, r) for i, (a, r) in enumerate(zip(got, ref)) if a != r]
        assert not bad, f"{kw}: {len(bad)}/{len(ref)} differ, first {bad[:3]}"
    assert ref != reference(banks, cfg, ids, qs, Z, qp)  # the head did change the selection
