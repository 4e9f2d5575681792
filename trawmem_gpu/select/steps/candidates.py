"""Stage 2, step 3 (design note): the candidates U_q (every unit of the neighbourhood's threads,
ascending) and their affinity alpha.

alpha is computed over the whole bank *before* step 1, because best-unit seeds read it:
``dense`` = (1 + cos(z, e_v)) / 2 (the paper), ``fused`` = (1 - w) dense + w bm25 / max_bank(bm25),
``rrf`` = 1 / (k + rank_cos) + [bm25 > 0] / (k + rank_bm25) over the bank (ranks from 1, ties to
the lower unit), divided by its bank maximum; ``learned``: a logistic model over generic
relevance features, in its own module (``steps/relevance.py``).

Side by side: the NumPy reference (:func:`candidates`; the affinity in ``affinity.py``), the torch batch
(:func:`affinity_torch`, :func:`bm25_batch`, :func:`candidates_torch`) and the compiled
per-query RRF (:func:`rrf_row`: a bucket sort of the cosines and a radix sort of the BM25 float32
bits, the same float64 operations as the torch path).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._jit import njit
from ..lexical import tokenize
from ..tensor_ops import compact, ranks, ranks_positive
from .. import word_table as words
from ..text_features import SMALL_BATCH


# ----------------------------------------------------------------------------------------------
# reference (NumPy, one query)
# ----------------------------------------------------------------------------------------------
def candidates(bank, threads: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(cand [U], lt [U])``: the units of ``threads`` (ascending), and each one's position in ``threads``."""
    off = bank.thread_offsets
    cand = np.concatenate([np.arange(off[j], off[j + 1]) for j in threads])
    lt = np.concatenate([np.full(off[j + 1] - off[j], i, dtype=np.int64) for i, j in enumerate(threads)])
    return cand, lt


def uses_bm25(cfg) -> bool:
    """Whether the affinity reads BM25 (a host without bm25s can still run dense configs)."""
    return cfg.affinity in ("rrf", "learned") or (cfg.affinity == "fused" and cfg.lexical_weight > 0)


# ----------------------------------------------------------------------------------------------
# torch (a batch of queries, each over its own bank's N units; padding after them)
# ----------------------------------------------------------------------------------------------
def affinity_torch(cos: Tensor, umask: Tensor, lex: Tensor | None, cfg) -> Tensor:
    """``alpha [Q, N]`` (0 on padding) from the cosines ``[Q, N]``, the live mask and the raw BM25
    scores (None when the affinity reads none)."""
    if cfg.affinity == "rrf":
        s = ranks(cos, umask).add_(cfg.rrf_k).reciprocal_()
        s += torch.where(lex > 0, ranks_positive(lex).add_(cfg.rrf_k).reciprocal_(), 0.0)
        s.masked_fill_(~umask, 0.0)
        alpha = s.div_(s.amax(dim=1, keepdim=True))
    else:
        alpha = (1.0 + cos) / 2.0
        if lex is not None:
            mx = lex.amax(dim=1, keepdim=True)
            norm = torch.where(mx > 0, lex / torch.where(mx > 0, mx, 1.0), 0.0)
            alpha = (1.0 - cfg.lexical_weight) * alpha + cfg.lexical_weight * norm
    return torch.where(umask, alpha, torch.zeros((), dtype=alpha.dtype, device=alpha.device))


class BM25Store(NamedTuple):
    """Every bank's bm25s score matrix (CSC over its own vocabulary), stored side by side: bank
    ``b``'s term ``t`` is column ``col0[b] + t`` of ``ptr`` (bank-local pointers, ``V_b + 1`` rows
    per bank) and its entries are ``data / idx [nz0[b] + ptr[...]]``."""

    data: np.ndarray
    idx: np.ndarray
    ptr: np.ndarray
    col0: np.ndarray
    nz0: np.ndarray


_TOKEN_ASCII = words.TOKEN_ASCII  # (its home: word_table)


