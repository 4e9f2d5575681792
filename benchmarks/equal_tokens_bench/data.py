"""The dev sets, the methods' configurations and their picks, fold by fold."""
from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np


TARGET_T = {"locomo": 800, "longmemeval": 400}
BASELINES = ("cosine", "bm25", "hybrid")
GRID = [dict(headings=h, knapsack=k, w_aff=w) for h in ("date", "gist") for k in ("gain", "best")
        for w in (1.0, 4.0, 16.0)]
HEADLINE = BASELINES + ("trawmem-previous", "trawmem-rrf", "trawmem")
PREVIOUS = dict(affinity="rrf", w_aff=1.0, knapsack="best", headings="gist")
"""The defaults before this benchmark chose them (hand-set fusion, the paper's weights, gist headings)."""


class Dataset:
    """One dev set: its labelled questions (features for the fit), contexts and fold of each question."""

    def __init__(self, name: str, path: Path):
        from trawmem_gpu.head.relevance import load_labelled

        t0 = time.perf_counter()
        self.name, self.path = name, path
        self.questions, self.ctxs = load_labelled(path, dataset=name)
        self.banks = [c.bank for c in self.ctxs.values()]
        self.groups = sorted({q.group for q in self.questions})
        self.category_names = None
        if name == "longmemeval":
            from trawmem_gpu.data.longmemeval import QUESTION_TYPES

            self.category_names = {i + 1: t for i, t in enumerate(QUESTION_TYPES)}
        print(f"{name}: {len(self.questions)} questions, {len(self.banks)} banks, {len(self.groups)} folds "
              f"({time.perf_counter() - t0:.1f}s)", flush=True)

    def cat_name(self, c: int) -> str:
        return self.category_names.get(c, str(c)) if self.category_names else str(c)


def select(ds: Dataset, method: str, setting_of_group) -> tuple[list[list[int]], str]:
    """Picks for every question of ``ds``, fold by fold (``setting_of_group(group)`` ->
    ``(SelectConfig, QueryParams)``), and the headings they are rendered (and were paid for) with.
    One engine per method config; the query parameters go with each call."""
    from trawmem_gpu.select import SelectionEngine
    from trawmem_gpu.select.baselines import baseline_units
    from trawmem_gpu.select.workspace import headings_for

    out: list = [None] * len(ds.questions)
    by_group = defaultdict(list)
    for i, q in enumerate(ds.questions):
        by_group[q.group].append(i)
    cache = {}
    for g, rows in by_group.items():
        cfg, params = setting_of_group(g)
        if method in BASELINES:
            for i in rows:
                q = ds.questions[i]
                out[i] = baseline_units(method, ds.ctxs[q.bank_id], q.extra["question"], q.extra["z"], cfg, params)
        elif method == "alpha-rank":  # ablation: every unit of the bank ranked by the affinity alone
            from trawmem_gpu.select.baselines import take_within_tokens
            from trawmem_gpu.select.objective import date_seconds
            from trawmem_gpu.select.steps.affinity import unit_affinity
            from trawmem_gpu.select.workspace import fit_to_tokens

            for i in rows:
                q = ds.questions[i]
                ctx = ds.ctxs[q.bank_id]
                a = unit_affinity(ctx, np.asarray(q.extra["z"], dtype=np.float64), q.extra["question"], cfg,
                                  date_seconds(q.extra["date"]))
                order = np.lexsort((np.arange(len(a)), -a))
                costs = ctx.token_costs("none")
                u = take_within_tokens(order, costs, ctx.bank.unit_thread, params.token_budget, "skip")
                out[i] = fit_to_tokens(ctx.bank, u, params.token_budget, "none", costs=costs)
        else:
            key = json.dumps(cfg.to_dict(), sort_keys=True)
            eng = cache.get(key) or SelectionEngine(ds.banks, cfg)
            cache = {key: eng}
            qs = [ds.questions[i] for i in rows]
            picks = eng.select_units([q.bank_id for q in qs], [q.extra["question"] for q in qs],
                                     np.stack([q.extra["z"] for q in qs]), dates=[q.extra["date"] for q in qs],
                                     params=params)
            for i, p in zip(rows, picks):
                out[i] = p
    return out, headings_for(method, setting_of_group(ds.groups[0])[0])


def _params(T, B, query: dict):
    """The run's ``QueryParams``: T with at most B units (None = no cap), or B (default 16)."""
    from trawmem_gpu.select.params import QueryParams

    return QueryParams(token_budget=T, budget=B, **query) if T else QueryParams(budget=B or 16, **query)


def trawmem_setting(W, T=None, B=None, **kw):
    """``group -> (SelectConfig, QueryParams)``: the learned affinity with the fold's weights
    ``W[group]``; ``kw`` holds method fields and query fields (e.g. ``hops``) side by side."""
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import split_fields

    method, query = split_fields(kw)
    params = _params(T, B, query)
    return lambda g: (SelectConfig(affinity="learned", relevance_weights=W[g], **method), params)


def fixed_setting(T=None, B=None, **kw):
    """``group -> (SelectConfig, QueryParams)``, the same for every fold (``kw`` as
    :func:`trawmem_setting`)."""
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import split_fields

    method, query = split_fields(kw)
    setting = (SelectConfig(**method), _params(T, B, query))
    return lambda g: setting
