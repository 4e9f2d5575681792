"""Filters inside the engine: a per-query unit mask (``select.restrict``) on every path.

* **every fast path** (the compiled front and stage, the tensor backend, the tensor front with the
  compiled stage, no per-bank tables) picks exactly what the reference picks with the same mask,
  across configs (role terms included: the bridge feature is where a cut thread shows), masks of
  every density, a mask that keeps nothing and one that keeps everything, a token budget with
  gist headings;
* **exactness**: a mask is the bank restricted to its units. For masks that keep or drop whole
  threads and a method that reads no corpus statistic (the dense affinity), the restricted bank
  is a plain ``Bank`` holding only the passing units, and selecting over it (reference and
  engine, a fresh bank of its own) picks the same turns as selecting over the whole bank with the
  mask. For any mask the reference's selection is, by construction, the one over
  ``restrict(ctx, keep)`` (its docstring says which build-time statistics stay the bank's);
* the budget is spent on passing units: never filled, then cut.
"""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select.config import MULTI_THREAD, PAPER_HOPS, ROLE_TERMS, SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.params import QueryParams, split_fields
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.restrict import restrict_bank
from engine_banks import banks, queries  # noqa: F401 - fixtures
from mask_cases import masked_reference as _reference, unit_masks as _masks

VARIANTS = [dict(), dict(backend="tensor"), dict(front="tensor"), dict(backend="tensor", table_bytes=0)]


def _agree(banks, cfg, ids, qs, Z, qp, masks, variants=VARIANTS):
    ref = _reference(banks, cfg, ids, qs, Z, qp, masks)
    for r, m in zip(ref, masks):
        assert m is None or all(m[u] for u in r)  # only passing units
    for v in variants:
        got = SelectionEngine(banks, cfg, device="cpu", **v).select_units(ids, qs, Z, params=qp, masks=masks)
        bad = [(i, g, r) for i, (g, r) in enumerate(zip(got, ref)) if g != r]
        assert not bad, f"{v or 'default'}: {len(bad)}/{len(ref)} queries differ from the reference, first: {bad[:2]}"
    return ref


CONFIGS = [  # (config, the engine variants to check: every one where a config has its own fast paths)
    pytest.param({}, VARIANTS, id="default"),
    pytest.param(dict(affinity="rrf", hops=2), VARIANTS[:2], id="rrf"),
    pytest.param(dict(affinity="dense", n_seeds=2, neighborhood_cap=3), VARIANTS[:2], id="dense-small-cap"),
    pytest.param(dict(seed_score="head", affinity="fused", hops=2), VARIANTS[:2], id="head-fused"),
    pytest.param(dict(seed_score="max", d_idx="cosine", hops=2), VARIANTS[:2], id="max"),
    pytest.param(ROLE_TERMS | MULTI_THREAD | dict(hops=2), VARIANTS, id="roles-multi-thread"),
    pytest.param("paper", VARIANTS[:2], id="paper"),
]


@pytest.mark.parametrize("kw,variants", CONFIGS)
def test_every_path_picks_what_the_reference_picks_under_a_mask(banks, queries, kw, variants):  # noqa: F811
    if kw == "paper":
        cfg, qp = SelectConfig.paper(), QueryParams(hops=PAPER_HOPS)
    else:
        method, query = split_fields(kw)
        cfg, qp = SelectConfig(**method), QueryParams(**query)
    ids, qs, Z = queries
    masks = _masks(banks, ids, seed=len(str(kw)))
    ref = _agree(banks, cfg, ids, qs, Z, qp, masks, variants)
    plain = SelectionEngine(banks, cfg, device="cpu").select_units(ids, qs, Z, params=qp)
    assert sum(r != p for r, p in zip(ref, plain)) > len(ids) // 3  # the masks change the picks
    assert all(not r for r, m in zip(ref, masks) if m is not None and not m.any())  # nothing passes: nothing


@pytest.mark.parametrize("headings", ["date", "gist"])
def test_token_budgets_under_a_mask(banks, queries, headings):  # noqa: F811
    ids, qs, Z = queries
    cfg = SelectConfig(headings=headings, **ROLE_TERMS)
    _agree(banks, cfg, ids, qs, Z, QueryParams(token_budget=90), _masks(banks, ids, seed=3), VARIANTS[:3])


