"""LoCoMo and LongMemEval files, read by the loaders ``build`` uses (``data.locomo``,
``data.longmemeval``): a bank per conversation, its turns as they load (id, speaker, text,
session, date, caption, metadata)."""
from __future__ import annotations


def read(path, fmt: str):
    from .. import load_conversations

    for conv in load_conversations(path, fmt):
        for t in conv.turns:
            yield conv.bank_id, {"id": t.turn_id, "speaker": t.speaker, "text": t.text, "date": t.timestamp,
                                 "session": t.session, "caption": t.caption,
                                 "metadata": dict(t.metadata) if t.metadata else None}
