"""The candidates of the transfer table, their fits by source and their picks.

A :class:`Variant` is the shipped method with one choice changed: the form of the ``words``
relevance feature (``WORDS``), a few ``SelectConfig`` fields, or the units (messages instead of
bursts). Its affinity weights are fitted by :func:`fit_weights` on one source's plain dev set
(every question weighs the same, ``head.relevance.fit_relevance``), and it selects with the
batched engine (which the agreement tests hold to the reference's picks), its tables built with
its ``words`` column (:func:`words_as`; nothing else changes).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

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
    """One candidate: the shipped method with ``words`` in another form, features dropped
    (``drop``: their weights 0, fitted without them), ``config`` fields set, or messages as units
    (``bursts=False``)."""

    name: str
    words: str = "cap20"
    drop: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)
    bursts: bool = True
    fit_views: tuple[str, ...] = ()
    """Views of the fit's source whose questions the fit reads beside its plain set's (the same
    groups held out in each)."""

    @property
    def features(self) -> tuple:
        """What its fit depends on: the ``words`` form, the dropped features (and the fit's views)."""
        return (self.words, self.drop) + ((self.fit_views,) if self.fit_views else ())


def _cols(drop: tuple[str, ...]) -> list[int]:
    from trawmem_gpu.select.config import RELEVANCE_FEATURES

    return [RELEVANCE_FEATURES.index(d) for d in drop]


def _rows(ds: ViewSet, features: tuple) -> list:
    """``ds``'s labelled questions with ``words`` in the form and the dropped columns 0."""
    form, drop = features[:2]
    cols = {b: words_form(form, c.bank) for b, c in ds.ctxs.items()}
    out = []
    for q in ds.questions:
        F = q.F.copy()
        col = cols[q.bank_id]
        F[:, WORDS_COL] = 0.0 if col is None else col
        F[:, _cols(drop)] = 0.0
        out.append(replace(q, F=F))
    return out


def _fit(qs: list, features: tuple) -> np.ndarray:
    from trawmem_gpu.head.relevance import fit_relevance

    w = np.asarray(fit_relevance(qs))
    w[_cols(features[1]) + ([WORDS_COL] if features[0] == "none" else [])] = 0.0  # a constant column: no weight
    return w


def fit_weights(sets: dict, features: tuple, src: str) -> dict:
    """``{(src, held-out group or None): weights}``: fitted on ``src``'s plain set's questions with
    ``features`` (:attr:`Variant.features`), all of them (``None``) and without each of its groups
    (the within-source folds)."""
    ds = sets[(src, "plain")]
    views = features[2] if len(features) > 2 else ()
    qs = [q for v in ("plain",) + tuple(views) for q in _rows(sets[(src, v)], features)]
    return {(src, g): _fit([q for q in qs if q.group != g], features) for g in [None] + list(ds.groups)}


def fit_both(sets: dict, features: tuple) -> dict:
    """``{("both", group): weights}``: today's protocol, the fit on both sources' plain sets without
    ``group`` (the fold the question is in)."""
    qs = [q for src in SOURCES for q in _rows(sets[(src, "plain")], features)]
    return {("both", g): _fit([q for q in qs if q.group != g], features) for g in sorted({q.group for q in qs})}


def weights_for(W: dict, fit_src: str, target: ViewSet, group: str) -> np.ndarray:
    """The weights that score ``target``'s question of ``group`` under the fit on ``fit_src``: the
    fit without that group when the target is the fit's own source (within-source folds; ``both``:
    today's folds), else the fit on all of ``fit_src`` (transfer)."""
    if fit_src == "both":
        return W[("both", group)]
    return W[(fit_src, group if target.name == fit_src else None)]


@contextmanager
def words_as(form: str):
    """The ``words`` feature in ``form`` wherever it is computed inside the block (the engines'
    tables read ``relevance_static``, which calls ``words_feature``)."""
    from trawmem_gpu.select.steps import relevance as R

    orig = R.words_feature

    def feature(turns):
        col = words_form(form, SimpleNamespace(turns=turns))
        return np.zeros(len(turns)) if col is None else col

    R.words_feature = feature
    try:
        yield
    finally:
        R.words_feature = orig


def select_variant(ds: ViewSet, v: Variant, W: dict, fit_src: str, T: int) -> list[list[int]]:
    """``v``'s picks for every question of ``ds`` at ``T``, weights from the fit on ``fit_src``: the
    batched engine (which picks what the reference picks), one per weights, its tables built with
    ``v``'s units and ``words``."""
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.select.params import QueryParams

    src = ds.units("bursts" if v.bursts else "messages")
    qp = QueryParams(token_budget=T, budget=None)
    by_w: dict = {}
    for i, q in enumerate(ds.questions):
        by_w.setdefault(weights_for(W, fit_src, ds, q.group).tobytes(), []).append(i)
    picks: list = [None] * len(ds.questions)
    for key, rows in ((k, c) for k, rows in by_w.items() for c in _bank_chunks(ds, rows, src)):
        w = np.frombuffer(key, dtype=np.float64)
        cfg = SelectConfig(affinity="learned", relevance_weights=tuple(float(x) for x in w), **v.config)
        qs = [ds.questions[i] for i in rows]
        with words_as(v.words):  # an engine over the banks these questions ask
            eng = SelectionEngine([src.ctxs[b].bank for b in dict.fromkeys(q.bank_id for q in qs)], cfg)
        got = eng.select_units([q.bank_id for q in qs], [q.extra["question"] for q in qs],
                               np.stack([q.extra["z"] for q in qs]), dates=[q.extra["date"] for q in qs], params=qp)
        for i, p in zip(rows, got):
            picks[i] = [int(u) for u in p]
    return picks


CHUNK_UNITS = 1000
"""Units per engine in :func:`select_variant`: a batch's work grows with its questions times the
units of all its engine's banks, so the banks are selected from in chunks of about this many
units (at least one bank each; the picks are each question's over its own bank either way, and
side by side on LongMemEval dev 4 banks an engine ran 2.6x faster than 30)."""


def _bank_chunks(ds: ViewSet, rows: list[int], units: "ViewSet") -> list[list[int]]:
    """``rows`` (question indices) in chunks whose banks (in ``units``) hold about
    ``CHUNK_UNITS`` units together."""
    chunk: dict = {}
    n = size = 0
    for b in dict.fromkeys(ds.questions[i].bank_id for i in rows):
        k = units.ctxs[b].bank.n_units
        if size and size + k > CHUNK_UNITS:
            n, size = n + 1, 0
        chunk[b], size = n, size + k
    out: list = [[] for _ in range(n + 1 if chunk else 0)]
    for i in rows:
        out[chunk[ds.questions[i].bank_id]].append(i)
    return out


def select_hybrid(ds: ViewSet, units: str, T: int) -> list[list[int]]:
    """The RRF hybrid's picks at ``T`` (its standard configuration: ``select.baselines``) over
    ``units`` (``bursts`` or ``messages``)."""
    from trawmem_gpu.select.baselines import baseline_units
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.params import QueryParams

    ctxs = ds.units(units).ctxs
    cfg, qp = SelectConfig(), QueryParams(token_budget=T, budget=None)
    return [baseline_units("hybrid", ctxs[q.bank_id], q.extra["question"], q.extra["z"], cfg, qp)
            for q in ds.questions]


VARIANTS = {v.name: v for v in (
    Variant("defaults"),
    Variant("words-none", words="none"),
    Variant("words-rank", words="rank"),
    Variant("words-z", words="z"),
    Variant("roles-on", config={"lambda_r": 0.5, "w_role": 1.0, "cross_thread": True, "w_thr": 1.0}),
    Variant("knapsack-best", config={"knapsack": "best"}),
    Variant("knapsack-ratio", config={"knapsack": "ratio"}),
    Variant("messages", bursts=False),
    Variant("context-none", drop=("context_cos", "context_rrf")),
    Variant("speaker-none", drop=("speaker_named",)),
    Variant("temporal-none", drop=("temporal_match",)),
    Variant("fit-views", fit_views=("split", "chat")),
    Variant("multi-thread-on", config={"cross_thread": True, "w_thr": 1.0}),
)}
"""The candidates, by name (``--variants``). ``roles-on`` is the earlier default (the role terms and
the multi-thread term on, as before issue 36's defaults turned them off), ``multi-thread-on`` the
multi-thread term alone; ``knapsack-best`` runs the gain and the ratio pass and keeps the better,
``knapsack-ratio`` the ratio pass alone (the defaults: ``gain``)."""
