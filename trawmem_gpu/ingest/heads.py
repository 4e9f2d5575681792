"""Extractive thread heads (no LLM): date, speakers, and the most central turns."""
from __future__ import annotations

import numpy as np

from ..data.types import Turn


def _clip(text: str, words: int) -> str:
    w = text.split()
    return " ".join(w[:words]) + (" ..." if len(w) > words else "")


def extractive_head(turns: list[Turn], vecs: np.ndarray, *, sentences: int, words: int) -> str:
    """``[date] A & B: A: <central turn> | B: <central turn>`` for one thread.

    Central = highest cosine to the thread's mean vector; quoted in source order, ties to the
    earlier turn. Image captions stand in for empty texts. A thread with one speaker names them
    once (``[date] A: <central turn> | <central turn>``): a label per quote would only repeat it.
    """
    date = turns[0].time.strftime("%d %B %Y") if turns[0].time else turns[0].timestamp
    names = dict.fromkeys(t.speaker for t in turns)
    speakers, one = " & ".join(names), len(names) == 1
    centroid = vecs.mean(axis=0)
    score = vecs @ centroid
    pick = sorted(sorted(range(len(turns)), key=lambda i: (-score[i], i))[:sentences])
    quotes = []
    for i in pick:
        t = turns[i]
        body = t.text if t.text.strip() else (t.caption or "")
        quotes.append(_clip(body, words) if one else f"{t.speaker}: {_clip(body, words)}")
    return f"[{date}] {speakers}: " + " | ".join(quotes)
