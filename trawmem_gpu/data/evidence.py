"""Tolerant parsing of LoCoMo evidence ids, counting every repair (evaluation.md)."""
from __future__ import annotations

import re

from .types import EvidenceRepairs

# "D3:7", "D03:007", "D:11:26" (stray colon), "D 3 : 7"; several ids may share one string.
_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)", re.IGNORECASE)


def canonical_id(session: int, index: int) -> str:
    return f"D{session}:{index}"


def parse_evidence(raw, known_ids: set[str], repairs: EvidenceRepairs) -> tuple[str, ...]:
    """Turn a question's raw ``evidence`` field into canonical ids that name real turns.

    Never raises on dirty ids: drops what names no turn and counts each repair in ``repairs``.
    Duplicates are removed, source order is kept.
    """
    if raw is None:
        raw = []
    if not isinstance(raw, (list, tuple)):  # "D1:3", or a stray scalar such as 5: one item
        raw = [raw]
    if not raw:
        repairs.empty_lists += 1
        return ()
    out: list[str] = []
    for item in raw:
        s = str(item)
        matches = list(_ID.finditer(s))
        if not matches:
            repairs.dropped_unparseable += 1
            continue
        if len(matches) > 1:
            repairs.multi_id_strings += 1
        for m in matches:
            cid = canonical_id(int(m.group(1)), int(m.group(2)))
            if m.group(0) != cid or (len(matches) == 1 and s.strip() != cid):
                repairs.normalized_ids += 1
            if cid not in known_ids:
                repairs.dropped_unknown += 1
                continue
            if cid not in out:
                out.append(cid)
    return tuple(out)
