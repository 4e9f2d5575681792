"""Stage 2, steps 5-6 (design note): costs and priorities.

Step 5: ``C(T_j, v) = d_q(T_j, v) + lambda_m (1 - alpha(v)) + lambda_r (1 - phi(v))`` with
``d_q`` the shortest-path cost in the local graph: head to head along G_H (edge cost
``c_hop + (1 - w_H)``, Floyd-Warshall over the neighbourhood), then from the unit's own head to
the unit inside its thread (``d_in``, query-independent).
Step 6: ``B_q = max(1, min(B, |U_q|))``, ``kappa = 1 / B_q``,
``w(v) = min(kappa, sum_j r~(T_j) exp(-C(T_j, v) / tau))``, ``pi = w / sum(w)`` (0 when the sum is 0).

The batched paths factor the sum: only the head-to-head part of ``C`` depends on ``j``, so
``sum_j r~_j exp(-C(T_j, v) / tau) = gravity[k(v)] * exp(-(d_in(v) + ...) / tau)`` with
``gravity[k] = sum_j r~_j exp(-Dhead[j, k] / tau)`` over the neighbourhood threads.

Side by side: the NumPy reference (:func:`head_distances`, :func:`priorities`), the torch batch
(:func:`gravity_torch`, :func:`role_priority_torch` and its Triton dispatcher
:func:`role_priority`) and the compiled per-query :func:`gravity_one`.
"""
from __future__ import annotations

import os
from typing import Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._jit import njit
from ..tensor_ops import POS_INF

Impl = Literal["auto", "torch", "triton"]


def unit_cost(dist, alpha, phi, lambda_m, lambda_r):
    """Step 5's ``C = dist + lambda_m (1 - alpha) + lambda_r (1 - phi)`` (floats, arrays, tensors)."""
    return dist + lambda_m * (1.0 - alpha) + lambda_r * (1.0 - phi)


unit_cost_compiled = njit(cache=True, inline="always")(unit_cost)


def effective_budget(budget, n_cand):
    """Step 6's ``B_q = max(1, min(B, |U_q|))`` (ints, NumPy arrays or torch tensors)."""
    b = n_cand * (n_cand < budget) + budget * (n_cand >= budget)
    return b + (b < 1) * (1 - b)


# ----------------------------------------------------------------------------------------------
# reference (NumPy, one query)
# ----------------------------------------------------------------------------------------------
def head_distances(ctx, threads: list[int], cfg) -> np.ndarray:
    """``[T, T]`` shortest head-to-head cost inside the neighbourhood (Floyd-Warshall); every
    off-diagonal entry is infinite without cross-thread support."""
    T = len(threads)
    D = np.full((T, T), np.inf)
    np.fill_diagonal(D, 0.0)
    if not cfg.cross_thread:
        return D
    pos = {t: i for i, t in enumerate(threads)}
    for i, j in enumerate(threads):
        for k, w in ctx.neighbours(j, cfg.semantic_edges):
            if k in pos:
                D[i, pos[k]] = min(D[i, pos[k]], cfg.c_hop + (1.0 - w))
    for m in range(T):
        D = np.minimum(D, D[:, m:m + 1] + D[m:m + 1, :])
    return D


def priorities(graph_cost: np.ndarray, rvec: np.ndarray, alpha: np.ndarray, phi: np.ndarray, Bq: int,
               weights: dict) -> np.ndarray:
    """``pi [U]`` from ``graph_cost [T, U]`` (= d_q(T_j, v)), the threads' r~ ``[T]``, the
    candidates' alpha and phi, B_q and the query's weights (lambda_m, lambda_r, tau)."""
    C = unit_cost(graph_cost, alpha[None, :], phi[None, :], weights["lambda_m"], weights["lambda_r"])
    w = np.minimum(1.0 / Bq, (rvec[:, None] * np.exp(-C / weights["tau"])).sum(axis=0))
    return w / w.sum() if w.sum() > 0 else np.zeros(len(alpha))


# ----------------------------------------------------------------------------------------------
# torch (a chunk of queries)
# ----------------------------------------------------------------------------------------------
def gravity_torch(Dh: Tensor, hvalid: Tensor, rvec: Tensor, tau, cross_thread: bool) -> Tensor:
    """``gravity [Qc, T] = sum_j r~_j exp(-Dhead[j, k] / tau)`` over the H_q threads.

    :param Dh: ``[Qc, T, T]`` direct head-to-head edge costs (inf where none; the diagonal is
        set to 0 here); Floyd-Warshall runs in place of the reference's
    :param tau: a float or per-query ``[Qc, 1]``
    """
    T = Dh.shape[1]
    eye = torch.eye(T, dtype=torch.bool, device=Dh.device)[None] & hvalid[:, :, None]
    Dh = torch.where(eye, torch.zeros((), dtype=Dh.dtype, device=Dh.device), Dh)
    if cross_thread:
        for m in range(T):
            Dh = torch.minimum(Dh, Dh[:, :, m:m + 1] + Dh[:, m:m + 1, :])
    tau = tau[:, :, None] if isinstance(tau, Tensor) else tau  # per-query [Qc, 1, 1]
    contrib = torch.where(hvalid[:, :, None], rvec[:, :, None] * torch.exp(-Dh / tau), 0.0)
    return contrib.sum(dim=1)


