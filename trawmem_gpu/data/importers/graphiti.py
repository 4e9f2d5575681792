"""Graphiti episodes: a JSON list of ``{"uuid", "name", "content" (or "episode_body"), "source_description"?,
"valid_at"? / "created_at"?, "group_id"?}``. Bank ``group_id`` (else ``graphiti``); a turn per episode:
id ``uuid``, speaker ``name``, text the content, date ``valid_at`` (else ``created_at``), metadata
``{"source_description"}``."""
from __future__ import annotations

from pathlib import Path

from ...errors import InputError, read_json
from . import flat


def read(path, fmt: str = "graphiti"):
    rows = read_json(Path(path), "graphiti episodes", "expected a JSON list of episodes")
    if isinstance(rows, dict):
        rows = rows.get("episodes")
    if not isinstance(rows, list):
        raise InputError("graphiti: expected a list of episodes")
    banks: dict[str, list] = {}
    for i, e in enumerate(rows):
        text = e.get("content", e.get("episode_body")) if isinstance(e, dict) else None
        if not isinstance(text, str) or not isinstance(e.get("uuid"), str):
            raise InputError(f"episodes[{i}]: field 'content': an episode needs a string uuid and content")
        banks.setdefault(e.get("group_id") or "graphiti", []).append(
            {"id": e["uuid"], "speaker": e.get("name") or "episode", "text": text,
             "date": e.get("valid_at") or e.get("created_at") or "",
             "metadata": flat({"source_description": e.get("source_description")})})
    for bank, turns in banks.items():
        for t in turns:
            yield bank, t
