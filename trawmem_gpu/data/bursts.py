"""Bursts: consecutive messages of one speaker that carry one thought (issue 36).

People chat in short messages and split a thought over several of them, sent one after the other.
A **burst** is a run of consecutive messages of one session by one speaker, each sent within the
session's burst gap of the one before. The rule reads only the session's own statistics, never a
data set's name:

* **the gap** (:func:`burst_gap`): the split of the session's gaps between consecutive messages
  into two groups, short and long, that are furthest apart (Otsu's rule on log seconds). Where
  the times tell the groups apart, a gap in the short group keeps a burst going;
* **without telling times** (fewer than two distinct gaps: no times, or one time for a whole
  session as in the LoCoMo layout; or groups less than :data:`MIN_GAP_RATIO` apart), turn taking
  alone ends a burst, and only where it can: in a session of two speakers or more whose median
  message (words of its text and image caption) is at most :data:`SHORT_WORDS`, shorter than a
  sentence. Where messages are sentences or paragraphs (LoCoMo's turns), or one speaker's log
  without times (LongMemEval's user turns), each message is a unit of its own, as it was;
* **the size**: a burst takes no message that would carry it past :data:`MAX_BURST_WORDS` words
  (the encoder reads a unit's first 256 word pieces; a longer unit is also a coarse pick under a
  token budget).

The gap is the conversation's own (every gap inside its sessions: a few messages say little);
the rest is a function of the session. Appending messages re-forms the bursts of the session they
extend: an appended message from the speaker of the session's last burst, within the gap, joins
that burst. The gap is recomputed with the new gaps, so in a long conversation it moves little;
bursts of earlier sessions can change with it (their threads are kept by an ``--update``, and a
burst is cut where a thread starts: ``store.bursts``).
"""
from __future__ import annotations

import numpy as np

SHORT_WORDS = 12.0
"""A session's median message, in words, up to which its messages form bursts."""
MAX_BURST_WORDS = 120
"""Words past which a burst takes no more messages."""
MIN_GAP_RATIO = 3.0
"""How far apart (ratio of geometric means) the short and the long gaps must be to count as two groups."""


def message_words(t) -> int:
    """Words of a message's text and image caption (split on white space)."""
    return len(f"{t.text or ''} {t.caption or ''}".split())


def burst_gap(gaps: np.ndarray) -> float:
    """The largest gap (seconds) inside a burst, from a session's ``gaps`` between consecutive
    messages (NaN where a time is missing, left out): Otsu's two-group split of ``log(1 + gap)``,
    midway (on that scale) between the largest short gap and the smallest long one; ``inf``
    (every gap inside) when the gaps do not fall into two groups (see the module docstring)."""
    g = np.asarray(gaps, dtype=np.float64).reshape(-1)
    g = np.sort(np.log1p(g[~np.isnan(g)].clip(min=0.0)))
    n = len(g)
    k = np.flatnonzero(g[1:] > g[:-1]) + 1  # splits between distinct values: g[:k] short, g[k:] long
    if not len(k):
        return float("inf")
    c = np.cumsum(g)
    m0, m1 = c[k - 1] / k, (c[-1] - c[k - 1]) / (n - k)
    i = int(np.argmax(k * (n - k) * (m1 - m0) ** 2))  # Otsu: the largest between-group variance
    if m1[i] - m0[i] < np.log(MIN_GAP_RATIO):
        return float("inf")
    return float(np.expm1((g[k[i] - 1] + g[k[i]]) / 2))  # midway (log scale) between the groups


def _gaps(turns: list) -> np.ndarray:
    """``[n - 1]`` seconds between consecutive messages (NaN where a time is missing)."""
    return np.array([(b.time - a.time).total_seconds() if a.time is not None and b.time is not None else np.nan
                     for a, b in zip(turns, turns[1:])], dtype=np.float64)