def edge_costs_torch(nbr_rows: Tensor, nbw_rows: Tensor, tpos: Tensor, T: int, c_hop: float) -> Tensor:
    """``[Qc, T, T]`` direct head-to-head costs ``c_hop + (1 - w_H)`` between the neighbourhood
    threads (scatter-amin from their neighbour lists ``nbr_rows / nbw_rows [Qc, T, D]``;
    ``tpos [Qc, J]``: a bank thread's neighbourhood position or -1); inf where no edge."""
    Qc = nbr_rows.shape[0]
    Dh = torch.full((Qc, T, T + 1), POS_INF, dtype=nbw_rows.dtype, device=nbw_rows.device)
    posk = torch.gather(tpos, 1, nbr_rows.clamp(min=0).flatten(1)).view_as(nbr_rows)
    posk = torch.where((nbr_rows >= 0) & (posk >= 0), posk, T)
    Dh.scatter_reduce_(2, posk, c_hop + (1.0 - nbw_rows), reduce="amin", include_self=True)
    return Dh[:, :, :T]


class PriorityInputs(NamedTuple):
    """One padded chunk of steps 5-6 inputs (torch tensors on one device)."""

    feats: Tensor
    """[Q, U, F] unit features."""
    Mq: Tensor
    """[Q, R, F] M(delta_q)."""
    delta: Tensor
    """[Q, R] role demand."""
    thread: Tensor
    """[Q, U] int64 index of each unit into ``gravity`` (-1 = padding)."""
    valid: Tensor
    """[Q, U] bool, live units."""
    gravity: Tensor
    """[Q, T]."""
    dist_in: Tensor
    """[Q, U] in-thread path cost d_in."""
    alpha: Tensor
    """[Q, U]."""
    budget: Tensor
    """[Q] int64 B_q (kappa = 1 / max(1, B_q))."""


class PriorityWeights(NamedTuple):
    """lambda_m, lambda_r, tau: floats or per-query ``[Q, 1]`` tensors."""

    lambda_m: object
    lambda_r: object
    tau: object


