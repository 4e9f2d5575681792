"""The worked example of a new coverage term (``docs/examples/entity-coverage-term.patch``) is one
file: applied to a copy of the tree, it adds ``select/terms/entity_coverage.py`` and the weight
``w_ent`` (a ``SelectConfig`` field) and nothing else; the copy keeps the layout test's checks
(imports and size limits), the term registers itself when the copy is imported, and a selection
with it on picks on the engine what the NumPy reference picks (the fused paths stand aside while
``w_ent`` is non-zero, and only then)."""
from __future__ import annotations

import re
import shutil

import pytest

from tree_copy import ROOT, apply_patch, copy_tree, run_layout_checks, run_python

PATCH = ROOT / "docs" / "examples" / "entity-coverage-term.patch"

SCRIPT = '''
import json

import numpy as np

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.head.model import LEARNED_WEIGHTS
from trawmem_gpu.select import objective as J, terms
from trawmem_gpu.select._jit import HAS_NUMBA
from trawmem_gpu.select.config import EngineConfig, SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine, plan as P
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.terms.entity_coverage import unit_entities
from engine_banks import make_bank

NAMES = "Ana Ben Cleo Dan Eve Finn".split()
banks = []
for k, lens in enumerate(([3, 2, 4, 3], [5, 1, 2], [2, 2, 2, 2, 2])):
    texts = [f"we talked with {NAMES[i % 6]} and {NAMES[(i * 5 + k) % 6]} about the trip" for i in range(sum(lens))]
    banks.append(make_bank(f"named{k}", lens, seed=10 + k, texts=texts))
rng = np.random.default_rng(3)
ids = [b.bank_id for b in banks for _ in range(4)]
qs = [f"What did {NAMES[i % 6]} say about the trip?" for i in range(len(ids))]
by = {b.bank_id: b for b in banks}
Z = np.stack([by[b].unit_vecs[int(rng.integers(by[b].n_units))] for b in ids]).astype(np.float64)
ctx = {b.bank_id: BankContext.of(b) for b in banks}
term = terms.TERM_BY_NAME["entity_coverage"]
ents = unit_entities("I met Anna in Paris. Then we saw Tom and Anna again")
out = {"module": type(term).__module__, "coverage": [t.name for t in terms.COVERAGE_TERMS],
       "attributes": list(terms.UNIT_ATTRIBUTES), "columns": [term.columns.start, term.columns.stop],
       "fused": sorted(n for b in terms.FUSED_BACKENDS for n in terms.fused_terms(b)),
       "learned": list(LEARNED_WEIGHTS), "default": J.CoverageWeights(1.0, 1.0, 1.0).w_ent,
       "entities": [len(set(e for e in ents if e == e)), ents.count(ents[0])], "numba": HAS_NUMBA}
for w in (0.0, 4.0):
    cfg = SelectConfig(w_ent=w)
    plan = P.resolve(EngineConfig(device="cpu"), cfg, banks)  # what auto picks (without compiling it)
    eng = SelectionEngine(banks, cfg, device="cpu", backend="tensor")  # the backend that composes the terms
    ref = [list(map(int, select_reference(ctx[b], q, z, cfg).units)) for b, q, z in zip(ids, qs, Z)]
    got = [list(map(int, g)) for g in eng.select_units(ids, qs, Z)]
    try:
        P.resolve(EngineConfig(device="cpu", backend="compiled"), cfg, banks)
        refused = None
    except ConfigError as e:
        refused = str(e)
    out[str(w)] = {"backend": plan.backend, "same": got == ref, "ref": ref, "refused": refused}
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot apply the example patch")
    tree = copy_tree(tmp_path_factory.mktemp("entity_tree"))
    apply_patch(tree, PATCH)
    return tree


def test_the_patch_adds_one_term_file_and_a_config_line():
    text = PATCH.read_text(encoding="utf-8")
    files = re.findall(r"^diff --git a/(\S+) b/", text, re.M)
    assert files == ["trawmem_gpu/select/config.py", "trawmem_gpu/select/terms/entity_coverage.py"]
    config = text.split("diff --git")[1]
    added = [ln[1:] for ln in config.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert len(added) == 2 and added[0].strip() == "w_ent: float = 0.0" and added[1].strip().startswith('"""')
    assert not [ln for ln in config.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert "new file mode" in text.split("diff --git")[2]


def test_the_patched_tree_keeps_the_layout_checks(patched):
    r = run_layout_checks(patched)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert re.search(r"\b1[0-9] passed\b", r.stdout), r.stdout[-2000:]  # the checks ran, not deselected


def test_the_term_registers_and_a_selection_with_it_runs(patched):
    out = run_python(patched, SCRIPT)
    assert out["module"] == "trawmem_gpu.select.terms.entity_coverage"
    assert out["coverage"][-1] == "entity_coverage"  # optional, after every required coverage term
    assert out["attributes"][out["columns"][0]:out["columns"][1]] == ["ent0", "ent1", "ent2", "ent3"]
    assert "entity_coverage" not in out["fused"] and "w_ent" not in out["learned"] and out["default"] == 0.0
    assert out["entities"] == [3, 1]  # Anna, Paris, Tom: once each ("I" and "Then" are no entities)
    on, off = out["4.0"], out["0.0"]
    assert on["same"] and off["same"], "the engine's picks differ from the reference's"
    assert on["ref"] != off["ref"]  # the term is live: a strong weight changes some picks
    assert on["backend"] == "tensor" and "entity_coverage" in on["refused"]
    if out["numba"]:
        assert off["backend"] == "compiled" and off["refused"] is None  # weight 0: the fused paths stay