def _session_bursts(turns: list, tau: float) -> list[int]:
    """Burst starts (offsets into ``turns``, one session's messages in order) with the gap ``tau``."""
    n = len(turns)
    if n < 2:
        return list(range(n))
    words = [message_words(t) for t in turns]
    gaps = _gaps(turns)
    if tau == np.inf and (len({t.speaker for t in turns}) < 2 or float(np.median(words)) > SHORT_WORDS):
        return list(range(n))  # no times to go by, and no short messages between turns of speakers
    starts, size = [0], words[0]
    for i in range(1, n):
        g = gaps[i - 1]
        if turns[i].speaker == turns[i - 1].speaker and not g > tau and size + words[i] <= MAX_BURST_WORDS:
            size += words[i]
        else:
            starts.append(i)
            size = words[i]
    return starts


def _sessions(turns: list, lo: int, hi: int):
    s = lo
    for i in range(lo + 1, hi + 1):
        if i == hi or turns[i].session != turns[s].session:
            yield s, i
            s = i


def session_gaps(turns: list) -> np.ndarray:
    """Every gap (seconds, NaN where a time is missing) between consecutive messages of one session
    of ``turns``, session after session: what :func:`burst_gap` reads."""
    read = getattr(turns, "field", None)  # a loaded bank's columns (``store.turn_columns``), read whole:
    if read is not None:  # the same pairs (consecutive turns of one session), no Turn made per row
        ses, tm = read("session"), read("time")
        return np.array([(tm[i] - tm[i - 1]).total_seconds() if tm[i] is not None and tm[i - 1] is not None
                         else np.nan for i in range(1, len(ses)) if ses[i] == ses[i - 1]], dtype=np.float64)
    spans = list(_sessions(turns, 0, len(turns)))
    return np.concatenate([_gaps(turns[a:b]) for a, b in spans]) if spans else np.zeros(0)


def appended_session_gaps(gaps0: np.ndarray, n0: int, turns: list) -> np.ndarray:
    """:func:`session_gaps` of ``turns`` from ``gaps0``, those of its first ``n0`` turns (an append:
    the old turns, then new ones): the old gaps, then the gaps the new turns open inside a session
    (the new turns continue the last old session or open new ones, so their gaps come last)."""
    new = [(turns[i].time - turns[i - 1].time).total_seconds()
           if turns[i].time is not None and turns[i - 1].time is not None else np.nan
           for i in range(max(n0, 1), len(turns)) if turns[i].session == turns[i - 1].session]
    return np.concatenate([np.asarray(gaps0, dtype=np.float64), np.asarray(new, dtype=np.float64)])


def burst_starts(turns: list, lo: int = 0, hi: int | None = None, tau: float | None = None) -> list[int]:
    """Where each burst of ``turns[lo:hi]`` starts (indices into ``turns``, a conversation's messages
    in order), session by session (a burst never crosses a session); ``[lo]`` and up, ascending.
    The gap ``tau`` is :func:`burst_gap` of every gap inside a session of ``turns`` (all of them, also
    outside ``lo:hi``: the conversation's own statistic; given: computed so by the caller)."""
    hi = len(turns) if hi is None else hi
    tau = burst_gap(session_gaps(turns)) if tau is None else tau
    out: list[int] = []
    for a, b in _sessions(turns, lo, hi):
        out += [a + k for k in _session_bursts(turns[a:b], tau)]
    return out


def burst_vectors(vecs: np.ndarray, offsets) -> np.ndarray:
    """``[B, d]`` float32: the normalized mean of each burst's message vectors (``offsets``: the
    ``B + 1`` burst offsets over the rows of ``vecs``), the vector of a burst wherever one is needed
    (the burst view's units, segmentation by bursts)."""
    off = np.asarray(offsets, dtype=np.int64)
    v = np.add.reduceat(vecs.astype(np.float64), off[:-1], axis=0) / np.diff(off)[:, None]
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return (v / np.maximum(n, 1e-12)).astype(np.float32)
