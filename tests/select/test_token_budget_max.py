"""The largest token budget the command line documents (``MAX_TOKEN_BUDGET``) selects: the pool
sizes it derives (``n_seeds``, ``neighborhood_cap``: B_T / 2 and 3 B_T / 4 with B_T = T / 50) stop at
``MAX_BUDGET``, the bound of those fields, instead of failing late with an internal name."""
from __future__ import annotations

import pytest

from trawmem_gpu.select.params import MAX_BUDGET, MAX_TOKEN_BUDGET, TOKENS_PER_UNIT, QueryParams


@pytest.mark.parametrize("T", [MAX_TOKEN_BUDGET, 300_000, 2 * TOKENS_PER_UNIT * MAX_BUDGET + TOKENS_PER_UNIT])
def test_derived_pool_sizes_stop_at_the_budget_bound(T):
    r = QueryParams(token_budget=T, budget=None).resolved()
    B = round(T / TOKENS_PER_UNIT)
    assert r.pool_budget == B
    assert r.n_seeds == min(MAX_BUDGET, round(B / 2))
    assert r.neighborhood_cap == min(MAX_BUDGET, round(3 * B / 4)) and r.neighborhood_cap >= r.n_seeds
    assert r.resolved() is r  # idempotent


def test_sizes_below_the_bound_and_asked_for_sizes_are_kept():
    r = QueryParams(token_budget=100_000, budget=None).resolved()  # B_T 2000: nothing to clamp
    assert (r.n_seeds, r.neighborhood_cap) == (1000, 1500)
    r = QueryParams(token_budget=MAX_TOKEN_BUDGET, budget=None, n_seeds=7).resolved()
    assert (r.n_seeds, r.neighborhood_cap) == (7, MAX_BUDGET)


def test_the_cli_selects_under_the_documented_maximum(tmp_path, capsys):
    from trawmem_gpu.cli import main
    from trawmem_gpu.data import sample_path

    out = tmp_path / "banks"
    assert main(["build", "--input", str(sample_path()), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    rc = main(["query", "--bank", str(out), "--question", "When is the half marathon?",
               "--token-budget", str(MAX_TOKEN_BUDGET)])
    text, err = capsys.readouterr()
    assert rc == 0, err
    assert "n_seeds" not in err and "33 units in" in text  # the whole sample fits in a million tokens
