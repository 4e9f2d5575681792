"""Extractive thread heads (no LLM): date, speakers, and the most central turns."""
from __future__ import annotations

import numpy as np

from ..data.types import Turn


def _clip(text: str, words: int) -> str:
    w = text.split()
    return " ".join(w[:words]) + (" ..." if len(w) > words else "")


def extractive_head(turns: list[Turn], vecs: np.ndarray, *, sentences: int, words: int) -> str:
    """``[date] A & B: <central turn> | <central turn>`` for one thread.

    Central = highest cosine to the thread's mean vector; quoted in source order, ties to the
    earlier turn. Image captions stand in for empty texts.
    """
    date = turns[0].time.strftime("%d %B %Y") if turns[0].time else turns[0].timestamp
    speakers = " & ".join(dict.fromkeys(t.speaker for t in turns))
    centroid = vecs.mean(axis=0)
    score = vecs @ centroid
    pick = sorted(sorted(range(len(turns)), key=lambda i: (-score[i], i))[:sentences])
    quotes = []
    for i in pick:
        t = turns[i]
        body = t.text if t.text.strip() else (t.caption or "")
        quotes.append(f"{t.speaker}: {_clip(body, words)}")
    return f"[{date}] {speakers}: " + " | ".join(quotes)
