"""Stage 2, step 4 (design note): roles. The query's demand ``delta = A x_q / 1^T A x_q`` over the
roles (anchor, bridge, context) from its text features ``x_q = (1, z_temp, z_rel, z_len)``; each
candidate's features ``f_q(v)`` (``UNIT_FEATURES`` order: 1, alpha, r~ of its thread, bridge =
best cosine to a candidate of another neighbourhood thread clipped to [0, 1], cosine to its own
head, temporal expression, position in its thread); role weights ``rho(v) = softmax(M(delta)
f_q(v) / T_R)`` and role fit ``phi(v) = delta . rho(v)``. ``M(delta) = M * (1 + delta)`` row-wise,
or a learned head's A and M(delta) (and its per-query weights).

Side by side: the NumPy reference (:func:`role_params`, :func:`unit_features`, :func:`role_fit`),
the torch batch (:func:`demand`, :func:`features_torch`, the bridge feature from the per-bank
table or from the candidates' cosines) and the compiled per-unit :func:`unit_roles`.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._jit import njit
from ..objective import weight_matrix
from ..terms import QUERY_WEIGHTS
from ..tensor_ops import NEG_INF
from ..text_features import demand_features


# ----------------------------------------------------------------------------------------------
# reference (NumPy, one query)
# ----------------------------------------------------------------------------------------------
def demand_mix(A: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``[Q, R]`` rows ``A x`` for ``X [Q, F]``, summed left to right over F in plain float64
    (elementwise IEEE operations, no BLAS): the reference and the batched engine get the same
    bits, one query or a thousand."""
    out = X[:, :1] * A[None, :, 0]
    for k in range(1, A.shape[1]):
        out = out + X[:, k:k + 1] * A[None, :, k]
    return out


def role_params(x: np.ndarray, cfg, head=None) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """``(delta [R], M(delta) [R, F], weights)`` from the demand features ``x_q``; ``weights`` maps
    every name of ``QUERY_WEIGHTS`` to its value for this query.

    Hand-set: delta = A x / 1^T A x, M(delta) = M * (1 + delta) row-wise, the config's weights.
    A learned head (``head.params(x) -> {"A", "M", "weights"?}``) supplies A and M(delta) instead,
    and may override any of the weights (``weights``: a dict of ``QUERY_WEIGHTS`` names).
    """
    weights = {k: float(getattr(cfg, k)) for k in QUERY_WEIGHTS}
    if head is None:
        delta = demand_mix(np.array(cfg.A), x[None, :])[0]
        delta = delta / delta.sum()
        return delta, np.array(cfg.M) * (1.0 + delta)[:, None], weights
    p = head.params(x)
    delta = demand_mix(np.asarray(p["A"], dtype=np.float64), x[None, :])[0]
    delta = np.maximum(delta, 1e-12)
    delta = delta / delta.sum()
    weights.update(check_head_weights(p.get("weights") or {}))
    return delta, np.asarray(p["M"], dtype=np.float64), weights


def check_head_weights(w: dict) -> dict:
    """A head's per-query weights, checked: known names, finite, >= 0 (tau > 0)."""
    unknown = set(w) - set(QUERY_WEIGHTS)
    if unknown:
        raise ValueError(f"the role head sets unknown weights {sorted(unknown)}; it may set {list(QUERY_WEIGHTS)}")
    for k, v in w.items():
        a = np.asarray(v, dtype=np.float64)
        if not np.all(np.isfinite(a)) or np.any(a < 0) or (k == "tau" and np.any(a <= 0)):
            raise ValueError(f"the role head's {k} must be finite and {'> 0' if k == 'tau' else '>= 0'}")
    return w


def unit_features(ctx, cand: np.ndarray, lt: np.ndarray, alpha: np.ndarray, rvec: np.ndarray,
                  S: np.ndarray) -> np.ndarray:
    """``f [U, F]`` of the candidates (``S [U, U]``: their cosines; ``rvec [T]``: r~ per thread)."""
    U = len(cand)
    other = lt[:, None] != lt[None, :]
    bridge = np.where(other, S, -np.inf).max(axis=1) if U > 1 else np.zeros(U)
    bridge = np.clip(np.where(np.isfinite(bridge), bridge, 0.0), 0.0, 1.0)
    return np.stack([np.ones(U), alpha, rvec[lt], bridge, ctx.head_sim[cand], ctx.temporal[cand],
                     ctx.position[cand]], 1)


def role_fit(f: np.ndarray, M: np.ndarray, delta: np.ndarray, T_R: float) -> tuple[np.ndarray, np.ndarray]:
    """``(rho [U, R], phi [U])``: rho = softmax(M(delta) f / T_R), phi = delta . rho."""
    x = f @ M.T / T_R
    e = np.exp(x - x.max(axis=1, keepdims=True))
    rho = e / e.sum(axis=1, keepdims=True)
    return rho, rho @ delta


# ----------------------------------------------------------------------------------------------
# the query part, batched (every backend)
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1 << 16)
def demand_features_cached(question: str) -> np.ndarray:
    """``demand_features`` once per distinct question text (read-only result; callers copy)."""
    x = demand_features(question)
    x.setflags(write=False)
    return x


