"""LLM segmentation and heads, batched across every session / thread of every bank.

Both are structured calls (``llm.structured.ask``: the reply's schema sent for constrained
decoding, a malformed reply re-asked once). What a reply says is used only when it passes the
checks of ``llm.grounding``:

* **boundaries** that cut a session into one-turn threads (every turn, or at least two and half
  of its threads) are degenerate (refused);
  a session whose prompt overflows the model's context, or whose reply stops at its token limit,
  is halved and each half segmented (down to ``MIN_SPLIT_TURNS``), its halves' starts merged;
* a **head** must hold no markup or prompt text, keep within ``grounding.HEAD_WORDS``, and be
  supported by its thread's own turns, lexically (``HEAD_LEXICAL_FLOOR``) and, when the caller
  gives the turns' vectors and an encoder, by embedding (``HEAD_EMBEDDING_FLOOR``).

What fails comes back as None, so the caller falls back (embedding segmentation, the extractive
head); every fallback is counted with its reason (``llm.structured.fell_back``: an error under
``--strict-llm``), never raised otherwise.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

import numpy as np

from trawmem_gpu.errors import ConfigError
from trawmem_gpu.llm.base import LLMBackend
from trawmem_gpu.llm.grounding import HEAD_EMBEDDING_FLOOR, embedding_support, head_problem
from trawmem_gpu.llm.prompts import HEAD, SEGMENT
from trawmem_gpu.llm.structured import Outcome, ask, fell_back, parse_boundaries, parse_head, reason

log = logging.getLogger(__name__)

MAX_TURN_CHARS = 600
"""Turns longer than this are clipped in the segmentation prompt."""
SEGMENT_MAX_TOKENS, HEAD_MAX_TOKENS = 256, 128
"""Reply budgets of the segmentation and head requests (part of their cache keys)."""
MIN_SPLIT_TURNS = 4
"""A session is not halved below this many turns (its segmentation falls back instead)."""


def thread_text(turns) -> str:
    """A thread as the head prompt shows it: ``[timestamp] embedded text`` per turn."""
    return "\n".join(f"[{t.timestamp}] {t.embed_text()}" for t in turns)


def build_requests(sessions, threads) -> list[tuple[list[dict], int, Optional[dict]]]:
    """The first requests (messages, max_tokens, reply schema; temperature 0, JSON mode) a build
    sends for ``sessions`` and ``threads`` (lists of turns): what a forget looks up in the LLM cache."""
    out = [(SEGMENT.messages(turns=render_turns([t.embed_text() for t in s])), SEGMENT_MAX_TOKENS, SEGMENT.schema)
           for s in sessions if len(s) > 1]
    return out + [(HEAD.messages(thread=thread_text(t)), HEAD_MAX_TOKENS, HEAD.schema) for t in threads if t]


def render_turns(turns: Sequence[str], max_chars: int = MAX_TURN_CHARS) -> str:
    """Numbered turn list, ``[i] text`` per line, as the SEGMENT prompt expects."""
    lines = []
    for i, t in enumerate(turns):
        t = " ".join(str(t).split())
        if len(t) > max_chars:
            t = t[: max_chars - 1] + "…"
        lines.append(f"[{i}] {t}")
    return "\n".join(lines)


def _degenerate(starts: list[int], n: int) -> Optional[str]:
    """Why boundaries are degenerate: they cut a session into one-turn threads (every turn, or
    at least two and half its threads: the prompt's ``[0, 1, 2, ...]`` copied; the prompt asks
    to keep short asides in the surrounding thread)."""
    if n < 2:
        return None
    lens = np.diff(list(starts) + [n])
    ones = int((lens == 1).sum())
    if len(starts) == n and n >= 3:
        return f"degenerate: cuts every one of its {n} turns into its own thread"
    if ones >= 2 and 2 * ones >= len(lens):
        return f"degenerate: {ones} of its {len(lens)} threads are single turns"
    return None


def _segment_round(parts: list[list[str]], backend, max_retries, max_tokens, max_turn_chars, desc) -> list[Outcome]:
    convs = [SEGMENT.messages(turns=render_turns(p, max_turn_chars)) for p in parts]
    return ask(backend, SEGMENT, convs, lambda i, t: parse_boundaries(t, len(parts[i])), desc=desc,
               max_tokens=max_tokens, check=lambda i, v: _degenerate(v, len(parts[i])), retries=max_retries)


def llm_segment(sessions: list[list[str]], backend: LLMBackend, max_retries: int = 1, *,
                max_tokens: int = SEGMENT_MAX_TOKENS, max_turn_chars: int = MAX_TURN_CHARS,
                desc: str = "segment") -> tuple[list[Optional[list[int]]], list[Optional[str]]]:
    """Thread starts per session (``[0, s1, ...]``) from batched structured calls (module docstring).

    ``sessions`` holds the rendered turns (e.g. ``"Speaker: text"``) of every session of every
    bank. Returns the starts per session (None: malformed, refused or failed: use embedding
    segmentation) and, per session, why it falls back (None: it does not). Sessions of 0 or 1
    turns are not sent.
    """
    if max_retries < 0:
        raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
    out: list[Optional[list[int]]] = [None] * len(sessions)
    # pieces: (session index, offset, turns); a piece too long for the model is halved and sent again
    todo = []
    for s, turns in enumerate(sessions):
        if len(turns) <= 1:
            out[s] = [0] if turns else []
        else:
            todo.append((s, 0, list(turns)))
    found: dict[int, list[tuple[int, Optional[list[int]]]]] = {}
    final: dict[int, Outcome] = {}
    while todo:
        res = _segment_round([t for _, _, t in todo], backend, max_retries, max_tokens, max_turn_chars, desc)
        nxt = []
        for (s, off, turns), o in zip(todo, res):
            if not o.ok and o.too_long and len(turns) >= 2 * MIN_SPLIT_TURNS:
                h = len(turns) // 2
                nxt += [(s, off, turns[:h]), (s, off + h, turns[h:])]
                continue
            found.setdefault(s, []).append((off, o.value if o.ok else None))
            if not o.ok:
                final[s] = o
        todo = nxt
    for s, pieces in found.items():
        if s not in final:
            out[s] = sorted({off + b for off, starts in pieces for b in starts})
    fell_back(backend, desc, [final.get(s, Outcome()) for s in found], "segmentation")
    return out, [reason(final[s]) if s in final else None for s in range(len(sessions))]


def llm_heads(threads: list[str], backend: LLMBackend, max_retries: int = 1, *, max_tokens: int = HEAD_MAX_TOKENS,
              desc: str = "head", sources: Optional[list[Sequence[str]]] = None,
              embed: Optional[Callable[[list[str]], np.ndarray]] = None,
              source_vecs: Optional[list[np.ndarray]] = None) -> tuple[list[Optional[str]], list[Optional[str]]]:
    """One-sentence head per rendered thread text (with date and speakers), batched.

    ``sources``: each thread's turn texts (the lexical support; default: the rendered thread);
    ``embed`` and ``source_vecs`` (each thread's turn vectors, normalized): the embedding support.
    Returns heads (None: malformed, refused or failed: use the extractive head) and, per thread,
    why it falls back (None: it does not). Empty threads are not sent and count as fallbacks.
    """
    out: list[Optional[str]] = [None] * len(threads)
    idx = [j for j, t in enumerate(threads) if str(t or "").strip()]
    outcomes = [Outcome(status="failed", why="empty thread") for _ in threads]
    if idx:
        srcs = [list(sources[j]) if sources is not None else [threads[j]] for j in idx]
        res = ask(backend, HEAD, [HEAD.messages(thread=str(threads[j])) for j in idx], lambda i, t: parse_head(t),
                  desc=desc, max_tokens=max_tokens, check=lambda i, v: head_problem(v, srcs[i], HEAD.template),
                  retries=max_retries)
        if embed is not None and source_vecs is not None:
            _embedding_check(res, idx, embed, source_vecs, backend, desc)
        for j, o in zip(idx, res):
            outcomes[j] = o
            if o.ok:
                out[j] = o.value
    fell_back(backend, desc, outcomes, "head")
    return out, [reason(o) for o in outcomes]


def _embedding_check(res: list[Outcome], idx: list[int], embed, source_vecs, backend, desc: str) -> None:
    """Refuse the heads among ``res`` whose vector reaches no turn of their thread."""
    ok = [k for k, o in enumerate(res) if o.ok]
    if not ok:
        return
    vecs = np.asarray(embed([res[k].value for k in ok]), dtype=np.float32)
    refused = 0
    for k, v in zip(ok, vecs):
        s = embedding_support(v, source_vecs[idx[k]])
        if s < HEAD_EMBEDDING_FLOOR:
            res[k].status = "refused"
            res[k].why = f"not supported by its thread (embedding support {s:.2f} < {HEAD_EMBEDDING_FLOOR})"
            refused += 1
    if refused:
        backend.usage.note(desc, refused=refused)
