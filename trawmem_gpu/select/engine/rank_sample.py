"""The rank sample of a large bank (``shortlist.RANK_SAMPLE`` units drawn once with a fixed seed):
its vectors held as int8 codes, one scale per unit, for the query's dots that estimate the cosine
rank of a working-set unit past the index's proposals (``ranks.cosine_ranks``).

A unit ``v`` of the sample is held as ``codes = round(v / s)`` (int8 in ``[-127, 127]``) with
``s = max_k |v_k| / 127`` (float32; ``s = 1`` for a zero vector), and its dot with a query ``z``
is ``s * (codes . z)``, summed in float32. Each code is off by at most ``s / 2``, so a dot is off by
at most ``s / 2 * sum_k |z_k|`` (plus float32 rounding): about 0.002 for unit vectors of d = 384.

Why codes: a query reads every vector of the sample (4,096 x d float32 is 6.3 MB at d = 384, more
than a core's L2), and the dots are only counted (the sample's share above a unit's cosine, times
the bank's size, is that unit's rank estimate). A rank estimate from ``S`` sampled units is off
by about ``sqrt(S p (1 - p))`` units of the sample at a cosine whose share above it is ``p``: the
codes' error moves a dot across a unit's cosine only where a sampled cosine lies within 0.002 of
it, far fewer than that sampling error. The int8 codes are a quarter of the bytes
(``benchmarks/results/large_bank_sweep.json``, ``ab_stop61``).

:func:`dots` is the compiled loop; :func:`dots_plain` states the same sum in NumPy (the same
values up to float32 summation order, ``tests/select/test_rank_sample.py``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._jit import njit

CODE_MAX = 127
"""The largest code's magnitude (symmetric: ``-128`` is never written)."""
CODES = "int8"
"""What a new rank sample holds (:func:`rank_sample`): ``int8`` codes, or ``float32``: the vectors
as they are with scale 1 (the form before int8 codes; the same dots as a float32 loop)."""


class RankSample(NamedTuple):
    """A bank's rank sample: its units and their vectors as codes."""

    units: np.ndarray
    """``[S]`` int64: bank-local units, ascending."""
    codes: np.ndarray
    """``[S, d]`` int8 (each unit's vector over its scale, rounded) or float32 (the vectors, scale
    1), C-contiguous."""
    scale: np.ndarray
    """``[S]`` float32: each unit's scale (its largest magnitude over :data:`CODE_MAX`; 1 for float32
    codes)."""


def rank_sample(units: np.ndarray, vecs: np.ndarray, codes: str | None = None) -> RankSample:
    """The :class:`RankSample` of bank-local ``units [S]`` whose vectors are ``vecs [S, d]``, held as
    ``codes`` (``int8`` or ``float32``; None: :data:`CODES`)."""
    codes = CODES if codes is None else codes
    if codes not in ("int8", "float32"):
        raise ValueError(f"codes must be 'int8' or 'float32', got {codes!r}")
    v = np.asarray(vecs, dtype=np.float32)
    if v.ndim != 2 or len(v) != len(units):
        raise ValueError(f"vecs must be [{len(units)}, d], got {list(v.shape)}")
    if codes == "float32":
        return RankSample(np.asarray(units, dtype=np.int64), np.ascontiguousarray(v), np.ones(len(v), np.float32))
    top = np.abs(v).max(axis=1) if v.shape[1] else np.zeros(len(v), np.float32)
    scale = np.where(top > 0, top / CODE_MAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(v / scale[:, None]), -CODE_MAX, CODE_MAX).astype(np.int8)
    return RankSample(np.asarray(units, dtype=np.int64), np.ascontiguousarray(q), scale)


def dots_plain(sample: RankSample, z: np.ndarray) -> np.ndarray:
    """``[S]`` float32: ``scale_i * (codes_i . z)`` (the reference of :func:`dots`)."""
    z32 = np.asarray(z, dtype=np.float32)
    return (sample.codes.astype(np.float32) @ z32 * sample.scale).astype(np.float32)


def dots(sample: RankSample, z: np.ndarray) -> np.ndarray:
    """``[S]`` float32: each sampled unit's dot with ``z`` (:func:`dots_plain`), one compiled pass."""
    out = np.empty(len(sample.units), np.float32)
    _dots(sample.codes, sample.scale, np.ascontiguousarray(z, dtype=np.float32), out)
    return out


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz", "contract"})
def _dots(codes, scale, z, out):  # pragma: no cover - compiled
    """``out[i] = scale[i] * (codes[i] . z)`` in float32, one thread (int8 or float32 codes)."""
    for i in range(codes.shape[0]):
        acc = np.float32(0.0)
        for k in range(codes.shape[1]):
            acc += np.float32(codes[i, k]) * z[k]
        out[i] = acc * scale[i]
