"""Ingestion: LoCoMo-layout JSON and plain JSONL histories -> Conversation objects."""
from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .jsonl import load_jsonl, turn_from_record
from .locomo import load_locomo
from .longmemeval import load_longmemeval, read_head, sniff_longmemeval
from .types import Conversation, EvidenceRepairs, Question, Turn, turns_digest

__all__ = ["Conversation", "EvidenceRepairs", "Question", "Turn", "FORMATS", "detect_format", "load_conversations",
           "load_jsonl", "load_locomo", "load_longmemeval", "sample_path", "turn_from_record", "turns_digest"]

FORMATS = {"locomo": load_locomo, "jsonl": load_jsonl, "longmemeval": load_longmemeval}
"""Input format name -> loader ``(path, *, dayfirst) -> list[Conversation]`` (``--format`` choices)."""


def sample_path() -> Path:
    """The small sample conversation that ships with the package (JSONL)."""
    return Path(__file__).parent / "sample" / "sample_conversation.jsonl"


def detect_format(path: str | Path) -> str:
    """The format of ``path`` (what ``--format auto`` picks): the one sniffer of every command.

    A ``.jsonl`` / ``.ndjson`` suffix means JSONL; otherwise the first 64 KiB (decompressed when
    gzip) decide: a LongMemEval-only key (``haystack_sessions``, ``haystack_session_ids``,
    ``haystack_dates``) as a JSON key means LongMemEval, anything else LoCoMo layout (whose
    loader then says what is missing). Field order does not matter: a LoCoMo file whose ``qa``
    comes first and carries ``question_id`` is LoCoMo.
    """
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return "jsonl"
    return "longmemeval" if sniff_longmemeval(read_head(path)) else "locomo"


def require_locomo(path: str | Path, command: str) -> None:
    """Refuse a LongMemEval file where only LoCoMo-layout data makes sense (LoCoMo categories,
    multi-hop hit): ``eval``, ``sweep``, ``train-head``. One message for every command."""
    if detect_format(path) == "longmemeval":
        raise InputError(f"{path} is a LongMemEval file, which `trawmem {command}` does not take (its LoCoMo "
                         "categories do not apply there): score it with `trawmem score` (official metrics, abstention "
                         "rules, per-type tables)")


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