def role_priority_torch(x: PriorityInputs, w: PriorityWeights, T_R: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Role softmax, role fit, capped weight and priority (the specification; any float dtype):
    ``rho = softmax_r(Mq feats / T_R)``, ``phi = delta . rho``, ``cost = dist_in + lambda_m (1 -
    alpha) + lambda_r (1 - phi)``, ``w = min(1 / max(1, B_q), gravity[thread] exp(-cost / tau))``
    on live units (0 where ``thread`` is outside ``[0, T)``), ``pi = w / sum_u w`` (0 for a query
    whose ``w`` sums to 0). Returns ``rho [Q, U, R]``, ``phi [Q, U]``, ``w [Q, U]``, ``pi [Q, U]``."""
    dtype = x.feats.dtype
    valid = x.valid.bool()
    logits = torch.einsum("qrf,quf->qur", x.Mq.to(dtype), x.feats) / T_R
    rho = torch.softmax(logits, dim=-1) * valid.to(dtype)[..., None]
    phi = (rho * x.delta.to(dtype)[:, None, :]).sum(-1)
    cost = unit_cost(x.dist_in.to(dtype), x.alpha.to(dtype), phi, w.lambda_m, w.lambda_r)
    kappa = 1.0 / x.budget.clamp(min=1).to(dtype)
    T = x.gravity.shape[1]
    in_range = (x.thread >= 0) & (x.thread < T)
    g = torch.gather(x.gravity.to(dtype), 1, x.thread.clamp(0, max(T - 1, 0))) if T > 0 else torch.zeros_like(cost)
    g = torch.where(in_range, g, torch.zeros_like(g))
    wv = torch.minimum(kappa[:, None].expand_as(cost), g * torch.exp(-cost / w.tau))
    wv = torch.where(valid, wv, torch.zeros_like(wv))
    s = wv.sum(dim=1, keepdim=True)
    pi = torch.where(s > 0, wv / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(wv))
    return rho, phi, wv, pi


def role_priority(x: PriorityInputs, w: PriorityWeights, T_R: float, impl: Impl = "auto"):
    """:func:`role_priority_torch`, or the Triton kernel when the tensors are on CUDA and triton
    imports (``impl="auto"``) or when forced (``impl="triton"``; on CPU only under
    ``TRITON_INTERPRET=1``). The Triton path returns float32."""
    if not use_triton(impl, x.feats):
        return role_priority_torch(x, w, T_R)
    return kernels("priority", x.feats).role_priority_triton(x, per_query(w, x.feats.shape[0], x.feats.device), T_R)


def per_query(w: NamedTuple, Q: int, device) -> Tensor:
    """``[Q, len(w)]`` float32 columns of a weights tuple (floats or ``[Q, 1]`` tensors), for kernels."""
    return torch.stack([torch.as_tensor(v, dtype=torch.float32, device=device).reshape(-1).expand(Q) for v in w],
                       dim=1).contiguous()


# ----------------------------------------------------------------------------------------------
# Triton dispatch (shared with the greedy op)
# ----------------------------------------------------------------------------------------------
def _has_triton() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError, AttributeError):  # pragma: no cover - broken installs
        return False


HAS_TRITON = _has_triton()


def _interpret_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def use_triton(impl: str, x: Tensor) -> bool:
    """Whether to run the Triton kernel for tensors like ``x`` under ``impl``."""
    if impl == "torch":
        return False
    if impl == "auto":
        return HAS_TRITON and x.is_cuda
    if impl != "triton":
        raise ValueError(f"impl must be 'auto', 'torch' or 'triton' (got {impl!r})")
    if not HAS_TRITON:
        raise RuntimeError("impl='triton' requested but triton is not installed")
    if not x.is_cuda and not _interpret_enabled():
        raise RuntimeError("impl='triton' on CPU tensors needs TRITON_INTERPRET=1 set before the kernels are imported")
    return True


def kernels(name: str, x: Tensor):
    """``trawmem_gpu.kernels.<name>``, imported lazily (triton reads TRITON_INTERPRET when the
    kernels are decorated, i.e. at their first import)."""
    import importlib

    mod = importlib.import_module(f"trawmem_gpu.kernels.{name}")
    if not x.is_cuda and not getattr(mod, "INTERPRETED", False):
        raise RuntimeError(f"trawmem_gpu.kernels.{name} was imported without TRITON_INTERPRET=1; "
                           "CPU tensors cannot run compiled Triton kernels")
    return mod


# ----------------------------------------------------------------------------------------------
# compiled (numba, one query)
# ----------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def gravity_one(nt, hrows, tpos_q, graph, rvec_q, tau, c_hop, cross_thread, Dh, grav):  # pragma: no cover
    """``grav[:nt]`` of one query: Floyd-Warshall over its ``nt`` neighbourhood threads (stored
    thread rows ``hrows [nt]``, bank-thread -> position ``tpos_q``, ``graph``: a
    ``propagation.ThreadGraph``), then ``grav[k] = sum_j rvec_q[j] exp(-Dh[j, k] / tau)``.
    ``Dh [>= nt, >= nt]`` is scratch."""
    nbr, nbw = graph.nbr, graph.nbw
    D = nbr.shape[1]
    for i in range(nt):
        for j in range(nt):
            Dh[i, j] = np.inf
        Dh[i, i] = 0.0
    if cross_thread:
        for i in range(nt):
            g = hrows[i]
            for e in range(D):
                k = nbr[g, e]
                if k < 0:
                    continue
                p = tpos_q[k]
                if p >= 0 and p != i:
                    w = c_hop + (1.0 - nbw[g, e])
                    if w < Dh[i, p]:
                        Dh[i, p] = w
        for mm in range(nt):
            dm = Dh[mm, :nt]
            for i in range(nt):
                dim = Dh[i, mm]
                if dim == np.inf:
                    continue
                di = Dh[i, :nt]
                for j in range(nt):
                    di[j] = min(di[j], dim + dm[j])
    for k in range(nt):
        grav[k] = 0.0
    for j in range(nt):
        rj = rvec_q[j]
        for k in range(nt):
            if Dh[j, k] != np.inf:
                grav[k] += rj * np.exp(-Dh[j, k] / tau)


def in_thread_distances(head_sim: np.ndarray, thread_offsets: np.ndarray, c_head: float, c_step: float) -> np.ndarray:
    """``[N]`` d_in(v) = min_u c_head (1 - cos(h, e_u)) + c_step |u - v| over v's thread (the
    reference's ``BankContext.in_thread_dist``, vectorized over padded ``[J, L, L]``)."""
    lens = np.diff(thread_offsets)
    L = int(lens.max())
    ar = np.arange(L)
    valid = ar[None, :] < lens[:, None]
    idx = np.where(valid, thread_offsets[:-1, None] + ar[None, :], 0)
    a = np.where(valid, c_head * (1.0 - head_sim[idx]), np.inf)  # [J, L(u)]
    steps = c_step * np.abs(ar[:, None] - ar[None, :])  # [L(v), L(u)]
    d = (a[:, None, :] + steps[None]).min(axis=2)  # [J, L(v)]
    return d[valid]
