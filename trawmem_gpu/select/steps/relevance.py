"""Stage 2, step 3 (design note), the ``learned`` affinity: alpha(v) = p(v) / max over the bank of p,
with p(v) = sigmoid(w . f_q(v) + b) a logistic model of "v is evidence for q".

The design note leaves the fusion of dense and lexical evidence open; this fuses them, and a few
other generic cues, with weights learned from labelled questions (``trawmem train-affinity``)
instead of a fixed rank fusion. Every feature describes a query-unit pair without naming a data
set, a person or a topic (:data:`RELEVANCE_FEATURES`, in this order):

==================  ==========================================================================
``cos``             cos(z_q, e_v)
``bm25``            BM25(q, v) / max over the bank (0 when no term matches)
``rrf_cos``         1 / (k + rank of v by cosine)              (k = ``SelectConfig.rrf_k``)
``rrf_bm25``        1 / (k + rank of v by BM25), 0 when BM25(q, v) = 0
``top_cos``         1 / (5 + rank by cosine): the same ranks with weight on the first few
``top_bm25``        1 / (5 + rank by BM25), 0 when BM25(q, v) = 0
``speaker_named``   1 when v's speaker is named in the question (a whole word, any case)
``temporal_match``  z_temp(q) x [v holds a temporal expression]
``context_cos``     the larger ``cos`` of v's neighbours in its session (the turn before / after)
``context_rrf``     the larger ``rrf_cos + rrf_bm25`` of those neighbours
``date_match``      for a question that points at a time relative to its own date ("two weeks
                    ago", "last month"): max over those times of exp(-|age(v) - age| / tolerance)
                    with age(v) = days from v's date to the question's (``text_features.relative_dates``);
                    0 without a question date
``words``           log(1 + min(words of v, ``WORDS_CAP``)): how much v says, up to about a
                    sentence (its text and image caption, split on white space). Short replies
                    ("Wow, great!") seldom hold evidence; past a sentence, more words are not more
                    relevance, and a token budget pays for them already
==================  ==========================================================================

Exactness: the features are elementwise IEEE operations on the cosines, BM25 scores and ranks
(the ranks of the ``rrf`` affinity: descending, ties to the lower unit), summed in the fixed
order of :data:`RELEVANCE_FEATURES` (:func:`logits`); the exponentials are one NumPy call
(``date_match``) and one compiled function (the sigmoid, :func:`affinity_from_logits`) that every
CPU path calls. So the NumPy reference and the engine's CPU path compute the same bits from the
same cosines; CUDA computes the same formulas in torch.
"""
from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._jit import njit
from ..config import RELEVANCE_FEATURES  # noqa: F401 - the one order of the features (re-exported)
from ..objective import date_seconds
from ..tensor_ops import NEG_INF, ranks, ranks_positive
from ..text_features import SMALL_BATCH, demand_features, relative_dates, temporal_flags
from ...store.bursts import unit_members
from ...store.turn_columns import field_of
from .candidates import ranks_of

TOP_K = 5.0
"""The k of the ``top_*`` rank features."""
WORDS_CAP = 20
"""Words past which the ``words`` feature stops growing (about one sentence)."""


class RelevanceStatic(NamedTuple):
    """The query-independent inputs of the features, per unit of one bank."""

    speaker: np.ndarray
    """[N] int64 index into ``speakers``."""
    speakers: tuple[str, ...]
    prev: np.ndarray
    """[N] int64 the unit before in the same session, -1 for none."""
    next: np.ndarray
    """[N] int64 the unit after in the same session, -1 for none."""
    temporal: np.ndarray
    """[N] float64 1 where the unit's text holds a temporal expression."""
    time: np.ndarray
    """[N] float64 the unit's date in POSIX seconds (NaN when the source gave none)."""
    words: np.ndarray
    """[N] float64 the ``words`` feature (:func:`words_feature`)."""


def word_counts(turns) -> np.ndarray:
    """``[N]`` float64 words of each unit's text and caption (split on white space)."""
    return np.array([len(f"{x or ''} {c or ''}".split()) for x, c in zip(field_of(turns, "text"), field_of(turns, "caption"))],
                    dtype=np.float64)


def words_feature(turns) -> np.ndarray:
    """``[N]`` float64 log(1 + min(words, WORDS_CAP)) of each unit (:func:`word_counts`)."""
    return np.log1p(np.minimum(word_counts(turns), float(WORDS_CAP)))


