"""Token counting with tiktoken ``cl100k_base``, loaded offline from the ``bpe-openai`` package.

tiktoken normally downloads its BPE file; here its cache is fed from the copy that ships
inside ``bpe-openai``, so counting works without network access.
"""
from __future__ import annotations

import gzip
import hashlib
import os
from functools import lru_cache
from pathlib import Path

TOKENIZER_NAME = "tiktoken/cl100k_base"
_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@lru_cache(maxsize=1)
def get_tokenizer():
    import bpe_openai
    import tiktoken

    from .paths import default_cache_dir

    cache = default_cache_dir() / "tiktoken"
    target = cache / hashlib.sha1(_URL.encode()).hexdigest()
    if not target.exists():
        src = Path(bpe_openai.__file__).parent / "data" / "cl100k_base.tiktoken.gz"
        cache.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(gzip.decompress(src.read_bytes()))
        os.replace(tmp, target)
    prev = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    try:
        return tiktoken.get_encoding("cl100k_base")
    finally:
        if prev is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = prev


def count_tokens(text: str) -> int:
    return len(get_tokenizer().encode(text, disallowed_special=()))


def count_tokens_many(texts: list[str]) -> list[int]:
    """``[count_tokens(t) for t in texts]``, batched over tiktoken's threads for many texts
    (special-token text is plain text in both: ``encode_ordinary`` is ``encode`` with
    ``disallowed_special=()``)."""
    enc = get_tokenizer()
    if len(texts) < 256:  # below this a thread pool costs more than it saves
        return [len(enc.encode_ordinary(t)) for t in texts]
    texts, out = list(texts), []
    for i in range(0, len(texts), COUNT_BATCH):  # the token lists of one batch at a time: memory bounded
        out += [len(x) for x in enc.encode_ordinary_batch(texts[i:i + COUNT_BATCH])]
    return out


COUNT_BATCH = 4096
"""Texts :func:`count_tokens_many` encodes at once (their token lists are held until counted)."""


CL100K_PATTERNS = frozenset({
    # tiktoken >= 0.8 (possessive quantifiers, a trailing-whitespace rule)
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
    # earlier tiktoken
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
})


def lines_count_apart() -> bool:
    """Whether the tokenizer counts a text of lines line by line: True for ``cl100k_base``'s
    split pattern (checked, so another tokenizer or pattern gets False).

    BPE runs on the pieces a regex cuts the text into. In this pattern, a piece that holds a
    newline ends in whitespace: no alternative reaches from a newline into a following
    non-whitespace character (the letter rule's optional prefix excludes ``\r\n``, the
    punctuation rule's optional prefix is a space, the rest are whitespace runs). So when every
    line starts with a non-whitespace character, ``text = L1 + "\n" + L2 + "\n" + ...`` is cut into
    the pieces of each ``Li + "\n"`` on its own, and its token count is their sum, except where a
    line is followed by an empty line (the two newlines join one piece). ``select.workspace.TokenCosts``
    rests on this."""
    return getattr(get_tokenizer(), "_pat_str", None) in CL100K_PATTERNS


@lru_cache(maxsize=1)
def _line_starts():
    """The cut points of :func:`count_tokens_cached` (a newline, then a non-whitespace character),
    or None for a tokenizer that does not count lines apart."""
    import re

    return re.compile(r"(?<=\n)(?=\S)") if lines_count_apart() else None


_piece_counts: dict[str, int] = {}
MAX_CACHED_PIECES = 1 << 20
"""Most texts whose counts :func:`count_tokens_cached` and :func:`count_tokens_many_cached` keep
(the cache is dropped beyond): a bank's lines and heading variants, about three per unit, so a
bank of 10^5 units fits."""


def clear_counts() -> None:
    """Drop the pieces :func:`count_tokens_cached` keeps (a forget: they hold workspace lines)."""
    _piece_counts.clear()


def count_tokens_many_cached(texts: list[str]) -> list[int]:
    """``count_tokens_many(texts)``, exactly, with each whole text's count kept across calls (in
    the cache :func:`count_tokens_cached` keeps, which maps any text to its exact count): only the
    texts not seen before are counted, batched. A bank's token costs (``workspace.token_costs``)
    are recounted on every append, and all but the new lines are the same: an append then counts
    what it adds. Thread-safe (a race only counts a text twice)."""
    cache = _piece_counts
    todo = list(dict.fromkeys(t for t in texts if t not in cache))
    if todo:
        got = dict(zip(todo, count_tokens_many(todo)))
        if len(cache) + len(todo) > MAX_CACHED_PIECES:
            cache.clear()
        if len(todo) <= MAX_CACHED_PIECES:
            cache.update(got)
        return [got[t] if t in got else cache[t] for t in texts]
    return [cache[t] for t in texts]


def count_tokens_cached(text: str) -> int:
    """``count_tokens(text)``, exactly, from per-line counts kept across calls.

    The text is cut after every newline that a non-whitespace character follows, and the counts
    of the parts are summed: exact for ``cl100k_base`` (:func:`lines_count_apart`), whose pieces
    never hold a newline followed by a non-whitespace character (so no piece crosses such a cut)
    and whose only context-dependent rules (``\\s++$``, ``\\s+(?!\\S)``) cut a part's final
    whitespace run, which ends in that newline, the same way whether a non-whitespace character or
    the end of the text follows. (A cut before each code point that Python's ``\\S`` takes was
    checked against the whole-text count, for every code point; Python leaves out a few that
    tiktoken calls non-space, which only means fewer cuts.) A workspace is such lines (every line
    starts with ``[`` or ``#``), and the same lines recur across queries of a bank, so counting a
    rendered workspace costs a split and a few dictionary look-ups once the cache is warm, instead
    of a tokenizer pass over the whole text. Any other tokenizer falls back to
    :func:`count_tokens`.
    Thread-safe (a race only counts a part twice)."""
    cut = _line_starts()
    if cut is None:
        return count_tokens(text)
    cache = _piece_counts
    parts = cut.split(text)
    todo = [p for p in parts if p not in cache]
    if not todo:
        return sum(cache[p] for p in parts)
    if len(cache) + len(todo) > MAX_CACHED_PIECES:
        cache.clear()
    enc = get_tokenizer()
    for p in todo:
        cache[p] = len(enc.encode_ordinary(p))
    return sum(cache[p] if p in cache else len(enc.encode_ordinary(p)) for p in parts)