def bm25_columns(bidx: list[int], questions: list[str], vocabs: list[dict], plain: list[bool],
                 col0: np.ndarray, maps: dict | None = None) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Each query's BM25 term columns (``col0[b] + term``), in query-token order, as CSR ``(ptr
    [Q + 1], ids)``: :func:`bm25_columns_reference`'s value. Each bank's raw words (lower-cased
    word runs before the stop-word filter and the stemmer) are mapped to a column, or to -1 for a
    stop word or a word out of the bank's vocabulary, once (``maps``: ``{bank: (word map,
    word_table.WordTable)}`` the caller keeps for these vocabularies, or None: once per call).
    Consecutive queries of one bank whose questions are ASCII and hold no newline are split and
    mapped in one compiled pass over their newline-joined text (``word_table.table_columns``, with
    kept ``maps``; without them or numba by one ``translate`` / ``split`` / ``map``,
    ``word_table.run_columns``), the others word by word (``word_table.question_columns``); a call of
    fewer than ``text_features.SMALL_BATCH`` questions goes word by word (:func:`_few_columns`). ``slow``: queries whose bank's BM25
    variant needs bm25s itself (no columns listed)."""
    if len(questions) < SMALL_BATCH:  # a few questions: word by word, without a run's arrays
        return _few_columns(bidx, questions, vocabs, plain, col0)
    compiled = words.HAS_NUMBA and maps is not None  # the table pays off across calls (a first split costs more)
    maps = {} if maps is None else maps
    Q = len(bidx)
    counts = np.zeros(Q, dtype=np.int64)
    parts: list[np.ndarray] = []
    slow: list[int] = []
    b_arr = np.asarray(bidx, dtype=np.int64).reshape(Q)
    cut = (np.flatnonzero(b_arr[1:] != b_arr[:-1]) + 1).tolist()
    for s, e in zip([0] + cut, cut + [Q]) if Q else ():
        b = int(b_arr[s])
        if not plain[b]:
            slow += range(s, e)
            continue
        got = maps.get(b)
        if got is None or len(got[0]) + len(got[1]) > words.MAX_WORDS:  # new maps replace full ones
            got = maps[b] = ({words.SEP_WORD: -2}, words.WordTable())
        m, table = got
        for a, z, joined in words.joined_runs(questions, s, e):
            if joined is not None:
                o = int(col0[b])
                ids, counts[a:z] = (words.table_columns(joined, z - a, table, vocabs[b], o) if compiled
                                    else words.run_columns(joined, m, vocabs[b], o))
                parts.append(ids)
            else:
                ids = words.question_columns(questions[a], m, vocabs[b], int(col0[b]))
                counts[a] = len(ids)
                parts.append(np.asarray(ids, dtype=np.int64))
    ptr = np.zeros(Q + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), slow


def _few_columns(bidx: list[int], questions: list[str], vocabs: list[dict], plain: list[bool],
                 col0: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """:func:`bm25_columns` question by question (``word_table.question_columns``, one word map per
    bank for the call): its form for calls of fewer than ``text_features.SMALL_BATCH`` questions."""
    maps: dict[int, dict] = {}
    ids: list[int] = []
    ptr = [0]
    slow: list[int] = []
    for q, (b, text) in enumerate(zip(bidx, questions)):
        if not plain[b]:
            slow.append(q)
        else:
            ids += words.question_columns(text, maps.setdefault(b, {}), vocabs[b], int(col0[b]))
        ptr.append(len(ids))
    return np.asarray(ptr, dtype=np.int64), np.asarray(ids, dtype=np.int64), slow


def bm25_columns_reference(bidx: list[int], questions: list[str], vocabs: list[dict], plain: list[bool],
                           col0: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The plain statement of :func:`bm25_columns`: ``lexical.tokenize`` each question, keep its
    tokens in the bank's vocabulary, in order, as ``col0[b] + vocab[token]``."""
    ids: list[int] = []
    ptr = [0]
    slow: list[int] = []
    for q, (b, text) in enumerate(zip(bidx, questions)):
        if not plain[b]:
            slow.append(q)
        else:
            vocab, o = vocabs[b], int(col0[b])
            ids += [o + vocab[w] for w in tokenize(text) if w in vocab]
        ptr.append(len(ids))
    return np.asarray(ptr, dtype=np.int64), np.asarray(ids, dtype=np.int64), slow