def relevance_static(bank, temporal: np.ndarray | None = None) -> RelevanceStatic:
    """The :class:`RelevanceStatic` of ``bank`` (``temporal``: the bank's ``temporal_flags`` when
    the caller has them already, so the regexes run once per bank)."""
    turns = bank.turns  # its fields read whole (``field_of``: a loaded bank's columns make no Turn per unit)
    said = field_of(turns, "speaker")
    speakers = tuple(dict.fromkeys(said))
    pos = {s: i for i, s in enumerate(speakers)}
    ses = np.array(field_of(turns, "session"), dtype=np.int64)
    n = len(turns)
    idx = np.arange(n, dtype=np.int64)
    same_prev = np.concatenate([[False], ses[1:] == ses[:-1]])
    same_next = np.concatenate([ses[:-1] == ses[1:], [False]])
    prev, nxt = np.where(same_prev, idx - 1, -1), np.where(same_next, idx + 1, -1)
    if getattr(bank, "is_view", False):
        prev, nxt = _layered_context(turns, ses)
    return RelevanceStatic(np.array([pos[s] for s in said], dtype=np.int64), speakers, prev, nxt,
                           temporal_flags(field_of(turns, "text")) if temporal is None else temporal,
                           np.array([date_seconds(t) for t in field_of(turns, "time")], dtype=np.float64),
                           words_feature(turns))


