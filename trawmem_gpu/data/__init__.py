"""Ingestion: LoCoMo-layout JSON and plain JSONL histories -> Conversation objects."""
from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .jsonl import load_jsonl, turn_from_record
from .locomo import load_locomo
from .longmemeval import load_longmemeval, looks_like_longmemeval
from .types import Conversation, EvidenceRepairs, Question, Turn, turns_digest

__all__ = ["Conversation", "EvidenceRepairs", "Question", "Turn", "FORMATS", "detect_format", "load_conversations",
           "load_jsonl", "load_locomo", "load_longmemeval", "sample_path", "turn_from_record", "turns_digest"]

FORMATS = {"locomo": load_locomo, "jsonl": load_jsonl, "longmemeval": load_longmemeval}
"""Input format name -> loader ``(path, *, dayfirst) -> list[Conversation]`` (``--format`` choices)."""


def sample_path() -> Path:
    """The small sample conversation that ships with the package (JSONL)."""
    return Path(__file__).parent / "sample" / "sample_conversation.jsonl"


def detect_format(path: Path) -> str:
    """The format ``--format auto`` picks: JSONL by suffix, LongMemEval by content, else LoCoMo."""
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return "jsonl"
    return "longmemeval" if looks_like_longmemeval(path) else "locomo"


def check_input_file(path: str | Path) -> Path:
    """``path`` as a ``Path`` when it is a readable file; else an ``InputError`` that says why."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: file not found")
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give one LoCoMo .json or .jsonl file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    return path


def load_conversations(path: str | Path, fmt: str = "auto", *, dayfirst: bool = False) -> list[Conversation]:
    """Load conversations from ``path`` (``fmt``: ``auto`` or a key of ``FORMATS``).

    :param dayfirst: read ambiguous dates such as ``01.02.2023`` day first (``--dayfirst``)
    """
    path = check_input_file(path)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r} (expected {' or '.join(map(repr, FORMATS))})")
    return FORMATS[fmt](path, dayfirst=dayfirst)
