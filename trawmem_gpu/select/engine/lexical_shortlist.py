"""BM25 of a large bank's shortlist without adding every posting of the query's terms
(``shortlist.py``, steps 1 and 3).

Exact BM25 (:func:`bm25_sparse`) adds every posting of the query's columns: at 10^6 units a
common term holds tens of thousands of them, and ranking them all by ``np.lexsort`` took more than
the rest of the query. A query whose columns hold more than :data:`EXACT_POSTINGS` postings is
read in one compiled pass by default (:data:`DENSE`, ``lexical_dense``: the same float32 scores,
the exact top and exact ranks counted for the units asked, with no sort of every posting;
``lexical_merge`` by default, :data:`MERGED`), or,
with ``DENSE`` off, from two orders of the same postings (approximate ranks below a bound):

* **impact order** (:func:`impact_order`, built once per bank and kept with it): each column's
  postings by score descending, unit ascending. The union of every column's ``M`` best postings
  are the candidates, and the ``M`` best of them by their whole score are the proposals;
* **unit order** (the store's own): any unit's score is the sum over the query's columns of its
  posting in each (a binary search per column, float32 in the query's token order, as bm25s adds
  them: :func:`scores_at`), so the working set's scores are exact.

A unit that is not a candidate scores at most ``bound``, the sum over the columns of each one's
``M``-th best posting (0 for a column whose every posting is a candidate): the threshold
algorithm's stopping bound. So every unit scoring more than ``bound`` is a candidate, and its
rank (1 + the units scoring more, ties to the lower unit) is counted exactly among them; the
rank of a unit scoring ``bound`` or less is estimated from the bank's rank sample scored the
same way (as the cosine ranks past the index's proposals are), and is at least its rank among
the candidates. The bank's largest score is a candidate's.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from .._jit import njit
from . import lexical_dense, lexical_merge
from .tables import Snapshot

EXACT_POSTINGS = 1 << 15
"""A query whose columns hold at most this many postings is scored over all of them (exactly)."""
MAX_DEPTH = 1 << 13
"""Most postings read from the top of each column (the depth doubles from ``M`` until the ``M``
best candidates are certain: the ``M``-th scores more than the bound)."""
DENSE = True
"""Past ``EXACT_POSTINGS``, every posting is added in one compiled pass (``lexical_dense``: exact
scores and ranks) instead of the impact-ordered reading below."""
RANK_TABLE = True
"""Counted ranks are read from a table built once per query (``lexical_dense.rank_table``)
instead of a pass over every touched unit per front round (``lexical_dense.counted_ranks``)."""
RADIX_ORDER = True
"""A query read exactly (at most ``EXACT_POSTINGS`` postings) orders its touched units by a
compiled radix sort of their scores (``lexical_dense.rank_table``) instead of ``np.lexsort``
(the plain form, False: the same order; :func:`_ranked`)."""
MERGED = True
"""Past ``EXACT_POSTINGS`` (:data:`DENSE`), the touched units are read ascending, block by block,
and the query's rank table is built at once (sorted by counting its distinct scores; its first
``M`` keys are the top) and kept (``lexical_merge``), instead of ``lexical_dense.accumulate``'s
sweeps of a bank-long accumulator, its top-``M`` heap and the table's radix sort at the first ranks
(False: that form, the plain reference; the same scores, top and ranks). The ascending units also
give the working set its scores (:func:`scores_of`)."""
COUNTED_RANKS = True
"""With :data:`MERGED`, a query of at most ``lexical_merge.FEW_SCORES`` distinct scores keeps every
touched unit's rank (``lexical_merge.score_ranks``: exact, as the sparse reading's) instead of the
rank table (a unit's rank one binary search away, not four); False: the table (the same ranks)."""
MERGED_POSTINGS = 0
"""With :data:`MERGED` (and :data:`DENSE`), a query whose columns hold more than this many postings
takes the compiled reading in place of ``EXACT_POSTINGS``: it is cheaper than :func:`bm25_sparse`'s
``np.unique`` and ``np.add.at`` at any size (10^5 units: ``lexical`` 0.88 -> 0.17 ms a query) and
exact too; a filtered query (``keep``) is read by :func:`bm25_sparse`."""
_LOCK = threading.Lock()


class Lexical(NamedTuple):
    """One query's BM25 over a bank, as the shortlist reads it."""

    top: np.ndarray
    """The proposals: the ``M`` best units by score (ties to the lower unit)."""
    units: np.ndarray
    """Units whose score and rank are known (ascending): every unit of positive score (exact), or
    the candidates."""
    scores: np.ndarray
    """Their float32 scores ..."""
    rank: np.ndarray
    """... and their ranks among the bank's units of positive score (among themselves)."""
    bound: float
    """A unit outside ``units`` scores at most this (-1: ``units`` holds every unit of positive score)."""
    sample: np.ndarray
    """Scores of the bank's rank sample, ascending (empty when exact)."""
    n_bank: int
    """Units of the bank."""
    counted: bool = False
    """``units`` / ``scores`` hold every unit of positive score in no order (``rank`` empty): ranks
    are counted over them (``lexical_dense``), exactly."""
    memo: list | None = None
    """Counted ranks: ``[lexical_dense.rank_table]`` once the query's first ranks are read (built
    with the reading itself with :data:`MERGED`) (:data:`RANK_TABLE`), else ``[(units ascending,
    their ranks)]`` counted so far for this query (a grown working set counts only the units it adds)."""
    ascending: bool = False
    """``units`` are ascending and hold every unit of positive score with its exact score (no
    filter): :func:`scores_of` reads a unit's score there."""


def bm25_sparse(snap: Snapshot, bank: int, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(units ascending, float32 BM25)`` of the units a query's BM25 columns ``cols`` (store
    columns, token order) touch: each unit's postings added in token order, as bm25s does."""
    st = snap.bm25.store
    nz = int(st.nz0[bank])
    us, vs = [], []
    for t in cols.tolist():
        s, e = nz + int(st.ptr[t]), nz + int(st.ptr[t + 1])
        us.append(st.idx[s:e])
        vs.append(st.data[s:e])
    if not us or not sum(len(u) for u in us):
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    u, v = np.concatenate(us).astype(np.int64), np.concatenate(vs).astype(np.float32)
    uniq, inv = np.unique(u, return_inverse=True)
    acc = np.zeros(len(uniq), dtype=np.float32)
    np.add.at(acc, inv, v)
    return uniq, acc


def warm(snap: Snapshot) -> None:
    """Compile (or load from numba's cache) the compiled pass :func:`lexical` takes past
    ``EXACT_POSTINGS`` (:data:`DENSE`, :data:`RANK_TABLE`), by running it over no posting with the
    store's own arrays, so with the argument types a query passes. Only a query whose columns hold
    that many postings reaches it: without this, the first such query compiles ``lexical_dense``
    inside its own latency (5.4-7.9 CPU s with an empty numba cache, ~25 ms to load it from the
    cache; ``benchmarks/results/scale_outlier_1e5.json``). Cheap once compiled (empty arrays)."""
    if RADIX_ORDER:  # the exact reading's order (_ranked), with bm25_sparse's types
        lexical_dense.rank_table(np.zeros(0, np.int64), np.zeros(0, np.float32), lexical_dense.radix_scratch(0))
    if not DENSE:
        return
    st = snap.bm25.store
    none = np.zeros(1, np.int64)
    if MERGED:
        u, s = lexical_merge.dense_scores(st.idx, st.data, none, none, 1)
        keys, units, runs = lexical_merge.score_table(u, s, lexical_dense.radix_scratch(len(u)))
        lexical_merge.table_top(keys, units, 1)
        lexical_merge.score_ranks(u, s, 1)
        lexical_merge.scores_in(u, s, np.zeros(0, np.int64))
        lexical_dense.top_units(u, s, 1)
        lexical_dense.table_ranks(keys, units, runs, np.zeros(0, np.int64), np.zeros(0, np.float32))
        return
    u, s = lexical_dense.dense_scores(st.idx, st.data, none, none, 1)
    lexical_dense.top_units(u, s, 1)
    if RANK_TABLE:
        keys, units, runs = lexical_dense.rank_table(u, s, lexical_dense.radix_scratch(len(u)))
        lexical_dense.table_ranks(keys, units, runs, np.zeros(0, np.int64), np.zeros(0, np.float32))


def columns(snap: Snapshot, bank: int, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)``: the store positions of each query column's postings (``cols``: store columns)."""
    st = snap.bm25.store
    nz = int(st.nz0[bank])
    c = np.asarray(cols, dtype=np.int64)
    return nz + st.ptr[c].astype(np.int64), nz + st.ptr[c + 1].astype(np.int64)


def impact_order(snap: Snapshot, bank: int) -> tuple[np.ndarray, int]:
    """``(order, start)``: store positions of the bank's postings, each column's by score
    descending then unit ascending, laid out as the columns are (the posting at store position
    ``p`` of a column is replaced by ``order[p - start]``); built on first use and kept with the
    bank's ``BankInfo``."""
    info = snap.infos[bank]
    with _LOCK:
        got = info.cache.get("bm25_impact")
        if got is None:
            st = snap.bm25.store
            nz, c0, V = int(st.nz0[bank]), int(st.col0[bank]), len(snap.bm25.vocabs[bank])
            starts = st.ptr[c0:c0 + V].astype(np.int64)
            ends = np.concatenate([starts[1:], [_bank_nnz(snap, bank)]]).astype(np.int64)
            a = nz + (int(starts[0]) if V else 0)
            b = nz + (int(ends[-1]) if V else 0)
            col = np.repeat(np.arange(V), ends - starts)
            order = np.lexsort((st.idx[a:b], -st.data[a:b].astype(np.float64), col))
            got = info.cache["bm25_impact"] = ((a + order).astype(np.int64), a)
        return got


def _bank_nnz(snap: Snapshot, bank: int) -> int:
    st = snap.bm25.store
    nxt = [int(x) for x in st.nz0 if int(x) > int(st.nz0[bank])]
    return (min(nxt) if nxt else len(st.data)) - int(st.nz0[bank])


def _ranked(u: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rank, order)``: ``order`` sorts ``(s, u)`` by score descending, unit ascending, and
    ``rank[order] = 1 .. len(u)`` (so ``order`` is ``np.argsort(rank)``: its first ``M`` are the top).

    The plain order is ``np.lexsort((u, -s))``. With :data:`RADIX_ORDER`, ``u`` strictly ascending
    (as :func:`bm25_sparse` returns it) and every score a positive float32, it is read from
    ``lexical_dense.rank_table``'s keys instead: a stable radix sort by score descending of the
    positions ``0 .. len(u)``, so tied scores keep position order, which is unit order here (the
    same permutation; ``tests/select/test_lexical_shortlist.py``)."""
    if RADIX_ORDER and _radix_sortable(u, s):
        keys, _, _ = lexical_dense.rank_table(u, s, lexical_dense.radix_scratch(len(u)))
        order = keys & np.int64(0xFFFFFFFF)
    else:
        order = np.lexsort((u, -s))
    rank = np.empty(len(u))
    rank[order] = np.arange(1, len(u) + 1)
    return rank, order


def _radix_sortable(u: np.ndarray, s: np.ndarray) -> bool:
    """Whether :func:`_ranked` may read its order from a radix sort: int64 units strictly
    ascending (fewer than ``lexical_dense.KEY_UNITS``) with float32 scores, all positive and finite."""
    n = len(u)
    if n < 2 or n >= lexical_dense.KEY_UNITS or u.dtype != np.int64 or s.dtype != np.float32:
        return False
    return bool(s.min() > 0) and bool(np.isfinite(s.max())) and bool((u[1:] > u[:-1]).all())


def lexical(snap: Snapshot, bank: int, cols: np.ndarray, M: int, sample_rows: np.ndarray,
            keep: np.ndarray | None = None) -> Lexical:
    """The query's :class:`Lexical` over ``bank`` (``cols``: its store columns in token order;
    ``sample_rows``: the bank's rank sample, bank-local; ``keep``: a filter's unit mask, whose
    failing units are neither proposed nor ranked: read exactly)."""
    lo, hi = columns(snap, bank, cols)
    n = int(snap.off.nu[bank])
    if int((hi - lo).sum()) <= (MERGED_POSTINGS if DENSE and MERGED else EXACT_POSTINGS) or keep is not None:
        u, s = bm25_sparse(snap, bank, cols)
        if keep is not None:
            ok = keep[u]
            u, s = u[ok], s[ok]
        rank, order = _ranked(u, s)
        return Lexical(u[order[:M]], u, s, rank, -1.0, np.zeros(0, np.float32), n, ascending=keep is None)
    st = snap.bm25.store
    if DENSE and MERGED:
        return _merged(st, lo, hi, M, n)
    if DENSE:  # every posting added in one compiled pass: exact scores and ranks
        u, s = lexical_dense.dense_scores(st.idx, st.data, lo, hi, n)
        return Lexical(lexical_dense.top_units(u, s, M), u, s, np.zeros(0), -1.0, np.zeros(0, np.float32), n, True, [])
    imp, start = impact_order(snap, bank)
    depth, cand, s = M, np.zeros(0, np.int64), np.zeros(0, np.float32)
    while True:  # deeper into every column until the M-th best candidate beats the bound (or MAX_DEPTH)
        more, bound = _candidates(imp, st.idx, st.data, lo, hi, lo - start, depth)
        s = _rescored(more, cand, s, lambda units: scores_at(snap, bank, cols, units))
        cand = more
        kth = np.partition(s, len(s) - M)[len(s) - M] if len(s) >= M else -np.inf
        if bound == 0.0 or kth > bound or depth >= MAX_DEPTH:
            break
        depth *= 2
    rank, order = _ranked(cand, s)
    return Lexical(cand[order[:M]], cand, s, rank, float(bound),
                   np.sort(scores_at(snap, bank, cols, sample_rows)), n)


def _merged(st, lo: np.ndarray, hi: np.ndarray, M: int, n: int) -> Lexical:
    """:func:`lexical`'s compiled reading with :data:`MERGED`: the touched units ascending
    (``lexical_merge.dense_scores``), each one's exact rank and the top counted now
    (:data:`COUNTED_RANKS`, at most ``lexical_merge.FEW_SCORES`` distinct scores), else the rank
    table built now (:data:`RANK_TABLE`) and the top read from it, else the top by
    ``lexical_dense.top_units``' heap."""
    u, s = lexical_merge.dense_scores(st.idx, st.data, lo, hi, n)
    empty = np.zeros(0, np.float32)
    if not RANK_TABLE:
        return Lexical(lexical_dense.top_units(u, s, M), u, s, np.zeros(0), -1.0, empty, n, True, [], True)
    if n > lexical_dense.KEY_UNITS:
        raise ValueError(f"a bank of {n} units: BM25 rank keys hold at most 2^31")
    if COUNTED_RANKS:
        got = lexical_merge.score_ranks(u, s, M)  # None: too many distinct scores to count
        if got is not None:
            return Lexical(u[got[1]], u, s, got[0], -1.0, empty, n, ascending=True)
    table = lexical_merge.score_table(u, s, lexical_dense.radix_scratch(len(u)))
    return Lexical(lexical_merge.table_top(table[0], table[1], M), u, s, np.zeros(0), -1.0, empty, n, True,
                   [table], True)