def _layered_context(turns, ses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The session context of a unit view's units (``store.view``): a turn's neighbours are the turns
    before and after it in its session (the layer units between are skipped, so a turn's features
    are what they are in its bank); a fact's are its first source turn's (it restates that turn, in
    that place of the conversation); a profile section has none."""
    n = len(turns)
    prev, nxt = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    ti = [i for i, t in enumerate(turns) if getattr(t, "layer", "turns") == "turns"]
    for a, b in zip(ti, ti[1:]):
        if ses[a] == ses[b]:
            nxt[a], prev[b] = b, a
    where = {m: i for i in ti for m in unit_members(turns[i])}  # a burst: each member names it
    for i, t in enumerate(turns):
        if getattr(t, "layer", "turns") == "facts" and t.cited_turns and t.cited_turns[0] in where:
            src = where[t.cited_turns[0]]
            prev[i], nxt[i] = prev[src], nxt[src]
    return prev, nxt


def speakers_named(question: str, speakers: tuple[str, ...]) -> np.ndarray:
    """``[S]`` float64: 1 for each speaker whose name appears in ``question`` as a whole word."""
    return np.array(_named(question, speakers), dtype=np.float64)


def _named(question: str, speakers) -> list[float]:
    """:func:`speakers_named` as a list (a batch concatenates them once). On an ASCII question and
    an ASCII name the case-blind search folds case as ``str.lower`` does, so the question's lower
    case is searched for the name's without re.I (faster), and only where it holds the name as a
    substring (a match needs one)."""
    if not question.isascii():
        return [1.0 if f is not None and f(question) else 0.0 for f, _, _ in _speaker_searches(tuple(speakers))]
    low = question.lower()
    return [0.0 if f is None else (1.0 if f(question) else 0.0) if key is None
            else (1.0 if key in low and g(low) else 0.0) for f, key, g in _speaker_searches(tuple(speakers))]


@functools.lru_cache(maxsize=1 << 12)
def _speaker_searches(speakers: tuple[str, ...]) -> tuple:
    """Each speaker's ``(whole-word case-blind search, lower-case name, whole-word search of the
    lower-case name without re.I)``, the last two None for a name that is not ASCII (all three
    for a blank name), compiled once per bank's speakers rather than escaped and looked up per
    question."""
    out = []
    for s in speakers:
        name = s.strip()
        if not name:
            out.append((None, None, None))
        else:
            word = lambda x: r"(?<!\w)" + re.escape(x) + r"(?!\w)"
            low = name.lower() if name.isascii() else None
            out.append((re.compile(word(name), re.I).search, low,
                        None if low is None else re.compile(word(low)).search))
    return tuple(out)


def date_match(time: np.ndarray, question: str, now: float) -> np.ndarray | None:
    """``[N]`` the ``date_match`` feature, or None when it is 0 everywhere (no question date, or the
    question names no relative time)."""
    if now != now:  # NaN: no date
        return None
    targets = relative_dates(question)
    if not targets:
        return None
    age = (now - time) / 86400.0
    out = np.zeros(len(time))
    for a, tol in targets:
        m = np.exp(-np.abs(age - a) / tol)
        out = np.maximum(out, np.where(m == m, m, 0.0))  # units without a date: 0
    return out


# ----------------------------------------------------------------------------------------------
# reference (NumPy, one query over its whole bank)
# ----------------------------------------------------------------------------------------------
def _rank_desc(x: np.ndarray) -> np.ndarray:
    n = len(x)
    r = np.empty(n)
    r[np.lexsort((np.arange(n), -x))] = np.arange(1, n + 1)
    return r


def _context(x: np.ndarray, st: RelevanceStatic) -> np.ndarray:
    p = np.where(st.prev >= 0, x[np.maximum(st.prev, 0)], 0.0)
    q = np.where(st.next >= 0, x[np.maximum(st.next, 0)], 0.0)
    return np.maximum(p, q)


def relevance_features(st: RelevanceStatic, cos: np.ndarray, bm25: np.ndarray, question: str, now: float,
                       rrf_k: float) -> np.ndarray:
    """``[N, F]`` the features of every unit of one bank for one query (``cos``, ``bm25``: ``[N]``)."""
    pos = bm25 > 0
    rc, rb = _rank_desc(cos), _rank_desc(bm25)
    mx = bm25.max() if len(bm25) else 0.0
    rrf_c = 1.0 / (rrf_k + rc)
    rrf_b = np.where(pos, 1.0 / (rrf_k + rb), 0.0)
    z_temp = demand_features(question)[1]
    dm = date_match(st.time, question, now)
    return np.stack([cos, bm25 / mx if mx > 0 else np.zeros_like(bm25), rrf_c, rrf_b, 1.0 / (TOP_K + rc),
                     np.where(pos, 1.0 / (TOP_K + rb), 0.0), speakers_named(question, st.speakers)[st.speaker],
                     z_temp * st.temporal, _context(cos, st), _context(rrf_c + rrf_b, st),
                     dm if dm is not None else np.zeros(len(cos)), st.words], axis=-1)


def logits(F, w) -> np.ndarray | Tensor:
    """``F [..., F] . w[:F] + w[F]``, summed left to right over the features (plain elementwise
    operations: NumPy and torch give the same bits)."""
    out = F[..., 0] * w[0]
    for k in range(1, F.shape[-1]):
        out = out + F[..., k] * w[k]
    return out + w[F.shape[-1]]


@njit(cache=True)
def _sigmoid_rows(s, n, out):  # pragma: no cover - compiled
    """``out[q, :n[q]] = sigmoid(s[q, :n[q]]) / max``; the rest 0."""
    for q in range(s.shape[0]):
        mx = 0.0
        for j in range(n[q]):
            p = 1.0 / (1.0 + math.exp(-s[q, j]))
            out[q, j] = p
            if p > mx:
                mx = p
        for j in range(n[q]):
            out[q, j] = out[q, j] / mx
        for j in range(n[q], s.shape[1]):
            out[q, j] = 0.0


def affinity_from_logits(s: np.ndarray, n: np.ndarray | None = None) -> np.ndarray:
    """alpha = sigmoid(s) / its max over the first ``n[q]`` (live) entries of each row of ``s``
    (``[N]`` or ``[Q, N]``), 0 past them: one compiled function, so every CPU path computes the
    same exponentials (NumPy's and numba's ``exp`` may differ in the last bit)."""
    s2 = np.ascontiguousarray(np.atleast_2d(s), dtype=np.float64)
    n = np.full(len(s2), s2.shape[1], dtype=np.int64) if n is None else np.ascontiguousarray(n, dtype=np.int64)
    out = np.empty_like(s2)
    _sigmoid_rows(s2, n, out)
    return out.reshape(np.shape(s))


def learned_affinity(st: RelevanceStatic, cos: np.ndarray, bm25: np.ndarray, question: str, now: float,
                     cfg) -> np.ndarray:
    """``[N]`` alpha of the ``learned`` affinity for one query (the reference)."""
    F = relevance_features(st, cos, bm25, question, now, float(cfg.rrf_k))
    return affinity_from_logits(logits(F, np.asarray(cfg.relevance_weights, dtype=np.float64)))


# ----------------------------------------------------------------------------------------------
# torch (a batch of queries, each over its own bank's N units; padding after them)
# ----------------------------------------------------------------------------------------------
class RelevanceRows(NamedTuple):
    """The static inputs gathered per query row, ``[Q, N]`` (padding: speaker 0, no neighbours)."""

    speaker: Tensor
    prev: Tensor
    """bank-local, -1 for none."""
    next: Tensor
    temporal: Tensor
    time: Tensor
    words: Tensor
    """the ``words`` feature (0 on padding)."""


def learned_affinity_torch(cos: Tensor, umask: Tensor, lex: Tensor, rows: RelevanceRows, named: Tensor,
                           z_temp: Tensor, date_cols: dict[int, np.ndarray], cfg) -> Tensor:
    """``alpha [Q, N]`` of the ``learned`` affinity (0 off ``umask``: padding, and units a filter's
    mask leaves out, whose BM25 scores in ``lex`` and whose slots in ``rows.prev`` / ``rows.next``
    the caller has cleared; the live units need not be a prefix).

    :param named: ``[Q, S]`` :func:`speakers_named` of each query against its bank's speakers
        (padded with 0), indexed by ``rows.speaker``
    :param z_temp: ``[Q]`` each question's temporal cue
    :param date_cols: row -> ``[n]`` :func:`date_match` for the few queries where it is not 0
    """
    k = float(cfg.rrf_k)
    pos = lex > 0
    rc = ranks(cos, umask)
    rb = ranks_positive(lex)
    mx = lex.amax(dim=1, keepdim=True)
    zero = torch.zeros((), dtype=cos.dtype, device=cos.device)
    rrf_c = 1.0 / (k + rc)
    rrf_b = torch.where(pos, 1.0 / (k + rb), zero)

    def context(x: Tensor) -> Tensor:
        p = torch.where(rows.prev >= 0, torch.gather(x, 1, rows.prev.clamp(min=0)), zero)
        q = torch.where(rows.next >= 0, torch.gather(x, 1, rows.next.clamp(min=0)), zero)
        return torch.maximum(p, q)

    dm = torch.zeros_like(cos)
    for q, col in date_cols.items():
        dm[q, :len(col)] = torch.as_tensor(col, dtype=cos.dtype, device=cos.device)
    F = torch.stack([cos, torch.where(mx > 0, lex / torch.where(mx > 0, mx, 1.0), zero), rrf_c, rrf_b,
                     1.0 / (TOP_K + rc), torch.where(pos, 1.0 / (TOP_K + rb), zero), torch.gather(named, 1, rows.speaker),
                     z_temp[:, None] * rows.temporal, context(cos), context(rrf_c + rrf_b), dm, rows.words], dim=-1)
    s = logits(F, torch.as_tensor(cfg.relevance_weights, dtype=cos.dtype, device=cos.device))
    if s.device.type == "cpu":  # the reference's exponential: same bits (-inf off the live units: 0, no maximum)
        alpha = torch.from_numpy(affinity_from_logits(torch.where(umask, s, NEG_INF).numpy())).to(cos.dtype)
    else:
        p = torch.where(umask, torch.sigmoid(s), zero)
        alpha = p / p.amax(dim=1, keepdim=True)
    return torch.where(umask, alpha, zero)


# ----------------------------------------------------------------------------------------------
# compiled (numba, one query at a time): the engine's compiled front
# ----------------------------------------------------------------------------------------------
class LearnedTables(NamedTuple):
    """Per stored unit: ``rel_idx [units, 3]`` (speaker, previous, next: bank-local), the temporal
    flag and the ``words`` feature."""

    rel_idx: np.ndarray
    temporal: np.ndarray
    words: np.ndarray


def learned_tables(n: dict) -> LearnedTables:
    """The :class:`LearnedTables` of an engine's stored tables ``n`` (name -> NumPy array), or
    placeholders for an engine without the learned affinity's tables."""
    if n["rel_idx"].shape[1] != 3:
        return no_learned_tables(n["temporal"])
    return LearnedTables(n["rel_idx"], n["temporal"], n["rel_words"])


