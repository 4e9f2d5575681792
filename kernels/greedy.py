"""Triton kernel for the greedy workspace-selection loop.

One program per query runs the whole greedy loop. Per-query state lives in registers:

* ``c[BLOCK_N]``: covered support ``max_{s in S} K[s, v]``; ``pi[BLOCK_N]``: priorities,
* ``m[BLOCK_R]``: covered role mass ``max_{s in S} rho[s, r]``,
* ``sel_vec[BLOCK_S]`` / ``thr_vec[BLOCK_S]``: the picked units and their threads (used to mask
  picked units and hit threads by comparison, so no scratch memory and no barriers are needed).

Each step sweeps the candidates in blocks of ``BLOCK_U`` rows. The coverage gain of a block
needs a ``[BLOCK_U, BLOCK_N]`` tile of ``K``, which is loaded from a ``[Q, U, U]`` tensor
(``KMODE=0``), computed from unit vectors ``E[Q, U, D]`` with an fp32 ``tl.dot``
(``KMODE=1``; ``clamp(E E^T, 0, 1)``, unit diagonal), or is the identity (``KMODE=2``). The
running best (value, index) keeps the earlier block on ties and each block takes its smallest
index among equal maxima, so ties go to the smallest unit index. The ``K`` row of the picked unit
is then re-derived from the same tile computation (bit-identical to what the gains saw).

All accumulation is float32. The specification is
``trawmem_gpu.select.batched_ops.greedy_select_torch``. Sized for ``U`` up to ~1-2k (``c`` and
``pi`` are register vectors of ``next_pow2(U)``); with ``KMODE=1`` the tiles of ``K`` are
recomputed at every step, which trades ``max_steps`` times the ``E E^T`` flops for never
materialising ``K``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

INTERPRETED = bool(triton.knobs.runtime.interpret)

KMODE_MATRIX = 0
KMODE_VECTORS = 1
KMODE_IDENTITY = 2


@triton.jit
def _k_tile(k_ptr, e_ptr, q, offs_u, umask, valid_u, offs_n, nmask, valid_n, U, D,
            KMODE: tl.constexpr, BLOCK_U: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """``K[q, offs_u, offs_n]`` as a float32 ``[BLOCK_U, BLOCK_N]`` tile, 0 outside live pairs."""
    pair = (umask & valid_u)[:, None] & (nmask & valid_n)[None, :]
    diag = offs_u[:, None] == offs_n[None, :]
    if KMODE == 0:
        ptrs = k_ptr + q * U * U + offs_u[:, None].to(tl.int64) * U + offs_n[None, :]
        tile = tl.load(ptrs, mask=umask[:, None] & nmask[None, :], other=0.0).to(tl.float32)
    elif KMODE == 1:
        acc = tl.zeros([BLOCK_U, BLOCK_N], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            dmask = offs_d < D
            a = tl.load(e_ptr + (q * U + offs_u)[:, None] * D + offs_d[None, :],
                        mask=umask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            b = tl.load(e_ptr + (q * U + offs_n)[:, None] * D + offs_d[None, :],
                        mask=nmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        tile = tl.minimum(tl.maximum(acc, 0.0), 1.0)
        tile = tl.where(diag, 1.0, tile)
    else:
        tile = tl.where(diag, 1.0, 0.0)
    return tl.where(pair, tile, 0.0)


@triton.jit
def _greedy_kernel(
    pi_ptr, k_ptr, e_ptr, rho_ptr, delta_ptr, alpha_ptr, thread_ptr, tmass_ptr, valid_ptr, limit_ptr,
    sel_ptr, gains_ptr, nsel_ptr,
    U, T, D, S,
    w_cov, w_role, w_aff, w_thr, stop_cov,
    R: tl.constexpr, KMODE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_U: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
):
    q = tl.program_id(0).to(tl.int64)

    offs_n = tl.arange(0, BLOCK_N)
    nmask = offs_n < U
    valid_n = tl.load(valid_ptr + q * U + offs_n, mask=nmask, other=0) != 0
    pi_n = tl.load(pi_ptr + q * U + offs_n, mask=nmask, other=0.0).to(tl.float32)
    pi_n = tl.where(nmask & valid_n, pi_n, 0.0)

    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < R
    delta = tl.load(delta_ptr + q * R + offs_r, mask=rmask, other=0.0).to(tl.float32)

    offs_s = tl.arange(0, BLOCK_S)
    c = tl.zeros([BLOCK_N], dtype=tl.float32)
    m = tl.zeros([BLOCK_R], dtype=tl.float32)
    sel_vec = tl.full([BLOCK_S], -1, tl.int32)
    thr_vec = tl.full([BLOCK_S], -1, tl.int64)

    limit = tl.load(limit_ptr + q).to(tl.int32)
    t = tl.full([], 0, tl.int32)
    go = limit > 0
    while go:
        best_val = tl.full([], float("-inf"), tl.float32)
        best_idx = tl.full([], 0, tl.int32)
        for u0 in range(0, U, BLOCK_U):
            offs_u = u0 + tl.arange(0, BLOCK_U)
            umask = offs_u < U
            row = q * U + offs_u
            valid_u = tl.load(valid_ptr + row, mask=umask, other=0) != 0
            ktile = _k_tile(k_ptr, e_ptr, q, offs_u, umask, valid_u, offs_n, nmask, valid_n, U, D,
                            KMODE, BLOCK_U, BLOCK_N, BLOCK_D)
            cov = tl.sum(pi_n[None, :] * tl.maximum(ktile - c[None, :], 0.0), axis=1)

            rho_t = tl.load(rho_ptr + row[:, None] * R + offs_r[None, :],
                            mask=umask[:, None] & rmask[None, :], other=0.0).to(tl.float32)
            role = tl.sum(delta[None, :] * tl.maximum(rho_t - m[None, :], 0.0), axis=1)

            alpha_u = tl.load(alpha_ptr + row, mask=umask, other=0.0).to(tl.float32)

            th = tl.load(thread_ptr + row, mask=umask, other=-1)
            tok = umask & valid_u & (th >= 0) & (th < T)
            mass = tl.load(tmass_ptr + q * T + tl.where(tok, th, 0), mask=tok, other=0.0).to(tl.float32)
            hit = tl.sum((th[:, None] == thr_vec[None, :]).to(tl.int32), axis=1) > 0
            thr = tl.where(hit, 0.0, mass)

            gain = w_cov * cov + w_role * role + w_aff * alpha_u + w_thr * thr
            n_picked = tl.sum((offs_u[:, None] == sel_vec[None, :]).to(tl.int32), axis=1)
            avail = umask & valid_u & (n_picked == 0)
            gain = tl.where(avail, gain, float("-inf"))
            bmax = tl.max(gain, axis=0)
            bidx = tl.min(tl.where(avail & (gain == bmax), offs_u, 2147483647), axis=0)
            better = bmax > best_val
            best_idx = tl.where(better, bidx, best_idx)
            best_val = tl.where(better, bmax, best_val)

        tl.store(sel_ptr + q * S + t, best_idx.to(tl.int64))
        tl.store(gains_ptr + q * S + t, best_val)

        # state update with the picked unit
        if KMODE == 0:
            krow = tl.load(k_ptr + q * U * U + best_idx.to(tl.int64) * U + offs_n, mask=nmask, other=0.0)
            krow = tl.where(nmask & valid_n, krow.to(tl.float32), 0.0)
        elif KMODE == 1:
            offs_b = (best_idx // BLOCK_U) * BLOCK_U + tl.arange(0, BLOCK_U)
            bmask = offs_b < U
            valid_b = tl.load(valid_ptr + q * U + offs_b, mask=bmask, other=0) != 0
            btile = _k_tile(k_ptr, e_ptr, q, offs_b, bmask, valid_b, offs_n, nmask, valid_n, U, D,
                            KMODE, BLOCK_U, BLOCK_N, BLOCK_D)
            krow = tl.sum(tl.where(offs_b[:, None] == best_idx, btile, 0.0), axis=0)
        else:
            krow = tl.where((offs_n == best_idx) & nmask & valid_n, 1.0, 0.0)
        c = tl.maximum(c, krow)
        rho_star = tl.load(rho_ptr + (q * U + best_idx) * R + offs_r, mask=rmask, other=0.0).to(tl.float32)
        m = tl.maximum(m, rho_star)
        th_star = tl.load(thread_ptr + q * U + best_idx)
        thr_vec = tl.where(offs_s == t, th_star, thr_vec)
        sel_vec = tl.where(offs_s == t, best_idx, sel_vec)
        covered = tl.sum(pi_n * c, axis=0)
        t += 1
        go = (t < limit) & (covered < stop_cov)
    tl.store(nsel_ptr + q, t.to(tl.int64))


def _np2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def greedy_select_triton(pi, K, E, identity: bool, rho, delta, alpha, thread, thread_mass, valid, limit,
                         w_cov: float, w_role: float, w_aff: float, w_thr: float,
                         stop_coverage: float, max_steps: int, block_u: int = 0):
    """Launch the greedy kernel; same contract as ``greedy_select_torch``.

    :param pi: ``[Q, U]``; ``K``: ``[Q, U, U]`` or None; ``E``: ``[Q, U, D]`` or None (used when
        ``K`` is None and not ``identity``); ``rho``: ``[Q, U, R]``; ``delta``: ``[Q, R]``;
        ``alpha``, ``thread``, ``valid``: ``[Q, U]``; ``thread_mass``: ``[Q, T]``
    :param limit: ``[Q]`` int, ``min(budget, #valid, max_steps)``
    :param block_u: candidate rows per block (power of two >= 16); 0 picks a default
    :return: ``sel [Q, max_steps]`` int64, ``gains [Q, max_steps]`` float32, ``n_sel [Q]`` int64
    """
    Q, U = pi.shape
    dev = pi.device
    S = int(max_steps)
    sel = torch.full((Q, S), -1, dtype=torch.int64, device=dev)
    gains = torch.zeros(Q, S, dtype=torch.float32, device=dev)
    n_sel = torch.zeros(Q, dtype=torch.int64, device=dev)
    if Q == 0 or U == 0 or S <= 0:
        return sel, gains, n_sel
    R = rho.shape[2]
    T = thread_mass.shape[1]
    f32 = torch.float32
    if K is not None:
        kmode, k_arg, e_arg, D = KMODE_MATRIX, K.contiguous(), K, 1
    elif identity:
        kmode, k_arg, e_arg, D = KMODE_IDENTITY, pi, pi, 1
    else:
        if E is None:
            raise ValueError("greedy_select needs K, E, or identity=True")
        D = E.shape[2]
        kmode, k_arg, e_arg = KMODE_VECTORS, pi, E.contiguous()
    BLOCK_N = max(16, _np2(U))
    BLOCK_U = block_u or max(16, min(BLOCK_N, 8192 // BLOCK_N))
    BLOCK_D = 32 if BLOCK_N <= 512 else 16
    tmass = thread_mass.to(f32).contiguous() if T > 0 else torch.zeros(Q, 1, dtype=f32, device=dev)
    _greedy_kernel[(Q,)](
        pi.to(f32).contiguous(), k_arg, e_arg, rho.to(f32).contiguous(), delta.to(f32).contiguous(),
        alpha.to(f32).contiguous(), thread.to(torch.int64).contiguous(), tmass,
        valid.to(torch.int8).contiguous(), limit.to(torch.int32).contiguous(),
        sel, gains, n_sel,
        U, T, D, S,
        float(w_cov), float(w_role), float(w_aff), float(w_thr), float(stop_coverage),
        R=R, KMODE=kmode, BLOCK_N=BLOCK_N, BLOCK_U=BLOCK_U, BLOCK_D=BLOCK_D,
        BLOCK_R=max(2, _np2(R)), BLOCK_S=max(2, _np2(S)),
        num_warps=4 if BLOCK_N <= 128 else 8,
    )
    return sel, gains, n_sel
