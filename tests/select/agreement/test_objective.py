"""J is defined once (``select/objective.py``): every optimizer, and the head's training surrogate,
against it term by term.

Each backend runs the greedy on the same random problems with one term of ``terms.TERMS``
switched on at a time (its weight 1, every other 0; a modular term enters as the modular vector),
then with all of them. The picks and gains must equal those of the NumPy reference
(``objective.Objective`` + ``steps.greedy.plain_greedy``); a failure names the backend and the
term, so a backend that misses a term, or states it differently, is found at once.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from trawmem_gpu.select import objective as J, terms
from trawmem_gpu.select._jit import HAS_NUMBA
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.steps import greedy as G
from trawmem_gpu.select.steps.greedy.batched import TRITON_FUSED_TERMS
from trawmem_gpu.select.steps.greedy.compiled import FUSED_TERMS, FusedWeights
from trawmem_gpu.select.steps.priority import HAS_TRITON
from objective_problems import _problem, _problem_of, NOW

TRITON_OK = HAS_TRITON and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
ROOT = Path(__file__).resolve().parents[3]
SIZES = [(3, 13, 4), (2, 29, 6)]  # (queries, candidates, threads)


def _cases():
    """(label, coverage weights in ``COVERAGE_TERMS`` order, modular weights): each term alone,
    then all of them."""
    for t in terms.TERMS:
        w = {k: 1.0 if k == t.weight else 0.0 for k in terms.WEIGHTS}
        yield t.name, J.coverage_weights(w), {m.weight: w[m.weight] for m in terms.MODULAR_TERMS}
    yield "all terms", tuple(0.7 + 0.3 * k for k in range(len(terms.COVERAGE_TERMS))), \
        {m.weight: 0.5 for m in terms.MODULAR_TERMS}


def _modular(x: dict, w: dict) -> np.ndarray:
    """The modular part by the objective's own function, on the problem's unit attributes."""
    Q, U = x["alpha"].shape
    return J.modular_gain(J.ModularInputs(x["alpha"], x["attrs"], np.full((Q, 1), NOW)), w, SelectConfig())


def _fused_covers(w, fused) -> bool:
    """Whether a fused backend (restating ``fused``) computes every term that ``w`` weighs."""
    return all(t.name in fused for t, v in zip(terms.COVERAGE_TERMS, w) if float(v) != 0.0)


def _fused_weights(w, fused) -> tuple:
    by = {t.name: float(v) for t, v in zip(terms.COVERAGE_TERMS, w)}
    return tuple(by[n] for n in fused)


def _reference(x, w, modular):
    out = []
    for q in range(len(x["pi"])):
        obj = J.Objective(x["pi"][q], x["K"][q], x["rho"][q], x["delta"][q], modular[q], x["thread"][q], w,
                          thread_mass=x["thread_mass"][q], attrs=x["attrs"][q], alpha=x["alpha"][q])
        out.append(G.plain_greedy(obj, G.StopRule(int(x["budget"][q]))))
    return out


def _batched(fn):
    def run(x, w, modular):
        Q, U = x["pi"].shape
        sel, gains, n = fn(_problem_of(x, modular), w, G.StopRule(torch.as_tensor(x["budget"]), 2.0, U))
        sel, gains, n = (np.asarray(a.cpu() if isinstance(a, torch.Tensor) else a) for a in (sel, gains, n))
        return [(sel[q, :n[q]].tolist(), gains[q, :n[q]].tolist()) for q in range(Q)]
    return run


def _numba(x, w, modular):
    """The compiled lazy greedy of the CPU engine, one query at a time."""
    out = []
    Q, U = x["pi"].shape
    s = G.greedy_scratch(U, 3, int(x["thread"].max()) + 1)
    for q in range(Q):
        K = np.ascontiguousarray(x["K"][q])
        bound = K @ x["pi"][q]  # the exact step-0 coverage gains are upper bounds too
        g = G.CompiledQuery(x["pi"][q], np.ascontiguousarray(x["rho"][q]), x["delta"][q], np.ascontiguousarray(modular[q]),
                            x["thread"][q], x["thread_mass"][q][x["thread"][q]], bound,
                            G.KSource(K.reshape(-1), 0, U, np.arange(U), False),
                            FusedWeights(*_fused_weights(w, FUSED_TERMS)), G.StopRule(int(x["budget"][q]), 2.0, U))
        sel = np.full(U, -1, dtype=np.int64)
        n = G.lazy_greedy_one(g, s, sel)
        # the compiled greedy does not report gains: recompute them with the reference's state
        obj = J.Objective(x["pi"][q], K, x["rho"][q], x["delta"][q], modular[q], x["thread"][q], w,
                          thread_mass=x["thread_mass"][q], attrs=x["attrs"][q], alpha=x["alpha"][q])
        gains = []
        for u in sel[:n]:
            gains.append(obj.gain(int(u)))
            obj.add(int(u))
        out.append((sel[:n].tolist(), gains))
    return out


def _surrogate(x, w, modular):
    """The head's training surrogate: its gain function and the terms' updates (as
    ``head.train.greedy_unroll`` runs them) in a plain greedy loop."""
    from trawmem_gpu.head.train import _coverage_data, _gains

    t = {k: torch.as_tensor(v) for k, v in x.items()}
    Q, U = t["pi"].shape
    s = {"pi": t["pi"], "rho": t["rho"], "delta": t["delta"], "mass": t["thread_mass"],
         "modular": torch.as_tensor(modular), "weights": {term.weight: v for term, v in zip(terms.COVERAGE_TERMS, w)}}
    d = _coverage_data(s, {"K": t["K"], "lt": t["thread"], "umask": t["valid"], "attrs": t["attrs"],
                              "alpha": t["alpha"]})
    state = [term.init_t(d) for term in terms.COVERAGE_TERMS]
    free = torch.ones(Q, U, dtype=torch.bool)
    out = [([], []) for _ in range(Q)]
    qi, every = torch.arange(Q), torch.ones(Q, dtype=torch.bool)
    for _ in range(int(x["budget"].max())):
        g = torch.where(free, _gains(s, d, state), float("-inf"))
        u = g.argmax(1)
        for q in range(Q):
            if len(out[q][0]) < int(x["budget"][q]):
                out[q][0].append(int(u[q]))
                out[q][1].append(float(g[q, u[q]]))
        state = [term.add_t(d, st, lambda a: a[qi, u], every) for term, st in zip(terms.COVERAGE_TERMS, state)]
        free[qi, u] = False
    return out


# compiled on a GPU; on the CPU only under TRITON_INTERPRET=1 (the kernels refuse CPU tensors otherwise)
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _triton(x, w, modular):
    def on(v):
        return v.to(TRITON_DEVICE) if isinstance(v, torch.Tensor) else v

    def fn(p, w_, rule):
        p32 = G.GreedyProblem(*(on(v.float() if v.is_floating_point() else v) if v is not None else None for v in p))
        w_ = J.CoverageWeights(*(on(v) for v in w_))
        return G.greedy_select(p32, w_, rule._replace(budget=on(rule.budget)), impl="triton")
    return _batched(fn)(x, w, modular)


_numba.fused = FUSED_TERMS  # the fused backends run only the cases whose terms they restate
_triton.fused = TRITON_FUSED_TERMS


BACKENDS = [
    pytest.param(_batched(lambda p, w, r: G.greedy_reference_np(p, w, r, lazy=True)), 1e-12, id="numpy-lazy"),
    # the torch optimizers compute in float64 but report gains in float32
    pytest.param(_batched(G.greedy_select_torch), 1e-6, id="torch-plain"),
    pytest.param(_batched(G.greedy_lazy_torch), 1e-6, id="torch-lazy"),
    pytest.param(_numba, 1e-12, id="numba-lazy", marks=pytest.mark.skipif(not HAS_NUMBA, reason="needs numba")),
    pytest.param(_surrogate, 1e-12, id="head-surrogate"),
    pytest.param(_triton, 2e-6, id="triton", marks=pytest.mark.skipif(not TRITON_OK, reason="needs triton")),
]


@pytest.mark.parametrize("backend,tol", BACKENDS)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"Q{s[0]}-U{s[1]}")
def test_every_optimizer_agrees_with_the_objective_term_by_term(backend, tol, size):
    x = _problem(sum(size), *size)
    for label, w, mw in _cases():
        fused = getattr(backend, "fused", None)
        if fused is not None and not _fused_covers(w, fused):
            continue  # the plan never sends such a J to this backend (tests/select/agreement/test_dispatch.py)
        modular = _modular(x, mw)
        want = _reference(x, w, modular)
        got = backend(x, w, modular)
        for q, ((ws, wg), (gs, gg)) in enumerate(zip(want, got)):
            assert gs == ws, f"term {label!r}: picks differ from objective.py's (query {q}): {gs} vs {ws}"
            np.testing.assert_allclose(gg, wg, rtol=tol, atol=tol,
                                       err_msg=f"term {label!r}: gains differ from objective.py's (query {q})")


def test_terms_registry_is_the_one_order():
    """The weight order, the config's fields and the learned head's weights all come from TERMS."""
    from trawmem_gpu.head.model import LEARNED_WEIGHTS

    assert terms.WEIGHTS == tuple(t.weight for t in terms.TERMS)
    assert terms.QUERY_WEIGHTS[:len(terms.WEIGHTS)] == terms.WEIGHTS
    assert all(hasattr(SelectConfig(), k) for k in terms.QUERY_WEIGHTS)
    assert [k for k in terms.QUERY_WEIGHTS if k in LEARNED_WEIGHTS] == list(LEARNED_WEIGHTS)
    assert {t.kind for t in terms.TERMS} == {"modular", "coverage"}
    assert all((t.value is not None) == (t.kind == "modular") for t in terms.TERMS)
    W = J.weight_matrix(SelectConfig(w_role=0.25), 3, {"tau": np.array([1.0, 2.0, 3.0])})
    assert W.shape == (3, len(terms.QUERY_WEIGHTS)) and (W[:, terms.COL["w_role"]] == 0.25).all()
    assert W[:, terms.TAU].tolist() == [1.0, 2.0, 3.0]


def test_support_formula_once():
    """The K clip formula exists in objective.py only; its NumPy, torch, float and compiled forms
    agree bit for bit (and with the division form to an ulp)."""
    x = np.concatenate([np.linspace(-1.0, 1.0 + 1e-15, 257), [0.3, 1.0, -0.0]])
    for ks in (0.0, 0.3, 0.75):
        want = np.clip((x - ks) * (1.0 / (1.0 - ks)), 0.0, 1.0)
        np.testing.assert_allclose(want, np.clip((x - ks) / (1.0 - ks), 0.0, 1.0), rtol=3e-16, atol=0)
        np.testing.assert_array_equal(J.support_from_cosine(x, ks), want)
        np.testing.assert_array_equal(J.support_from_cosine(torch.as_tensor(x), ks).numpy(), want)
        np.testing.assert_array_equal([J.support_from_cosine(float(v), ks) for v in x], want)
        if HAS_NUMBA:
            np.testing.assert_array_equal([J.support_from_cosine_compiled(float(v), ks) for v in x], want)
    pattern = re.compile(r"(-\s*k_shift\)\s*/|/\s*\(1(\.0)?\s*-\s*k_shift\)|\*\s*inv_ks)")
    hits = [str(p.relative_to(ROOT)) for d in ("trawmem_gpu/select", "trawmem_gpu/head", "kernels")
            for p in (ROOT / d).rglob("*.py") if pattern.search(p.read_text())]
    assert hits == ["trawmem_gpu/select/support.py"], hits


def test_modular_gain_skips_zero_weights_exactly_and_gathers_lazily():
    """A term weighted 0 for every query is skipped (it would add +0.0: the same bits), and the
    unit attributes are gathered only when a term with a weight reads them."""
    rng = np.random.default_rng(1)
    alpha = rng.random((3, 5))
    calls = []

    def attrs():
        calls.append(1)
        return NOW - rng.random((3, 5, len(terms.UNIT_ATTRIBUTES))) * 86400 * 30

    only_aff = {t.weight: (0.7 if t.name == "affinity" else 0.0) for t in terms.MODULAR_TERMS}
    m = J.modular_gain(J.ModularInputs(alpha, attrs, np.full((3, 1), NOW)), only_aff, SelectConfig())
    assert np.array_equal(m, 0.7 * alpha) and not calls
    zero = {t.weight: 0.0 for t in terms.MODULAR_TERMS}
    assert np.array_equal(J.modular_gain(J.ModularInputs(alpha, attrs, NOW), zero, SelectConfig()), 0 * alpha)
    if len(terms.MODULAR_TERMS) > 1:
        J.modular_gain(J.ModularInputs(alpha, attrs, NOW), {k: 1.0 for k in zero}, SelectConfig())
        assert calls == [1]


def test_modular_gain_is_the_weighted_sum_of_the_terms():
    rng = np.random.default_rng(0)
    x = J.ModularInputs(rng.random((2, 7)), np.zeros((2, 7, len(terms.UNIT_ATTRIBUTES))), np.full((2, 1), np.nan))
    w = {t.weight: float(rng.random()) for t in terms.MODULAR_TERMS}
    want = sum(w[t.weight] * t.value(x, SelectConfig()) for t in terms.MODULAR_TERMS)
    np.testing.assert_allclose(J.modular_gain(x, w, SelectConfig()), want, rtol=1e-15)
    tw = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    xt = J.ModularInputs(torch.as_tensor(x.alpha), torch.as_tensor(x.attrs), torch.as_tensor(x.now))
    np.testing.assert_allclose(J.modular_gain(xt, tw, SelectConfig()).numpy(), want, rtol=1e-15)
