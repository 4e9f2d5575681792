"""The one dispatcher (``engine/plan.py``) and J's terms as objects.

A new coverage term, defined only as a ``CoverageTerm`` subclass, runs through every optimizer
that composes the terms (the NumPy reference, the torch plain and lazy greedies) with the same
picks, while the fused paths (compiled, Triton) stand aside: ``auto`` resolves around them and
an explicit request for them is a ``ConfigError``, never a silent switch.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.select import objective as J, terms
from trawmem_gpu.select.config import EngineConfig, SelectConfig
from trawmem_gpu.select.engine import SelectionEngine, plan as P
from trawmem_gpu.select.steps import greedy as G
from trawmem_gpu.select.steps.greedy import batched as GB

from engine_banks import banks, queries  # noqa: F401 - fixtures
from objective_problems import _problem as random_problem, _problem_of as problem_of


class PairCoverage(terms.CoverageTerm):
    """A made-up coverage term (not registered: the fixture patches it into the term lists): pairs of adjacent local threads, each paid once (its mass: the
    pair's priority mass). Only here, to show that composing optimizers need nothing else."""

    def _p(self, d, u):
        t = int(d.thread[u])
        return t // 2 if t >= 0 else -1

    def _mass(self, d):
        T = len(d.mass)
        return np.array([d.mass[2 * k:2 * k + 2].sum() for k in range((T + 1) // 2)])

    def init(self, d):
        return np.zeros((len(d.mass) + 1) // 2, dtype=bool)

    def gain(self, d, hit, u):
        p = self._p(d, u)
        return float(self._mass(d)[p]) if p >= 0 and not hit[p] else 0.0

    def add(self, d, hit, u):
        p = self._p(d, u)
        if p >= 0:
            hit[p] = True

    def total(self, d, hit):
        return float(self._mass(d)[hit].sum())

    def _cols(self, d):  # torch: thread column c (1-based, 0 = none) -> pair column (c + 1) // 2
        return (d.thread + 1) // 2

    def _pmass(self, d):
        Q, T1 = d.mass.shape
        P_ = T1 // 2 + 1
        return torch.zeros(Q, P_ + 1, dtype=d.mass.dtype).scatter_add(1, (torch.arange(T1) + 1) // 2 * (
            torch.arange(T1) > 0)[None, :].expand(Q, T1), d.mass)

    def init_t(self, d):
        return torch.zeros_like(self._pmass(d), dtype=torch.bool)

    def gains_t(self, d, hit, pick):
        col = pick.units(self._cols(d))
        return torch.gather(pick.query(self._pmass(d)), 1, col) * ~torch.gather(pick.query(hit), 1, col)

    def add_t(self, d, hit, rows, active):
        col = rows(self._cols(d))[:, None]
        new = hit.scatter(1, col, torch.gather(hit, 1, col) | active[:, None])
        new[:, 0] = False
        return new


PAIR = PairCoverage("pair_coverage", "w_pair", "sum_pairs [S hits pair] mass_pair", "<= mass_pair", position=70)


@pytest.fixture
def four_terms(monkeypatch):
    """J's fused coverage terms, its modular terms and the made-up term, patched where the term
    lists are read (so the test does not depend on which other terms J has)."""
    base = tuple(terms.TERM_BY_NAME[n] for n in GB.TRITON_FUSED_TERMS)
    all_terms = tuple(t for t in terms.TERMS if t.kind == "modular" or t in base) + (PAIR,)
    cov = base + (PAIR,)
    for mod in (J, GB, P):
        monkeypatch.setattr(mod, "COVERAGE_TERMS", cov, raising=False)
    monkeypatch.setattr(J, "TERMS", all_terms)
    monkeypatch.setattr(SelectConfig, "w_pair", 1.5, raising=False)  # its weight (a class default)
    return cov


def _problem(seed, Q=3, U=15, T=5):
    """test_objective's random problem as a torch ``GreedyProblem``, with a small modular part."""
    x = random_problem(seed, Q, U, T)
    return problem_of(x, x["alpha"] * 0.1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_new_coverage_term_runs_through_every_composing_optimizer(four_terms, seed):
    p = _problem(seed)
    w = (0.5, 0.3, 0.2, 2.0)  # the new term dominates: it must change the picks
    rule = G.StopRule(torch.full((3,), 6), 2.0, 6)
    ref, _, n_ref = G.greedy_reference_np(p, w, rule._replace(budget=np.full(3, 6)))
    for run in (G.greedy_select_torch, G.greedy_lazy_torch):
        sel, _, n = run(p, w, rule)
        assert sel.tolist() == ref.tolist() and n.tolist() == n_ref.tolist(), run.__name__
    without, _, _ = G.greedy_reference_np(p, w[:3] + (0.0,), rule._replace(budget=np.full(3, 6)))
    assert without.tolist() != ref.tolist()  # the term is live


def test_objective_value_is_the_sum_of_the_terms(four_terms):
    p = _problem(3)
    q = 0
    obj = J.Objective(p.pi[q], p.K[q], p.rho[q], p.delta[q], p.modular[q], p.thread[q], (1.0, 1.0, 1.0, 1.0),
                      thread_mass=p.thread_mass[q])
    S, total = [], 0.0
    for u in (4, 0, 9, 2):
        total += obj.gain(u)
        obj.add(u)
        S.append(u)
        assert obj.value(S) == pytest.approx(total, abs=1e-12)


def test_plan_routes_around_fused_paths(four_terms, banks):  # noqa: F811
    plan = P.resolve(EngineConfig(device="cpu"), SelectConfig(), banks)
    assert plan.backend == "tensor" and plan.kernels == "torch" and plan.propagation == "torch"
    with pytest.raises(ConfigError, match=r"backend='compiled' does not apply: it computes the coverage terms"):
        P.resolve(EngineConfig(device="cpu", backend="compiled"), SelectConfig(), banks)
    with pytest.raises(ConfigError, match=r"kernels='triton' does not apply: .* J also has \['pair_coverage'\]"):
        P.resolve(EngineConfig(device="cpu", kernels="triton"), SelectConfig(), banks)
    off = SelectConfig()
    object.__setattr__(off, "w_pair", 0.0)  # the term off: it counts for nothing, the fused paths apply
    assert P.resolve(EngineConfig(device="cpu"), off, banks).backend == "compiled"


def test_plan_is_explicit(banks):  # noqa: F811
    """Every choice is in the plan: the compiled backend's pieces, and the tensor backend's."""
    c = P.resolve(EngineConfig(device="cpu"), SelectConfig(), banks)
    assert (c.backend, c.front, c.propagation, c.greedy_tokens) == ("compiled", "compiled", "compiled", "compiled")
    t = P.resolve(EngineConfig(device="cpu", backend="tensor"), SelectConfig(affinity="rrf"), banks)
    assert (t.backend, t.front, t.propagation, t.greedy_tokens, t.rrf_rows) == \
        ("tensor", "tensor", "torch", "torch", "compiled")
    with pytest.raises(ConfigError, match="front='compiled' does not apply"):
        P.resolve(EngineConfig(device="cpu", front="compiled"), SelectConfig(affinity="dense"), banks)


def test_triton_greedy_refuses_a_token_budget():
    p = _problem(4)
    W1 = tuple(1.0 if t.name in GB.TRITON_FUSED_TERMS else 0.0 for t in terms.COVERAGE_TERMS)
    rule = G.StopRule(torch.full((3,), 4), 2.0, 4, G.TokenBudget(torch.full((3,), 50.0), torch.ones(3, 15) * 5,
                                                                torch.ones(3, 5), False))
    with pytest.raises(ValueError, match="no token knapsack"):
        G.greedy_select(p, W1, rule, impl="triton")
    assert G.greedy_select(p, W1, rule, impl="torch")[2].tolist() == G.greedy_select_torch(p, W1, rule)[2].tolist()


def test_fused_term_lists_match_the_kernels():
    from trawmem_gpu.select.steps.greedy.compiled import FUSED_TERMS

    assert FUSED_TERMS == GB.TRITON_FUSED_TERMS and set(FUSED_TERMS) <= {t.name for t in terms.COVERAGE_TERMS}


def test_engine_with_a_new_term_matches_the_reference(four_terms, banks, queries, monkeypatch):  # noqa: F811
    """End to end: the engine (tensor backend, chosen by the plan) and the reference agree with
    the made-up term in J (its weight from the config's ``w_pair``, set here)."""
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.select.reference import select_reference

    monkeypatch.setattr(SelectConfig, "w_pair", 1.5, raising=False)
    monkeypatch.setattr(terms, "WEIGHTS", terms.WEIGHTS + ("w_pair",))  # SelectConfig checks these
    from trawmem_gpu.select.steps import roles

    for mod in (J, roles):
        monkeypatch.setattr(mod, "QUERY_WEIGHTS", terms.QUERY_WEIGHTS + ("w_pair",))
    ids, qs, Z = queries
    cfg = SelectConfig()
    got = SelectionEngine(banks, cfg, device="cpu").select_units(ids, qs, Z)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    assert got == [select_reference(ctx[b], q, z, cfg).units for b, q, z in zip(ids, qs, Z)]
