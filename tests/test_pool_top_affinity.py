"""``SelectConfig.pool_top_affinity``: the candidate pool widened by the query's top units of the
whole bank by affinity (the NumPy reference; the engines refuse it with a ``ConfigError``)."""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.objective import date_seconds
from trawmem_gpu.select.params import QueryParams
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.steps.affinity import unit_affinity

from test_engine import banks, make_bank, queries  # noqa: F401 - fixtures

NARROW = QueryParams(budget=6, hops=0, n_seeds=1, neighborhood_cap=1)
"""One seed thread and no hops: most of a bank's high-affinity units lie outside H_q."""


def _run(banks, queries, m, params=NARROW):
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    cfg = SelectConfig(pool_top_affinity=m)
    out = []
    for b, q, z in zip(*queries):
        z = np.asarray(z, np.float64)
        out.append((ctx[b], z, q, select_reference(ctx[b], q, z, cfg, params, keep_internals=True)))
    return out


def test_the_pool_holds_the_top_affinity_units_beside_the_threads(banks, queries):  # noqa: F811
    off, on = _run(banks, queries, 0), _run(banks, queries, 5)
    outside = 0
    for (ctx, z, q, a), (_, _, _, b) in zip(off, on):
        alpha = unit_affinity(ctx, z, q, SelectConfig().resolved(), date_seconds(None))
        top = np.lexsort((np.arange(len(alpha)), -alpha))[:5]
        assert set(b.candidates.tolist()) == set(a.candidates.tolist()) | set(top.tolist())
        assert np.all(np.diff(b.candidates) > 0)
        assert set(a.threads) <= set(b.threads) == set(a.threads) | set(ctx.unit_thread[top].tolist())
        assert set(b.units) <= set(b.candidates.tolist())
        outside += sum(int(ctx.unit_thread[u]) not in a.threads for u in b.units)
    assert outside > 0  # an added unit from a thread H_q had left out was picked


def test_off_picks_what_the_defaults_pick(banks, queries):  # noqa: F811
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    for p in (NARROW, QueryParams(token_budget=120)):
        for b, q, z in zip(*queries):
            z = np.asarray(z, np.float64)
            assert (select_reference(ctx[b], q, z, SelectConfig(pool_top_affinity=0), p).units
                    == select_reference(ctx[b], q, z, SelectConfig(), p).units)


def test_under_a_token_budget_the_widened_pool_fits(banks, queries):  # noqa: F811
    for ctx, _, _, s in _run(banks, queries, 8, QueryParams(token_budget=120)):
        costs = ctx.token_costs(SelectConfig().headings)
        assert costs.cost(s.units, ctx.unit_thread) <= 120


def test_engines_refuse_it(banks):  # noqa: F811
    with pytest.raises(ConfigError, match="pool_top_affinity"):
        SelectionEngine(banks, SelectConfig(pool_top_affinity=4), device="cpu")


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_bad_values_name_the_field(bad):
    with pytest.raises(ConfigError, match="pool_top_affinity"):
        SelectConfig(pool_top_affinity=bad)
