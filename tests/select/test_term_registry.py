"""The term registry (``objective.TERMS``) drives every backend.

* The fused greedies' term lists are the terms that declare them (``objective.fused_terms``), and
  each fused greedy holds exactly those terms' pieces (``<term>_gain``, ``<term>_add``), calls every
  one of them and reads exactly their weights: a term cannot declare a fused path that lacks it,
  and a fused path cannot compute a term that does not declare it.
* The learned head's weight list is the terms declared ``learned``, then the priority weights.
* A term registered beside J's (``objective.register_term``), with no fused pieces, keeps the
  dispatcher off the fused paths while its weight is non-zero (and only then), the engine then
  picks what the reference picks, the head learns its weight exactly when it declares so, and its
  compiled code caches apart from this process's.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trawmem_gpu.select import objective as J, terms

ROOT = Path(__file__).resolve().parents[2]
FUSED = {  # backend -> (its source file, the greedy that calls the pieces)
    "numba": (ROOT / "trawmem_gpu" / "select" / "steps" / "greedy" / "compiled.py", "lazy_greedy_one"),
    "triton": (ROOT / "kernels" / "greedy.py", "_greedy_kernel"),
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


def test_the_registry_checks_its_declarations():
    with pytest.raises(ValueError, match="no fused greedy"):
        terms.fused_terms("cuda")
    with pytest.raises(RuntimeError, match="before importing"):  # this process holds the views already
        from trawmem_gpu.select.steps.greedy import compiled  # noqa: F401
        J.register_term(J.ThreadCoverage("late", "w_late", "coverage", "-", "-", optional=True))
    assert "late" not in terms.TERM_BY_NAME


TOY = textwrap.dedent('''
    import json
    from dataclasses import dataclass

    import numpy as np
    from trawmem_gpu.select import objective as J

    # two toy coverage terms, no fused pieces: a second role coverage (its weight learned) and a
    # second thread coverage (its weight not learned)
    J.register_term(J.MaxCoverage("toy_roles", "w_toy_roles", "coverage", "-", "-", learned=True, optional=True,
                                  a="delta", x="rho"))
    J.register_term(J.ThreadCoverage("toy_threads", "w_toy_threads", "coverage", "-", "-", optional=True))

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
        got = SelectionEngine(banks, cfg, device="cpu").select_units(ids, qs, Z)
        out[label] = {"backend": plan.backend, "kernels": plan.kernels, "refused": refused,
                      "same": [list(map(int, g)) for g in got] == [list(map(int, r)) for r in ref],
                      "ref": [list(map(int, r)) for r in ref]}
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def toy():
    """The toy terms' run, in a fresh interpreter (the terms are registered before anything reads J)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "support"), str(ROOT)] + sys.path))
    r = subprocess.run([sys.executable, "-c", TOY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])


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
