"""Fitting the ``learned`` affinity (``SelectConfig.relevance_weights``) from labelled questions.

Each labelled question gives one row per unit of its bank: the features of
:mod:`trawmem_gpu.select.steps.relevance` (the very function selection uses) and the label "this
unit is gold evidence". The weights are those of an L2-regularized logistic regression, fitted by
L-BFGS in torch on standardized features (then mapped back to raw-feature weights). Every
question weighs the same (its rows share a weight of 1 / its bank's units), and every data set
weighs the same (its questions share 1 / its question count), so a benchmark with ten times the
questions does not decide the fusion alone and a bank of 600 units counts as much as one of 60.

Validation is by groups that share nothing (:func:`cross_validate`): a fold's weights are fitted
on every row outside it, and its questions are scored with them only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..select import weights_file
from ..select.config import RELEVANCE_FEATURES, SelectConfig
from ..select.context import BankContext
from ..select.objective import date_seconds
from ..select.steps.relevance import relevance_features
from ..store.bursts import unit_members

L2 = 1.0
"""Inverse regularization strength C of the fit (the loss is 0.5 |w|^2 + C * mean weighted log-loss
* rows), as scikit-learn's default."""


@dataclass
class LabelledQuestion:
    """One question's feature rows and labels (every unit of its bank)."""

    dataset: str
    bank_id: str
    qid: str
    group: str
    """Rows of one group are held out together (a conversation, or a fold of questions)."""
    category: int
    F: np.ndarray
    """[N, F] the relevance features."""
    y: np.ndarray
    """[N] 1.0 for gold units."""
    extra: dict = field(default_factory=dict)


def labelled_rows(ctx: BankContext, question: str, z: np.ndarray, gold_ids, now, cfg: SelectConfig) -> tuple:
    """``(F [N, F], y [N])`` for one question over its bank (the selection's own features); a unit
    is gold when it shows a gold message (a burst: any of its members)."""
    bank = ctx.bank
    cos = bank.unit_vecs.astype(np.float64) @ np.asarray(z, dtype=np.float64)
    F = relevance_features(ctx.relevance, cos, ctx.bm25.scores(question), question, date_seconds(now),
                           float(cfg.rrf_k))
    gold = set(gold_ids)
    return F, np.array([1.0 if gold.intersection(unit_members(t)) else 0.0 for t in bank.turns])


NEEDS_LABELS = ("the fit needs questions with gold evidence: LoCoMo categories 1-4 with evidence, LongMemEval "
                "questions with a has_answer user turn, not abstention ones; a turns JSONL has no questions")
"""What :func:`load_labelled` keeps, for the errors that find nothing to fit on."""


def row_weights(questions: list[LabelledQuestion]) -> np.ndarray:
    """Per unit row of ``questions`` (concatenated), the fit's sample weight: every data set and,
    within it, every question weighs the same (mean 1)."""
    n_ds = {}
    for q in questions:
        n_ds[q.dataset] = n_ds.get(q.dataset, 0) + 1
    w = np.concatenate([np.full(len(q.y), 1.0 / len(q.y) / n_ds[q.dataset]) for q in questions])
    return w / w.mean()


ZERO_WEIGHT = 1e-12
"""A fit whose every standardized feature weight is at most this (in magnitude) is refused: with
a ``C`` so small (``1e-300``) the L2 term wins and the weights are zero."""