def no_learned_tables(temporal: np.ndarray | None = None) -> LearnedTables:
    """Placeholder :class:`LearnedTables` where the learned affinity is off: one row each, in the
    stored tables' dtypes (``rel_idx`` int32), so compiled readers see one argument type;
    ``temporal``: the engine's own table where a reader still takes it (default one 0.0)."""
    return LearnedTables(np.zeros((1, 3), np.int32), np.zeros(1) if temporal is None else temporal, np.zeros(1))


class LearnedQueries(NamedTuple):
    """The question cues of a chunk's queries (row ``q`` in chunk order) and the weights."""

    named: np.ndarray
    """Flat float64: query q's :func:`speakers_named` at ``named_off[q]:``."""
    named_off: np.ndarray
    z_temp: np.ndarray
    """[Qc] the temporal cue of each question."""
    dm: np.ndarray
    """Flat float64: query q's :func:`date_match` at ``dm_off[q]:`` (``dm_off[q] < 0``: none)."""
    dm_off: np.ndarray
    w: np.ndarray
    """[F + 1] ``relevance_weights``."""
    rrf_k: float


def learned_queries(questions: list[str], speakers: list[tuple], times: list[np.ndarray], now: np.ndarray,
                    cfg, z_temp: np.ndarray | None = None) -> LearnedQueries:
    """The :class:`LearnedQueries` of a chunk: ``speakers[q]`` / ``times[q]`` of each query's bank
    (``times[q]`` is read only where ``now[q]`` is a date). ``z_temp``: the questions' temporal
    cue (column 1 of ``text_features.demand_matrix``) when the caller has it (None: from the cache)."""
    from .roles import demand_features_cached

    if z_temp is None:
        z_temp = np.array([demand_features_cached(t)[1] for t in questions], dtype=np.float64)
    elif len(z_temp) != len(questions):
        raise ValueError(f"learned_queries: {len(z_temp)} z_temp values for {len(questions)} questions")
    Q = len(questions)
    if Q < SMALL_BATCH:  # a few questions: one by one, without the batch's arrays
        return _few_queries(questions, speakers, times, now, cfg, z_temp)
    named_off = np.zeros(Q + 1, dtype=np.int64)
    np.cumsum([len(sp) for sp in speakers], out=named_off[1:])
    named = _named_batch(questions, speakers, named_off)
    dm, dm_off = [], np.full(Q, -1, dtype=np.int64)
    k = 0
    now = np.asarray(now, dtype=np.float64).reshape(Q)
    for q in np.flatnonzero(now == now).tolist():  # the dated queries (NaN: no date, no date_match)
        col = date_match(times[q], questions[q], float(now[q]))
        if col is not None:
            dm_off[q] = k
            dm.append(col)
            k += len(col)
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0)
    return LearnedQueries(named, named_off[:Q], np.ascontiguousarray(z_temp, dtype=np.float64), cat(dm), dm_off,
                          np.asarray(cfg.relevance_weights, dtype=np.float64), float(cfg.rrf_k))


