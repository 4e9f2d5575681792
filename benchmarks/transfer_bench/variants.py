"""The candidates of the transfer table, their fits by source and their picks.

A :class:`Variant` is the shipped method with one choice changed: the form of the ``words``
relevance feature (``WORDS``), a few ``SelectConfig`` fields, or the units (messages instead of
bursts). Its affinity weights are fitted by :func:`fit_weights` on one source's plain dev set
(every question weighs the same, ``head.relevance.fit_relevance``), and it selects with the NumPy
reference (``select_reference``, which the engines match pick for pick), its ``words`` column
swapped in the contexts' ``RelevanceStatic`` (nothing else changes).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .sets import SOURCES, ViewSet

WORDS_COL = 11
"""The column of ``words`` in ``RELEVANCE_FEATURES``."""


def word_counts(bank) -> np.ndarray:
    from trawmem_gpu.select.steps.relevance import word_counts as wc

    return wc(bank.turns)


def words_form(form: str, bank) -> np.ndarray | None:
    """``[N]`` the ``words`` feature of ``bank``'s units in ``form`` (None: no feature):

    * ``cap20``: log(1 + min(words, 20)) (shipped before issue 36);
    * ``rank``: the unit's rank by words within its bank, in (0, 1) (ties share their mean rank);
    * ``z``: log(1 + words), z-scored within its bank (0 when every unit has as many words);
    * ``none``: no feature (its weight 0)."""
    from scipy.stats import rankdata

    if form == "none":
        return None
    w = word_counts(bank)
    if form == "cap20":
        return np.log1p(np.minimum(w, 20.0))
    if form == "rank":
        return (rankdata(w) - 0.5) / len(w)
    if form == "z":
        lw = np.log1p(w)
        sd = lw.std()
        return (lw - lw.mean()) / sd if sd > 0 else np.zeros_like(lw)
    raise ValueError(f"unknown words form {form!r}")


WORDS = ("cap20", "none", "rank", "z")


@dataclass(frozen=True)
class Variant:
    """One candidate: the shipped method with ``words`` in another form, ``config`` fields set, or
    messages as units (``bursts=False``)."""

    name: str
    words: str = "cap20"
    config: dict = field(default_factory=dict)
    bursts: bool = True

    def key(self) -> tuple:
        return (self.words,)


def _with_words(q, form: str, col_of: dict):
    """Labelled question ``q`` with its ``words`` column in ``form`` (0 for ``none``)."""
    col = col_of[q.bank_id]
    F = q.F.copy()
    F[:, WORDS_COL] = 0.0 if col is None else col
    return replace(q, F=F)


def fit_weights(sets: dict, form: str, groups_out=None) -> dict:
    """``{(source, held-out group or None): weights}``: per source, fitted on its plain set's
    questions with ``words`` in ``form``, all of them (``None``) and without each of its groups
    (``groups_out``: the groups to hold out; default every group)."""
    from trawmem_gpu.head.relevance import fit_relevance

    out = {}
    for src in SOURCES:
        ds = sets[(src, "plain")]
        cols = {b: words_form(form, c.bank) for b, c in ds.ctxs.items()}
        qs = [_with_words(q, form, cols) for q in ds.questions]
        for g in [None] + list(ds.groups if groups_out is None else groups_out):
            w = np.asarray(fit_relevance([q for q in qs if q.group != g]))
            if form == "none":
                w[WORDS_COL] = 0.0
            out[(src, g)] = w
    return out


def weights_for(W: dict, fit_src: str, target: ViewSet, group: str) -> np.ndarray:
    """The weights that score ``target``'s question of ``group`` under the fit on ``fit_src``: the
    fit without that group when the target is the fit's own source (within-source folds), else the
    fit on all of ``fit_src`` (transfer)."""
    return W[(fit_src, group if target.name == fit_src else None)]


def variant_contexts(ds: ViewSet, v: Variant) -> dict:
    """``{bank_id: BankContext}`` of ``ds`` as ``v`` selects from it (its units, its ``words``)."""
    base = ds.ctxs if v.bursts else ds.raw_ctxs
    out = {}
    for b, c in base.items():
        col = words_form(v.words, c.bank)
        out[b] = replace(c, relevance=c.relevance._replace(words=np.zeros(c.bank.n_units) if col is None else col))
    return out


def select_variant(ds: ViewSet, v: Variant, W: dict, fit_src: str, T: int) -> list[list[int]]:
    """``v``'s picks for every question of ``ds`` at ``T``, weights from the fit on ``fit_src``."""
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams
    from trawmem_gpu.select.reference import select_reference

    ctxs = variant_contexts(ds, v)
    qp = QueryParams(token_budget=T)
    cfgs: dict = {}
    picks = []
    for q in ds.questions:
        w = weights_for(W, fit_src, ds, q.group)
        key = w.tobytes()
        if key not in cfgs:
            cfgs[key] = SelectConfig(affinity="learned", relevance_weights=tuple(float(x) for x in w), **v.config)
        picks.append(select_reference(ctxs[q.bank_id], q.extra["question"], np.asarray(q.extra["z"], np.float64),
                                      cfgs[key], qp, now=q.extra["date"]).units)
    return picks


def select_hybrid(ds: ViewSet, units: str, T: int) -> list[list[int]]:
    """The RRF hybrid's picks at ``T`` (its standard configuration: ``select.baselines``) over
    ``units`` (``bursts`` or ``messages``)."""
    from trawmem_gpu.select.baselines import baseline_units
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams

    ctxs = ds.units(units).ctxs
    cfg, qp = SelectConfig(), QueryParams(token_budget=T)
    return [baseline_units("hybrid", ctxs[q.bank_id], q.extra["question"], q.extra["z"], cfg, qp)
            for q in ds.questions]


def fit_both(sets: dict, form: str) -> dict:
    """``{("both", group): weights}``: today's protocol, the fit on both sources' plain sets without
    ``group`` (the fold the question is in), ``words`` in ``form``."""
    from trawmem_gpu.head.relevance import fit_relevance

    qs = []
    for src in SOURCES:
        ds = sets[(src, "plain")]
        cols = {b: words_form(form, c.bank) for b, c in ds.ctxs.items()}
        qs += [_with_words(q, form, cols) for q in ds.questions]
    out = {}
    for g in sorted({q.group for q in qs}):
        w = np.asarray(fit_relevance([q for q in qs if q.group != g]))
        if form == "none":
            w[WORDS_COL] = 0.0
        out[("both", g)] = w
    return out


VARIANTS = {v.name: v for v in (
    Variant("defaults"),
    Variant("words-none", words="none"),
    Variant("words-rank", words="rank"),
    Variant("words-z", words="z"),
    Variant("roles-on", config={"lambda_r": 0.5, "w_role": 1.0, "cross_thread": True, "w_thr": 1.0}),
    Variant("knapsack-best", config={"knapsack": "best"}),
    Variant("messages", bursts=False),
)}
"""The candidates, by name (``--variants``)."""
