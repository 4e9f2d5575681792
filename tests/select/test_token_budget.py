"""Token budgets (``QueryParams.token_budget``): the config rule, the token costs beside the
renderer, the cost-aware knapsack greedy in every optimizer (NumPy plain / lazy, torch plain /
lazy, numba; Triton routed to torch), the engine against the reference, the baselines' fill,
the check of the real rendering, the command-line flags and the sweep's token-budget cells.

Random problems and tiny hand-made banks for most of it; the LoCoMo dev banks for the check that
every method's rendered workspace holds at most T tokens on real turns.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from engine_banks import VOCAB, make_bank
from select_objective import _objective as _select_objective
from trawmem_gpu.errors import ConfigError
from trawmem_gpu.select._jit import HAS_NUMBA
from trawmem_gpu.select.baselines import BASELINES, baseline_units, take_within_tokens
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.context import BankContext
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.objective import CoverageWeights, Objective
from trawmem_gpu.select.params import TOKENS_PER_UNIT, QueryParams, split_fields
from trawmem_gpu.select.reference import select_reference
from trawmem_gpu.select.steps import greedy as G
from trawmem_gpu.select.workspace import assemble, fit_to_tokens, token_costs, unit_line

D = 16


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
def _extractive_bank(seed=3, lens=(3, 5, 2, 4, 1, 6), when=None):
    """A bank whose heads are extractive (``[date] A & B: A: quote``), so showing the quoted turn
    drops the quote from the heading; texts with trailing punctuation, line breaks and captions.
    Every turn dated 8 May 2023, or ``when(unit index)`` (a datetime)."""
    from trawmem_gpu.ingest.heads import extractive_head
    from trawmem_gpu.data.types import Turn

    bank = make_bank("ext", list(lens), seed)
    rng = np.random.default_rng(seed)
    ends = ["", ".", "!!", "?)", " ...", ":\n", "\nok"]
    turns = []
    for i, t in enumerate(bank.turns):
        text = t.text + ends[int(rng.integers(len(ends)))]
        cap = "a photo of a dog" if rng.random() < 0.2 else None
        d = _date() if when is None else when(i)
        turns.append(Turn(t.turn_id, t.speaker, text, t.session, f"{d.day} {d:%B %Y}", d, cap))
    heads = []
    for j in range(bank.n_threads):
        idx = list(bank.thread_units(j))
        heads.append(extractive_head([turns[i] for i in idx], bank.unit_vecs[idx], sentences=1 + j % 2, words=6))
    bank.turns, bank.heads = turns, heads
    return bank


def _date():
    from datetime import datetime

    return datetime(2023, 5, 8)


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
# the knapsack greedy: lazy == plain, the result fits, the guarantee
# ----------------------------------------------------------------------------------------------
def _objective(rng, U, ties=False):
    """test_select's random objective (threads 0..3), with random token costs: own costs 1-29,
    headings up to 39 (large, so keys rise when a thread is hit)."""
    obj = _select_objective(rng, U, ties)
    uc = rng.integers(1, 30, size=U).astype(float)
    hc = rng.integers(0, 40, size=int(obj.thread.max()) + 1).astype(float)
    if ties:
        uc = np.round(uc / 10) * 10 + 10
    return obj, uc, hc


def _cost(S, uc, hc, th):
    return float(uc[list(S)].sum() + hc[sorted({int(th[u]) for u in S})].sum()) if len(S) else 0.0


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("ratio", [False, True, None])
def test_lazy_equals_plain_under_a_token_budget(ratio, ties):
    rng = np.random.default_rng(11 + ties)
    for trial in range(40):
        U = int(rng.integers(1, 30))
        obj, uc, hc = _objective(rng, U, ties)
        cap = float(rng.integers(5, 200))
        rule = G.StopRule(U if trial % 3 else max(1, U // 3), 2.0, None, G.TokenBudget(cap, uc, hc, ratio))
        plain = G.cost_aware_greedy(obj, rule, lazy=False)
        lazy = G.cost_aware_greedy(obj, rule, lazy=True)
        assert lazy[0] == plain[0], (trial, lazy[0], plain[0])
        np.testing.assert_allclose(lazy[1], plain[1], rtol=0, atol=0)
        assert _cost(plain[0], uc, hc, obj.thread) <= cap
        assert len(plain[0]) <= rule.budget
        # gains are the marginal values, and J is their sum
        assert math.isclose(G.j_value(plain[1]), obj.value(plain[0]), rel_tol=1e-12, abs_tol=1e-12)
        if len(plain[0]) < rule.budget:  # nothing left out still fits (a run only stops when full)
            if True:
                left = cap - _cost(plain[0], uc, hc, obj.thread)
                hit = {int(obj.thread[u]) for u in plain[0]}
                assert all(uc[u] + (0 if obj.thread[u] in hit else hc[obj.thread[u]]) > left
                           for u in set(range(U)) - set(plain[0]))


def _modular_objective(gains, threads):
    n = len(gains)
    return Objective(np.full(n, 1 / n), np.eye(n), np.zeros((n, 1)), np.zeros(1), np.asarray(gains, float),
                     np.asarray(threads), CoverageWeights(0.0, 0.0, 0.0))


def test_best_of_two_keeps_the_better_run():
    # unit 0: gain 3 for all 10 tokens; unit 1: gain 0.5 for 1 token (the better ratio)
    obj = _modular_objective([3.0, 0.5], [0, 1])
    tb = G.TokenBudget(10.0, np.array([10.0, 1.0]), np.array([0.0, 0.0]))
    rule = G.StopRule(2, 2.0, None, tb)
    for lazy in (False, True):
        assert G.cost_aware_greedy(obj, rule._replace(tokens=tb._replace(ratio=False)), lazy)[0] == [0]
        assert G.cost_aware_greedy(obj, rule._replace(tokens=tb._replace(ratio=True)), lazy)[0] == [1]
        assert G.cost_aware_greedy(obj, rule, lazy)[0] == [0]  # J 3 beats J 0.5
    # ... and the other way round: three cheap units beat one dear one
    obj = _modular_objective([1.5, 1.4, 1.4], [0, 1, 1])
    tb = G.TokenBudget(10.0, np.array([10.0, 1.0, 1.0]), np.array([0.0, 8.0]))
    for lazy in (False, True):
        assert G.cost_aware_greedy(obj, G.StopRule(3, 2.0, None, tb._replace(ratio=False)), lazy)[0] == [0]
        assert G.cost_aware_greedy(obj, G.StopRule(3, 2.0, None, tb), lazy)[0] == [1, 2]
    # the same set chosen both ways: the ratio run's pick order, whatever the summation order says
    calls = []

    def run(r):
        calls.append(r.tokens.ratio)
        return ([1, 0], [0.5, 0.25]) if r.tokens.ratio else ([0, 1], [0.5, 0.2500001])
    assert G.best_of_two(run, G.StopRule(3, 2.0, None, tb)) == ([1, 0], [0.5, 0.25]) and calls == [False, True]


def test_a_key_that_rises_when_its_heading_is_paid_is_taken():
    """Unit 1 shares unit 0's thread (heading 8): its key 1.4 / 9 is below unit 2's 0.4 / 2 until
    unit 0 pays the heading, then 1.4 / 1 is above it. The lazy heap must re-key it."""
    obj = _modular_objective([2.0, 1.4, 0.4], [0, 0, 1])
    tb = G.TokenBudget(12.0, np.array([1.0, 1.0, 2.0]), np.array([8.0, 0.0]), ratio=True)
    for lazy in (False, True):
        assert G.cost_aware_greedy(obj, G.StopRule(3, 2.0, None, tb), lazy)[0] == [0, 1, 2]


def test_cost_aware_greedy_guarantee_on_small_problems():
    """Brute force: the cost-aware greedy gets >= (1 - 1/e) / 2 of the best set that fits with
    modular costs (headings 0), and of the best set that fits when every unit pays its heading."""
    rng = np.random.default_rng(5)
    bound = (1 - 1 / math.e) / 2
    worst = 1.0
    for trial in range(60):
        U = int(rng.integers(3, 10))
        obj, uc, hc = _objective(rng, U)
        if trial % 2:
            hc = np.zeros_like(hc)
        cap = float(rng.integers(10, 80))
        S, _ = G.cost_aware_greedy(obj, G.StopRule(U, 2.0, None, G.TokenBudget(cap, uc, hc)))
        pess = uc + hc[obj.thread]
        best = max((obj.value(c) for k in range(U + 1) for c in itertools.combinations(range(U), k)
                    if pess[list(c)].sum() <= cap), default=0.0)
        if best > 0:
            worst = min(worst, obj.value(S) / best)
            assert obj.value(S) >= bound * best - 1e-12, (trial, obj.value(S), best)
    assert worst <= 1.0


# ----------------------------------------------------------------------------------------------
# every optimizer picks what the NumPy reference picks
# ----------------------------------------------------------------------------------------------
def _batch_problem(seed, Q, U, T):
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((Q, U, 5))
    E /= np.linalg.norm(E, axis=2, keepdims=True)
    K = np.clip(E @ E.transpose(0, 2, 1) - 0.1, 0, 1)
    for q in range(Q):
        np.fill_diagonal(K[q], 1.0)
    pi = rng.random((Q, U)) ** 3
    valid = np.ones((Q, U), dtype=bool)
    valid[0, U - 3:] = False  # padding
    pi = np.where(valid, pi, 0)
    pi /= pi.sum(1, keepdims=True)
    thread = np.where(valid, rng.integers(0, T, (Q, U)), -1)
    mass = np.stack([np.bincount(thread[q][valid[q]], weights=pi[q][valid[q]], minlength=T) for q in range(Q)])
    p = G.GreedyProblem(pi, K, rng.dirichlet(np.ones(3), size=(Q, U)), rng.dirichlet(np.ones(3), size=Q),
                        rng.random((Q, U)), thread, mass, valid)
    tb = G.TokenBudget(rng.integers(20, 150, size=Q).astype(float), rng.integers(1, 25, (Q, U)).astype(float),
                       rng.integers(0, 30, (Q, T)).astype(float))
    return p, tb


def _numba_batch(p, w, rule):
    """The compiled greedy of the CPU engine, one query at a time (as ``engine/compiled.py``)."""
    Q, U = p.pi.shape
    T = p.thread_mass.shape[1]
    s = G.greedy_scratch(U, 3, T + 1)
    tb = rule.tokens
    sel = np.full((Q, U), -1, dtype=np.int64)
    n_sel = np.zeros(Q, dtype=np.int64)
    for q in range(Q):
        live = np.flatnonzero(p.valid[q])
        K = np.ascontiguousarray(p.K[q][np.ix_(live, live)])
        lt = np.ascontiguousarray(p.thread[q][live])
        args = (np.ascontiguousarray(p.pi[q][live]), np.ascontiguousarray(p.rho[q][live]), p.delta[q],
                np.ascontiguousarray(p.modular[q][live]), lt, p.thread_mass[q][lt], K @ p.pi[q][live],
                G.KSource(K.reshape(-1), 0, len(live), np.arange(len(live)), False), w,
                G.StopRule(min(int(rule.budget[q]), len(live)), 2.0, len(live), None),
                np.ascontiguousarray(tb.unit_cost[q][live]), np.ascontiguousarray(tb.head_cost[q]),
                float(tb.capacity[q]))
        row = np.full(len(live), -1, dtype=np.int64)
        if tb.ratio is None:
            n = G.best_of_two_compiled(G.CompiledQuery(*args, False), G.CompiledQuery(*args, True), s, row,
                                       np.empty(len(live), np.int64), np.zeros(len(live), np.bool_))
        else:
            n = G.lazy_greedy_one(G.CompiledQuery(*args, tb.ratio), s, row)
        sel[q, :n] = live[row[:n]]
        n_sel[q] = n
    return sel, None, n_sel


def _torch(fn):
    def run(p, w, rule):
        t = lambda a: torch.as_tensor(a)  # noqa: E731
        pt = G.GreedyProblem(*(None if x is None else t(x) for x in p))
        tb = rule.tokens
        tt = None if tb is None else G.TokenBudget(t(tb.capacity), t(tb.unit_cost), t(tb.head_cost), tb.ratio)
        return fn(pt, w, rule._replace(budget=t(rule.budget), tokens=tt))
    return run


OPTIMIZERS = [
    pytest.param(lambda p, w, r: G.greedy_reference_np(p, w, r, lazy=True), id="numpy-lazy"),
    pytest.param(_torch(G.greedy_select_torch), id="torch-plain"),
    pytest.param(_torch(G.greedy_lazy_torch), id="torch-lazy"),
    pytest.param(_torch(lambda p, w, r: G.greedy_lazy_torch(p, w, r, k=1)), id="torch-lazy-k1"),
    pytest.param(_numba_batch, id="numba", marks=pytest.mark.skipif(not HAS_NUMBA, reason="needs numba")),
]


@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("ratio", [None, False, True], ids=["best", "gain", "ratio"])
def test_every_optimizer_agrees_under_a_token_budget(opt, ratio):
    w = CoverageWeights(0.8, 1.1, 0.9)
    for seed, (Q, U, T) in enumerate([(3, 13, 4), (2, 29, 6), (4, 7, 2)]):
        p, tb = _batch_problem(seed, Q, U, T)
        budget = np.array([U] + [max(1, U // 2)] * (Q - 1))
        rule = G.StopRule(budget, 2.0, U, tb._replace(ratio=ratio))
        want_sel, _, want_n = G.greedy_reference_np(p, w, rule, lazy=False)
        sel, _, n = opt(p, w, rule)
        sel, n = np.asarray(sel), np.asarray(n)
        for q in range(Q):
            assert sel[q, :n[q]].tolist() == want_sel[q, :want_n[q]].tolist(), (seed, q)
            S = want_sel[q, :want_n[q]]
            assert _cost(S, tb.unit_cost[q], tb.head_cost[q], p.thread[q]) <= tb.capacity[q]


def test_token_budgets_never_reach_the_triton_kernel(monkeypatch):
    """The Triton greedy kernel has the unit budget only: under a token budget ``impl="auto"``
    runs the torch plain greedy and never asks for the kernel (``impl="triton"`` is refused:
    ``test_dispatch.py``)."""
    from trawmem_gpu.select.steps.greedy import batched as GB

    p, tb = _batch_problem(0, 3, 13, 4)
    w = CoverageWeights(1.0, 1.0, 1.0)
    run = _torch(lambda pt, w_, r: G.greedy_select(pt, w_, r, impl="auto"))

    def boom(*a, **k):
        raise AssertionError("the Triton kernel ran under a token budget")
    monkeypatch.setattr(GB, "kernels", boom)
    monkeypatch.setattr(GB, "use_triton", boom)
    rule = G.StopRule(np.full(3, 13), 2.0, 13, tb)
    sel, _, n = run(p, w, rule)
    want, _, want_n = _torch(G.greedy_select_torch)(p, w, rule)
    assert torch.equal(sel, want) and torch.equal(n, want_n)
    with pytest.raises(AssertionError, match="Triton kernel ran"):  # without T it would ask for the kernel
        run(p, w, rule._replace(tokens=None))


# ----------------------------------------------------------------------------------------------
# the engine against the reference; every method within T
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def banks():
    return [make_bank("odd", [3, 1, 5, 2, 7, 4, 1, 6, 3], seed=1, n_semantic=5), make_bank("single", [4], seed=2),
            make_bank("tiny", [1, 2], seed=3), make_bank("wide", [2, 3, 4, 5] * 8, seed=4, n_semantic=20),
            _extractive_bank(seed=6, lens=(4, 2, 6, 3, 5, 1, 2))]


@pytest.fixture(scope="module")
def queries(banks):
    rng = np.random.default_rng(7)
    ids, qs, zs = [], [], []
    for b in banks:
        for i in range(5):
            z = b.unit_vecs[int(rng.integers(b.n_units))] + 0.4 * rng.normal(size=D) if i < 3 else rng.normal(size=D)
            ids.append(b.bank_id)
            qs.append("When did " + " ".join(rng.choice(VOCAB, size=3)) + "?")
            zs.append(z / np.linalg.norm(z))
    return ids, qs, np.array(zs, dtype=np.float32)


ENGINE_VARIANTS = [{}, {"backend": "tensor"}, {"backend": "tensor", "optimizer": "plain"}, {"front": "tensor"}]


@pytest.mark.parametrize("cfg", [
    pytest.param(dict(token_budget=60, budget=None), id="T60"),
    pytest.param(dict(token_budget=150, budget=None), id="T150"),
    pytest.param(dict(token_budget=400, budget=None), id="T400"),
    pytest.param(dict(token_budget=400, budget=5), id="T400-B5"),
    pytest.param(dict(token_budget=150, budget=None, knapsack="gain"), id="T150-gain"),
    pytest.param(dict(token_budget=150, budget=None, knapsack="ratio", hops=2), id="T150-ratio-H2"),
    pytest.param(dict(token_budget=300, budget=None, ablation="no_multi_thread"), id="T300-no-multi-thread"),
    pytest.param(dict(token_budget=300, budget=None, lambda_r=0.5, w_role=1.0, cross_thread=True, w_thr=1.0),
                 id="T300-roles-and-multi-thread"),
    pytest.param(dict(token_budget=200, budget=None, affinity="learned"), id="T200-learned-affinity"),
    pytest.param(dict(token_budget=200, budget=None, headings="gist"), id="T200-gist-headings"),
    pytest.param(dict(token_budget=200, budget=None, headings="none"), id="T200-no-headings"),
])
def test_engine_agrees_with_reference_under_a_token_budget(banks, queries, cfg):
    ids, qs, Z = queries
    method, query = split_fields(cfg)
    c, qp = SelectConfig(**method), QueryParams(**query)
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    bank = {b.bank_id: b for b in banks}
    ref = [select_reference(ctx[b], q, z, c, qp).units for b, q, z in zip(ids, qs, Z)]
    assert any(ref) and all(assemble(bank[b], q, p, c.headings).n_tokens <= qp.token_budget
                            for b, q, p in zip(ids, qs, ref))
    if qp.budget is not None:
        assert max(len(p) for p in ref) <= qp.budget
    for v in ENGINE_VARIANTS:
        got = SelectionEngine(banks, c, device="cpu", **v).select_units(ids, qs, Z, params=qp)
        bad = [(i, g, r) for i, (g, r) in enumerate(zip(got, ref)) if g != r]
        assert not bad, f"{v or 'default'}: {len(bad)} queries differ, first {bad[:2]}"


def test_token_costs_survive_replace_bank(banks, queries):
    ids, qs, Z = queries
    cfg, qp = SelectConfig(), QueryParams(token_budget=150, budget=None)
    eng = SelectionEngine(banks, cfg, device="cpu")
    new = _extractive_bank(seed=9, lens=(5, 5, 2))
    new.bank_id = "odd"  # same id, other units: other costs
    for t in range(len(new.turns)):
        new.turns[t] = replace(new.turns[t], turn_id=f"odd:{t}")
    eng.replace_bank(new)
    eng.remove_bank("tiny")
    rows = [i for i, b in enumerate(ids) if b in ("odd", "ext")]
    rid, rq = [ids[i] for i in rows], [qs[i] for i in rows]
    got = eng.select_units(rid, rq, Z[rows], params=qp)
    now = {b.bank_id: b for b in banks if b.bank_id != "odd"} | {"odd": new}
    ref = [select_reference(BankContext.of(now[b]), q, z, cfg, qp).units for b, q, z in zip(rid, rq, Z[rows])]
    assert got == ref and any(p for b, p in zip(rid, got) if b == "odd")


@pytest.mark.parametrize("fill", ["skip", "stop"])
def test_baselines_fill_a_token_budget(banks, queries, fill):
    ids, qs, Z = queries
    bank = {b.bank_id: b for b in banks}
    for T in (40, 120, 300):
        cfg, qp = SelectConfig(), QueryParams(token_budget=T, budget=None, fill=fill)
        for b, q, z in zip(ids, qs, Z):
            ctx = BankContext.of(bank[b])
            costs = ctx.token_costs("none")
            for m in BASELINES:
                units = baseline_units(m, ctx, q, z, cfg, qp)
                assert assemble(bank[b], q, units, "none").n_tokens <= T
                from trawmem_gpu.select.baselines import ranking

                order = [int(u) for u in ranking(m, ctx, q, z)]
                pos = [order.index(u) for u in units]
                assert pos == sorted(pos)  # rank order
                if fill == "stop":
                    assert units == order[:len(units)]  # a prefix of the ranking
                else:  # every unit ranked above the last taken one that was left out did not fit then
                    left = [u for u in order[:pos[-1] if pos else 0] if u not in units]
                    for u in left:
                        before = [x for x in units if order.index(x) < order.index(u)]
                        assert costs.cost(before + [u], bank[b].unit_thread) > T
            # a unit cap on top of T
            capped = baseline_units("cosine", ctx, q, z, cfg, replace(qp, budget=2))
            assert capped == baseline_units("cosine", ctx, q, z, cfg, qp)[:2] or fill == "skip" and len(capped) <= 2


def test_take_within_tokens_skip_and_stop():
    class C:
        unit = np.array([5, 50, 5, 5])
        heading = np.array([0, 0])
    th = np.array([0, 0, 1, 1])
    assert take_within_tokens([0, 1, 2, 3], C, th, 12, "skip") == [0, 2]
    assert take_within_tokens([0, 1, 2, 3], C, th, 15, "skip") == [0, 2, 3]
    assert take_within_tokens([0, 1, 2, 3], C, th, 15, "stop") == [0]
    assert take_within_tokens([0, 1, 2, 3], C, th, 15, "skip", cap=2) == [0, 2]
    C.heading = np.array([0, 6])  # a heading paid with its thread's first unit
    assert take_within_tokens([0, 2, 3], C, th, 20, "skip") == [0, 2]


@pytest.mark.slow
def test_every_method_fits_the_budget_on_dev_banks(dev_path):
    """Real turns (LoCoMo dev, 3 banks, 20 questions each): TrawMem (reference and engine) and every
    baseline (both fills) render within T at T = 400, 800, 1600."""
    from trawmem_gpu.ingest.config import BuildConfig
    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.retrieval import banks_for

    convs, banks, _ = banks_for(dev_path, BuildConfig(), progress=False)
    convs, banks = convs[:3], banks[:3]
    items = [(c.bank_id, q.question) for c in convs for q in
             [q for q in c.questions if q.category in (1, 2, 3, 4) and q.evidence][:20]]
    Z = get_encoder().encode([q for _, q in items], is_query=True)
    bank = {b.bank_id: b for b in banks}
    ctx = {b.bank_id: BankContext.of(b) for b in banks}
    for T in (400, 800, 1600):
        cfg, qp = SelectConfig(), QueryParams(token_budget=T, budget=None)
        ref = [select_reference(ctx[b], q, z, cfg, qp).units for (b, q), z in zip(items, Z)]
        eng = SelectionEngine(banks, cfg).select_units([b for b, _ in items], [q for _, q in items], Z, params=qp)
        assert eng == ref
        used = [assemble(bank[b], q, p).n_tokens for (b, q), p in zip(items, ref)]
        assert max(used) <= T and np.mean(used) > 0.9 * T  # the budget is used, not wasted
        for m in BASELINES:
            for fill in ("skip", "stop"):
                for (b, q), z in zip(items, Z):
                    p = baseline_units(m, ctx[b], q, z, cfg, replace(qp, fill=fill))
                    assert assemble(bank[b], q, p, "none").n_tokens <= T


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
