"""Triton kernels for the fused role-softmax / role-fit / cost / priority stage.

Two launches, both with one program per (query, block of units):

1. ``_role_weight_kernel``: ``rho = softmax_r(Mq feats / T_R)``, ``phi = delta . rho``,
   ``cost``, ``w = min(kappa, gravity[thread] exp(-cost / tau))`` and a per-block partial sum of
   ``w`` (written to ``partial[Q, NB]``; no atomics, so the result is deterministic).
2. ``_normalize_kernel``: ``pi = w / sum(partial[q])``, or 0 when that sum is 0.

Everything is computed in float32; the costs and priorities follow ``steps.priority`` (step 5's
``unit_cost``, step 6's capped weight) with per-query lambda_m, lambda_r and tau. The
specification is ``trawmem_gpu.select.steps.priority.role_priority_torch``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def _role_weight_kernel(
    feats_ptr, m_ptr, delta_ptr, thread_ptr, valid_ptr, grav_ptr, dist_ptr, alpha_ptr, budget_ptr,
    pw_ptr, rho_ptr, phi_ptr, w_ptr, partial_ptr,
    U, F, T, NB, inv_tr,
    R: tl.constexpr, BLOCK_U: tl.constexpr, BLOCK_R: tl.constexpr,
):
    q = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    lambda_m = tl.load(pw_ptr + q * 3 + 0)  # this query's priority weights (steps.priority.PriorityWeights)
    lambda_r = tl.load(pw_ptr + q * 3 + 1)
    inv_tau = 1.0 / tl.load(pw_ptr + q * 3 + 2)
    offs_u = blk * BLOCK_U + tl.arange(0, BLOCK_U)
    offs_r = tl.arange(0, BLOCK_R)
    umask = offs_u < U
    rmask = offs_r < R

    row = q * U + offs_u  # flat [Q, U] index
    valid = tl.load(valid_ptr + row, mask=umask, other=0) != 0
    live = umask & valid

    # logits[u, r] = sum_f feats[q, u, f] * Mq[q, r, f], accumulated one feature column at a time
    logits = tl.zeros([BLOCK_U, BLOCK_R], dtype=tl.float32)
    for f in range(0, F):
        fcol = tl.load(feats_ptr + row * F + f, mask=umask, other=0.0).to(tl.float32)
        mcol = tl.load(m_ptr + (q * R + offs_r) * F + f, mask=rmask, other=0.0).to(tl.float32)
        logits += fcol[:, None] * mcol[None, :]
    logits = logits * inv_tr
    logits = tl.where(rmask[None, :], logits, float("-inf"))
    lmax = tl.max(logits, axis=1)
    ex = tl.exp(logits - lmax[:, None])
    ex = tl.where(rmask[None, :], ex, 0.0)
    rho = ex / tl.sum(ex, axis=1)[:, None]
    rho = tl.where(live[:, None] & rmask[None, :], rho, 0.0)

    delta = tl.load(delta_ptr + q * R + offs_r, mask=rmask, other=0.0).to(tl.float32)
    phi = tl.sum(rho * delta[None, :], axis=1)

    dist = tl.load(dist_ptr + row, mask=umask, other=0.0).to(tl.float32)
    alpha = tl.load(alpha_ptr + row, mask=umask, other=0.0).to(tl.float32)
    cost = dist + lambda_m * (1.0 - alpha) + lambda_r * (1.0 - phi)

    budget = tl.load(budget_ptr + q)
    kappa = 1.0 / tl.maximum(budget, 1).to(tl.float32)

    th = tl.load(thread_ptr + row, mask=umask, other=-1)
    tok = live & (th >= 0) & (th < T)
    grav = tl.load(grav_ptr + q * T + tl.where(tok, th, 0), mask=tok, other=0.0).to(tl.float32)
    w = tl.minimum(kappa, grav * tl.exp(-cost * inv_tau))
    w = tl.where(live, w, 0.0)

    rho_offs = row[:, None] * R + offs_r[None, :]
    tl.store(rho_ptr + rho_offs, rho, mask=umask[:, None] & rmask[None, :])
    tl.store(phi_ptr + row, phi, mask=umask)
    tl.store(w_ptr + row, w, mask=umask)
    tl.store(partial_ptr + q * NB + blk, tl.sum(w, axis=0))


@triton.jit
def _normalize_kernel(w_ptr, partial_ptr, pi_ptr, U, NB, BLOCK_U: tl.constexpr, BLOCK_NB: tl.constexpr):
    q = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    offs_b = tl.arange(0, BLOCK_NB)
    s = tl.sum(tl.load(partial_ptr + q * NB + offs_b, mask=offs_b < NB, other=0.0), axis=0)
    offs_u = blk * BLOCK_U + tl.arange(0, BLOCK_U)
    umask = offs_u < U
    w = tl.load(w_ptr + q * U + offs_u, mask=umask, other=0.0)
    denom = tl.where(s > 0.0, s, 1.0)
    pi = tl.where(s > 0.0, w / denom, 0.0)
    tl.store(pi_ptr + q * U + offs_u, pi, mask=umask)


def _np2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def role_priority_triton(x, pw, T_R: float, block_u: int = 0):
    """Triton role priority; same contract as ``role_priority_torch`` (float32 outputs).

    :param x: ``steps.priority.PriorityInputs``
    :param pw: ``[Q, 3]`` float32 per-query (lambda_m, lambda_r, tau)
    :param block_u: units per program (power of two); 0 picks ``min(128, next_pow2(U))``
    :return: ``rho [Q, U, R]``, ``phi [Q, U]``, ``w [Q, U]``, ``pi [Q, U]``
    """
    Q, U, F = x.feats.shape
    R = x.Mq.shape[1]
    T = x.gravity.shape[1]
    dev = x.feats.device
    f32 = torch.float32
    rho = torch.zeros(Q, U, R, dtype=f32, device=dev)
    phi = torch.zeros(Q, U, dtype=f32, device=dev)
    w = torch.zeros(Q, U, dtype=f32, device=dev)
    pi = torch.zeros(Q, U, dtype=f32, device=dev)
    if Q == 0 or U == 0:
        return rho, phi, w, pi
    BLOCK_U = block_u or min(128, max(16, _np2(U)))
    NB = triton.cdiv(U, BLOCK_U)
    partial = torch.zeros(Q, NB, dtype=f32, device=dev)
    grav = x.gravity.to(f32).contiguous() if T > 0 else torch.zeros(Q, 1, dtype=f32, device=dev)
    grid = (Q, NB)
    _role_weight_kernel[grid](
        x.feats.contiguous(), x.Mq.contiguous(), x.delta.to(f32).contiguous(), x.thread.to(torch.int64).contiguous(),
        x.valid.to(torch.int8).contiguous(), grav, x.dist_in.to(f32).contiguous(), x.alpha.to(f32).contiguous(),
        x.budget.to(torch.int64).contiguous(), pw.to(f32).contiguous(),
        rho, phi, w, partial,
        U, F, T, NB, 1.0 / float(T_R),
        R=R, BLOCK_U=BLOCK_U, BLOCK_R=max(2, _np2(R)),
    )
    _normalize_kernel[grid](w, partial, pi, U, NB, BLOCK_U=BLOCK_U, BLOCK_NB=max(2, _np2(NB)))
    return rho, phi, w, pi