def fit_relevance(questions: list[LabelledQuestion], C: float = L2, max_iter: int = 500) -> tuple[float, ...]:
    """The relevance weights (one per feature, then the bias) fitted on ``questions``.

    :param C: inverse L2 strength, a finite number above 0 (``ConfigError`` naming ``C`` otherwise,
        when the fit still diverges: non-finite weights, and when it yields zero weights: every
        standardized feature weight at most ``ZERO_WEIGHT``)
    :raises InputError: no questions
    """
    from ..errors import ConfigError, InputError

    if isinstance(C, bool) or not isinstance(C, (int, float)) or not 0 < C < math.inf:
        raise ConfigError(f"C must be a finite number above 0, got {C!r} (0 fits all-zero weights, a negative C "
                          "maximizes the loss)")
    if not questions:
        raise InputError(f"no labelled questions to fit the affinity on ({NEEDS_LABELS})")
    X = np.concatenate([q.F for q in questions])
    y = np.concatenate([q.y for q in questions])
    w = row_weights(questions)
    mu, sd = X.mean(axis=0), X.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    Xt = torch.as_tensor((X - mu) / sd, dtype=torch.float64)
    yt, wt = torch.as_tensor(y, dtype=torch.float64), torch.as_tensor(w, dtype=torch.float64)
    beta = torch.zeros(X.shape[1], dtype=torch.float64, requires_grad=True)
    b0 = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([beta, b0], max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        s = Xt @ beta + b0
        loss = (wt * torch.nn.functional.binary_cross_entropy_with_logits(s, yt, reduction="none")).sum()
        loss = C * loss + 0.5 * (beta * beta).sum()
        loss.backward()
        return loss

    opt.step(closure)
    coef = beta.detach().numpy() / sd
    bias = float(b0.detach()) - float((beta.detach().numpy() * mu / sd).sum())
    out = tuple(float(x) for x in coef) + (bias,)
    if not all(math.isfinite(x) for x in out):
        raise ConfigError(f"the affinity fit diverged (non-finite weights) at C = {C:g}; a smaller C "
                          "regularizes more")
    if not np.any(np.abs(beta.detach().numpy()) > ZERO_WEIGHT):
        raise ConfigError(f"C = {C:g} regularizes the affinity fit to zero weights (every feature's weight is "
                          f"0: the affinity would rank every unit the same); a larger C regularizes less (the "
                          f"default is {L2:g})")
    return out


def cross_validate(questions: list[LabelledQuestion], C: float = L2) -> dict[str, tuple[float, ...]]:
    """``{group: weights fitted on every other group}``."""
    groups = sorted({q.group for q in questions})
    return {g: fit_relevance([q for q in questions if q.group != g], C) for g in groups}


def labelled_banks(path: str | Path, *, view: str = "plain", progress: bool = False, dayfirst: bool = False,
                   encoder=None, only: set | None = None) -> tuple[list, dict]:
    """``(conversations, {bank_id: stored bank})`` of a benchmark file under ``view``
    (``data.chat_views``), built once into the bank cache (a view's banks apart, keyed by the view
    too): the banks :func:`load_labelled` selects from, as stored (one unit per message).
    ``only``: the bank ids to build and load (every conversation is still returned)."""
    from ..ingest.config import BuildConfig
    from ..data import detect_format, load_conversations
    from ..data.chat_views import apply_view, view_spec

    path = Path(path)
    fmt = detect_format(path)
    spec = view_spec(view)
    if fmt != "longmemeval" and view == "plain":
        from ..eval.retrieval import banks_for

        convs, blist, _ = banks_for(path, BuildConfig(), None, progress, encoder, dayfirst=dayfirst)
        return convs, {b.bank_id: b for b in blist}
    from ..ingest.cache import build_identity, default_bank_dir, ensure_collection
    from ..paths import file_sha256
    from ..store import Collection

    convs = apply_view(load_conversations(path, dayfirst=dayfirst), view)
    ident = build_identity(file_sha256(path), BuildConfig(), "user" if fmt == "longmemeval" else "all",
                           dayfirst=dayfirst)
    if view != "plain":
        ident["view"] = spec.to_dict()
    bdir = default_bank_dir(ident)
    chosen = [c for c in convs if only is None or c.bank_id in only]
    ensure_collection(chosen, bdir, ident, BuildConfig(), encoder=encoder, progress=progress)
    coll = Collection(bdir)
    return convs, {c.bank_id: coll.load(c.bank_id) for c in chosen}


def load_labelled(path: str | Path, cfg: SelectConfig | None = None, *, dataset: str | None = None,
                  folds: int = 5, seed: int = 0, progress: bool = False, dayfirst: bool = False,
                  view: str = "plain", loaded: tuple | None = None):
    """The labelled questions of a benchmark file, with their banks and question vectors.

    LoCoMo-layout files: categories 1-4 with gold evidence, grouped by conversation. LongMemEval:
    every question with a gold user turn except abstention ones, grouped into ``folds`` folds
    (a seeded shuffle). ``view``: the file's conversations under a real-chat view
    (``data.chat_views``, :func:`labelled_banks`); the questions, groups and folds are the plain
    file's. Each bank is selected from as its unit view (``store.view.unit_view``: bursts of
    messages as units). ``loaded``: :func:`labelled_banks`'s answer for these arguments, when the
    caller has it. Returns ``(questions, contexts {bank_id: BankContext})``.
    """
    from ..ingest.config import BuildConfig
    from ..data import detect_format
    from ..encode import get_encoder
    from ..store.view import unit_view

    cfg = cfg or SelectConfig()
    path = Path(path)
    fmt = detect_format(path)
    enc = get_encoder(BuildConfig().encoder)
    convs, banks = loaded or labelled_banks(path, view=view, progress=progress, dayfirst=dayfirst, encoder=enc)
    if fmt == "longmemeval":
        from ..data.longmemeval import is_abstention

        items = [(c.bank_id, q) for c in convs for q in c.questions if q.evidence and not is_abstention(q.qid)]
        order = np.random.RandomState(seed).permutation(len(items))
        group = {items[i][1].qid: f"fold{j % folds}" for j, i in enumerate(order)}
    else:
        items = [(c.bank_id, q) for c in convs for q in c.questions if q.category in (1, 2, 3, 4) and q.evidence]
        group = {q.qid: bid for bid, q in items}
    items = [(b, q) for b, q in items if b in banks]  # the folds are the whole file's
    dataset = dataset or path.name.split(".")[0]
    ctxs = {b: BankContext.of(unit_view(bank)) for b, bank in banks.items()}
    Z = enc.encode([q.question for _, q in items], is_query=True, progress=progress, desc="encode questions")
    out = []
    for (bid, q), z in zip(items, Z):
        F, y = labelled_rows(ctxs[bid], q.question, z, q.evidence, q.date, cfg)
        out.append(LabelledQuestion(dataset, bid, q.qid, f"{dataset}:{group[q.qid]}", q.category, F, y,
                                    {"question": q.question, "date": q.date, "z": z, "evidence": q.evidence}))
    return out, ctxs


def save_weights(path: str | Path, weights, meta: dict | None = None) -> Path:
    """``weights_file.save_weights`` for the ``learned`` affinity's features."""
    return weights_file.save_weights(path, weights, RELEVANCE_FEATURES, meta)


def load_weights(path: str | Path, label: str = "`affinity_weights`") -> tuple[float, ...]:
    """``weights_file.load_weights`` for the ``learned`` affinity's features (``label``: how errors
    name the file's source)."""
    return weights_file.load_weights(path, RELEVANCE_FEATURES, label)
