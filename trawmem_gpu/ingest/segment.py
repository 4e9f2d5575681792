"""Thread segmentation within one session: embedding (TextTiling-style) or fixed windows.

Each function takes one session and returns segment start offsets (``[0, s1, s2, ...]``);
threads never cross a session because sessions are segmented one at a time.
"""
from __future__ import annotations

import numpy as np


def fixed_segments(n: int, size: int) -> list[int]:
    """Starts of fixed windows of ``size`` turns over a session of ``n`` turns."""
    return list(range(0, n, size)) if n else []


def gap_similarities(vecs: np.ndarray, window: int) -> np.ndarray:
    """[n, d] unit vectors -> [n-1] cosine of the mean of ``window`` turns left and right of each gap."""
    n = len(vecs)
    if n < 2:
        return np.zeros(0, dtype=np.float64)
    c = np.concatenate([np.zeros((1, vecs.shape[1])), np.cumsum(vecs.astype(np.float64), axis=0)])
    sims = np.empty(n - 1)
    for g in range(n - 1):  # gap g lies between turn g and turn g+1
        lo, hi = max(0, g + 1 - window), min(n, g + 1 + window)
        left = c[g + 1] - c[lo]
        right = c[hi] - c[g + 1]
        den = np.linalg.norm(left) * np.linalg.norm(right)
        sims[g] = float(left @ right / den) if den > 0 else 0.0
    return sims


def depth_scores(sims: np.ndarray) -> np.ndarray:
    """TextTiling depth: climb to the highest similarity on each side while it keeps rising."""
    m = len(sims)
    depth = np.zeros(m)
    for g in range(m):
        lp = sims[g]
        i = g
        while i > 0 and sims[i - 1] >= lp:
            i -= 1
            lp = sims[i]
        rp = sims[g]
        j = g
        while j < m - 1 and sims[j + 1] >= rp:
            j += 1
            rp = sims[j]
        depth[g] = (lp - sims[g]) + (rp - sims[g])
    return depth


def embedding_segments(vecs: np.ndarray, *, window: int, depth_std: float, min_depth: float,
                       min_len: int, max_len: int) -> list[int]:
    """Segment one session of [n, d] unit vectors; returns sorted segment starts, first 0.

    Gaps whose depth clears ``max(min_depth, mean - depth_std * std)`` become boundaries, the
    deepest first, skipping any that would leave a thread shorter than ``min_len``; segments
    longer than ``max_len`` are then split at their lowest-similarity gap that respects
    ``min_len`` on both sides. Deterministic: ties go to the earlier gap.
    """
    n = len(vecs)
    if n == 0:
        return []
    if n <= min_len:
        return [0]
    sims = gap_similarities(vecs, window)
    depth = depth_scores(sims)
    cut = max(min_depth, float(depth.mean() - depth_std * depth.std())) if len(depth) else np.inf
    bounds: list[int] = []  # boundary b means a new thread starts at turn b (= gap b-1)
    for g in sorted(range(len(depth)), key=lambda g: (-depth[g], g)):
        if depth[g] < cut or depth[g] <= 0:
            break
        b = g + 1
        pts = sorted(bounds + [b])
        edges = [0] + pts + [n]
        if all(edges[i + 1] - edges[i] >= min_len for i in range(len(edges) - 1)):
            bounds = pts
    starts = [0] + bounds

    def split(s: int, e: int) -> list[int]:
        if e - s <= max_len:
            return [s]
        lo, hi = s + min_len, e - min_len  # candidate new starts b in [lo, hi]
        if lo > hi:
            lo, hi = s + 1, e - 1
        cands = list(range(lo, hi + 1))
        b = min(cands, key=lambda b: (sims[b - 1], b))
        return split(s, b) + split(b, e)

    out: list[int] = []
    ends = starts[1:] + [n]
    for s, e in zip(starts, ends):
        out.extend(split(s, e))
    return out
