"""LLM segmentation and heads, batched across every session / thread of every bank.

Malformed replies are retried (with a follow-up asking for the JSON only); what is still
malformed comes back as None so the caller falls back to embedding segmentation or the
extractive head. Fallbacks are counted, never raised.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.llm.base import LLMBackend
from trawmem_gpu.llm.prompts import HEAD, SEGMENT, retry_messages
from trawmem_gpu.llm.structured import parse_boundaries, parse_head

log = logging.getLogger(__name__)

MAX_TURN_CHARS = 600
"""Turns longer than this are clipped in the segmentation prompt."""
SEGMENT_MAX_TOKENS, HEAD_MAX_TOKENS = 256, 128
"""Reply budgets of the segmentation and head requests (part of their cache keys)."""


def thread_text(turns) -> str:
    """A thread as the head prompt shows it: ``[timestamp] embedded text`` per turn."""
    return "\n".join(f"[{t.timestamp}] {t.embed_text()}" for t in turns)


def build_requests(sessions, threads) -> list[tuple[list[dict], int]]:
    """The first requests (messages, max_tokens; temperature 0, JSON mode) a build sends for
    ``sessions`` and ``threads`` (lists of turns): what a forget looks up in the LLM cache."""
    out = [(SEGMENT.messages(turns=render_turns([t.embed_text() for t in s])), SEGMENT_MAX_TOKENS)
           for s in sessions if len(s) > 1]
    return out + [(HEAD.messages(thread=thread_text(t)), HEAD_MAX_TOKENS) for t in threads if t]


def render_turns(turns: Sequence[str], max_chars: int = MAX_TURN_CHARS) -> str:
    """Numbered turn list, ``[i] text`` per line, as the SEGMENT prompt expects."""
    lines = []
    for i, t in enumerate(turns):
        t = " ".join(str(t).split())
        if len(t) > max_chars:
            t = t[: max_chars - 1] + "…"
        lines.append(f"[{i}] {t}")
    return "\n".join(lines)


def _structured_batch(convs: list[list[dict]], parsers: list[Callable[[str], object]], backend: LLMBackend, *,
                      max_retries: int, max_tokens: int, desc: str) -> tuple[list, int]:
    """Send all conversations, re-ask the malformed ones up to ``max_retries`` times."""
    if max_retries < 0:
        raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
    out: list = [None] * len(convs)
    current = list(convs)
    pending = list(range(len(convs)))
    for attempt in range(max_retries + 1):
        if not pending:
            break
        results = backend.chat([current[i] for i in pending], max_tokens=max_tokens, temperature=0.0,
                               json_mode=True, desc=desc if attempt == 0 else f"{desc}-retry",
                               accept=lambda j, text, p=tuple(pending): parsers[p[j]](text) is not None)
        still = []
        for i, r in zip(pending, results):
            val = parsers[i](r.text) if r.error is None else None
            if val is None:
                still.append(i)
                if r.error is None:  # show the model its reply and ask again (also a new cache key)
                    current[i] = retry_messages(convs[i], r.text)
            else:
                out[i] = val
        pending = still
    if pending:
        log.warning("%s: %d of %d replies still malformed after %d retr%s; caller falls back",
                    desc, len(pending), len(convs), max_retries, "y" if max_retries == 1 else "ies")
    return out, len(pending)


def llm_segment(sessions: list[list[str]], backend: LLMBackend, max_retries: int = 1, *,
                max_tokens: int = SEGMENT_MAX_TOKENS, max_turn_chars: int = MAX_TURN_CHARS,
                desc: str = "segment") -> tuple[list[Optional[list[int]]], int]:
    """Thread starts per session (``[0, s1, ...]``) from one batched chat call per attempt.

    ``sessions`` holds the rendered turns (e.g. ``"Speaker: text"``) of every session of every
    bank. Returns the starts per session (None = malformed after retries: use embedding
    segmentation) and the number of such fallbacks. Sessions of 0 or 1 turns are not sent.
    """
    out: list[Optional[list[int]]] = [None] * len(sessions)
    idx, convs, parsers = [], [], []
    for s, turns in enumerate(sessions):
        n = len(turns)
        if n <= 1:
            out[s] = [0] if n == 1 else []
            continue
        idx.append(s)
        convs.append(SEGMENT.messages(turns=render_turns(turns, max_turn_chars)))
        parsers.append(lambda text, n=n: parse_boundaries(text, n))
    if convs:
        vals, n_fallback = _structured_batch(convs, parsers, backend, max_retries=max_retries,
                                             max_tokens=max_tokens, desc=desc)
        for s, v in zip(idx, vals):
            out[s] = v
    else:
        n_fallback = 0
    return out, n_fallback


def llm_heads(threads: list[str], backend: LLMBackend, max_retries: int = 1, *, max_tokens: int = HEAD_MAX_TOKENS,
              desc: str = "head") -> tuple[list[Optional[str]], int]:
    """One-sentence head per rendered thread text (with date and speakers), batched.

    Returns heads (None = malformed after retries: use the extractive head) and the number of
    such fallbacks. Empty threads are not sent and count as fallbacks.
    """
    out: list[Optional[str]] = [None] * len(threads)
    idx, convs = [], []
    empty = 0
    for j, text in enumerate(threads):
        if not str(text or "").strip():
            empty += 1
            continue
        idx.append(j)
        convs.append(HEAD.messages(thread=str(text)))
    n_fallback = empty
    if convs:
        vals, nf = _structured_batch(convs, [parse_head] * len(convs), backend, max_retries=max_retries,
                                     max_tokens=max_tokens, desc=desc)
        n_fallback += nf
        for j, v in zip(idx, vals):
            out[j] = v
    return out, n_fallback
