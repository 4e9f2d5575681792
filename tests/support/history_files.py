"""Small synthetic JSONL histories and question files (dates in 2031) for the end-to-end command tests,
the ``build`` and ``score`` runs over them, and the caches redirected into ``tmp_path`` (``cache``,
autouse where imported)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trawmem_gpu.cli import main


TOPICS = ["the garden shed", "a trip to the coast", "learning the cello", "a new bicycle", "the bakery downtown",
          "a chess club", "painting the kitchen", "a hiking boot"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _history(path: Path, banks=("b1", "b2"), n: int = 8, date="2031/03/02 10:{m:02d}", extra: str = "") -> Path:
    """A JSONL history, year-first dates (``2031/03/02`` is 2 March in every reading)."""
    recs = [{"bank_id": b, "turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben",
             "text": f"{b} message {i}: we talked about {TOPICS[i % len(TOPICS)]}{extra}",
             "timestamp": date.format(m=i)} for b in banks for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _questions(path: Path, qs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(q) + "\n" for q in qs))
    return path


def _build(hist: Path, out: Path, *extra) -> int:
    return main(["build", "--input", str(hist), "--out", str(out), "--quiet", *extra])


def _score(banks: Path, qs: Path, out: Path, *extra) -> int:
    return main(["score", "--banks", str(banks), "--questions", str(qs), "--out", str(out), "--quiet", *extra])


QS = [{"id": "q1", "bank_id": "b1", "question": "What about the garden shed?"},
      {"id": "q2", "bank_id": "b2", "question": "Tell me about the new bicycle"}]
