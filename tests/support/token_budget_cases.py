"""Shared by the token-budget tests (tests/select/test_token_budget_*.py): the embedding width and
a small bank with extractive heads and dated, punctuated turns."""
from __future__ import annotations

import numpy as np

from engine_banks import make_bank

D = 16


def _extractive_bank(seed=3, lens=(3, 5, 2, 4, 1, 6), when=None):
    """A bank whose heads are extractive (``[date] A & B: A: quote``), so showing the quoted turn
    drops the quote from the heading; texts with trailing punctuation, line breaks and captions.
    Every turn dated 8 May 2023, or ``when(unit index)`` (a datetime)."""
    from trawmem_gpu.ingest.heads import extractive_head
    from trawmem_gpu.data.types import Turn

    bank = make_bank("ext", list(lens), seed)
    rng = np.random.default_rng(seed)
    ends = ["", ".", "!!", "?)", " ...", ":\n", "\nok"]
    turns = []
    for i, t in enumerate(bank.turns):
        text = t.text + ends[int(rng.integers(len(ends)))]
        cap = "a photo of a dog" if rng.random() < 0.2 else None
        d = _date() if when is None else when(i)
        turns.append(Turn(t.turn_id, t.speaker, text, t.session, f"{d.day} {d:%B %Y}", d, cap))
    heads = []
    for j in range(bank.n_threads):
        idx = list(bank.thread_units(j))
        heads.append(extractive_head([turns[i] for i in idx], bank.unit_vecs[idx], sentences=1 + j % 2, words=6))
    bank.turns, bank.heads = turns, heads
    return bank


def _date():
    from datetime import datetime

    return datetime(2023, 5, 8)