def scores_of(lex: Lexical | None, snap: Snapshot, bank: int, cols: np.ndarray, units: np.ndarray) -> np.ndarray:
    """:func:`scores_at` of ``units``, read from ``lex`` when its units are ascending with every unit
    of positive score (:attr:`Lexical.ascending`: one binary search a unit, not one per column);
    the same float32 values (both the column-order sums)."""
    if lex is not None and lex.ascending:
        return lexical_merge.scores_in(lex.units, lex.scores, np.ascontiguousarray(units, dtype=np.int64))
    return scores_at(snap, bank, cols, units)


def _rescored(units: np.ndarray, had: np.ndarray, scores: np.ndarray, score) -> np.ndarray:
    """Scores of ``units`` (ascending): those of ``had`` (ascending, scored ``scores``) kept, the
    others' from ``score`` (a deeper read re-scores only the candidates it adds)."""
    p = np.minimum(np.searchsorted(had, units), max(len(had) - 1, 0))
    old = (had[p] == units) if len(had) else np.zeros(len(units), bool)
    out = np.empty(len(units), np.float32)
    out[old] = scores[p[old]]
    out[~old] = score(units[~old])
    return out


@njit(cache=True, nogil=True)
def _candidates(imp, idx, data, lo, hi, ilo, M):  # pragma: no cover - compiled
    """``(candidates ascending, bound)``: every column's ``M`` best postings (``imp[ilo[c]:]``) and
    the sum of each column's ``M``-th best score (0 for a column read whole)."""
    total = 0
    for c in range(len(lo)):
        total += min(M, hi[c] - lo[c])
    out = np.empty(total, np.int64)
    k = 0
    bound = 0.0
    for c in range(len(lo)):
        m = min(M, hi[c] - lo[c])
        for i in range(m):
            out[k] = idx[imp[ilo[c] + i]]
            k += 1
        if m < hi[c] - lo[c]:
            bound += data[imp[ilo[c] + m - 1]]
    return np.unique(out), bound


