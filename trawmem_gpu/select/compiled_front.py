"""Compiled CPU front of the batched engine (numba): stages 0-5 per query in one loop.

For the default configuration on CPU (``affinity="rrf"``, ``seed_score="best_unit"``, float64,
compiled stage 6) :class:`~trawmem_gpu.select.engine.SelectionEngine` runs, after one GEMM per
bank for the query-unit cosines, a single compiled loop over the queries (:func:`_front_loop`)
that does for each query, with its rows in cache:

* BM25 of every unit of its bank: the query tokens' CSC columns added in query-token order in
  float32 (bit-identical to bm25s, as ``SelectionEngine._lexical``);
* the ranks of the cosines (descending, ties to the lower unit) by a bucket sort on the value
  (:func:`_order_desc`: O(N) for spread-out values such as cosines, an insertion or merge sort
  inside a bucket) and of the positive BM25 scores by an LSD radix sort on their float32 bits
  (:func:`_order_desc_bits`: BM25 scores bunch up, e.g. every unit naming a speaker), then the
  RRF affinity alpha (same float64 operations as the torch path of ``_affinity``);
* seeds scores r0 (best unit of each thread), H-hop propagation and the capped neighbourhood
  (:func:`_propagate_one`, the reference's order);
* the candidates (units of the neighbourhood threads, ascending) and the per-candidate inputs of
  the compiled stage 6 (neighbourhood thread position, alpha, the neighbourhood's threads and
  their scores).

Nothing of shape ``[Q, N]`` beyond the cosines is materialized, and no torch op runs between the
GEMM and the greedy. The torch stages of the engine are the specification this loop is tested
against (``tests/test_engine*.py``: every fast path picks exactly what the reference picks).
"""
from __future__ import annotations

import numpy as np

_STATE: dict = {}
_SMALL_BUCKET = 32  # insertion sort up to this many entries in one bucket, merge sort above


def _order_desc(vals, m, order, bk, cnt):  # pragma: no cover - compiled by numba
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


def _order_desc_bits(bits, pos, m, order, tmp, hist):  # pragma: no cover - compiled by numba
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


def _rrf_row(vals, m, bm, bmbits, rrf_k, alpha, order, pos, bk, cnt):  # pragma: no cover - numba
    """RRF affinity of one query's ``m`` units: ``alpha[j] = 1 / (rank_cos(j) + k) + [bm_j > 0] /
    (rank_bm(j) + k)``, divided by its max (ranks from 1, descending, ties to the lower unit;
    ``vals``: cosines, ``bm``: float32 BM25 scores, ``bmbits``: their int32 view). The float64
    operations of the torch path of ``SelectionEngine._affinity``. Scratch: ``order``, ``pos``,
    ``bk [>= m]``, ``cnt [>= max(m + 1, 4 * 257)]``."""
    _order_desc(vals, m, order, bk, cnt)
    for i in range(m):
        alpha[order[i]] = 1.0 / (np.float64(i + 1) + rrf_k)
    npos = 0
    for j in range(m):
        if bm[j] > 0:
            pos[npos] = j
            npos += 1
    _order_desc_bits(bmbits, pos, npos, order, bk, cnt)
    for i in range(npos):
        j = pos[order[i]]
        alpha[j] = alpha[j] + 1.0 / (np.float64(i + 1) + rrf_k)
    mx = 0.0
    for j in range(m):
        if alpha[j] > mx:
            mx = alpha[j]
    for j in range(m):
        alpha[j] = alpha[j] / mx


def _rrf_rows(cos, n, lex, lexbits, rrf_k, out):  # pragma: no cover - compiled by numba
    """:func:`_rrf_row` for every row of ``cos [Q, N]`` (``n [Q]`` live units, ``lex [Q, N]``
    float32 BM25 and its int32 view ``lexbits``) into ``out [Q, N]`` (padding left as is): the
    RRF stage of the tensor front on CPU."""
    Q, N = cos.shape
    order = np.empty(max(N, 1), dtype=np.int64)
    pos = np.empty(max(N, 1), dtype=np.int64)
    bk = np.empty(max(N, 1), dtype=np.int64)
    cnt = np.empty(max(N + 1, 4 * 257), dtype=np.int64)
    for q in range(Q):
        _rrf_row(cos[q], n[q], lex[q], lexbits[q], rrf_k, out[q], order, pos, bk, cnt)


