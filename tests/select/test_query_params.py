"""Per-call query parameters (``QueryParams``): one engine, one set of bank tables, any mix of
budgets B, hops H and token budgets T per call or per query, picking exactly what the reference
picks for each query with its own parameters."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.params import MAX_HOPS, QueryParams, per_query, split_fields
from trawmem_gpu.select.reference import select_reference

from engine_banks import banks, make_bank, queries  # noqa: F401 - fixtures
from query_mix import MIX, VARIANTS


def _reference(banks, cfg, ids, qs, Z, params):
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    return [select_reference(ctx[b], q, z, cfg, p).units for b, q, z, p in zip(ids, qs, Z, params)]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_mixed_batch_matches_reference(banks, queries, variant):  # noqa: F811
    ids, qs, Z = queries
    params = [MIX[i % len(MIX)] for i in range(len(ids))]
    cfg = SelectConfig()
    eng = SelectionEngine(banks, cfg, device="cpu", **variant)
    tables = {k: v.data_ptr() for k, v in eng.snapshot.t.items()}
    got = eng.select_units(ids, qs, Z, params=params)
    assert got == _reference(banks, cfg, ids, qs, Z, params)
    # one call per params, the same engine: the same picks, and no table was rebuilt or copied
    for p in MIX[:4]:
        assert eng.select_units(ids, qs, Z, params=p) == _reference(banks, cfg, ids, qs, Z, [p] * len(ids))
    assert {k: v.data_ptr() for k, v in eng.snapshot.t.items()} == tables


@pytest.mark.parametrize("cfg", [SelectConfig(knapsack="best"), SelectConfig(knapsack="ratio"),
                                 SelectConfig.paper(), SelectConfig(ablation="seed_only")],
                         ids=["best", "ratio", "paper", "seed_only"])
def test_mixed_batch_method_variants(banks, queries, cfg):  # noqa: F811
    """Token-budget and unit-budget queries in one batch under every knapsack rule (the ratio
    key must never reach a query without T), head seeds, and a per-query ablation."""
    ids, qs, Z = queries
    params = [MIX[(i * 3) % len(MIX)] for i in range(len(ids))]
    ref = _reference(banks, cfg, ids, qs, Z, params)
    for v in VARIANTS[2:] + ((VARIANTS[0],) if cfg.seed_score == "best_unit" else ()):
        assert SelectionEngine(banks, cfg, device="cpu", **v).select_units(ids, qs, Z, params=params) == ref, v


def test_huge_budget_is_sized_by_the_pool(banks, queries):  # noqa: F811
    """A budget far above any bank's size allocates by the candidate pool, not by B."""
    ids, qs, Z = queries
    p = QueryParams(budget=4096)
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    got = eng.select_units(ids[:6], qs[:6], Z[:6], params=p)
    assert got == _reference(banks, SelectConfig(), ids[:6], qs[:6], Z[:6], [p] * 6)


def test_params_validation_names_fields():
    with pytest.raises(ConfigError, match=r"^`token_budget` must lie in"):
        QueryParams(token_budget=0)
    with pytest.raises(ConfigError, match=r"^`hops` must lie in \[0, 8\]"):
        QueryParams(hops=MAX_HOPS + 1)
    with pytest.raises(ConfigError, match="`budget` must be a whole number"):
        QueryParams(budget=2.5)
    with pytest.raises(ConfigError, match="only with a `token_budget`"):
        QueryParams(budget=None)
    with pytest.raises(ConfigError, match="^`fill` must be one of"):
        QueryParams(fill="all")
    with pytest.raises(ConfigError, match="`neighborhood_cap` must be >= `n_seeds`"):
        QueryParams(n_seeds=4, neighborhood_cap=2)
    with pytest.raises(ConfigError, match="3 queries but 2 query params"):
        per_query([QueryParams()] * 2, 3)
    with pytest.raises(ConfigError, match=r"params\[1\] must be a QueryParams"):
        per_query([QueryParams(), {"budget": 3}], 2)


def test_resolved_sizes_and_split():
    p = QueryParams(budget=16).resolved()
    assert (p.n_seeds, p.neighborhood_cap, p.pool_budget) == (8, 12, 16)
    t = QueryParams(budget=None, token_budget=800).resolved()
    assert (t.pool_budget, t.n_seeds, t.neighborhood_cap) == (16, 8, 12)
    assert QueryParams(hops=3).resolved(SelectConfig(ablation="seed_only")).hops == 0
    method, query = split_fields({"budget": 8, "hops": 2, "w_aff": 3.0, "token_budget": None})
    assert method == {"w_aff": 3.0} and query == {"budget": 8, "hops": 2, "token_budget": None}
    # a stored config from before the split still loads as a method
    assert SelectConfig.from_dict({"budget": 8, "hops": 2, "w_aff": 3.0}).w_aff == 3.0


def test_engine_errors_on_bad_params(banks, queries):  # noqa: F811
    ids, qs, Z = queries
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    with pytest.raises(ConfigError, match="2 queries but 1 query params"):
        eng.select_units(ids[:2], qs[:2], Z[:2], params=[QueryParams()])