def scores_at(snap: Snapshot, bank: int, cols: np.ndarray, units: np.ndarray) -> np.ndarray:
    """``[len(units)]`` float32 BM25 of bank-local ``units`` for the query columns ``cols``, summed
    in token order as bm25s adds them (0 for a unit no column holds)."""
    lo, hi = columns(snap, bank, cols)
    st = snap.bm25.store
    return _scores_at(st.idx, st.data, lo, hi, np.ascontiguousarray(units, dtype=np.int64))


@njit(cache=True, nogil=True)
def _scores_at(idx, data, lo, hi, units):  # pragma: no cover - compiled
    out = np.zeros(len(units), np.float32)
    for c in range(len(lo)):
        a, b = lo[c], hi[c]
        if a == b:
            continue
        col = idx[a:b]
        for j in range(len(units)):
            p = np.searchsorted(col, units[j])
            if p < b - a and col[p] == units[j]:
                out[j] += data[a + p]
    return out


def ranks_of(lex: Lexical, units: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``[len(units)]`` float64 BM25 ranks of ``units`` scoring ``scores`` (0 where the score is 0:
    the affinity reads no rank there). Exact for a unit of ``lex.units`` when they hold every unit
    of positive score, or when it scores more than ``lex.bound``; otherwise the larger of its rank
    among ``lex.units`` and ``1 + N * (the share of the rank sample scoring more) + u * (the share
    scoring the same)`` (BM25 ties often, and ties rank by unit ``u``: about that many of the tied
    units come before it)."""
    out = np.zeros(len(units))
    if not len(lex.units):
        return out
    if lex.counted:
        return _counted(lex, units, scores, out)
    if lex.bound < 0:  # every unit of positive score with its rank: one galloping search a unit
        lexical_merge.take_in(lex.units, lex.rank, np.ascontiguousarray(units, dtype=np.int64), out)
        return out
    p = np.minimum(np.searchsorted(lex.units, units), len(lex.units) - 1)
    hit = lex.units[p] == units
    out[hit] = lex.rank[p[hit]]
    if lex.bound < 0:
        return out
    past = (scores > 0) & ~(hit & (scores > lex.bound))
    if past.any():
        desc = np.sort(-lex.scores.astype(np.float64))
        among = 1.0 + np.searchsorted(desc, -scores[past].astype(np.float64), side="left")
        hi = np.searchsorted(lex.sample, scores[past], side="right")
        above = len(lex.sample) - hi
        equal = hi - np.searchsorted(lex.sample, scores[past], side="left")
        # ties rank by unit: of the units scoring the same, about the share below this one come first
        est = 1.0 + (lex.n_bank * above + equal * units[past]) / max(1, len(lex.sample))
        out[past] = np.maximum(np.where(hit[past], out[past], among), est)
    return out


def _counted(lex: Lexical, units: np.ndarray, scores: np.ndarray, out: np.ndarray) -> np.ndarray:
    """:func:`ranks_of` of a counted :class:`Lexical`: read from the query's rank table (built on
    its first call, :data:`RANK_TABLE`), or the units of positive score not counted before for
    this query counted now (``lexical_dense.counted_ranks``), the others read from its memo."""
    pos = np.flatnonzero(scores > 0)
    if RANK_TABLE:
        if not lex.memo:
            if lex.n_bank > lexical_dense.KEY_UNITS:
                raise ValueError(f"a bank of {lex.n_bank} units: BM25 rank keys hold at most 2^31")
            lex.memo[:] = [lexical_dense.rank_table(lex.units, lex.scores, lexical_dense.radix_scratch(len(lex.units)))]
        out[pos] = lexical_dense.table_ranks(*lex.memo[0], np.ascontiguousarray(units[pos], dtype=np.int64),
                                             np.ascontiguousarray(scores[pos], dtype=np.float32))
        return out
    had_u, had_r = lex.memo[0] if lex.memo else (np.zeros(0, np.int64), np.zeros(0))
    p = np.minimum(np.searchsorted(had_u, units[pos]), max(len(had_u) - 1, 0))
    old = had_u[p] == units[pos] if len(had_u) else np.zeros(len(pos), bool)
    out[pos[old]] = had_r[p[old]]
    new = pos[~old]
    if len(new):
        out[new] = lexical_dense.counted_ranks(lex.units, lex.scores, np.ascontiguousarray(units[new], dtype=np.int64),
                                               np.ascontiguousarray(scores[new], dtype=np.float32))
        u = np.concatenate([had_u, units[new].astype(np.int64)])
        o = np.argsort(u, kind="stable")
        lex.memo[:] = [(u[o], np.concatenate([had_r, out[new]])[o])]
    return out