def bm25_batch(bidx: np.ndarray, cols: tuple[np.ndarray, np.ndarray], store: BM25Store, N: int) -> np.ndarray:
    """``[Q, N]`` float32 raw BM25 of every unit of each query's bank (0 on padding).

    bm25s scores a query by adding its terms' CSC columns in query-token order in float32
    (``np.add.at``). This does the same additions, in the same order and precision, for the whole
    batch at once: token position ``p`` of every query is one fancy-indexed float32 add (a query
    appears once per position, so no index repeats), hence bit-identical scores.
    """
    ptr, ids = cols
    Q = len(bidx)
    out = np.zeros((Q, N), dtype=store.data.dtype)
    flat = out.reshape(-1)
    lens = np.diff(ptr)
    nz0 = store.nz0[bidx]
    for p in range(int(lens.max()) if Q else 0):
        who = np.flatnonzero(lens > p)
        tid = ids[ptr[who] + p]
        start, end = store.ptr[tid] + nz0[who], store.ptr[tid + 1] + nz0[who]
        ln = end - start
        tot = int(ln.sum())
        if tot == 0:
            continue
        first = np.repeat(np.cumsum(ln) - ln, ln)
        pos = np.repeat(start, ln) + (np.arange(tot) - first)
        flat[np.repeat(who * N, ln) + store.idx[pos]] += store.data[pos]
    return out