def _few_queries(questions: list[str], speakers: list[tuple], times: list[np.ndarray], now: np.ndarray, cfg,
                 z_temp: np.ndarray) -> LearnedQueries:
    """:func:`learned_queries` question by question (its form for calls of fewer than
    ``text_features.SMALL_BATCH`` questions: the same arrays)."""
    named, named_off, dm, dm_off = [], [], [], []
    n = k = 0
    for text, sp, tm, t_now in zip(questions, speakers, times, np.asarray(now, dtype=np.float64).tolist()):
        named_off.append(n)
        named += _named(text, sp)
        n += len(sp)
        col = None if t_now != t_now else date_match(tm, text, t_now)  # NaN: no date
        if col is None:
            dm_off.append(-1)
        else:
            dm_off.append(k)
            dm.append(col)
            k += len(col)
    return LearnedQueries(np.array(named, dtype=np.float64), np.asarray(named_off, np.int64),
                          np.ascontiguousarray(z_temp, dtype=np.float64),
                          np.concatenate(dm) if dm else np.zeros(0), np.asarray(dm_off, np.int64),
                          np.asarray(cfg.relevance_weights, dtype=np.float64), float(cfg.rrf_k))


def _named_batch(questions: list[str], speakers: list[tuple], named_off: np.ndarray) -> np.ndarray:
    """Every query's :func:`_named` flat at ``named_off[q]`` (``[Q + 1]``): by the compiled scan
    (``text_scan.named_flat``) when numba imports and the call holds at least
    ``text_features.SMALL_BATCH`` questions, else :func:`_named_plain_batch`."""
    from .._jit import HAS_NUMBA

    from ..text_scan import named_flat

    if not HAS_NUMBA or len(questions) < SMALL_BATCH:
        return _named_plain_batch(questions, speakers)

    return named_flat(questions, speakers, named_off[:-1], int(named_off[-1]), _named)


