"""Batched Stage-2 selection ops: role priority and greedy workspace selection.

Two ops over a padded batch of ``Q`` queries with at most ``U`` candidate units each
(``R`` roles, ``T`` neighborhood threads, ``F`` unit features):

* :func:`role_priority` -- role softmax ``rho``, role fit ``phi``, capped weight ``w`` and the
  priority distribution ``pi`` (method Stage 2, steps 4-6).
* :func:`greedy_select` -- greedy maximisation of the monotone submodular objective ``J(S)``
  (method Stage 2, step 7), with ``K`` given as a matrix, computed on the fly from unit vectors
  ``E``, or the identity.

Each op has a native torch implementation (``*_torch``: the specification, the fallback and
the test oracle) and a dispatcher that runs the Triton kernel from ``trawmem_gpu.kernels`` when
the tensors are on CUDA and triton imports (``impl="auto"``), or when forced with
``impl="triton"`` (on CPU only under ``TRITON_INTERPRET=1``). The greedy op also has two plain
NumPy float64 references, a loop (:func:`greedy_plain_np`) and a lazy greedy with stale upper
bounds (:func:`greedy_lazy_np`); both pick exactly the same units, ties included.

Conventions shared by every implementation:

* A unit is live iff ``valid[q, u]``; padding units get ``rho = phi = w = pi = 0`` and are
  never selected. A live unit whose ``thread`` is outside ``[0, T)`` gets gravity 0 and no
  thread-coverage term.
* ``pi`` is ``w / sum(w)``; when that sum is 0 (no live unit, or every ``w`` underflowed),
  ``pi`` is 0 for the whole query.
* ``K`` entries in padding rows or columns are ignored (treated as 0); ``pi`` of padding
  units is treated as 0.
* Greedy ties are broken by the smallest unit index. Implementations agree exactly whenever
  all arithmetic is exact (e.g. dyadic inputs); otherwise float32 paths (torch, Triton) may
  break near-ties differently from each other and from the float64 NumPy references, because
  sums are taken in different orders. Gains must be separated by more than float32 rounding
  (~1e-6 relative) for the paths to be guaranteed to pick the same units.
* All weights ``w_cov, w_role, w_aff, w_thr`` must be >= 0 (the objective is then monotone
  submodular, which lazy greedy relies on).
"""
from __future__ import annotations

import heapq
import importlib.util
import os
from typing import Literal, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

Impl = Literal["auto", "torch", "triton"]



def _has_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError, AttributeError):  # pragma: no cover - broken installs
        return False


HAS_TRITON = _has_triton()

__all__ = [
    "HAS_TRITON",
    "role_priority",
    "role_priority_torch",
    "K_from_vectors",
    "greedy_select",
    "greedy_select_torch",
    "greedy_plain_np",
    "greedy_lazy_np",
    "greedy_reference_np",
]


# --------------------------------------------------------------------------------------------
# dispatch helpers
# --------------------------------------------------------------------------------------------
def _interpret_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def _use_triton(impl: str, x: Tensor) -> bool:
    """Whether to run the Triton kernel for tensors like ``x`` under ``impl``."""
    if impl == "torch":
        return False
    if impl == "auto":
        return HAS_TRITON and x.is_cuda
    if impl != "triton":
        raise ValueError(f"impl must be 'auto', 'torch' or 'triton', got {impl!r}")
    if not HAS_TRITON:
        raise RuntimeError("impl='triton' requested but triton is not installed")
    if not x.is_cuda and not _interpret_enabled():
        raise RuntimeError(
            "impl='triton' on CPU tensors needs TRITON_INTERPRET=1 set before the kernels are imported"
        )
    return True


def _kernels(name: str, x: Tensor):
    """Import ``trawmem_gpu.kernels.<name>`` lazily (triton reads TRITON_INTERPRET when the
    kernels are decorated, i.e. at their first import)."""
    import importlib

    mod = importlib.import_module(f"trawmem_gpu.kernels.{name}")
    if not x.is_cuda and not getattr(mod, "INTERPRETED", False):
        raise RuntimeError(
            f"trawmem_gpu.kernels.{name} was imported without TRITON_INTERPRET=1; "
            "CPU tensors cannot run compiled Triton kernels"
        )
    return mod


