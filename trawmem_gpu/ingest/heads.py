"""Extractive thread heads (no LLM): date, speakers, and the most central bursts."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..data.bursts import burst_vectors
from ..data.types import Turn

HEAD_TEXT_VERSION = 3
"""Bumped whenever :func:`extractive_head`'s text changes, so cached banks are rebuilt (2: one
speaker named once; 3: bursts quoted whole)."""


def _clip(text: str, words: int) -> str:
    w = text.split()
    return " ".join(w[:words]) + (" ..." if len(w) > words else "")


def extractive_head(turns: list[Turn], vecs: np.ndarray, *, sentences: int, words: int,
                    bursts: Sequence[int] | None = None) -> str:
    """``[date] A & B: A: <central burst> | B: <central burst>`` for one thread.

    The thread's units are its bursts (``bursts``: their starts, offsets into ``turns``,
    ``data.bursts``; each message its own burst without them): a burst's text is its messages'
    joined by a space, its vector the normalized mean of theirs (``data.bursts.burst_vectors``,
    as the burst view's units), so a thought split over short messages is quoted whole up to
    ``words`` words, as one long message would be. Central = highest cosine to the mean of the
    bursts' vectors; the ``sentences`` most central quoted in source order, ties to the earlier
    burst. Image captions stand in for empty texts. A thread with one speaker names them once
    (``[date] A: <central burst> | <central burst>``): a label per quote would only repeat it.
    """
    date = turns[0].time.strftime("%d %B %Y") if turns[0].time else turns[0].timestamp
    names = dict.fromkeys(t.speaker for t in turns)
    speakers, one = " & ".join(names), len(names) == 1
    off = sorted({0, *(int(b) for b in (bursts if bursts is not None else range(len(turns))) if 0 <= b < len(turns))})
    off.append(len(turns))
    units = [turns[a:b] for a, b in zip(off[:-1], off[1:])]
    uv = np.asarray(vecs, dtype=np.float32) if len(units) == len(turns) else burst_vectors(vecs, off)
    centroid = uv.mean(axis=0)
    score = uv @ centroid
    pick = sorted(sorted(range(len(units)), key=lambda i: (-score[i], i))[:sentences])
    quotes = []
    for i in pick:
        u = units[i]
        body = " ".join(t.text if t.text.strip() else (t.caption or "") for t in u).strip()
        quotes.append(_clip(body, words) if one else f"{u[0].speaker}: {_clip(body, words)}")
    return f"[{date}] {speakers}: " + " | ".join(quotes)
