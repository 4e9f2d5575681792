"""OpenAI chat message lists: a JSON list of ``{"role", "content", "name"?, "timestamp"?}`` (one bank,
named by the file's stem) or an object of bank id -> such a list. A turn per message: id ``M<n>``,
speaker its ``name`` or ``role``, text its ``content``, date its ``timestamp`` (ISO, or Unix seconds),
metadata ``{"role"}``; a message without string content is refused naming its index."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from ...errors import InputError, read_json


def _date(v) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return datetime.fromtimestamp(v, timezone.utc).isoformat(timespec="seconds")
    return v if isinstance(v, str) else ""


def read(path, fmt: str = "openai"):
    data = read_json(Path(path), "openai messages", "expected a JSON list of messages")
    convs = data.items() if isinstance(data, dict) else [(Path(path).stem, data)]
    for bank_id, msgs in convs:
        if not isinstance(msgs, list):
            raise InputError(f"{bank_id}: expected a list of messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
                raise InputError(f"{bank_id}[{i}]: field 'content': a message needs a string role and content")
            yield bank_id, {"id": f"M{i + 1}", "speaker": m.get("name") or m["role"], "text": m["content"],
                            "date": _date(m.get("timestamp", m.get("created_at"))), "metadata": {"role": m["role"]}}