def test_workspaces_fit_each_querys_token_budget(banks, queries):  # noqa: F811
    from trawmem_gpu.tokens import count_tokens

    ids, qs, Z = queries
    params = [QueryParams(budget=None, token_budget=t) for t in (40, 90, 200, 500)] * (len(ids) // 4)
    n = len(params)
    ws = SelectionEngine(banks, SelectConfig(), device="cpu").select(ids[:n], qs[:n], Z[:n], params=params)
    for w, p in zip(ws, params):
        assert count_tokens(w.render()) <= p.token_budget


@pytest.mark.parametrize("given, coll, want", [
    ({}, None, {}),  # the method's defaults
    ({}, {"budget": 8, "hops": 2}, {"budget": 8, "hops": 2}),  # the collection's over the method's
    ({"hops": 3}, {"budget": 8, "hops": 2}, {"budget": 8, "hops": 3}),  # the request's over the collection's
    ({"budget": 4}, {"token_budget": 800}, {"budget": 4, "token_budget": 800}),
    ({"token_budget": 800}, None, {"budget": None, "token_budget": 800}),  # T alone: no unit cap
    ({"token_budget": 800}, {"budget": 8}, {"budget": None, "token_budget": 800}),
    ({"token_budget": 800, "budget": 8}, None, {"budget": 8, "token_budget": 800}),
    ({}, {"token_budget": 800}, {"budget": None, "token_budget": 800}),  # the collection's T: no unit cap
    ({"token_budget": None}, {"token_budget": 800}, {}),  # T turned off, B left out: the method's B
    ({"budget": None, "token_budget": 300}, {"budget": 8}, {"budget": None, "token_budget": 300}),
    ({"fill": "stop"}, {"hops": 0}, {"fill": "stop", "hops": 0}),
])
def test_the_merge_rule_request_over_collection_over_method(given, coll, want):
    from trawmem_gpu.select.params import merge_params

    base = None if coll is None else QueryParams(**{"budget": None, **coll} if "token_budget" in coll else coll)
    assert merge_params(given, base) == QueryParams(**want)
    assert merge_params(given, base) is merge_params(dict(given), base)  # cached: a batch repeats a few


def test_the_merge_rule_refuses_what_params_refuse_and_names_the_field():
    from trawmem_gpu.select.params import merge_params

    with pytest.raises(ConfigError, match=r"^unknown query parameter `budgt`"):
        merge_params({"budgt": 4})
    with pytest.raises(ConfigError, match=r"^`budget` must lie in \[1, 4096\] \(got 0\)"):
        merge_params({"budget": 0})
    with pytest.raises(ConfigError, match=r"^`budget` may be None"):
        merge_params({"budget": None})
    with pytest.raises(ConfigError, match=r"^`hops` must be a whole number"):
        merge_params({"hops": [1]})  # unhashable: checked all the same


def test_limits_bound_the_merged_params_and_never_loosen_the_engines():
    from trawmem_gpu.select.params import ENGINE_LIMITS, SERVED_LIMITS, LimitError, QueryLimits, merge_params

    lim = QueryLimits(max_budget=32, max_hops=2, max_token_budget=1000)
    assert merge_params({"budget": 32, "hops": 2}, limits=lim) == QueryParams(budget=32, hops=2)
    for given, field, limit, high in (({"budget": 33}, "budget", "max_budget", 32), ({"hops": 3}, "hops", "max_hops", 2),
                                      ({"token_budget": 1001}, "token_budget", "max_token_budget", 1000),
                                      ({"budget": 0}, "budget", "max_budget", 32)):
        with pytest.raises(LimitError) as e:
            merge_params(given, limits=lim)
        assert (e.value.field, e.value.limit, e.value.high) == (field, limit, high)
        assert str(e.value).startswith(f"`{field}` must lie in [")
    with pytest.raises(LimitError, match="`hops`"):  # the collection's value is held to the limits too
        merge_params({}, QueryParams(hops=3), limits=lim)
    with pytest.raises(ConfigError, match=r"^`max_budget` must lie in \[1, 4096\]"):
        QueryLimits(max_budget=5000)
    assert ENGINE_LIMITS == QueryLimits() and SERVED_LIMITS.max_budget < ENGINE_LIMITS.max_budget
    assert merge_params({"budget": 4096}, limits=ENGINE_LIMITS).budget == 4096
    from dataclasses import asdict

    from trawmem_gpu.serve.config import ServeConfig

    cfg = ServeConfig(limits=lim)  # a Ray shard rebuilds its ServeConfig from asdict
    assert ServeConfig(**asdict(cfg)) == cfg and ServeConfig(**asdict(cfg)).limits == lim



def test_resolved_params_are_kept_and_equal_the_resolved_ones():
    """``params.per_query`` keeps each resolved ``QueryParams`` (frozen, so equal params resolve
    alike): the same values as ``resolved``, with and without the seed-only ablation."""

    for p in (None, QueryParams(), QueryParams(hops=2, budget=5), QueryParams(token_budget=900)):
        for cfg in (None, SelectConfig(), SelectConfig(ablation="seed_only")):
            want = (p or QueryParams()).resolved(cfg)
            got = per_query(p, 3, cfg)
            assert got == [want] * 3 and per_query(p, 1, cfg)[0] is got[0]
            assert per_query([p or QueryParams()] * 2, 2, cfg) == [want] * 2
    assert per_query(None, 1, SelectConfig(ablation="seed_only"))[0].hops == 0
