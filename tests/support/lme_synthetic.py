"""Hand-made LongMemEval-format instances for tests (no benchmark text): a few short sessions
per question, answer sessions with ``has_answer`` user turns, dates in LongMemEval's format."""
from __future__ import annotations

import gzip
import json
import random
from datetime import datetime, timedelta
from pathlib import Path

TOPICS = ["hiking trip", "pottery class", "coffee mugs", "job interview", "sourdough bread", "guitar lessons",
          "marathon training", "vegetable garden", "road bike", "french course", "book club", "camera lens"]
TYPES = ["single-session-user", "multi-session", "temporal-reasoning", "knowledge-update"]


def _date(t: datetime) -> str:
    return t.strftime("%Y/%m/%d (%a) %H:%M")


def instance(i: int, rng: random.Random, n_sessions: int = 5, abstention: bool = False) -> dict:
    t0 = datetime(2023, 3, 1, 9, 0) + timedelta(days=rng.randint(0, 30))
    topic = TOPICS[i % len(TOPICS)]
    sids, dates, sessions, answer_sids = [], [], [], []
    for s in range(n_sessions):
        answer = s in (1, 3)
        sid = f"{'answer_' if answer else ''}{i:04x}{s:02x}ab_{s + 1}"
        other = TOPICS[(i + s + 3) % len(TOPICS)]
        turns = []
        for k in range(rng.randint(2, 4)):
            gold = answer and k == 1
            text = (f"I spent {10 + s} dollars on my {topic} last week" if gold else
                    f"Tell me about {other} number {rng.randint(1, 99)}, I am curious")
            turns.append({"role": "user", "content": text, "has_answer": gold})
            turns.append({"role": "assistant", "content": f"Here is something about {other if not gold else topic}.",
                          "has_answer": False})
        sids.append(sid)
        dates.append(_date(t0 + timedelta(days=s, hours=k)))
        sessions.append(turns)
        if answer:
            answer_sids.append(sid)
    qid = f"q{i:03d}" + ("_abs" if abstention else "")
    return {"question_id": qid, "question_type": TYPES[i % len(TYPES)],
            "question": f"How much did I spend on my {topic}?", "question_date": _date(t0 + timedelta(days=40)),
            "answer": f"{11} dollars", "answer_session_ids": answer_sids, "haystack_session_ids": sids,
            "haystack_dates": dates, "haystack_sessions": sessions}


def instances(n: int, seed: int = 0, n_sessions: int = 5) -> list[dict]:
    rng = random.Random(seed)
    return [instance(i, rng, n_sessions, abstention=(i % 5 == 4)) for i in range(n)]


def write(path: Path, data, gz: bool = False) -> Path:
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path
