"""Triton kernel for the greedy workspace-selection loop.

One program per query runs the whole greedy loop. Per-query state lives in registers:

* ``c[BLOCK_N]``: covered support ``max_{s in S} K[s, v]``; ``pi[BLOCK_N]``: priorities,
* ``m[BLOCK_R]``: covered role mass ``max_{s in S} rho[s, r]``,
* ``sel_vec[BLOCK_S]`` / ``thr_vec[BLOCK_S]``: the picked units and their threads (used to mask
  picked units and hit threads by comparison, so no scratch memory and no barriers are needed).

Each step sweeps the candidates in blocks of ``BLOCK_U`` rows. The coverage gain of a block
needs a ``[BLOCK_U, BLOCK_N]`` tile of ``K``, loaded from a ``[Q, U, U]`` tensor (``KMODE=0``:
the engine gathers it from the per-bank support tables, or forms it with
``objective.support_kernel``), or the identity (``KMODE=2``). A unit's gain is J's (``objective``):
``w_cov * cov + w_role * role + m(u) + w_thr * thr`` with the modular part ``m`` precomputed and the
coverage weights per query, read by their columns in ``terms.COVERAGE_TERMS`` order. The kernel
holds the pieces (``<term>_gain``, ``<term>_add``) of the coverage terms that declare ``triton`` in
``terms.TERMS`` (:data:`FUSED_TERMS`); the dispatcher uses it only while every coverage term
with a weight is one of them, ``tests/select/agreement/test_objective.py`` checks it term by term and
``tests/select/test_term_registry.py`` that its pieces are those the terms declare. The running
best (value, index) keeps the earlier block on ties and each block takes its smallest index among
equal maxima, so ties go to the smallest unit index.

All accumulation is float32. The specification is
``trawmem_gpu.select.steps.greedy.greedy_select_torch``. Sized for ``U`` up to ~1-2k (``c`` and
``pi`` are register vectors of ``next_pow2(U)``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..select.terms import COVERAGE_TERMS
from ..select.steps.greedy.batched import TRITON_FUSED_TERMS as FUSED_TERMS  # noqa: F401 - the terms held here

INTERPRETED = bool(triton.knobs.runtime.interpret)

KMODE_MATRIX = 0
KMODE_IDENTITY = 2


@triton.jit
def _k_tile(k_ptr, q, offs_u, umask, valid_u, offs_n, nmask, valid_n, U, KMODE: tl.constexpr):
    """``K[q, offs_u, offs_n]`` as a float32 ``[BLOCK_U, BLOCK_N]`` tile, 0 outside live pairs."""
    pair = (umask & valid_u)[:, None] & (nmask & valid_n)[None, :]
    if KMODE == 0:
        ptrs = k_ptr + q * U * U + offs_u[:, None].to(tl.int64) * U + offs_n[None, :]
        tile = tl.load(ptrs, mask=umask[:, None] & nmask[None, :], other=0.0).to(tl.float32)
    else:
        tile = tl.where(offs_u[:, None] == offs_n[None, :], 1.0, 0.0)
    return tl.where(pair, tile, 0.0)


@triton.jit
def _k_row(k_ptr, q, u, offs_n, nmask, valid_n, U, KMODE: tl.constexpr):
    """``K[q, u, offs_n]`` as a float32 row, 0 outside live units."""
    if KMODE == 0:
        krow = tl.load(k_ptr + q * U * U + u.to(tl.int64) * U + offs_n, mask=nmask, other=0.0).to(tl.float32)
    else:
        krow = tl.where(offs_n == u, 1.0, 0.0)
    return tl.where(nmask & valid_n, krow, 0.0)


@triton.jit
def information_coverage_gain(ktile, pi_n, c):
    """``sum_v pi[v] max(K(u, v) - c[v], 0)`` of each row ``u`` of the tile."""
    return tl.sum(pi_n[None, :] * tl.maximum(ktile - c[None, :], 0.0), axis=1)


@triton.jit
def information_coverage_add(c, krow):
    return tl.maximum(c, krow)


@triton.jit
def role_coverage_gain(rho_t, delta, m):
    """``sum_r delta_r max(rho[u, r] - m[r], 0)`` of each row ``u`` of ``rho_t``."""
    return tl.sum(delta[None, :] * tl.maximum(rho_t - m[None, :], 0.0), axis=1)


@triton.jit
def role_coverage_add(m, rho_star):
    return tl.maximum(m, rho_star)


@triton.jit
def thread_coverage_gain(th, thr_vec, mass):
    """Each unit's thread mass, 0 where its thread ``th`` is among the picks' (``thr_vec``)."""
    hit = tl.sum((th[:, None] == thr_vec[None, :]).to(tl.int32), axis=1) > 0
    return tl.where(hit, 0.0, mass)


@triton.jit
def thread_coverage_add(thr_vec, offs_s, t, th_star):
    return tl.where(offs_s == t, th_star, thr_vec)


@triton.jit
def _greedy_kernel(
    pi_ptr, k_ptr, rho_ptr, delta_ptr, mod_ptr, thread_ptr, tmass_ptr, valid_ptr, limit_ptr, w_ptr,
    sel_ptr, gains_ptr, nsel_ptr,
    U, T, S, stop_cov,
    R: tl.constexpr, KMODE: tl.constexpr, NW: tl.constexpr, C_COV: tl.constexpr, C_ROLE: tl.constexpr,
    C_THR: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_U: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
):
    q = tl.program_id(0).to(tl.int64)
    w_cov = tl.load(w_ptr + q * NW + C_COV)  # the coverage weights of this query (objective.CoverageWeights)
    w_role = tl.load(w_ptr + q * NW + C_ROLE)
    w_thr = tl.load(w_ptr + q * NW + C_THR)

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
            ktile = _k_tile(k_ptr, q, offs_u, umask, valid_u, offs_n, nmask, valid_n, U, KMODE)
            cov = information_coverage_gain(ktile, pi_n, c)

            rho_t = tl.load(rho_ptr + row[:, None] * R + offs_r[None, :],
                            mask=umask[:, None] & rmask[None, :], other=0.0).to(tl.float32)
            role = role_coverage_gain(rho_t, delta, m)

            mod_u = tl.load(mod_ptr + row, mask=umask, other=0.0).to(tl.float32)

            th = tl.load(thread_ptr + row, mask=umask, other=-1)
            tok = umask & valid_u & (th >= 0) & (th < T)
            mass = tl.load(tmass_ptr + q * T + tl.where(tok, th, 0), mask=tok, other=0.0).to(tl.float32)
            thr = thread_coverage_gain(th, thr_vec, mass)

            gain = w_cov * cov + w_role * role + mod_u + w_thr * thr  # objective.combine_gain
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
        c = information_coverage_add(c, _k_row(k_ptr, q, best_idx, offs_n, nmask, valid_n, U, KMODE))
        rho_star = tl.load(rho_ptr + (q * U + best_idx) * R + offs_r, mask=rmask, other=0.0).to(tl.float32)
        m = role_coverage_add(m, rho_star)
        th_star = tl.load(thread_ptr + q * U + best_idx)
        thr_vec = thread_coverage_add(thr_vec, offs_s, t, th_star)
        sel_vec = tl.where(offs_s == t, best_idx, sel_vec)
        covered = tl.sum(pi_n * c, axis=0)
        t += 1
        go = (t < limit) & (covered < stop_cov)
    tl.store(nsel_ptr + q, t.to(tl.int64))


_COLS = {t.name: i for i, t in enumerate(COVERAGE_TERMS)}


def _np2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def greedy_select_triton(p, w, limit, stop_coverage: float, max_steps: int, block_u: int = 0):
    """Launch the greedy kernel; same contract as ``greedy_select_torch``.

    :param p: ``steps.greedy.GreedyProblem`` (``K`` None = the identity)
    :param w: ``[Q, len(COVERAGE_TERMS)]`` float32 per-query coverage weights (``CoverageWeights`` order)
    :param limit: ``[Q]`` int, ``min(B_q, #valid, max_steps)`` (``steps.greedy.pick_limit``)
    :param block_u: candidate rows per block (power of two >= 16); 0 picks a default
    :return: ``sel [Q, max_steps]`` int64, ``gains [Q, max_steps]`` float32, ``n_sel [Q]`` int64
    """
    Q, U = p.pi.shape
    dev = p.pi.device
    S = int(max_steps)
    sel = torch.full((Q, S), -1, dtype=torch.int64, device=dev)
    gains = torch.zeros(Q, S, dtype=torch.float32, device=dev)
    n_sel = torch.zeros(Q, dtype=torch.int64, device=dev)
    if Q == 0 or U == 0 or S <= 0:
        return sel, gains, n_sel
    R = p.rho.shape[2]
    T = p.thread_mass.shape[1]
    f32 = torch.float32
    kmode, k_arg = (KMODE_MATRIX, p.K.contiguous()) if p.K is not None else (KMODE_IDENTITY, p.pi)
    BLOCK_N = max(16, _np2(U))
    BLOCK_U = block_u or max(16, min(BLOCK_N, 8192 // BLOCK_N))
    tmass = p.thread_mass.to(f32).contiguous() if T > 0 else torch.zeros(Q, 1, dtype=f32, device=dev)
    _greedy_kernel[(Q,)](
        p.pi.to(f32).contiguous(), k_arg, p.rho.to(f32).contiguous(), p.delta.to(f32).contiguous(),
        p.modular.to(f32).contiguous(), p.thread.to(torch.int64).contiguous(), tmass,
        p.valid.to(torch.int8).contiguous(), limit.to(torch.int32).contiguous(), w.to(f32).contiguous(),
        sel, gains, n_sel,
        U, T, S, float(stop_coverage),
        R=R, KMODE=kmode, NW=w.shape[1], C_COV=_COLS["information_coverage"], C_ROLE=_COLS["role_coverage"],
        C_THR=_COLS["thread_coverage"], BLOCK_N=BLOCK_N, BLOCK_U=BLOCK_U,
        BLOCK_R=max(2, _np2(R)), BLOCK_S=max(2, _np2(S)),
        num_warps=4 if BLOCK_N <= 128 else 8,
    )
    return sel, gains, n_sel
