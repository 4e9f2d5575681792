"""Ingestion: LoCoMo-layout JSON and plain JSONL histories -> Conversation objects."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..errors import InputError
from .jsonl import load_jsonl
from .locomo import load_locomo
from .longmemeval import load_longmemeval, looks_like_longmemeval
from .types import Conversation, EvidenceRepairs, Question, Turn

__all__ = ["Conversation", "EvidenceRepairs", "Question", "Turn", "load_conversations", "load_jsonl",
           "load_locomo", "load_longmemeval", "sample_path"]


def sample_path() -> Path:
    """The small sample conversation that ships with the package (JSONL)."""
    return Path(__file__).parent / "sample" / "sample_conversation.jsonl"


def load_conversations(path: str | Path, fmt: Literal["auto", "locomo", "jsonl", "longmemeval"] = "auto"
                       ) -> list[Conversation]:
    """Load conversations from ``path``; ``auto`` picks JSONL by suffix, LongMemEval by content, else LoCoMo."""
    path = Path(path)
    if fmt == "auto":
        fmt = "jsonl" if path.suffix.lower() in (".jsonl", ".ndjson") else \
            "longmemeval" if looks_like_longmemeval(path) else "locomo"
    if fmt == "longmemeval":
        return load_longmemeval(path)
    if fmt == "jsonl":
        return load_jsonl(path)
    if fmt == "locomo":
        return load_locomo(path)
    raise InputError(f"unknown input format {fmt!r} (expected 'locomo', 'jsonl' or 'longmemeval')")
