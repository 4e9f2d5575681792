"""Small inputs for the real-model tests (tests marked ``real_llm``): short prompts, so the
smoke run stays near five minutes on one CPU thread. The first sessions of the bundled sample
conversation, as JSONL and in LoCoMo's layout (with per-session observations, for
``--facts locomo``, and questions with gold answers and evidence)."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path


def sample_turns(sessions: int = 2, per_session: int = 5) -> list[dict]:
    """The first ``per_session`` turns of the sample's first ``sessions`` sessions (JSONL records)."""
    from trawmem_gpu.data import sample_path

    rows = [json.loads(x) for x in Path(sample_path()).read_text(encoding="utf-8").splitlines() if x.strip()]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["timestamp"][:10], []).append(r)
    return [r for day in sorted(by)[:sessions] for r in by[day][:per_session]]


def jsonl(path: Path, sessions: int = 2, per_session: int = 5) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in sample_turns(sessions, per_session)), encoding="utf-8")
    return path


QUESTIONS = [
    ("Which race did Ana sign up for?", "the spring half marathon in Porto", "D1:1"),
    ("What did the physiotherapist tell Ana to do?", "rest for ten days", "D2:4"),
]
"""(question, gold answer, evidence turn) over the first five turns of the first two sessions."""


def locomo(path: Path, sessions: int = 2, per_session: int = 5) -> Path:
    """The turns in LoCoMo's layout (ids ``D<session>:<n>``), one observation per turn, and
    :data:`QUESTIONS`."""
    turns = sample_turns(sessions, per_session)
    days = sorted({t["timestamp"][:10] for t in turns})
    conv = {"speaker_a": "Ana", "speaker_b": "Ben"}
    obs = {}
    for k, day in enumerate(days, 1):
        when = datetime.fromisoformat(turns[[t["timestamp"][:10] for t in turns].index(day)]["timestamp"])
        conv[f"session_{k}_date_time"] = f"{when:%I:%M %p} on {when.day} {when:%B}, {when.year}"
        rows = [t for t in turns if t["timestamp"][:10] == day]
        conv[f"session_{k}"] = [{"speaker": t["speaker"], "dia_id": f"D{k}:{i + 1}", "text": t["text"]}
                                for i, t in enumerate(rows)]
        obs[f"session_{k}_observation"] = {
            s: [[t["text"], f"D{k}:{i + 1}"] for i, t in enumerate(rows) if t["speaker"] == s] for s in ("Ana", "Ben")}
    qa = [{"question": q, "answer": a, "evidence": [e], "category": 4} for q, a, e in QUESTIONS]
    path.write_text(json.dumps([{"sample_id": "ana-ben", "conversation": conv, "observation": obs, "qa": qa}]),
                    encoding="utf-8")
    return path
