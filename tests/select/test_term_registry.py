"""The term registry (``select/terms/``, its views ``terms.TERMS``) drives every backend.

* The fused greedies' term lists are the terms that declare them (``terms.fused_terms``), and
  each fused greedy holds exactly those terms' pieces (``<term>_gain``, ``<term>_add``), calls every
  one of them and reads exactly their weights: a term cannot declare a fused path that lacks it,
  and a fused path cannot compute a term that does not declare it.
* The learned head's weight list is the terms declared ``learned``, then the priority weights.
* A term added beside J's (a module in ``select/terms/``), with no fused pieces, keeps the
  dispatcher off the fused paths while its weight is non-zero (and only then), the engine then
  picks what the reference picks, the head learns its weight exactly when it declares so, and its
  compiled code caches apart from this process's.
"""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from trawmem_gpu.select import terms

from tree_copy import copy_tree, run_python

ROOT = Path(__file__).resolve().parents[2]
FUSED = {  # backend -> (its source file, the greedy that calls the pieces)
    "numba": (ROOT / "trawmem_gpu" / "select" / "steps" / "greedy" / "compiled.py", "lazy_greedy_one"),
    "triton": (ROOT / "trawmem_gpu" / "kernels" / "greedy.py", "_greedy_kernel"),
}


def _pieces(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The module's top-level functions named like a term's piece (``*_gain``, ``*_add``)."""
    return {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.endswith(("_gain", "_add"))}


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}


@pytest.mark.parametrize("backend", sorted(FUSED))
def test_each_fused_greedy_holds_exactly_the_declared_pieces(backend):
    path, kernel = FUSED[backend]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pieces = _pieces(tree)
    declared = terms.fused_terms(backend)
    want = {f"{n}_{k}" for n in declared for k in ("gain", "add")}
    assert set(pieces) == want, (f"{path.name}: pieces {sorted(pieces)}, the terms declaring {backend!r} "
                                 f"({list(declared)}) need {sorted(want)}")
    body = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == kernel)
    assert want <= _calls(body), f"{kernel} does not call {sorted(want - _calls(body))}"
    assert declared, f"no coverage term declares {backend!r}"


def test_the_fused_greedies_read_the_declared_weights():
    from trawmem_gpu.select.steps.greedy import batched, compiled

    assert compiled.FUSED_TERMS == terms.fused_terms("numba")
    assert batched.TRITON_FUSED_TERMS == terms.fused_terms("triton")
    assert compiled.FusedWeights._fields == tuple(terms.TERM_BY_NAME[n].weight for n in compiled.FUSED_TERMS)
    # the Triton launcher reads each fused term's weight column by the term's name
    src = FUSED["triton"][0].read_text(encoding="utf-8")
    cols = [n.slice.value for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Subscript)
            and isinstance(n.value, ast.Name) and n.value.id == "_COLS" and isinstance(n.slice, ast.Constant)]
    assert tuple(cols) == terms.fused_terms("triton")


def test_the_head_learns_the_declared_weights():
    from trawmem_gpu.head.model import LEARNED_WEIGHTS

    assert LEARNED_WEIGHTS == tuple(t.weight for t in terms.TERMS if t.learned) + terms.PRIORITY_WEIGHTS
    assert [k for k in terms.QUERY_WEIGHTS if k in LEARNED_WEIGHTS] == list(LEARNED_WEIGHTS)


def test_the_registry_checks_its_declarations(monkeypatch):
    from trawmem_gpu.select.terms import registry

    with pytest.raises(ValueError, match="no fused greedy"):
        terms.fused_terms("cuda")
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))  # this test's registrations stay here
    thread_cls, recency_cls = (type(terms.TERM_BY_NAME[n]) for n in ("thread_coverage", "recency"))
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("thread_coverage", "w_other", position=99, formula="-", bound="-")(thread_cls)
    with pytest.raises(ValueError, match="only coverage terms have fused pieces"):
        registry.register("late", "w_late", position=99, formula="-", bound="-", fused=("numba",))(recency_cls)
    assert set(registry.REGISTRY) == set(terms.TERM_BY_NAME)


def test_the_views_are_derived_once_from_the_registry():
    """Nothing in the package rebinds the views: they are the registry's, sorted by position."""
    from trawmem_gpu.select.terms import registry

    assert terms.TERMS == tuple(sorted(registry.REGISTRY.values(), key=lambda t: t.position))
    assert [t.name for t in terms.TERMS] == ["information_coverage", "role_coverage", "affinity", "thread_coverage",
                                             "recency", "group_affinity"]  # J's order: the picks depend on it
    for p in (ROOT / "trawmem_gpu" / "select").rglob("*.py"):
        assert not re.search(r"^\s*global\b", p.read_text(encoding="utf-8"), re.M), p


TOY_TERMS = {  # two toy coverage terms, one module each, no fused pieces: a second role coverage (its
    # weight learned) and a second thread coverage (its weight not learned)
    "toy_roles.py": textwrap.dedent('''
        from .max_coverage import MaxCoverage
        from .registry import register


        @register("toy_roles", "w_toy_roles", position=80, learned=True, optional=True, formula="-", bound="-")
        class ToyRoles(MaxCoverage):
            a = "delta"
            x = "rho"
        '''),
    "toy_threads.py": textwrap.dedent('''
        from .registry import register
        from .thread_coverage import ThreadCoverage


        @register("toy_threads", "w_toy_threads", position=90, optional=True, formula="-", bound="-")
        class ToyThreads(ThreadCoverage):
            pass
        '''),
}
TOY = textwrap.dedent('''
    import json
    from dataclasses import dataclass

    import numpy as np
    import torch
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.head.model import LEARNED_WEIGHTS, RoleHead
    from trawmem_gpu.select.config import EngineConfig, SelectConfig
    from trawmem_gpu.select.context import BankContext
    from trawmem_gpu.select.engine import SelectionEngine, plan as P
    from trawmem_gpu.select.reference import select_reference
    from engine_banks import D, VOCAB, make_bank

    @dataclass
    class ToyConfig(SelectConfig):
        w_toy_roles: float = 0.0
        w_toy_threads: float = 0.0

    banks = [make_bank("odd", [3, 1, 5, 2, 7, 4, 1, 6, 3], seed=1, n_semantic=5),
             make_bank("wide", [2, 3, 4, 5] * 8, seed=4, n_semantic=20)]
    rng = np.random.default_rng(7)
    ids, qs, zs = [], [], []
    for b in banks:
        for i in range(6):
            z = b.unit_vecs[int(rng.integers(b.n_units))] + 0.4 * rng.normal(size=D)
            ids.append(b.bank_id)
            qs.append("What did " + " ".join(rng.choice(VOCAB, size=3)) + "?")
            zs.append(z / np.linalg.norm(z))
    Z = np.array(zs, dtype=np.float32)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    from trawmem_gpu.select._jit import cache_dir
    out = {"learned": list(LEARNED_WEIGHTS), "cache": cache_dir(),
           "head": sorted(RoleHead(ToyConfig(w_toy_roles=0.5)).weights_batch(torch.zeros(2, 4)))}
    for label, kw in (("off", {}), ("roles", dict(w_toy_roles=3.0)), ("threads", dict(w_toy_threads=3.0))):
        cfg = ToyConfig(**kw)
        plan = P.resolve(EngineConfig(device="cpu"), cfg, banks)
        refused = []
        for ec in (EngineConfig(device="cpu", backend="compiled"), EngineConfig(device="cpu", kernels="triton")):
            try:
                P.resolve(ec, cfg, banks)
            except ConfigError as e:
                refused.append(str(e))
        ref = [select_reference(ctx[b], q, z, cfg).units for b, q, z in zip(ids, qs, Z)]
        got = SelectionEngine(banks, cfg, device="cpu", backend="tensor").select_units(ids, qs, Z)
        out[label] = {"backend": plan.backend, "kernels": plan.kernels, "refused": refused,
                      "same": [list(map(int, g)) for g in got] == [list(map(int, r)) for r in ref],
                      "ref": [list(map(int, r)) for r in ref]}
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy terms' run: their modules added to a copy of the tree, imported in a fresh interpreter
    (the engine's picks on the backend that composes the terms; the plan for what ``auto`` picks)."""
    tree = copy_tree(tmp_path_factory.mktemp("toy_tree"))
    for name, src in TOY_TERMS.items():
        (tree / "trawmem_gpu" / "select" / "terms" / name).write_text(src, encoding="utf-8")
    return run_python(tree, TOY)


def test_a_new_term_keeps_the_fused_paths_off_while_it_is_live(toy):
    from trawmem_gpu.select._jit import HAS_NUMBA

    assert toy["off"]["backend"] == ("compiled" if HAS_NUMBA else "tensor")  # weight 0: the fast paths stay
    for label, name in (("roles", "toy_roles"), ("threads", "toy_threads")):
        assert toy[label]["backend"] == "tensor" and toy[label]["kernels"] == "torch", label
        assert len(toy[label]["refused"]) == 2 and all(name in e for e in toy[label]["refused"]), toy[label]["refused"]


def test_a_new_term_picks_what_the_reference_picks(toy):
    for label in ("off", "roles", "threads"):
        assert toy[label]["same"], f"{label}: the engine's picks differ from the reference's"
    assert toy["roles"]["ref"] != toy["off"]["ref"] and toy["threads"]["ref"] != toy["off"]["ref"]  # the terms are live


def test_a_new_term_compiles_into_its_own_cache(toy):
    """Compiled code freezes the weight columns: a registry with other terms must not share it."""
    from trawmem_gpu.select._jit import cache_dir

    assert toy["cache"] != cache_dir()


def test_the_head_learns_a_new_weight_iff_the_term_declares_it(toy):
    assert "w_toy_roles" in toy["learned"] and "w_toy_threads" not in toy["learned"]
    assert toy["learned"] == [k for k in terms.LEARNED_WEIGHTS if k not in terms.PRIORITY_WEIGHTS] + ["w_toy_roles"] + \
        list(terms.PRIORITY_WEIGHTS)
    assert toy["head"] == sorted(toy["learned"])


def test_coverage_weights_is_one_plain_class_over_the_registry():
    from trawmem_gpu.select.objective import CoverageWeights

    names = tuple(t.weight for t in terms.COVERAGE_TERMS)
    required = sum(not t.optional for t in terms.COVERAGE_TERMS)
    w = CoverageWeights(*range(1, required + 1))
    assert isinstance(w, tuple) and len(w) == len(names) and w[required:] == (0.0,) * (len(names) - required)
    assert tuple(getattr(w, n) for n in names) == tuple(w)
    assert CoverageWeights(**dict(zip(names, w))) == w
    with pytest.raises(ValueError, match="missing"):
        CoverageWeights(1.0)
    with pytest.raises(ValueError, match="expected"):
        CoverageWeights(*([1.0] * (len(names) + 1)))
    with pytest.raises(ValueError, match="unknown"):
        CoverageWeights(*w, w_nope=1.0)
    with pytest.raises(ValueError, match="given twice"):
        CoverageWeights(*w, **{names[0]: 1.0})
    with pytest.raises(AttributeError):
        w.w_nope  # noqa: B018
