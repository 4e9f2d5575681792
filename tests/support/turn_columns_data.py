"""Synthetic turns for the columns tests (``tests/memory/test_turn_columns_memory.py``): a few
topics' words, unicode, empty texts (with a caption, as the schema needs), several sessions."""
from __future__ import annotations

import random
from datetime import datetime, timedelta

from trawmem_gpu.data.types import Turn

TOPICS = [["dog", "park", "walk", "leash"], ["café", "crème", "brûlée", "Zoë"], ["日本語", "東京", "旅行"],
          ["guitar", "concert", "song", "🎸"], ["garden", "tomato", "rain", "spring"]]
QUESTIONS = ["Where did Zoë eat crème brûlée?", "what song at the concert 🎸", "東京 旅行", "tomato garden rain"]


def synthetic_turns(n: int, seed: int = 0) -> list[Turn]:
    """``n`` turns over a few sessions, each turn on one topic; every ninth has an empty text and a
    caption."""
    rng = random.Random(seed)
    out, session, when = [], 1, datetime(2031, 3, 2, 10, 0)
    for i in range(n):
        if i and rng.random() < 0.15:
            session, when = session + 1, when + timedelta(days=1)
        when += timedelta(minutes=rng.randrange(1, 30))
        words = rng.choice(TOPICS)
        text = "" if i % 9 == 4 else " ".join(rng.choice(words) for _ in range(rng.randrange(2, 9)))
        out.append(Turn(f"S{session}:{i}", rng.choice(["Ana", "Ben", "Zoë"]), text, session,
                        when.strftime("%Y-%m-%dT%H:%M"), when, "a photo of a cat" if not text else None))
    return out
