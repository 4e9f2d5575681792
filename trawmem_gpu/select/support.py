"""The support kernel K of J's information coverage (``objective`` re-exports these): the clip
formula once (:func:`support_from_cosine`), the kernel of a query's candidates (:func:`support_kernel`),
a unit view's support links as a floor of K (:func:`support_floor`), and the restatement groups those
links make (:func:`restatement_groups`, read by the group affinity of J)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._jit import njit, numba

def support_from_cosine(cos, k_shift):
    """``K = clip((cos - k_shift) / (1 - k_shift), 0, 1)``: the one statement of the clip formula,
    for floats, NumPy arrays, torch tensors and, compiled, inside numba
    (:func:`support_from_cosine_compiled`). The division is a product with the reciprocal, which a
    compiled loop hoists: one multiplication per entry."""
    return clip01((cos - k_shift) * (1.0 / (1.0 - k_shift)))


def clip01(y):
    """``clip(y, 0, 1)`` of an array, a tensor or a float (numba: ``min(max(y, 0), 1)``)."""
    return y.clip(0.0, 1.0) if hasattr(y, "clip") else min(max(y, 0.0), 1.0)


if numba is not None:
    @numba.extending.overload(clip01)
    def _clip01_compiled(y):  # pragma: no cover - compiled
        if isinstance(y, numba.types.Float):
            return lambda y: min(max(y, 0.0), 1.0)


support_from_cosine_compiled = njit(cache=True, inline="always")(support_from_cosine)


def support_kernel(cos, same_thread, cfg, floor=None):
    """``K [..., U, U]`` from candidate cosines (NumPy or torch): :func:`support_from_cosine`, zero across
    threads without cross-thread support (``same_thread [..., U, U]`` bool), raised to ``floor [..., U, U]``
    (a unit view's support links: :func:`support_floor`), unit diagonal; or the identity (``kernel="identity"``)."""
    U = cos.shape[-1]
    if _is_torch(cos):
        import torch

        eye = torch.eye(U, dtype=torch.bool, device=cos.device)
        if cfg.kernel == "identity":
            return eye.to(cos.dtype).expand(cos.shape).clone()
        K = support_from_cosine(cos, cfg.k_shift)
        if not cfg.cross_thread:
            K = K * same_thread
        if floor is not None:
            K = torch.maximum(K, floor.to(K.dtype))
        return torch.where(eye, torch.ones((), dtype=K.dtype, device=K.device), K)
    if cfg.kernel == "identity":
        return np.broadcast_to(np.eye(U), cos.shape).copy()
    K = support_from_cosine(cos, cfg.k_shift)
    if not cfg.cross_thread:
        K = K * same_thread
    K = np.array(K, dtype=np.float64)
    if floor is not None:
        np.maximum(K, floor, out=K)
    np.einsum("...ii->...i", K)[...] = 1.0
    return K


def support_floor(bank, cfg) -> np.ndarray | None:
    """``[N, N]`` float64 the least ``K(u, v)`` the support links of ``bank`` give (``Bank.support_src``
    restates ``support_dst``: a fact, a source turn), None without links. A restatement is lossy:
    ``K(restating, source) >= cfg.fact_support``; the source holds all it says: ``K(source,
    restating) = 1``. So J sees a fact and its source turn together as a redundancy."""
    src, dst = getattr(bank, "support_src", None), getattr(bank, "support_dst", None)
    if src is None or not len(src):
        return None
    F = np.zeros((bank.n_units, bank.n_units))
    F[src, dst] = cfg.fact_support
    F[dst, src] = 1.0
    return F


class SupportLinks(NamedTuple):
    """:func:`support_floor` held sparse, by row (CSR over the bank's units): row ``u``'s entries
    ``col[ptr[u]:ptr[u + 1]]`` with their floors ``val``; memory linear in the links, so a bank of
    any size keeps its links (a query's ``[U, U]`` floor is :meth:`between` its candidates)."""

    ptr: np.ndarray
    col: np.ndarray
    val: np.ndarray

    def between(self, cand: np.ndarray) -> np.ndarray | None:
        """``[U, U]`` the floor between the ascending units ``cand``: ``support_floor(bank)[ix_(cand,
        cand)]`` (a pair linked both ways takes the larger floor, 1, as the dense form's order of
        writes gives it, since ``fact_support <= 1``); None when no link joins two of them."""
        cand = np.asarray(cand, dtype=np.int64)
        U = len(cand)
        start, end = self.ptr[cand], self.ptr[cand + 1]
        lens = end - start
        tot = int(lens.sum())
        if tot == 0:
            return None
        row = np.repeat(np.arange(U), lens)
        idx = np.arange(tot) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(start, lens)
        v = self.col[idx]
        pos = np.minimum(np.searchsorted(cand, v), U - 1)
        ok = cand[pos] == v
        if not ok.any():
            return None
        F = np.zeros((U, U))
        np.maximum.at(F, (row[ok], pos[ok]), self.val[idx[ok]])
        return F

    def linked(self) -> np.ndarray:
        """``[N]`` float64 1 where a unit's floor row has an entry above 0 (``support_floor(bank).max(axis=1) > 0``)."""
        n = len(self.ptr) - 1
        rows = np.repeat(np.arange(n), np.diff(self.ptr))
        out = np.zeros(n)
        out[rows[self.val > 0]] = 1.0
        return out


def support_links(bank, cfg) -> SupportLinks | None:
    """The :class:`SupportLinks` of ``bank`` (:func:`support_floor`'s entries), None without links."""
    src, dst = getattr(bank, "support_src", None), getattr(bank, "support_dst", None)
    if src is None or not len(src):
        return None
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    rows, cols = np.concatenate([src, dst]), np.concatenate([dst, src])
    vals = np.concatenate([np.full(len(src), float(cfg.fact_support)), np.ones(len(dst))])
    order = np.lexsort((cols, rows))
    ptr = np.zeros(bank.n_units + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=bank.n_units), out=ptr[1:])
    return SupportLinks(ptr, cols[order], vals[order])


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")




def restatement_groups(bank) -> np.ndarray:
    """``[N]`` int64: each unit's restatement group, the smallest unit index of its component in the
    graph of the support links (a fact and the turns it restates, joined through shared turns); -1
    for a unit without links. J's group affinity (``terms/group_affinity.py``) counts the affinity
    of a group's picked units once, as their max."""
    n = bank.n_units
    src, dst = getattr(bank, "support_src", None), getattr(bank, "support_dst", None)
    out = np.full(n, -1, dtype=np.int64)
    if src is None or not len(src):
        return out
    parent = np.arange(n)

    def root(u):
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for a, b in zip(np.asarray(src).tolist(), np.asarray(dst).tolist()):
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the root stays its component's smallest index
    linked = np.zeros(n, dtype=bool)
    linked[src] = linked[dst] = True
    for u in np.flatnonzero(linked):
        out[u] = root(u)
    return out