def candidates_torch(in_h: Tensor, umask: Tensor, ult: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(cand [Q, U], cvalid [Q, U], n_cand [Q])``: the units of the H_q threads in ascending
    bank-local order (the reference's candidate order), compacted with a cumsum (no sort)."""
    J = in_h.shape[1]
    in_hp = torch.cat([in_h, torch.zeros(in_h.shape[0], 1, dtype=torch.bool, device=in_h.device)], 1)
    cmask = umask & torch.gather(in_hp, 1, ult.clamp(max=J))
    n_cand = cmask.sum(dim=1)
    U = int(n_cand.max())
    cand = compact(cmask, U, fill=0)
    cvalid = torch.arange(U, device=in_h.device)[None, :] < n_cand[:, None]
    return cand, cvalid, n_cand


# ----------------------------------------------------------------------------------------------
# compiled (numba, one query at a time): the RRF affinity of one query's units
# ----------------------------------------------------------------------------------------------
_SMALL_BUCKET = 32  # insertion sort up to this many entries in one bucket, merge sort above


@njit(cache=True)
def order_desc(vals, m, order, bk, cnt):  # pragma: no cover - compiled
    """``order[:m]`` = positions ``0..m-1`` of ``vals`` by value descending, ties to the lower
    position (a stable descending sort; ``-0.0 == 0.0``). Values must be finite.

    Bucket sort on the value: bucket ``int((hi - v) / (hi - lo) * (m - 1))`` is non-decreasing
    as ``v`` decreases (IEEE subtraction, division and multiplication round monotonically), so
    buckets in ascending order hold values in descending order; positions enter their bucket in
    ascending order and each bucket is sorted stably (insertion sort, or a merge sort when it
    holds more than ``_SMALL_BUCKET``). Scratch: ``bk [>= m]``, ``cnt [>= m + 1]``."""
    if m <= 0:
        return
    hi = vals[0]
    lo = vals[0]
    for j in range(1, m):
        x = vals[j]
        if x > hi:
            hi = x
        if x < lo:
            lo = x
    span = hi - lo
    if not span > 0.0:  # all equal: index order
        for j in range(m):
            order[j] = j
        return
    if not span < np.inf:  # values too far apart to bucket: one stable sort
        srt = np.argsort(-vals[:m], kind="mergesort")
        for i in range(m):
            order[i] = srt[i]
        return
    top = m - 1
    for b in range(m + 1):
        cnt[b] = 0
    for j in range(m):
        b = int((hi - vals[j]) / span * top)
        bk[j] = b
        cnt[b + 1] += 1
    for b in range(m):
        cnt[b + 1] += cnt[b]
    for j in range(m):  # ascending j: stable inside a bucket
        b = bk[j]
        order[cnt[b]] = j
        cnt[b] += 1
    s = 0
    for b in range(m):  # cnt[b] is now the end of bucket b
        e = cnt[b]
        n = e - s
        if n > _SMALL_BUCKET:
            seg = order[s:e].copy()
            key = np.empty(n)
            for i in range(n):
                key[i] = -vals[seg[i]]
            srt = np.argsort(key, kind="mergesort")
            for i in range(n):
                order[s + i] = seg[srt[i]]
        elif n > 1:
            for i in range(s + 1, e):
                v = order[i]
                x = vals[v]
                k = i
                while k > s and vals[order[k - 1]] < x:
                    order[k] = order[k - 1]
                    k -= 1
                order[k] = v
        s = e


@njit(cache=True)
def order_desc_bits(bits, pos, m, order, tmp, hist):  # pragma: no cover - compiled
    """``order[:m]`` = indices ``0..m-1`` into ``pos`` by ``bits[pos[i]]`` descending, ties to
    the lower ``i`` (a stable descending sort of non-negative int32 keys, e.g. the bits of
    positive float32 scores, which order like the values). LSD radix sort on ``max - key``, 8-bit
    digits, only as many passes as the key range needs, every digit counted in one pass.
    Scratch: ``tmp [>= m]``, ``hist [>= 4 * 257]``."""
    if m <= 0:
        return
    hib = np.int64(bits[pos[0]])
    lob = hib
    for i in range(1, m):
        x = np.int64(bits[pos[i]])
        if x > hib:
            hib = x
        if x < lob:
            lob = x
    rng = hib - lob
    passes = 0
    while passes < 4 and (rng >> (8 * passes)) > 0:
        passes += 1
    for i in range(m):
        order[i] = i
        tmp[i] = hib - np.int64(bits[pos[i]])  # the key, ascending = value descending
    if passes == 0:
        return
    for d in range(passes * 257):
        hist[d] = 0
    for i in range(m):
        k = tmp[i]
        for p in range(passes):
            hist[p * 257 + ((k >> (8 * p)) & 255) + 1] += 1
    for p in range(passes):
        h0 = p * 257
        for d in range(256):
            hist[h0 + d + 1] += hist[h0 + d]
    src = order
    dst = pos_tmp = np.empty(m, dtype=np.int64)
    keys = tmp
    for p in range(passes):
        h0 = p * 257
        sh = 8 * p
        for i in range(m):  # stable scatter in the current order
            v = src[i]
            d = h0 + ((keys[v] >> sh) & 255)
            dst[hist[d]] = v
            hist[d] += 1
        src, dst = dst, src
    if passes % 2 == 1:  # the result is in pos_tmp: copy back
        for i in range(m):
            order[i] = pos_tmp[i]


class RankScratch(NamedTuple):
    """Scratch of :func:`rrf_row` for banks of up to ``N`` units."""

    order: np.ndarray
    pos: np.ndarray
    bk: np.ndarray
    cnt: np.ndarray


def rank_scratch(N: int) -> RankScratch:
    N = max(N, 1)
    return RankScratch(np.empty(N, np.int64), np.empty(N, np.int64), np.empty(N, np.int64),
                       np.empty(max(N + 1, 4 * 257), np.int64))


@njit(cache=True)
def rrf_row(vals, m, bm, bmbits, rrf_k, alpha, s, rc, rb, given):  # pragma: no cover - compiled
    """RRF affinity of one query's ``m`` units: ``alpha[j] = 1 / (rank_cos(j) + k) + [bm_j > 0] /
    (rank_bm(j) + k)``, divided by its max (ranks from 1, descending, ties to the lower unit;
    ``vals``: cosines, ``bm``: float32 BM25 scores, ``bmbits``: their int32 view; ``rc``, ``rb``:
    scratch; ``given``: :class:`GivenRanks`, see :func:`ranks_of`). The float64 operations of
    :func:`affinity_torch`."""
    ranks_of(vals, m, bmbits, bm, s, rc, rb, given)
    for j in range(m):
        alpha[j] = 1.0 / (rc[j] + rrf_k)
    for j in range(m):
        if bm[j] > 0:
            alpha[j] = alpha[j] + 1.0 / (rb[j] + rrf_k)
    mx = 0.0
    for j in range(m):
        if alpha[j] > mx:
            mx = alpha[j]
    for j in range(m):
        alpha[j] = alpha[j] / mx


class GivenRanks(NamedTuple):
    """Ranks handed to :func:`ranks_of` (float64, one per unit; both empty: none given)."""

    cos: np.ndarray
    bm25: np.ndarray
    """The rank among the units of positive BM25 (read only where BM25 > 0)."""


NO_RANKS = GivenRanks(np.zeros(0), np.zeros(0))


@njit(cache=True, inline="always")
def given_slice(given, a, m):  # pragma: no cover - compiled
    """The :class:`GivenRanks` of units ``a .. a + m`` of a flat ``given`` (itself when empty)."""
    if given.cos.shape[0] == 0:
        return given
    return GivenRanks(given.cos[a:a + m], given.bm25[a:a + m])


@njit(cache=True, inline="always")
def ranks_of(vals, m, bmbits, bm, s, rc, rb, given):  # pragma: no cover - compiled
    """``rc[j]``: rank of unit ``j`` by cosine, ``rb[j]``: by BM25 among the units of positive BM25
    (0 elsewhere), from 1, descending, ties to the lower unit; or the ranks ``given`` (a
    :class:`GivenRanks` of ``m`` entries each: a shortlist's units ranked in their whole bank)."""
    if given.cos.shape[0] > 0:
        for j in range(m):
            rc[j] = given.cos[j]
            rb[j] = given.bm25[j] if bm[j] > 0 else 0.0
        return
    order, pos = s.order, s.pos
    order_desc(vals, m, order, s.bk, s.cnt)
    for i in range(m):
        rc[order[i]] = np.float64(i + 1)
    npos = 0
    for j in range(m):
        rb[j] = 0.0
        if bm[j] > 0:
            pos[npos] = j
            npos += 1
    order_desc_bits(bmbits, pos, npos, order, s.bk, s.cnt)
    for i in range(npos):
        rb[pos[order[i]]] = np.float64(i + 1)


@njit(cache=True)
def rrf_rows(cos, n, lex, lexbits, rrf_k, out):  # pragma: no cover - compiled
    """:func:`rrf_row` for every row of ``cos [Q, N]`` (``n [Q]`` live units, ``lex [Q, N]``
    float32 BM25 and its int32 view ``lexbits``) into ``out [Q, N]`` (padding left as is)."""
    Q, N = cos.shape
    N1 = max(N, 1)
    s = RankScratch(np.empty(N1, np.int64), np.empty(N1, np.int64), np.empty(N1, np.int64),
                    np.empty(max(N + 1, 4 * 257), np.int64))
    rc, rb = np.empty(N1), np.empty(N1)
    for q in range(Q):
        rrf_row(cos[q], n[q], lex[q], lexbits[q], rrf_k, out[q], s, rc, rb, NO_RANKS)


def rrf_compiled(cos: np.ndarray, n: np.ndarray, lex: np.ndarray, k: float) -> np.ndarray:
    """``alpha [Q, N]`` of the ``rrf`` affinity (0 on padding) by :func:`rrf_rows`; ``lex`` must hold
    float32 values (as bm25s gives them)."""
    lex32 = np.ascontiguousarray(lex, dtype=np.float32)
    out = np.zeros(cos.shape)
    rrf_rows(np.ascontiguousarray(cos), np.ascontiguousarray(n, dtype=np.int64), lex32, lex32.view(np.int32),
             float(k), out)
    return out


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz", "contract"})
def own_dots(Z, V, off, cnt, bidx, coff, out):  # pragma: no cover - compiled
    """``out[coff[q] + i] = Z[q] . V[off[b] + i]`` for ``i < cnt[b]``, ``b = bidx[q]``: each query
    against its own bank's rows only, into a flat buffer."""
    d = Z.shape[1]
    for q in range(Z.shape[0]):
        b = bidx[q]
        a = off[b]
        z = Z[q]
        o = coff[q]
        for i in range(cnt[b]):
            v = V[a + i]
            s = 0.0
            for k in range(d):
                s += z[k] * v[k]
            out[o + i] = s