# --------------------------------------------------------------------------------------------
# Op 1: role priority
# --------------------------------------------------------------------------------------------
def role_priority_torch(
    feats: Tensor,
    Mq: Tensor,
    delta: Tensor,
    thread: Tensor,
    valid: Tensor,
    gravity: Tensor,
    dist_in: Tensor,
    alpha: Tensor,
    budget: Tensor,
    lambda_m: float,
    lambda_r: float,
    tau: float,
    T_R: float,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Native torch role priority (the specification; works in any float dtype).

    :param feats: unit features, ``[Q, U, F]``
    :param Mq: per-query role matrix ``M(delta_q)``, ``[Q, R, F]``
    :param delta: task demand over roles, ``[Q, R]``
    :param thread: thread index of each unit into ``gravity``, ``[Q, U]`` int64 (-1 = padding)
    :param valid: live-unit mask, ``[Q, U]`` bool
    :param gravity: propagated thread scores ``r~``, ``[Q, T]``
    :param dist_in: in-neighborhood path cost ``d_q``, ``[Q, U]``
    :param alpha: query affinity, ``[Q, U]``
    :param budget: per-query budget ``B_q``, ``[Q]`` int64 (``kappa = 1 / max(1, B_q)``)
    :return: ``rho [Q, U, R]``, ``phi [Q, U]``, ``w [Q, U]``, ``pi [Q, U]``
    """
    dtype = feats.dtype
    valid = valid.bool()
    vf = valid.to(dtype)
    logits = torch.einsum("qrf,quf->qur", Mq.to(dtype), feats) / T_R
    rho = torch.softmax(logits, dim=-1) * vf[..., None]
    phi = (rho * delta.to(dtype)[:, None, :]).sum(-1)
    cost = dist_in.to(dtype) + lambda_m * (1.0 - alpha.to(dtype)) + lambda_r * (1.0 - phi)
    kappa = 1.0 / budget.clamp(min=1).to(dtype)
    T = gravity.shape[1]
    in_range = (thread >= 0) & (thread < T)
    g = torch.gather(gravity.to(dtype), 1, thread.clamp(0, max(T - 1, 0))) if T > 0 else torch.zeros_like(cost)
    g = torch.where(in_range, g, torch.zeros_like(g))
    w = torch.minimum(kappa[:, None].expand_as(cost), g * torch.exp(-cost / tau))
    w = torch.where(valid, w, torch.zeros_like(w))
    s = w.sum(dim=1, keepdim=True)
    pi = torch.where(s > 0, w / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(w))
    return rho, phi, w, pi


def role_priority(
    feats: Tensor,
    Mq: Tensor,
    delta: Tensor,
    thread: Tensor,
    valid: Tensor,
    gravity: Tensor,
    dist_in: Tensor,
    alpha: Tensor,
    budget: Tensor,
    lambda_m: float,
    lambda_r: float,
    tau: float,
    T_R: float,
    impl: Impl = "auto",
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Role softmax, role fit, capped weight and priority for a padded batch.

    ``rho = softmax_r(Mq feats / T_R)``, ``phi = delta . rho``,
    ``cost = dist_in + lambda_m (1 - alpha) + lambda_r (1 - phi)``,
    ``w = min(1 / max(1, budget), gravity[thread] * exp(-cost / tau))`` on live units,
    ``pi = w / sum_u w`` (0 for a query whose ``w`` sums to 0).

    :param feats: ``[Q, U, F]``; ``Mq``: ``[Q, R, F]``; ``delta``: ``[Q, R]``
    :param thread: ``[Q, U]`` int64; ``valid``: ``[Q, U]`` bool; ``gravity``: ``[Q, T]``
    :param dist_in, alpha: ``[Q, U]``; ``budget``: ``[Q]`` int64
    :param impl: ``"auto"`` (Triton on CUDA when available), ``"torch"`` or ``"triton"``
    :return: ``rho [Q, U, R]``, ``phi [Q, U]``, ``w [Q, U]``, ``pi [Q, U]`` (float32 on the
        Triton path; the input dtype on the torch path)
    """
    if not _use_triton(impl, feats):
        return role_priority_torch(
            feats, Mq, delta, thread, valid, gravity, dist_in, alpha, budget,
            lambda_m, lambda_r, tau, T_R,
        )
    return _kernels("priority", feats).role_priority_triton(
        feats, Mq, delta, thread, valid, gravity, dist_in, alpha, budget,
        float(lambda_m), float(lambda_r), float(tau), float(T_R),
    )


# --------------------------------------------------------------------------------------------
# Op 2: greedy selection
# --------------------------------------------------------------------------------------------
def K_from_vectors(E: Tensor, valid: Tensor, identity: bool = False) -> Tensor:
    """Support matrix from unit vectors: ``clamp(E E^T, 0, 1)`` with a unit diagonal.

    :param E: unit vectors, ``[Q, U, d]`` (any float dtype; computed in float32 or wider)
    :param valid: ``[Q, U]`` bool; padding rows and columns of ``K`` are 0
    :param identity: return the identity on live units instead (the ``identity_k`` ablation)
    :return: ``K [Q, U, U]`` with ``K[q, u, v]`` = how much selecting u supports v
    """
    valid = valid.bool()
    dtype = torch.promote_types(E.dtype, torch.float32)
    Q, U = valid.shape
    eye = torch.eye(U, dtype=torch.bool, device=valid.device)[None]
    if identity:
        K = eye.to(dtype).expand(Q, U, U).clone()
    else:
        Ef = E.to(dtype)
        K = torch.bmm(Ef, Ef.transpose(1, 2)).clamp_(0.0, 1.0)
        K = torch.where(eye, torch.ones_like(K), K)
    pair = valid[:, :, None] & valid[:, None, :]
    return torch.where(pair, K, torch.zeros_like(K))


def _greedy_limits(valid: Tensor, budget: Tensor, max_steps: int) -> Tensor:
    """``min(budget, #valid, max_steps)`` clamped at 0, ``[Q]`` int64."""
    n_valid = valid.bool().sum(dim=1)
    lim = torch.minimum(budget.to(n_valid.dtype), n_valid).clamp(min=0, max=max(int(max_steps), 0))
    return lim.to(torch.int64)


def greedy_select_torch(
    pi: Tensor,
    K: Optional[Tensor],
    rho: Tensor,
    delta: Tensor,
    alpha: Tensor,
    thread: Tensor,
    thread_mass: Tensor,
    valid: Tensor,
    budget: Tensor,
    w_cov: float = 1.0,
    w_role: float = 1.0,
    w_aff: float = 1.0,
    w_thr: float = 1.0,
    stop_coverage: float = 2.0,
    max_steps: int = 16,
    E: Optional[Tensor] = None,
    identity: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Native batched torch greedy: all queries at once, one Python iteration per step.

    Computes in ``promote(pi.dtype, float32)``; materializes ``K`` from ``E`` (or the identity)
    when ``K`` is None. Shapes and semantics as :func:`greedy_select`.
    """
    valid = valid.bool()
    Q, U = pi.shape
    dev = pi.device
    dtype = torch.promote_types(pi.dtype, torch.float32)
    max_steps = int(max_steps)
    if K is None:
        if identity:
            K = K_from_vectors(torch.zeros(Q, U, 1, device=dev, dtype=dtype), valid, identity=True)
        elif E is not None:
            K = K_from_vectors(E, valid)
        else:
            raise ValueError("greedy_select needs K, E, or identity=True")
    pair = valid[:, :, None] & valid[:, None, :]
    K = torch.where(pair, K.to(dtype), torch.zeros((), dtype=dtype, device=dev))
    piv = torch.where(valid, pi.to(dtype), torch.zeros((), dtype=dtype, device=dev))
    rho = rho.to(dtype)
    delta = delta.to(dtype)
    alpha = alpha.to(dtype)
    T = thread_mass.shape[1]
    in_range = valid & (thread >= 0) & (thread < T)
    # Column 0 of the padded thread tables is a dummy for out-of-range threads.
    tcol = torch.where(in_range, thread + 1, torch.zeros_like(thread))
    tmass = torch.cat([torch.zeros(Q, 1, dtype=dtype, device=dev), thread_mass.to(dtype)], dim=1)
    unit_mass = torch.gather(tmass, 1, tcol)  # [Q, U]
    hit = torch.zeros(Q, T + 1, dtype=torch.bool, device=dev)

    limit = _greedy_limits(valid, budget.to(dev), max_steps)
    sel = torch.full((Q, max_steps), -1, dtype=torch.int64, device=dev)
    gains = torch.zeros(Q, max_steps, dtype=dtype, device=dev)
    n_sel = torch.zeros(Q, dtype=torch.int64, device=dev)
    c = torch.zeros(Q, U, dtype=dtype, device=dev)
    m = torch.zeros_like(delta)
    avail = valid.clone()
    active = torch.ones(Q, dtype=torch.bool, device=dev)
    ar = torch.arange(U, device=dev)
    qidx = torch.arange(Q, device=dev)
    neg_inf = torch.tensor(float("-inf"), dtype=dtype, device=dev)
    zero = torch.zeros((), dtype=dtype, device=dev)

    for t in range(max_steps):
        active = active & (t < limit)
        if U == 0 or not bool(active.any()):
            break
        cov = (piv[:, None, :] * (K - c[:, None, :]).clamp_min(0)).sum(-1)
        role = (delta[:, None, :] * (rho - m[:, None, :]).clamp_min(0)).sum(-1)
        thr = torch.where(torch.gather(hit, 1, tcol), zero, unit_mass)
        gain = w_cov * cov + w_role * role + w_aff * alpha + w_thr * thr
        gain = torch.where(avail, gain, neg_inf)
        best_val = gain.max(dim=1, keepdim=True).values
        best = torch.where(gain == best_val, ar, U).min(dim=1).values  # smallest index among ties
        best = torch.where(active, best, torch.zeros_like(best)).clamp(max=max(U - 1, 0))
        bval = best_val.squeeze(1)
        sel[:, t] = torch.where(active, best, sel[:, t])
        gains[:, t] = torch.where(active, bval, zero)
        n_sel += active.to(torch.int64)
        # state update, only for active queries
        act2 = active[:, None]
        avail[qidx, best] = avail[qidx, best] & ~active
        c = torch.where(act2, torch.maximum(c, K[qidx, best]), c)
        m = torch.where(act2, torch.maximum(m, rho[qidx, best]), m)
        tb = tcol[qidx, best]
        hit[qidx, tb] = hit[qidx, tb] | active
        hit[:, 0] = False
        covered = (piv * c).sum(dim=1)
        active = active & (covered < stop_coverage)
    return sel, gains.to(torch.float32), n_sel


def greedy_select(
    pi: Tensor,
    K: Optional[Tensor],
    rho: Tensor,
    delta: Tensor,
    alpha: Tensor,
    thread: Tensor,
    thread_mass: Tensor,
    valid: Tensor,
    budget: Tensor,
    w_cov: float = 1.0,
    w_role: float = 1.0,
    w_aff: float = 1.0,
    w_thr: float = 1.0,
    stop_coverage: float = 2.0,
    max_steps: int = 16,
    *,
    E: Optional[Tensor] = None,
    identity: bool = False,
    impl: Impl = "auto",
) -> Tuple[Tensor, Tensor, Tensor]:
    """Greedy maximisation of ``J(S)`` for a padded batch of queries.

    ``gain(u) = w_cov sum_v pi_v max(0, K[u,v] - c_v) + w_role sum_r delta_r max(0, rho[u,r] - m_r)
    + w_aff alpha_u + w_thr [thread(u) not hit] thread_mass[thread(u)]``, with
    ``c_v = max_{s in S} K[s, v]``, ``m_r = max_{s in S} rho[s, r]``. Each step adds the live,
    unselected unit of largest gain (smallest index on ties) until ``min(budget, #live,
    max_steps)`` units are picked or, after an update, ``sum_v pi_v c_v >= stop_coverage``
    (a value > 1 disables the early stop).

    :param pi: priority, ``[Q, U]``
    :param K: support matrix ``[Q, U, U]`` in [0, 1] with unit diagonal, or None with ``E``
        (``K = K_from_vectors(E, valid)``, computed blockwise in the Triton kernel) or with
        ``identity=True``
    :param rho: role weights ``[Q, U, R]``; ``delta``: ``[Q, R]``; ``alpha``: ``[Q, U]``
    :param thread: ``[Q, U]`` int64 (-1 = padding); ``thread_mass``: ``[Q, T]``
    :param valid: ``[Q, U]`` bool; ``budget``: ``[Q]`` int64
    :param E: unit vectors ``[Q, U, d]`` (used when ``K`` is None)
    :param identity: use ``K = I`` on live units (when ``K`` is None)
    :param impl: ``"auto"`` (Triton on CUDA when available), ``"torch"`` or ``"triton"``
    :return: ``sel [Q, max_steps]`` int64 (unused slots -1), ``gains [Q, max_steps]`` float32
        (unused slots 0), ``n_sel [Q]`` int64
    """
    if K is None and E is None and not identity:
        raise ValueError("greedy_select needs K, E, or identity=True")
    if not _use_triton(impl, pi):
        return greedy_select_torch(
            pi, K, rho, delta, alpha, thread, thread_mass, valid, budget,
            w_cov, w_role, w_aff, w_thr, stop_coverage, max_steps, E=E, identity=identity,
        )
    limit = _greedy_limits(valid.to(pi.device), budget.to(pi.device), max_steps)
    return _kernels("greedy", pi).greedy_select_triton(
        pi, K, E, identity, rho, delta, alpha, thread, thread_mass, valid, limit,
        float(w_cov), float(w_role), float(w_aff), float(w_thr), float(stop_coverage), int(max_steps),
    )


# --------------------------------------------------------------------------------------------
# NumPy float64 references (one query at a time)
# --------------------------------------------------------------------------------------------
class _GreedyState:
    """Per-query greedy state and the exact marginal gain (NumPy float64)."""

    def __init__(self, pi, K, rho, delta, alpha, thread, thread_mass, valid, w):
        self.valid = np.asarray(valid, dtype=bool)
        U = self.valid.shape[0]
        pair = self.valid[:, None] & self.valid[None, :]
        self.K = np.where(pair, np.asarray(K, dtype=np.float64).reshape(U, U), 0.0)
        self.pi = np.where(self.valid, np.asarray(pi, dtype=np.float64), 0.0)
        self.rho = np.asarray(rho, dtype=np.float64).reshape(U, -1)
        self.delta = np.asarray(delta, dtype=np.float64)
        self.alpha = np.asarray(alpha, dtype=np.float64)
        self.thread = np.asarray(thread, dtype=np.int64)
        self.tmass = np.asarray(thread_mass, dtype=np.float64)
        self.w_cov, self.w_role, self.w_aff, self.w_thr = (float(x) for x in w)
        self.c = np.zeros(U)
        self.m = np.zeros(self.delta.shape[0])
        self.hit = np.zeros(self.tmass.shape[0], dtype=bool)

    def _thread_ok(self, u: int) -> bool:
        t = self.thread[u]
        return 0 <= t < self.tmass.shape[0]

    def gain(self, u: int) -> float:
        cov = float(np.sum(self.pi * np.maximum(0.0, self.K[u] - self.c)))
        role = float(np.sum(self.delta * np.maximum(0.0, self.rho[u] - self.m)))
        thr = 0.0
        if self._thread_ok(u) and not self.hit[self.thread[u]]:
            thr = float(self.tmass[self.thread[u]])
        return self.w_cov * cov + self.w_role * role + self.w_aff * float(self.alpha[u]) + self.w_thr * thr

    def add(self, u: int) -> float:
        """Add ``u``; return the covered mass ``sum_v pi_v c_v``."""
        self.c = np.maximum(self.c, self.K[u])
        self.m = np.maximum(self.m, self.rho[u])
        if self._thread_ok(u):
            self.hit[self.thread[u]] = True
        return float(np.sum(self.pi * self.c))


def greedy_plain_np(
    pi, K, rho, delta, alpha, thread, thread_mass, valid, budget: int,
    w_cov: float = 1.0, w_role: float = 1.0, w_aff: float = 1.0, w_thr: float = 1.0,
    stop_coverage: float = 2.0, max_steps: int = 16,
) -> Tuple[list, list]:
    """Plain greedy for ONE query in NumPy float64 (the clearest statement of the math).

    :param pi: ``[U]``; ``K``: ``[U, U]``; ``rho``: ``[U, R]``; ``delta``: ``[R]``;
        ``alpha``: ``[U]``; ``thread``: ``[U]``; ``thread_mass``: ``[T]``; ``valid``: ``[U]``
    :return: ``(sel, gains)`` lists of the picked indices and their marginal gains
    """
    st = _GreedyState(pi, K, rho, delta, alpha, thread, thread_mass, valid, (w_cov, w_role, w_aff, w_thr))
    U = st.valid.shape[0]
    limit = max(0, min(int(budget), int(st.valid.sum()), int(max_steps)))
    selected = np.zeros(U, dtype=bool)
    sel, gains = [], []
    for _ in range(limit):
        best_u, best_g = -1, -np.inf
        for u in range(U):  # ascending order + strict '>' = smallest index wins ties
            if st.valid[u] and not selected[u]:
                g = st.gain(u)
                if g > best_g:
                    best_u, best_g = u, g
        selected[best_u] = True
        sel.append(best_u)
        gains.append(best_g)
        if st.add(best_u) >= stop_coverage:
            break
    return sel, gains


def greedy_lazy_np(
    pi, K, rho, delta, alpha, thread, thread_mass, valid, budget: int,
    w_cov: float = 1.0, w_role: float = 1.0, w_aff: float = 1.0, w_thr: float = 1.0,
    stop_coverage: float = 2.0, max_steps: int = 16,
) -> Tuple[list, list]:
    """Lazy greedy for ONE query (NumPy float64); picks exactly what :func:`greedy_plain_np` picks.

    A heap holds stale upper bounds keyed ``(-bound, index)``. Pop the top, recompute its gain
    ``g``; accept it if ``g > next bound``, or ``g == next bound`` and its index is smaller than
    the next one's; otherwise push ``(-g, index)`` back. Exact because every gain term is
    non-increasing as S grows, in floating point too (``max(0, a - c)`` is monotone in ``c``
    under rounding, products with non-negative weights and sums in a fixed order preserve it).
    Same arguments and return as :func:`greedy_plain_np`.
    """
    st = _GreedyState(pi, K, rho, delta, alpha, thread, thread_mass, valid, (w_cov, w_role, w_aff, w_thr))
    U = st.valid.shape[0]
    limit = max(0, min(int(budget), int(st.valid.sum()), int(max_steps)))
    heap = [(-st.gain(u), u) for u in range(U) if st.valid[u]]
    heapq.heapify(heap)
    sel, gains = [], []
    while len(sel) < limit:
        _, u = heapq.heappop(heap)
        g = st.gain(u)
        if heap:
            nb, nu = -heap[0][0], heap[0][1]
            if not (g > nb or (g == nb and u < nu)):
                heapq.heappush(heap, (-g, u))
                continue
        sel.append(u)
        gains.append(g)
        if st.add(u) >= stop_coverage:
            break
    return sel, gains


def greedy_reference_np(
    pi, K, rho, delta, alpha, thread, thread_mass, valid, budget,
    w_cov: float = 1.0, w_role: float = 1.0, w_aff: float = 1.0, w_thr: float = 1.0,
    stop_coverage: float = 2.0, max_steps: int = 16, lazy: bool = False,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Batched wrapper over the per-query NumPy references (a Python loop over queries).

    Takes the same batched tensors/arrays as :func:`greedy_select` (``K`` materialized).
    :return: ``sel [Q, max_steps]`` int64, ``gains [Q, max_steps]`` float64, ``n_sel [Q]`` int64
    """
    def a(x):
        return x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)

    pi, K, rho, delta, alpha, thread, thread_mass, valid, budget = (
        a(x) for x in (pi, K, rho, delta, alpha, thread, thread_mass, valid, budget)
    )
    fn = greedy_lazy_np if lazy else greedy_plain_np
    Q = pi.shape[0]
    sel = np.full((Q, max_steps), -1, dtype=np.int64)
    gains = np.zeros((Q, max_steps), dtype=np.float64)
    n_sel = np.zeros(Q, dtype=np.int64)
    for q in range(Q):
        s, g = fn(pi[q], K[q], rho[q], delta[q], alpha[q], thread[q], thread_mass[q], valid[q],
                  int(budget[q]), w_cov, w_role, w_aff, w_thr, stop_coverage, max_steps)
        sel[q, : len(s)] = s
        gains[q, : len(g)] = g
        n_sel[q] = len(s)
    return sel, gains, n_sel
