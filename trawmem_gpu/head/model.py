"""The learned role head: x_q -> (A, M(delta), objective/cost weights), and its file format.

The head only supplies the numbers the method leaves open; rho, phi, the costs, the priorities
and the greedy stay the reference pipeline's (``select.steps.roles.role_params`` protocol)::

    A        = max(0, A0 + dA)                                      [R=3, 4]   (nonnegative)
    delta    = A x / 1^T A x
    M(delta) = B0 * (1 + delta)[:, None] + dM0 + sum_r delta_r dM_r  [R, F]
    weight_k = w0_k * exp(s_k + S_k . x)                            (positive), k in LEARNED_WEIGHTS

``A0``, ``B0`` and ``w0`` are the hand-set ``SelectConfig`` values (frozen buffers); every
trainable tensor starts at zero, so a fresh head reproduces the hand-set selection bit for bit
(``B0 * (1 + delta)`` is the hand-set ``M(delta)``, ``w0 * exp(0) == w0``). ``M(delta)`` is
thus ``M0 + sum_r delta_r M_r`` with ``M0 = B0 + dM0`` and ``M_r = B0[r-th row only] + dM_r``.
Nonnegativity of ``A`` is a clamp, not a softplus: a softplus cannot sit at the hand-set zeros
of ``A`` and its gradient there vanishes (sigmoid(-40) ~ 4e-18), so those entries could never
move; a clamped entry pushed below zero is pulled back to the boundary by the L2 term of the
training loss, where its gradient flows again.

Files are safetensors (float64 tensors) with string metadata: format version, the unit and
demand feature lists, the learned weight names, the selection config, training provenance
(data sha256, conversations, seed, epochs, ...) and a content hash (sha256 over the tensors and
the metadata, checked on load).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import TrawmemError, loads_json
from ..select.config import DEMAND_FEATURES, UNIT_FEATURES, SelectConfig
from ..select.terms import LEARNED_WEIGHTS
from ..select.steps.roles import demand_mix

FORMAT = "trawmem-role-head"
FORMAT_VERSION = 1
# LEARNED_WEIGHTS (``objective``: the terms declared ``learned``, then the priority weights) are the
# SelectConfig fields the head sets per query, in ``terms.QUERY_WEIGHTS`` order, and part of the
# file format. The other weights (``w_rec``, ``w_grp``) keep the config's value. Fields that shape
# the candidate set (seeds, hops, affinity, ...) are never overridden: the training surrogate
# precomputes U_q under them.
TENSORS = ("A0", "B0", "w0", "dA", "dM0", "dMr", "s", "S")
_TRAINABLE = ("dA", "dM0", "dMr", "s", "S")


class HeadError(TrawmemError):
    """A head file is missing, corrupt, of another format version or built for other features."""


class RoleHead(nn.Module):
    """Small learned map from the task-demand features x_q to A, M(delta) and the J/C weights.

    :param cfg: the selection config whose hand-set A, M and weights are the initial point
    :param conditional_weights: let the weights depend on x_q (``S``); else only ``s``
    """

    def __init__(self, cfg: SelectConfig | None = None, conditional_weights: bool = True):
        super().__init__()
        cfg = cfg or SelectConfig()
        self.cfg = cfg
        self.conditional_weights = bool(conditional_weights)
        R, F, D, W = 3, len(UNIT_FEATURES), len(DEMAND_FEATURES), len(LEARNED_WEIGHTS)
        dt = torch.float64
        self.register_buffer("A0", torch.tensor(cfg.A, dtype=dt))
        self.register_buffer("B0", torch.tensor(cfg.M, dtype=dt))
        self.register_buffer("w0", torch.tensor([float(getattr(cfg, k)) for k in LEARNED_WEIGHTS], dtype=dt))
        self.dA = nn.Parameter(torch.zeros(R, D, dtype=dt))
        self.dM0 = nn.Parameter(torch.zeros(R, F, dtype=dt))
        self.dMr = nn.Parameter(torch.zeros(R, R, F, dtype=dt))
        self.s = nn.Parameter(torch.zeros(W, dtype=dt))
        self.S = nn.Parameter(torch.zeros(W, D, dtype=dt), requires_grad=self.conditional_weights)
        self.meta: dict = {}
        self.path: str | None = None

    # ---------------------------------------------------------------------------------- torch
    def forward(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """X ``[Q, 4]`` -> ``delta [Q, R]``, ``M(delta) [Q, R, F]``, weights ``[Q, W]`` (LEARNED_WEIGHTS order)."""
        X = X.to(torch.float64)
        A = torch.clamp(self.A0 + self.dA, min=0.0)
        delta = torch.clamp(X @ A.T, min=1e-12)
        delta = delta / delta.sum(dim=1, keepdim=True)
        M = self.B0[None] * (1.0 + delta)[:, :, None] + self.dM0[None] + torch.einsum("qr,rkf->qkf", delta, self.dMr)
        w = self.w0[None] * torch.exp(self.s[None] + X @ self.S.T)
        return delta, M, w

    def role_matrices(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Batched-engine protocol: ``(delta [Q, R], M(delta) [Q, R, F])`` for X ``[Q, 4]``."""
        with torch.no_grad():
            delta, M, _ = self.forward(torch.as_tensor(X))
        return delta, M

    def weights_batch(self, X: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-query learned weights ``{field: [Q]}`` for X ``[Q, 4]`` (for a batched engine)."""
        with torch.no_grad():
            _, _, w = self.forward(torch.as_tensor(X))
        return {k: w[:, i] for i, k in enumerate(LEARNED_WEIGHTS)}

    # ------------------------------------------------------------------------- numpy protocol
    def _np(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k).detach().cpu().numpy().astype(np.float64) for k in TENSORS}

    def params(self, x: np.ndarray) -> dict:
        """Reference protocol (``select.steps.roles.role_params``): ``{"A", "M", "weights"}`` for one x_q.

        Plain NumPy float64 with the reference's own operations for ``delta``, so a fresh head
        gives exactly the hand-set numbers.
        """
        t = self._np()
        x = np.asarray(x, dtype=np.float64)
        A = np.maximum(t["A0"] + t["dA"], 0.0)
        delta = demand_mix(A, x[None, :])[0]
        delta = np.maximum(delta, 1e-12)
        delta = delta / delta.sum()
        M = t["B0"] * (1.0 + delta)[:, None] + t["dM0"] + np.einsum("r,rkf->kf", delta, t["dMr"])
        w = t["w0"] * np.exp(t["s"] + t["S"] @ x)
        return {"A": A, "M": M, "weights": {k: float(v) for k, v in zip(LEARNED_WEIGHTS, w)}}

    # -------------------------------------------------------------------------------- helpers
    def reg_loss(self) -> torch.Tensor:
        """Squared distance of the trainable tensors from the hand-set start (all zeros)."""
        return sum((getattr(self, k) ** 2).sum() for k in _TRAINABLE)

    def content_hash(self) -> str:
        return _content_hash(self._tensor_dict(), self._meta_for_hash())

    def _tensor_dict(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k).detach().cpu().to(torch.float64).contiguous() for k in TENSORS}

    def _meta_for_hash(self) -> dict[str, str]:
        return {
            "format": FORMAT, "format_version": str(FORMAT_VERSION),
            "unit_features": json.dumps(list(UNIT_FEATURES)), "demand_features": json.dumps(list(DEMAND_FEATURES)),
            "learned_weights": json.dumps(list(LEARNED_WEIGHTS)),
            "conditional_weights": json.dumps(self.conditional_weights),
            "config": json.dumps(asdict(self.cfg), sort_keys=True),
            "training": json.dumps(self.meta, sort_keys=True, default=str),
        }

    def describe(self) -> dict:
        """Provenance for result files: path, content hash and training summary."""
        tr = self.meta
        return {"path": self.path, "sha256": self.content_hash(), "format_version": FORMAT_VERSION,
                "data_sha256": tr.get("data_sha256"), "conversations": tr.get("conversations"),
                "seed": tr.get("seed"), "epochs": tr.get("epochs")}

    def summary(self) -> dict:
        """Learned values next to the hand-set ones (A, M rows at delta = e_r, weights at x = (1,0,0,0))."""
        t = self._np()
        A = np.maximum(t["A0"] + t["dA"], 0.0)
        w = t["w0"] * np.exp(t["s"] + t["S"][:, 0])
        return {"A": A.tolist(), "A0": t["A0"].tolist(), "dM0": t["dM0"].tolist(), "dMr": t["dMr"].tolist(),
                "weights": dict(zip(LEARNED_WEIGHTS, w.tolist())),
                "weights0": dict(zip(LEARNED_WEIGHTS, t["w0"].tolist())),
                "weight_log_slopes": {k: dict(zip(DEMAND_FEATURES, row))
                                      for k, row in zip(LEARNED_WEIGHTS, t["S"].tolist())}}


def _content_hash(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        a = tensors[k].numpy()
        h.update(k.encode() + b"\0" + str(a.shape).encode() + b"\0" + np.ascontiguousarray(a, dtype="<f8").tobytes())
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


def save_head(head: RoleHead, path: str | Path) -> str:
    """Write ``head`` to ``path`` atomically (temp file in the same folder, then rename). Returns its hash."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = head._tensor_dict()
    meta = head._meta_for_hash()
    digest = _content_hash(tensors, meta)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta | {"sha256": digest})
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    head.path = str(path)
    return digest


