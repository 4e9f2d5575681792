"""Extractive heads (``ingest.heads.extractive_head``): the date, the speakers once, and the most
central turns in source order. A thread of one speaker names them once: a chat's bursts of one
person's messages made heads reading ``[20 May 2023] user: user: ...``."""
from datetime import datetime

import numpy as np

from trawmem_gpu.data.types import Turn
from trawmem_gpu.ingest.heads import extractive_head

WHEN = datetime(2023, 5, 20)


def _turns(speakers, texts):
    return [Turn(f"D1:{i + 1}", s, t, 1, "20 May 2023", WHEN) for i, (s, t) in enumerate(zip(speakers, texts))]


def _vecs(n, central):
    """Unit vectors where the turns in ``central`` sit nearest the mean: each other turn its own
    axis, each central one the diagonal."""
    v = np.eye(n, dtype=np.float32)
    v[sorted(central)] = 1.0 / np.sqrt(n)
    return v


def test_one_speaker_is_named_once():
    turns = _turns(["user"] * 3, ["please continue", "how far is dc from virginia tech", "thanks a lot"])
    head = extractive_head(turns, _vecs(3, {1}), sentences=1, words=20)
    assert head == "[20 May 2023] user: how far is dc from virginia tech"
    two = extractive_head(turns, np.ones((3, 2), dtype=np.float32), sentences=2, words=20)  # ties: the earlier turns
    assert two == "[20 May 2023] user: please continue | how far is dc from virginia tech"
    assert two.count("user") == 1


def test_several_speakers_label_each_quote_in_source_order():
    turns = _turns(["Ana", "Ben", "Ana"], ["I ran the Porto half marathon", "Well done", "It took two hours"])
    head = extractive_head(turns, _vecs(3, {0, 2}), sentences=2, words=3)
    assert head == "[20 May 2023] Ana & Ben: Ana: I ran the ... | Ana: It took two ..."


def test_a_burst_is_quoted_whole_and_a_bank_without_bursts_reads_as_before():
    turns = _turns(["Ana", "Ana", "Ben", "Ben"], ["I ran the Porto half", "in under two hours", "nice", "well done"])
    v = _vecs(4, {0, 1})
    by_message = extractive_head(turns, v, sentences=1, words=20)
    assert by_message == "[20 May 2023] Ana & Ben: Ana: I ran the Porto half"
    assert extractive_head(turns, v, sentences=1, words=20, bursts=[0, 1, 2, 3]) == by_message
    by_burst = extractive_head(turns, v, sentences=1, words=20, bursts=[0, 2])
    assert by_burst == "[20 May 2023] Ana & Ben: Ana: I ran the Porto half in under two hours"
    assert extractive_head(turns, v, sentences=1, words=6, bursts=[2, 0]) == "[20 May 2023] Ana & Ben: Ana: I ran the Porto half in ..."


def test_the_build_quotes_bursts_in_heads(tmp_path):
    """A build of short messages in bursts (seconds apart, minutes between bursts) quotes whole bursts."""
    from datetime import timedelta

    from trawmem_gpu.data.types import Conversation
    from trawmem_gpu.ingest.builder import build_banks
    from word_encoder import WordEncoder

    lines = [("Ana", "i ran porto"), ("Ana", "the half marathon"), ("Ana", "under two hours"),
             ("Ben", "wow"), ("Ben", "well done ana"), ("Ana", "thanks ben"), ("Ana", "my knee hurts now")]
    t, turns = WHEN, []
    for i, (who, text) in enumerate(lines):
        t += timedelta(seconds=5 if i and lines[i - 1][0] == who else 600)
        turns.append(Turn(f"D1:{i + 1}", who, text, 1, "20 May 2023", t))
    (bank,), _ = build_banks([Conversation("c1", turns)], encoder=WordEncoder(), progress=False)
    assert any("i ran porto the half marathon" in h for h in bank.heads), bank.heads