def _named_plain_batch(questions: list[str], speakers: list[tuple]) -> np.ndarray:
    """:func:`_named_batch` question by question (the form before the compiled scan)."""
    named: list[float] = []
    for text, sp in zip(questions, speakers):
        named += _named(text, sp)
    return np.array(named, dtype=np.float64)


@njit(cache=True)
def learned_row(vals, m, bm, bmbits, u0, tab, lq, q, alpha, s, rc, rb, given, live):  # pragma: no cover - compiled
    """The ``learned`` affinity of one query's ``m`` units into ``alpha`` (``vals``: cosines, ``bm``:
    float32 BM25 and ``bmbits`` its int32 view, ``u0``: the bank's first stored unit, ``tab``
    :class:`LearnedTables`, ``lq`` :class:`LearnedQueries`, ``q`` the query's row there; scratch:
    ``s`` (``candidates.RankScratch``), ``rc`` and ``rb`` ``[>= m]``). The reference's features,
    ranks, summation order and exponential (:func:`relevance_features`, :func:`logits`,
    :func:`affinity_from_logits`), one unit at a time. ``given``: ``candidates.GivenRanks`` of the
    ``m`` units (their ranks in a bank they are a shortlist of, ``engine/shortlist.py``), or empty:
    the ranks among the ``m`` units. ``live [>= m]``: the units a filter's mask leaves
    (``steps.mask.hide_failing`` put the others last in ``vals`` and out of ``bm``; a masked query
    is given no ranks): a neighbour that is not live is no context, and the maximum is over the
    live units."""
    mx = 0.0
    for j in range(m):
        if bm[j] > 0 and np.float64(bm[j]) > mx:
            mx = np.float64(bm[j])
    ranks_of(vals, m, bmbits, bm, s, rc, rb, given)
    k = lq.rrf_k
    w = lq.w
    no = lq.named_off[q]
    do = lq.dm_off[q]
    zt = lq.z_temp[q]
    for j in range(m):  # rrf_cos + rrf_bm25 of each unit, for the context feature (in alpha until used)
        alpha[j] = 1.0 / (k + rc[j]) + (1.0 / (k + rb[j]) if bm[j] > 0 else 0.0)
    pmax = 0.0
    for j in range(m):
        g = u0 + j
        pv = tab.rel_idx[g, 1]
        nx = tab.rel_idx[g, 2]
        pv = pv if pv >= 0 and live[pv] else -1
        nx = nx if nx >= 0 and live[nx] else -1
        ctx_cos = max(vals[pv] if pv >= 0 else 0.0, vals[nx] if nx >= 0 else 0.0)
        ctx_rrf = max(alpha[pv] if pv >= 0 else 0.0, alpha[nx] if nx >= 0 else 0.0)
        pos_b = bm[j] > 0
        sc = vals[j] * w[0]
        sc = sc + (np.float64(bm[j]) / mx if mx > 0 else 0.0) * w[1]
        sc = sc + (1.0 / (k + rc[j])) * w[2]
        sc = sc + ((1.0 / (k + rb[j])) if pos_b else 0.0) * w[3]
        sc = sc + (1.0 / (TOP_K + rc[j])) * w[4]
        sc = sc + ((1.0 / (TOP_K + rb[j])) if pos_b else 0.0) * w[5]
        sc = sc + lq.named[no + tab.rel_idx[g, 0]] * w[6]
        sc = sc + (zt * tab.temporal[g]) * w[7]
        sc = sc + ctx_cos * w[8]
        sc = sc + ctx_rrf * w[9]
        sc = sc + (lq.dm[do + j] if do >= 0 else 0.0) * w[10]
        sc = sc + tab.words[g] * w[11]
        sc = sc + w[12]
        p = 1.0 / (1.0 + math.exp(-sc))
        rb[j] = p  # rb's rank is not read again after unit j (only earlier units' ranks were)
        if p > pmax and live[j]:
            pmax = p
    for j in range(m):
        alpha[j] = rb[j] / pmax