def _propagate_one(r0, n, g0, nbr, nbw, ns, cap, hops, gamma, paper, r, in_h, seeds, picked, front,
                   nxt):  # pragma: no cover - compiled by numba
    """Seeds, H-hop propagation and the capped neighbourhood of one query over its ``n`` threads
    (``g0``: its bank's first packed thread), in the reference's order (``reference.neighbourhood``):
    seeds = the ``ns`` best threads by (r0 desc, id asc), relaxed in seed-rank order in round 1,
    later rounds from the threads updated in the previous round in ascending id, each relaxation
    reading the source's current score; then the seeds plus the best other reached threads by
    (r~ desc, id asc) up to ``cap``. Writes ``r[:n]`` (-inf where unreached) and ``in_h[:n]``."""
    D = nbr.shape[1]
    for j in range(n):
        picked[j] = False
        r[j] = -np.inf
        in_h[j] = False
    k_seeds = min(ns, n)
    for s in range(k_seeds):  # selection: best r0, lowest id on ties
        b = -1
        for j in range(n):
            if not picked[j] and (b < 0 or r0[j] > r0[b]):
                b = j
        picked[b] = True
        seeds[s] = b
        r[b] = r0[b]
    nf = k_seeds
    for i in range(nf):
        front[i] = seeds[i]
    for _h in range(hops):
        if nf == 0:
            break
        for j in range(n):
            nxt[j] = False
        for i in range(nf):
            j = front[i]
            g = g0 + j
            for e in range(D):
                k = nbr[g, e]
                if k < 0:
                    continue
                w = nbw[g, e]
                val = gamma * r[j] + (1 - gamma) * w if paper else r[j] * (gamma + (1 - gamma) * w)
                if val > r[k]:
                    r[k] = val
                    nxt[k] = True
        nf = 0
        for j in range(n):
            if nxt[j]:
                front[nf] = j
                nf += 1
    for s in range(k_seeds):
        in_h[seeds[s]] = True
    need = cap - k_seeds
    if need <= 0:
        return
    nc = 0  # reached non-seeds, ascending id
    for j in range(n):
        if not picked[j] and r[j] > -np.inf:
            front[nc] = j
            nc += 1
    if nc > need:  # the best `need` by (r desc, id asc): stable insertion sort on r
        for i in range(1, nc):
            v = front[i]
            x = r[v]
            k = i
            while k > 0 and r[front[k - 1]] < x:
                front[k] = front[k - 1]
                k -= 1
            front[k] = v
        nc = need
    for i in range(nc):
        in_h[front[i]] = True