def load_head(path: str | Path) -> RoleHead:
    """Read a head written by ``save_head``; HeadError on a missing, corrupt or mismatched file."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise HeadError(f"role head {path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types on a bad header/body
        raise HeadError(f"role head {path}: not a readable safetensors file ({type(e).__name__}: {e})") from e
    if meta.get("format") != FORMAT:
        raise HeadError(f"role head {path}: not a TrawMem role head (format={meta.get('format')!r})")
    if meta.get("format_version") != str(FORMAT_VERSION):
        raise HeadError(f"role head {path}: format version {meta.get('format_version')!r}, "
                        f"this package reads {FORMAT_VERSION}")
    for key, want in (("unit_features", UNIT_FEATURES), ("demand_features", DEMAND_FEATURES),
                      ("learned_weights", LEARNED_WEIGHTS)):
        try:
            got = tuple(loads_json(meta.get(key, "null")) or ())
        except ValueError as e:  # malformed or nested too deeply
            raise HeadError(f"role head {path}: metadata field {key!r} is corrupt") from e
        if got != tuple(want):
            raise HeadError(f"role head {path}: {key} {list(got)} do not match this package's {list(want)}; "
                            f"retrain the head")
    missing = [k for k in TENSORS if k not in tensors]
    if missing:
        raise HeadError(f"role head {path}: missing tensors {missing}")
    stored = meta.pop("sha256", None)
    digest = _content_hash({k: tensors[k].to(torch.float64) for k in TENSORS}, meta)
    if stored != digest:
        raise HeadError(f"role head {path}: content hash mismatch (stored {stored}, computed {digest}); "
                        f"the file is corrupt or was edited")
    try:
        cfg = SelectConfig.from_dict(_tuples(loads_json(meta["config"])))
        conditional = bool(loads_json(meta["conditional_weights"]))
        training = loads_json(meta["training"])
    except (KeyError, TypeError, ValueError) as e:
        raise HeadError(f"role head {path}: metadata is corrupt ({e})") from e
    head = RoleHead(cfg, conditional_weights=conditional)
    with torch.no_grad():
        for k in TENSORS:
            want = tuple(getattr(head, k).shape)
            if tuple(tensors[k].shape) != want:
                raise HeadError(f"role head {path}: tensor {k} has shape {tuple(tensors[k].shape)}, expected {want}")
            getattr(head, k).copy_(tensors[k].to(torch.float64))
    head.meta = training
    head.path = str(path)
    head.eval()
    return head


def _tuples(d: dict) -> dict:
    for k in ("A", "M"):
        if k in d:
            d[k] = tuple(tuple(r) for r in d[k])
    return d
