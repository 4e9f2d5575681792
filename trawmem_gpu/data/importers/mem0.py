"""mem0's exported memories: a JSON list, or ``{"results": [...]}``, of ``{"id", "memory", "user_id"?,
"agent_id"?, "run_id"?, "created_at"?, "metadata"?}``. Bank: ``user_id`` (else ``agent_id``, else
``mem0``); a turn per memory: id ``id``, speaker ``user_id`` or ``memory``, text ``memory``, date
``created_at``, metadata the ids and the scalar entries of ``metadata``."""
from __future__ import annotations

from pathlib import Path

from ...errors import InputError, read_json
from . import flat


def read(path, fmt: str = "mem0"):
    data = read_json(Path(path), "mem0 export", "expected mem0's memories JSON")
    rows = data.get("results", data.get("memories")) if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise InputError("mem0: expected a list of memories (or {\"results\": [...]})")
    banks: dict[str, list] = {}
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not isinstance(r.get("memory"), str) or not isinstance(r.get("id"), str):
            raise InputError(f"memories[{i}]: field 'memory': a memory needs a string id and memory")
        bank = r.get("user_id") or r.get("agent_id") or "mem0"
        meta = {**(flat(r.get("metadata")) or {}), **(flat({k: r.get(k) for k in ("user_id", "agent_id", "run_id")}) or {})}
        banks.setdefault(bank, []).append({"id": r["id"], "speaker": r.get("user_id") or "memory", "text": r["memory"],
                                           "date": r.get("created_at") or "", "metadata": meta or None})
    for bank, turns in banks.items():
        for t in turns:
            yield bank, t
