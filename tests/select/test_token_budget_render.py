"""Token budgets (``QueryParams.token_budget``): the config rule, the token costs beside the
renderer (from its own lines), the command-line flags and the sweep's token-budget cells.

Random problems and tiny hand-made banks for most of it; the LoCoMo dev banks for the check that
every method's rendered workspace holds at most T tokens on real turns.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine_banks import VOCAB, make_bank
from trawmem_gpu.errors import ConfigError
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.params import TOKENS_PER_UNIT, QueryParams
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.workspace import assemble, fit_to_tokens, token_costs, unit_line

from token_budget_cases import D, _extractive_bank


# ----------------------------------------------------------------------------------------------
# the config
# ----------------------------------------------------------------------------------------------
def test_config_rule_and_errors():
    assert TOKENS_PER_UNIT == 50
    for T, B_T in ((800, 16), (400, 8), (1600, 32), (10, 1), (74, 1), (76, 2)):
        qp = QueryParams(token_budget=T, budget=None)
        assert qp.pool_budget == B_T
        r = qp.resolved()
        assert (r.n_seeds, r.neighborhood_cap) == (max(2, round(B_T / 2)), max(max(2, round(B_T / 2)),
                                                                              round(3 * B_T / 4)))
    # with T the unit cap sizes nothing: T = 800 sizes the pool like B = 16 whatever B is
    a, b = QueryParams(token_budget=800, budget=3).resolved(), QueryParams(budget=16).resolved()
    assert (a.n_seeds, a.neighborhood_cap) == (b.n_seeds, b.neighborhood_cap)
    assert QueryParams().pool_budget == 16 and QueryParams(budget=5).pool_budget == 5
    for bad in (0, -3):
        with pytest.raises(ConfigError, match=rf"^`token_budget` must lie in \[1, \d+\] \(got {bad}\)$"):
            QueryParams(token_budget=bad)
    for bad in (True, 1.5, "800"):
        with pytest.raises(ConfigError, match="^`token_budget` must be a whole number"):
            QueryParams(token_budget=bad)
    with pytest.raises(ConfigError, match="only with a `token_budget`"):
        QueryParams(budget=None)
    with pytest.raises(ConfigError, match="`knapsack` must be one of"):
        SelectConfig(knapsack="greedy")
    with pytest.raises(ConfigError, match="`fill` must be one of"):
        QueryParams(fill="all")
    t = QueryParams(token_budget=np.int64(800)).token_budget
    assert t == 800 and type(t) is int
    d = QueryParams(token_budget=400, budget=None, fill="stop").to_dict()
    assert QueryParams.from_dict(d) == QueryParams(token_budget=400, budget=None, fill="stop")
    assert SelectConfig.from_dict(SelectConfig(knapsack="gain").to_dict()) == SelectConfig(knapsack="gain")


# ----------------------------------------------------------------------------------------------
# token costs, from the renderer's own lines
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("heads", ["gist", "date", "none"])
def test_token_costs_come_from_the_renderer(heads):
    bank = _extractive_bank()
    c = token_costs(bank, heads)
    assert c.unit.dtype == np.int64 and (c.unit >= 1).all() and len(c.heading) == bank.n_threads
    assert (c.heading > 0).all() if heads != "none" else (c.heading == 0).all()
    # one unit alone: its cost plus its heading's (its own quote dropped), rounded up by at most
    # a token (a blank line that may cost one, a second quote), exact for most units
    exact = 0
    for v in range(bank.n_units):
        real, est = assemble(bank, "q", [v], heads).n_tokens, c.cost([v], bank.unit_thread)
        assert real <= est <= real + 1, (v, unit_line(bank.turns[v], heads), real, est)
        exact += real == est
    assert exact > bank.n_units // 2
    # any set: the additive cost never comes short, and is over by little: all threads here share
    # one date, so under ``date`` they share one heading, credited (one heading run); under
    # ``gist`` a heading left with its date only and shared with the one above is not credited
    from trawmem_gpu.tokens import count_tokens

    rng = np.random.default_rng(0)
    merged = 0
    for _ in range(300):
        S = rng.choice(bank.n_units, size=int(rng.integers(1, bank.n_units + 1)), replace=False)
        ws = assemble(bank, "q", list(S), heads)
        real, est = ws.n_tokens, c.cost(S, bank.unit_thread)
        shared = len(ws.blocks) - ws.render().count("## ") if heads != "none" else 0
        uncredited = shared * count_tokens("## 8 May 2023\n") if heads == "gist" else 0
        assert real <= est <= real + len(S) + uncredited, (sorted(S), real, est)
        merged += shared
    assert merged > 100 if heads != "none" else merged == 0
    assert c.cost([], bank.unit_thread) == 0


def _dated_bank(days):
    """An extractive bank of two-turn threads, thread ``j`` dated ``days[j]`` March 2031 (a pair of
    days: its two turns dated apart)."""
    from datetime import datetime

    def when(i):
        d = days[i // 2]
        return datetime(2031, 3, d[i % 2] if isinstance(d, list) else d)
    return _extractive_bank(seed=4, lens=(2,) * len(days), when=when)


def test_same_date_threads_share_one_heading():
    """Consecutive blocks under one date show one ``## date`` heading (their blocks still apart by a
    blank line); the token costs credit the shared heading of same-date threads next to each other
    in the bank (``heading_run``) and stay an upper bound, exact where the rendering is."""
    from trawmem_gpu.tokens import count_tokens
    from trawmem_gpu.select.workspace import date_label, heading_line

    bank = _dated_bank([2, 2, 2, 5, 2, [6, 7], 6, 8, 8])
    every = list(range(bank.n_units))
    text = assemble(bank, "q", every).render()
    heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert heads == ["## 2 March 2031", "## 5 March 2031", "## 2 March 2031", "## 6 March 2031", "## 8 March 2031"]
    assert text.count("\n\n") == bank.n_threads - 1  # one block per thread, as before
    assert text.startswith("## 2 March 2031\n[") and "\n\n[" in text
    # apart in the bank, next to each other in the workspace: shared too (threads 0 and 2)
    assert assemble(bank, "q", [0, 4]).render().count("## ") == 1
    costs = token_costs(bank, "date")
    assert costs.heading_run.tolist() == [0, 0, 0, 3, 4, 5, 6, 7, 7]  # thread 5 has two dates: alone
    # dropping a heading takes exactly its own tokens off: merged == unmerged - dropped headings
    rng = np.random.default_rng(2)
    for _ in range(200):
        S = sorted(rng.choice(bank.n_units, size=int(rng.integers(1, bank.n_units + 1)), replace=False).tolist())
        ws = assemble(bank, "q", S)
        apart = "\n".join(sum(([heading_line(date_label(b.units[0]), None)] + [unit_line(t, True) for t in b.units]
                               + [""] for b in ws.blocks), [])).strip() + "\n"  # every heading written
        shown = ws.render().splitlines()
        dropped = [ln for ln in apart.splitlines() if ln.startswith("## ")]
        for ln in (x for x in shown if x.startswith("## ")):
            dropped.remove(ln)
        assert ws.n_tokens == count_tokens(apart) - sum(count_tokens(h + "\n") for h in dropped)
        est = costs.cost(S, bank.unit_thread)
        per_thread = replace(costs, heading_run=None).cost(S, bank.unit_thread)  # a heading per thread
        hit = {int(bank.unit_thread[u]) for u in S}
        runs = {int(costs.heading_run[j]) for j in hit}
        # over by a token per unit at most, plus the headings shared across runs (threads 0 and 4)
        uncredited = (len(dropped) - (len(hit) - len(runs))) * count_tokens("## 2 March 2031\n")
        assert ws.n_tokens <= est <= ws.n_tokens + len(S) + uncredited, (S, est, ws.n_tokens)
        assert (est < per_thread) == (len(runs) < len(hit)) and est <= per_thread
    # gist: a heading is shared only when it is the very same line (no gist left on either)
    g = assemble(bank, "q", [0, 2], "gist")
    gh = [ln for ln in g.render().splitlines() if ln.startswith("## ")]
    assert len(gh) == len(set(gh)) and all(h.startswith("## 2 March 2031") for h in gh)
    if all(b.gist for b in g.blocks):
        assert len(gh) == 2 and all(" — " in h for h in gh)
    gc = token_costs(bank, "gist")
    assert gc.heading_run is None or (gc.heading_run == np.arange(bank.n_threads)).all()
    pairs = 0
    for j in range(bank.n_threads - 1):  # both threads shown whole: every quote shown
        S = list(bank.thread_units(j)) + list(bank.thread_units(j + 1))
        both = assemble(bank, "q", S, "gist")
        if [b.gist for b in both.blocks] == [None, None] and len(set(map(date_label, both.blocks[0].units
                                                                          + both.blocks[1].units))) == 1:
            assert both.render().count("## ") == 1  # the date only, twice: one heading
            assert gc.cost(S, bank.unit_thread) >= both.n_tokens
            pairs += 1
    assert pairs
    # none: no headings, every line dated
    assert "## " not in assemble(bank, "q", every, "none").render()


def test_fit_to_tokens_drops_picks_from_the_end():
    bank = _extractive_bank()
    picks = [5, 0, 9, 3, 12, 7]
    full = assemble(bank, "q", picks).n_tokens
    assert fit_to_tokens(bank, picks, full) == picks
    cut = fit_to_tokens(bank, picks, full - 1)
    assert cut == picks[:len(cut)] and len(cut) < len(picks)
    assert assemble(bank, "q", cut).n_tokens <= full - 1 < assemble(bank, "q", picks[:len(cut) + 1]).n_tokens
    assert fit_to_tokens(bank, picks, 1) == []
    # with the bank's costs: a selection whose cost is within T is not rendered; others are
    costs = token_costs(bank)
    assert costs.bounded
    import trawmem_gpu.select.workspace as W

    rendered = []
    real_assemble = W.assemble
    W.assemble = lambda *a, **k: rendered.append(1) or real_assemble(*a, **k)
    try:
        est = costs.cost(picks, bank.unit_thread)
        assert fit_to_tokens(bank, picks, est, costs=costs) == picks and not rendered
        assert fit_to_tokens(bank, picks, est - 1, costs=costs) == picks[:len(fit_to_tokens(bank, picks, est - 1))]
        assert rendered
        rendered.clear()
        loose = replace(costs, bounded=False)
        assert fit_to_tokens(bank, picks, est, costs=loose) == picks and rendered
    finally:
        W.assemble = real_assemble


def test_lines_are_counted_apart():
    """The tokenizer property the costs rest on (``tokens.lines_count_apart``): lines that start
    with a non-space character count on their own, however they end."""
    from trawmem_gpu.tokens import count_tokens, lines_count_apart

    assert lines_count_apart()
    rng = np.random.default_rng(1)
    bits = ["[a:1] Bob:", " word", "?)", "...", " ", "  ", "\n  more", "42", "'s", "é", "—", "!!", "\t", ":", "<|endoftext|>"]
    for _ in range(300):
        lines = ["[" + "".join(rng.choice(bits, size=int(rng.integers(1, 8)))) for _ in range(int(rng.integers(1, 6)))]
        text = "".join(x + "\n" for x in lines)
        assert count_tokens(text) == sum(count_tokens(x + "\n") for x in lines), lines


# ----------------------------------------------------------------------------------------------
# flags and the sweep
# ----------------------------------------------------------------------------------------------
def test_flags_parse_and_build_the_config(capsys):
    from trawmem_gpu.cli import build_parser
    from trawmem_gpu.cli.query import _select_config

    p = build_parser()
    for cmd in (["eval", "--data", "d", "--output", "o"], ["query", "--bank", "b", "--question", "q"],
                ["score", "--out", "o"], ["sweep", "--data", "d"]):
        with pytest.raises(SystemExit):
            p.parse_args(cmd + ["--token-budget", "0"])
        err = capsys.readouterr().err
        assert "argument --token-budget:" in err and "at least 1, got 0" in err
    a = p.parse_args(["eval", "--data", "d", "--output", "o", "--token-budget", "800"])
    _, qp = _select_config(a)
    assert (qp.token_budget, qp.budget, qp.fill) == (800, None, "skip")
    a = p.parse_args(["score", "--out", "o", "--token-budget", "800", "--budget", "12", "--fill", "stop"])
    _, qp = _select_config(a)
    assert (qp.token_budget, qp.budget, qp.fill) == (800, 12, "stop")
    cfg, qp = _select_config(p.parse_args(["query", "--bank", "b", "--question", "q"]))
    assert qp.token_budget is None and qp == QueryParams() and cfg.headings == "date"
    a = p.parse_args(["score", "--out", "o", "--token-budget", "400", "--headings", "gist"])
    assert _select_config(a)[0].headings == "gist"
    with pytest.raises(SystemExit):
        p.parse_args(["eval", "--data", "d", "--output", "o", "--headings", "summary"])
    assert "invalid choice: 'summary'" in capsys.readouterr().err
    a = p.parse_args(["sweep", "--data", "d", "--token-budget", "400,800,1600"])
    assert a.token_budget == [400, 800, 1600]


def test_sweep_grid_has_token_budget_cells():
    from trawmem_gpu.eval.sweep import grid

    cells = grid(["trawmem", "hybrid"], [1, 2], [16], [400, 800])
    keys = [c.key for c in cells]
    assert keys == ["trawmem B=16 H=1", "trawmem T=400 H=1", "trawmem T=800 H=1", "trawmem B=16 H=2",
                    "trawmem T=400 H=2", "trawmem T=800 H=2", "hybrid B=16", "hybrid T=400", "hybrid T=800"]
    qp = cells[2].params()
    assert (qp.budget, qp.token_budget, qp.hops) == (None, 800, 1)
    assert cells[6].params().token_budget is None
    # the cell's B / T / H replace those of the base params, the rest is kept
    assert cells[5].params(QueryParams(hops=3, fill="stop", n_seeds=2)) == \
        QueryParams(budget=None, token_budget=800, hops=2, fill="stop", n_seeds=2)


def test_paper_config_under_a_token_budget_does_not_trade_relevance_for_count():
    """Issue 25.4: the paper's J sums the dense affinity (1 + cos) / 2, about 1/2 even for an
    unrelated unit, so under a knapsack the set of most units has the largest J; the gain-per-token
    run of the cost-aware greedy then filled T with the shortest turns and left out the one turn
    the query is about. ``SelectConfig.paper()`` ranks by gain under T (the paper's greedy)."""
    rng = np.random.default_rng(11)
    lens = [1, 12, 12, 12, 12]
    E = rng.normal(size=(sum(lens), D))
    E[1:] -= np.outer(E[1:] @ E[0], E[0]) / (E[0] @ E[0])  # the short turns: orthogonal to the long one
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    texts = [" ".join(rng.choice(VOCAB, size=60))] + ["ok"] * (sum(lens) - 1)
    bank = make_bank("paper", lens, seed=11, unit_vecs=E, texts=texts)
    z = E[0].astype(np.float32)
    cfg = SelectConfig.paper()
    ctx = BankContext.of(bank)
    long_cost = token_costs(bank, cfg.headings).cost([0], bank.unit_thread)
    qp = QueryParams(token_budget=long_cost + 60, budget=None, hops=2)
    picks = select_reference(ctx, "What about it?", z, cfg, qp).units
    assert 0 in picks
    ratio = select_reference(ctx, "What about it?", z, replace(cfg, knapsack="ratio"), qp)
    assert 0 not in ratio.units and len(ratio.units) > len(picks)  # the trap the default run avoids
    assert SelectionEngine([bank], cfg, device="cpu").select_units(["paper"], ["What about it?"], z[None],
                                                                   params=qp)[0] == picks