def test_the_filter_path_is_the_mask_path(banks, queries):  # noqa: F811
    """``where`` over metadata gives the masks its filter evaluates to (``masks_of``), and a
    ``where`` with ``masks`` keeps the units both pass."""
    from dataclasses import replace

    rng = np.random.default_rng(8)
    tagged = [replace(b, turns=[replace(t, metadata={"user_id": f"u{rng.integers(3)}", "n": int(rng.integers(5))})
                                for t in b.turns]) for b in banks]
    ids, qs, Z = queries
    where = {"user_id": {"in": ["u0", "u2"]}, "n": {"gte": 1}}
    eng = SelectionEngine(tagged, SelectConfig(), device="cpu")
    masks = eng.masks_of(ids, where)
    by_id = {b.bank_id: b for b in tagged}
    for b, m in zip(ids, masks):
        want = np.array([t.metadata["user_id"] in ("u0", "u2") and t.metadata["n"] >= 1 for t in by_id[b].turns])
        np.testing.assert_array_equal(m, want)
    assert eng.select_units(ids, qs, Z, where=where) == eng.select_units(ids, qs, Z, masks=masks)
    extra = _masks(tagged, ids, seed=9)
    both = [m if e is None else m & e for m, e in zip(masks, extra)]
    assert eng.select_units(ids, qs, Z, where=where, masks=extra) == eng.select_units(ids, qs, Z, masks=both)
    assert eng.masks_of(ids, {"user_id": {"exists": True}}) is None  # every unit passes: no mask at all


# ----------------------------------------------------------------------------------------------
# exactness: the bank that holds only the passing units
# ----------------------------------------------------------------------------------------------
def _thread_masks(banks, ids, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for b in (next(x for x in banks if x.bank_id == i) for i in ids):
        keep_t = rng.random(b.n_threads) < 0.6
        keep_t[rng.integers(b.n_threads)] = True
        out.append(keep_t[b.unit_thread])
    return out


@pytest.mark.parametrize("kw", [dict(affinity="dense", hops=2), dict(affinity="dense", seed_score="head", hops=1),
                                ROLE_TERMS | MULTI_THREAD | dict(affinity="dense", hops=2)])
def test_a_mask_selects_what_the_bank_of_its_units_selects(banks, queries, kw):  # noqa: F811
    method, query = split_fields(kw)
    cfg, qp = SelectConfig(**method), QueryParams(**query)
    ids, qs, Z = queries
    masks = _thread_masks(banks, ids, seed=4)
    by_id = {b.bank_id: b for b in banks}
    want = []
    for b, q, z, m in zip(ids, qs, Z, masks):
        sub, units, _ = restrict_bank(by_id[b], m)  # a plain Bank of the passing units: its own contexts and tables
        alone = select_reference(BankContext.of(sub), q, z, cfg, qp).units
        eng = SelectionEngine([sub], cfg, device="cpu").select_units([b], [q], z[None], params=qp)[0]
        assert eng == alone
        want.append([int(units[u]) for u in alone])
    got = _agree(banks, cfg, ids, qs, Z, qp, masks, VARIANTS[:2])
    assert got == want


def test_the_budget_is_spent_on_passing_units(banks, queries):  # noqa: F811
    """With a mask, B units that pass are picked wherever enough pass; filtering the picks of an
    unmasked selection afterwards (what a filter after retrieval does) leaves fewer."""
    ids, qs, Z = queries
    wide = [b for b in banks if b.bank_id == "wide"][0]
    rows = [i for i, b in enumerate(ids) if b == "wide"]
    rng = np.random.default_rng(2)
    masks = [rng.random(wide.n_units) < 0.25 for _ in rows]
    qp = QueryParams(budget=8, hops=2)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    got = eng.select_units([ids[i] for i in rows], [qs[i] for i in rows], Z[rows], params=qp, masks=masks)
    after = eng.select_units([ids[i] for i in rows], [qs[i] for i in rows], Z[rows], params=qp)
    assert all(len(g) == 8 and all(m[u] for u in g) for g, m in zip(got, masks))
    assert sum(sum(m[u] for u in a) for a, m in zip(after, masks)) < sum(len(g) for g in got)


def test_a_cut_threads_head_is_hidden(banks):  # noqa: F811
    """A workspace never shows the head of a thread with a failing unit (it may quote that unit)."""
    from trawmem_gpu.select.workspace import assemble

    b = banks[0]
    keep = np.ones(b.n_units, dtype=bool)
    keep[b.thread_offsets[2]] = False  # thread 2 is cut; thread 0 is whole
    units = [int(b.thread_offsets[0]), int(b.thread_offsets[2]) + 1]
    ws = assemble(b, "q", units, "gist", keep)
    assert [blk.head for blk in ws.blocks] == [b.heads[0], ""]
    assert b.heads[2] not in ws.render()
    sub, _, _ = restrict_bank(b, keep)
    assert sub.heads[2] == "" and sub.heads[0] == b.heads[0]


def test_the_triton_kernels_under_a_mask(banks, queries):  # noqa: F811
    """The tensor backend with the Triton priority and greedy kernels (interpreted on a CPU: a few
    queries) picks what the reference picks under a mask."""
    pytest.importorskip("triton")
    ids, qs, Z = queries
    rows = [i for i, b in enumerate(ids) if b in ("odd", "chain")][:6]
    sub = ([ids[i] for i in rows], [qs[i] for i in rows], Z[rows])
    masks = [m for i, m in enumerate(_masks(banks, ids, seed=12)) if i in rows]
    _agree(banks, SelectConfig(), *sub, QueryParams(hops=2), masks,
           [dict(backend="tensor", kernels="triton", optimizer="plain")])