class Demand(NamedTuple):
    """The query part of step 4 for a batch, NumPy float64: ``delta [Q, R]``, ``Mq [Q, R, F]`` and
    the per-query weight matrix ``W [Q, len(QUERY_WEIGHTS)]`` (``objective.weight_matrix``)."""

    delta: np.ndarray
    Mq: np.ndarray
    W: np.ndarray


def demand(questions: list[str], cfg, head=None, X: np.ndarray | None = None) -> Demand:
    """:class:`Demand` of a batch. Hand-set: as :func:`role_params`. A learned head replaces delta
    and M(delta): ``head.role_matrices(X)`` (X: ``[Q, 4]`` float64 tensor) returns ``(delta [Q, R],
    Mq [Q, R, F])``; ``head.weights_batch(X)``, if present, returns ``{name: [Q]}`` for names of
    ``QUERY_WEIGHTS``. ``X``: the questions' ``text_features.demand_matrix`` when the caller has
    it already (None: from the per-question cache)."""
    if X is None:
        X = np.stack([demand_features_cached(q) for q in questions])
    elif X.shape != (len(questions), 4):
        raise ValueError(f"demand: X has shape {X.shape}, expected ({len(questions)}, 4)")
    if head is None:
        delta = demand_mix(np.array(cfg.A), X)  # the reference's own function: same bits
        delta = delta / delta.sum(axis=1, keepdims=True)
        return Demand(delta, np.array(cfg.M)[None] * (1.0 + delta)[:, :, None], weight_matrix(cfg, len(X)))
    Xt = torch.as_tensor(X, dtype=torch.float64)
    delta, Mq = head.role_matrices(Xt)
    over = None
    if hasattr(head, "weights_batch"):
        over = check_head_weights({k: torch.as_tensor(v).double().cpu().numpy()
                                   for k, v in head.weights_batch(Xt).items()})
    return Demand(torch.as_tensor(delta).double().cpu().numpy(), torch.as_tensor(Mq).double().cpu().numpy(),
                  weight_matrix(cfg, len(X), over))


# ----------------------------------------------------------------------------------------------
# torch (a chunk of queries' candidates)
# ----------------------------------------------------------------------------------------------
def bridge_from_table(btab: Tensor, rows: Tensor, hthread: Tensor, lt: Tensor, cvalid: Tensor) -> Tensor:
    """bridge ``[Qc, U]`` = clip(max over the *other* neighbourhood threads t of
    ``btab[rows[q, u] + t]``, 0, 1), 0 when there is none: the per-bank table holds each unit's
    best cosine per thread, so this is the max over candidates of other threads, as the
    reference takes it (``rows [Qc, U]``: each candidate's row start in ``btab``)."""
    T = hthread.shape[1]
    idx = rows[:, :, None] + hthread.clamp(min=0)[:, None, :]
    B = torch.take(btab, idx)  # [Qc, U, T]
    own = torch.arange(T, device=lt.device)[None, None, :] == lt[:, :, None]
    keep = (hthread >= 0)[:, None, :] & ~own & cvalid[:, :, None]
    bridge = torch.where(keep, B, NEG_INF).amax(dim=2) if T else torch.full(lt.shape, NEG_INF, dtype=btab.dtype)
    return torch.clamp(torch.where(torch.isfinite(bridge), bridge, 0.0), 0.0, 1.0)


def bridge_from_similarity(S: Tensor, lt: Tensor, cvalid: Tensor) -> Tensor:
    """bridge ``[Qc, U]`` from the candidates' cosines ``S [Qc, U, U]`` (no tables)."""
    other = (lt[:, :, None] != lt[:, None, :]) & cvalid[:, None, :]
    bridge = torch.where(other, S, NEG_INF).amax(dim=2)
    return torch.clamp(torch.where(torch.isfinite(bridge), bridge, 0.0), 0.0, 1.0)


def features_torch(alpha: Tensor, thread_score: Tensor, bridge: Tensor, unit_cols: tuple[Tensor, Tensor, Tensor],
                   cvalid: Tensor) -> Tensor:
    """``f [Qc, U, F]`` from the per-candidate columns (``unit_cols``: head_sim, temporal, position)."""
    f = torch.stack([torch.ones_like(alpha), alpha, thread_score, bridge, *unit_cols], dim=2)
    return torch.where(cvalid[:, :, None], f, 0.0)


# ----------------------------------------------------------------------------------------------
# compiled (numba, one unit)
# ----------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def unit_roles(f, Mq, delta, q, T_R, lg, rho, u):  # pragma: no cover - compiled
    """``rho[u] = softmax(Mq[q] f / T_R)`` (written in place; ``lg [R]`` scratch); returns
    ``phi = delta[q] . rho[u]``. Whole arrays and indices, no views: a view per unit would cost
    reference counting in the hot loop."""
    R, F = Mq.shape[1], Mq.shape[2]
    mx = -np.inf
    for r in range(R):
        acc = 0.0
        for k in range(F):
            acc += Mq[q, r, k] * f[k]
        lg[r] = acc / T_R
        if lg[r] > mx:
            mx = lg[r]
    den = 0.0
    for r in range(R):
        d = lg[r] - mx
        lg[r] = 1.0 if d == 0.0 else np.exp(d)  # the largest: exp(+-0) is 1 exactly (C99 Annex F)
        den += lg[r]
    phi = 0.0
    for r in range(R):
        rho[u, r] = lg[r] / den
        phi += rho[u, r] * delta[q, r]
    return phi