def _front_loop(cos, coff, nu, nt, uoff, toff, ult, tok_ptr, tok_ids, bm_data, bm_idx, bm_ptr, rrf_k, nbr, nbw, ns,
                cap, hops, gamma, paper, cand, n_cand, lt, alpha_c, hthread, rvec, n_h, tpos):  # pragma: no cover
    """Stages 0-5 per query (see the module docstring).

    Inputs per query ``q``: its cosines ``cos[coff[q] : coff[q] + nu[q]]`` (bank-local unit
    order), ``nu`` units and ``nt`` threads, first packed unit ``uoff`` and thread ``toff``, its
    BM25 term columns ``tok_ids[tok_ptr[q] : tok_ptr[q + 1]]`` (global columns of the
    concatenated CSC ``bm_data / bm_idx / bm_ptr``, in query-token order). ``ult``: bank-local
    thread of every packed unit.

    Outputs (rows ``q``): ``cand [Q, U]`` bank-local candidate units ascending, ``n_cand``,
    ``lt [Q, U]`` their neighbourhood thread position, ``alpha_c [Q, U]`` their affinity,
    ``hthread [Q, T]`` the neighbourhood's bank-local threads ascending (-1 pad), ``rvec [Q, T]``
    their r~ (0 pad), ``n_h``, ``tpos [Q, J]`` position in the neighbourhood or -1."""
    Q = nu.shape[0]
    N = 1
    J = 1
    for q in range(Q):
        N = max(N, nu[q])
        J = max(J, nt[q])
    bm = np.empty(N, dtype=np.float32)
    bmbits = bm.view(np.int32)  # positive float32 scores order like their bits
    vals = np.empty(N)
    alpha = np.empty(N)
    order = np.empty(N, dtype=np.int64)
    pos = np.empty(N, dtype=np.int64)
    bk = np.empty(N, dtype=np.int64)
    cnt = np.empty(max(N + 1, 4 * 257), dtype=np.int64)
    r0 = np.empty(J)
    r = np.empty(J)
    in_h = np.empty(J, dtype=np.bool_)
    seeds = np.empty(max(ns, 1), dtype=np.int64)
    picked = np.empty(J, dtype=np.bool_)
    front = np.empty(J, dtype=np.int64)
    nxt = np.empty(J, dtype=np.bool_)
    for q in range(Q):
        m = nu[q]
        n = nt[q]
        c0 = coff[q]
        # --- BM25 (float32, query-token order) -------------------------------------------------
        for j in range(m):
            bm[j] = np.float32(0.0)
        for p in range(tok_ptr[q], tok_ptr[q + 1]):
            t = tok_ids[p]
            for e in range(bm_ptr[t], bm_ptr[t + 1]):
                bm[bm_idx[e]] += bm_data[e]
        # --- RRF: cosine ranks over every unit, BM25 ranks over the positives -----------------
        for j in range(m):
            vals[j] = cos[c0 + j]
        _rrf_row(vals, m, bm, bmbits, rrf_k, alpha, order, pos, bk, cnt)
        # --- seed scores: best unit of each thread ---------------------------------------------
        for t in range(n):
            r0[t] = -np.inf
        u0 = uoff[q]
        for j in range(m):
            t = ult[u0 + j]
            if alpha[j] > r0[t]:
                r0[t] = alpha[j]
        # --- propagation and neighbourhood -------------------------------------------------------
        _propagate_one(r0, n, toff[q], nbr, nbw, ns, cap, hops, gamma, paper, r, in_h, seeds, picked, front, nxt)
        k = 0
        for t in range(n):
            if in_h[t]:
                if k >= hthread.shape[1]:
                    raise IndexError("neighbourhood buffer narrower than a query's neighbourhood")
                tpos[q, t] = k
                hthread[q, k] = t
                rvec[q, k] = r[t]
                k += 1
            else:
                tpos[q, t] = -1
        n_h[q] = k
        # --- candidates: units of the neighbourhood threads, ascending --------------------------
        k = 0
        W = cand.shape[1]
        for j in range(m):
            t = ult[u0 + j]
            if in_h[t]:
                if k >= W:  # the caller's bound on |U_q| was wrong: never write past the buffer
                    raise IndexError("candidate buffer narrower than a query's candidate set")
                cand[q, k] = j
                lt[q, k] = tpos[q, t]
                alpha_c[q, k] = alpha[j]
                k += 1
        n_cand[q] = k


def _own_dots_flat(Z, V, off, cnt, bidx, coff, out):  # pragma: no cover - compiled by numba
    """``out[coff[q] + i] = Z[q] . V[off[b] + i]`` for ``i < cnt[b]``, ``b = bidx[q]``: each
    query against its own bank's rows only, into a flat buffer."""
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


def kernels():
    """``(front_loop, propagate_loop, own_dots_flat, rrf_rows)`` compiled, or None without numba."""
    if "front" not in _STATE:
        _STATE["front"] = None
        try:
            import numba
        except Exception:  # noqa: BLE001 - any import failure means: no compiled front
            return None
        global _order_desc, _order_desc_bits, _rrf_row, _propagate_one
        _order_desc = numba.njit(cache=True)(_order_desc)
        _order_desc_bits = numba.njit(cache=True)(_order_desc_bits)
        _rrf_row = numba.njit(cache=True)(_rrf_row)
        _propagate_one = numba.njit(cache=True)(_propagate_one)
        # nogil: the engine may run chunks of queries on worker threads
        _STATE["front"] = (numba.njit(cache=True, nogil=True)(_front_loop), numba.njit(cache=True)(_propagate_batch),
                           numba.njit(cache=True, nogil=True, fastmath={"reassoc", "nsz", "contract"})(_own_dots_flat),
                           numba.njit(cache=True)(_rrf_rows))
    return _STATE["front"]


def _propagate_batch(r0, nt, toff, nbr, nbw, ns, cap, hops, gamma, paper, r, in_h):  # pragma: no cover - numba
    """:func:`_propagate_one` for every query of a batch (``r0``, ``r``: ``[Q, J]``; ``in_h``
    ``[Q, J]`` bool)."""
    Q, J = r0.shape
    seeds = np.empty(max(ns, 1), dtype=np.int64)
    picked = np.empty(max(J, 1), dtype=np.bool_)
    front = np.empty(max(J, 1), dtype=np.int64)
    nxt = np.empty(max(J, 1), dtype=np.bool_)
    for q in range(Q):
        _propagate_one(r0[q], nt[q], toff[q], nbr, nbw, ns, cap, hops, gamma, paper, r[q], in_h[q], seeds, picked,
                       front, nxt)
