"""``MemoryOptions``: how a :class:`~trawmem_gpu.memory.Memory` opens its collection (the
encoder, the method, the engine's threads and head, the LLMs, the caches). ``Memory(path,
threads=4, ...)`` takes the same fields as keywords."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable


@dataclass(frozen=True)
class MemoryOptions:
    """The options of one ``Memory`` (every field has the default ``Memory(path)`` gets)."""

    encoder: object = None
    """Encoder spec (``"minilm"``: all-MiniLM-L6-v2 on the CPU, ``"hf:/dir"``) or an ``Encoder``;
    None: the collection's own, else ``"minilm"``."""
    method: object = None
    """The selection method (``SelectConfig``; None: TrawMem as the CLI and server run it)."""
    params: object = None
    """The collection's default ``QueryParams`` (None: the method's, ``QueryParams()``)."""
    threads: int | None = None
    """CPU threads of the engine (None: its default)."""
    caches: Iterable = ()
    """Cache files a forget scrubs besides the default ones."""
    head: object = None
    """A learned role head (``trawmem_gpu.head.load_head``) for the engine."""
    only: Iterable[str] | None = None
    """Load only these bank ids (a process that serves a few banks of a large collection)."""
    create: bool = True
    """Create the collection when the path does not hold one (else a ``BankError``)."""
    embedding_cache: bool | str = False
    """Keep vectors in the on-disk embedding cache (True: the default one under
    ``TRAWMEM_CACHE``, or a file path); off by default."""
    llm: object = None
    """An LLM backend (``trawmem_gpu.llm.factory.llm_from_args``) for banks built with LLM
    segmentation or heads: ``add`` re-segments and writes heads with it, ``forget`` too."""
    units: tuple | list = ("turns",)
    """The layers the engine selects from (``store.view.unit_view``; default the turns)."""
    plan_llm: object = None
    """An LLM backend for planned TrawMem (``eval.planned``, docs/method.md): it writes each
    question's searches (TriMem's target-query step) and TrawMem selects for each; None: the
    question is the only search."""
    follow_up: bool = False
    """With ``plan_llm``, one more LLM call per question asks for the evidence its first
    workspace still lacks."""
    max_resident_bytes: int | None = None
    """Open banks lazily, on first use, and let the least recently used go once the banks held
    pass this many bytes (their arrays, turns and engine tables: ``memory.resident``); None: every
    bank is loaded when the Memory opens and stays."""


OPTION_FIELDS = frozenset(f.name for f in fields(MemoryOptions))
