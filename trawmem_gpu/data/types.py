"""The objects ingestion produces: turns, questions and conversations (one per bank)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Literal

UNIT_TEXT_VERSION = 2
"""Bumped whenever ``Turn.embed_text`` changes, so cached banks are rebuilt."""


@dataclass(frozen=True)
class Turn:
    """One memory unit: a dialogue turn, in source order."""

    turn_id: str
    """Unique id within its conversation (LoCoMo ``dia_id`` such as ``"D3:7"``)."""
    speaker: str
    text: str
    session: int
    """Session index (LoCoMo ``session_N`` -> N); threads never cross a session."""
    timestamp: str
    """The session date as given in the source (kept verbatim for provenance)."""
    time: datetime | None = None
    """``timestamp`` parsed; None only when the source gave no date."""
    caption: str | None = None
    """Image caption, for turns that shared an image (images enter as their captions)."""
    metadata: dict | None = field(default=None, hash=False)
    """A flat map of keys to strings, numbers, booleans or ISO dates (``user_id``, ``agent_id``,
    ``run_id``, ...; checked by ``data.metadata.metadata_field``), or None. Selection filters read it
    (``where=``); the encoder, BM25 and workspaces never see it. Read-only (``data.metadata.Metadata``)
    as the turn is frozen."""
    stored_at: str | None = field(default=None, compare=False)
    """When the turn was stored, ISO 8601 UTC (naive, as ``memory.history``'s times): set by the
    store's doors when the turn enters a bank (``store.records.stamped``), never by a caller, and
    kept by every later write (late inserts, segments, compaction, forgets of other turns, an
    export and its import). None for a turn stored before the field existed. ``time`` is when it
    was said; this is when the memory learned it. Not part of the turn's identity: equality, the
    hash and :func:`turns_digest` leave it out (a bank equals the build of the same turns)."""

    def lexical_text(self) -> str:
        """Speaker, words and the image caption (what BM25 indexes)."""
        return lexical_line(self.speaker, self.text, self.caption)

    def embed_text(self) -> str:
        """Text the encoder sees: the session date, then ``lexical_text()``.

        The date prefix lifts cosine top-16 macro evidence recall on the dev data from 0.455 to
        0.508 (MiniLM), mostly on temporal questions.
        """
        return f"[{self.timestamp}] {lexical_line(self.speaker, self.text, self.caption)}"


def lexical_line(speaker: str, text: str, caption: str | None) -> str:
    """``Turn.lexical_text`` of these fields (the one rule; ``store.turn_columns.embed_texts``
    writes a loaded bank's lines from its columns with it)."""
    s = f"{speaker}: {text}"
    if caption:
        s += f" [shares an image: {caption}]"
    return s


def turns_digest(turns: Iterable[Turn]) -> str:
    """sha256 over every field of every turn, in order: a bank's identity against its data.

    A bank records the digest of the turns it was built from; ``trawmem eval --banks`` compares
    it with the digest of the data file's turns and refuses a bank built from other data. The
    parsed ``time`` is included, so reading the same file with another ``--dayfirst`` differs.

    ``stored_at`` is not included: when a turn was stored is no part of the data it came from.

    A turn's ``metadata`` is included when it has any (its keys sorted: the same map in another
    order is the same turn): a filter reads it, so a bank whose data gained or changed metadata is
    another bank's data. A turn without metadata hashes as it did before metadata existed, so
    every bank written before keeps its digest (and loads).
    """
    h = hashlib.sha256()
    for t in turns:
        digest_turn(h, t)
    return h.hexdigest()


def digest_turn(h, t: Turn) -> Turn:
    """Feed ``t``'s row of :func:`turns_digest` into the sha256 ``h``; returns ``t`` (so a reader
    can hash turns as it stores them: ``store.files.load_bank``)."""
    row = [t.turn_id, t.speaker, t.text, t.session, t.timestamp, t.time.isoformat() if t.time else None,
           t.caption]
    if t.metadata:
        row.append(dict(sorted(t.metadata.items())))
    h.update(json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    h.update(b"\n")
    return t


MAX_QUESTION_CHARS = 4000
"""Longest question text accepted anywhere (``trawmem query``, ``score`` question files, ``serve``)."""
# The bounds of a turn, one home for every door (``data.fields`` enforces them on every input:
# the JSONL and LoCoMo loaders, ``Memory.add``, ``build --update``, ``score --data``; the HTTP
# models of ``serve.models`` carry the same numbers; docs/serving-limits.md tabulates them).
MAX_ID_CHARS = 256
"""Longest bank id, turn id (or LoCoMo ``sample_id``, question id) accepted anywhere."""
MAX_SPEAKER_CHARS = 256
"""Longest ``speaker``."""
MAX_TEXT_CHARS = 131072
"""Longest turn ``text`` (the longest user turn of LongMemEval's dev split is 76,560 characters)."""
MAX_CAPTION_CHARS = 8192
"""Longest ``caption`` (LoCoMo's ``blip_caption``)."""
MAX_DATE_CHARS = 64
"""Longest ``timestamp`` (or question date) as written; the longest date the loaders read is about 40."""
MAX_SESSION = 2**31 - 1
"""Largest ``session`` number (sessions are 0..MAX_SESSION). A turn whose counted session (the
next calendar day after a turn of session MAX_SESSION) would pass it is refused."""


@dataclass(frozen=True)
class Question:
    """One evaluation question with its gold evidence turn ids (already repaired)."""

    qid: str
    question: str
    answer: str | None
    evidence: tuple[str, ...]
    category: int
    adversarial_answer: str | None = None
    date: datetime | None = None
    """When the question is asked ("now" for temporal features); None when the source gives none
    (LoCoMo). LongMemEval's ``question_date``."""
    qtype: str | None = None
    """The source's question type name, when it has one (LongMemEval's ``question_type``)."""


@dataclass
class EvidenceRepairs:
    """Counts of every repair made while parsing evidence ids (see evaluation.md)."""

    multi_id_strings: int = 0
    normalized_ids: int = 0
    dropped_unknown: int = 0
    dropped_unparseable: int = 0
    empty_lists: int = 0

    def add(self, other: "EvidenceRepairs") -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class Conversation:
    """The interaction history of one memory owner: becomes one bank."""

    bank_id: str
    turns: list[Turn]
    speakers: tuple[str, ...] = ()
    questions: list[Question] = field(default_factory=list)
    repairs: EvidenceRepairs = field(default_factory=EvidenceRepairs)
    session_source: Literal["explicit", "calendar_day"] = "explicit"
    """Where session numbers came from: the source (LoCoMo ``session_N``, a JSONL ``session``
    field) or counted by calendar day from the first turn of the file (JSONL without
    ``session``). An append-only ``--update`` renumbers counted sessions to continue the bank."""
    skipped_empty: int = 0
    """Turns of the source left out because they had empty text and no caption."""

    @property
    def sessions(self) -> list[int]:
        return sorted({t.session for t in self.turns})
