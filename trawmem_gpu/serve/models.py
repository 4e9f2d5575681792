"""Request and response bodies of API v1 (pydantic; FastAPI derives the OpenAPI schema from them).

Whole numbers (budget, hops, token_budget) are strict: ``true``, ``"8"`` or ``8.0`` is refused,
not read as a number; so are a ``question_vector``'s entries (numbers only: ``"0.5"`` or ``true``
is refused). Limits that depend on the server's options (question length, budget, hops
and token budget ranges, vector length, batch and append sizes) are checked by the app against
``ServeConfig.limits`` and the other options, so their error messages name the option.

Every string and list field also has a fixed bound (the ``MAX_*`` constants below, and a turn's
from ``data.types``; the table in docs/serving-limits.md), enforced by pydantic's JSON validator while it reads the body, before any
of the server's own parsing (dates, turns) sees a value: the body is at most ``max_body_bytes``
(413 before it is read), the validator is linear in it, and everything after works on bounded
fields. An oversized field answers 422 naming the field and its bound, never echoing the value.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from ..data.types import (MAX_CAPTION_CHARS, MAX_DATE_CHARS, MAX_ID_CHARS, MAX_SESSION, MAX_SPEAKER_CHARS,
                          MAX_TEXT_CHARS)

# A turn's bounds (ids, speaker, text, caption, timestamp, session) are the data layer's
# (``data.types``; every other door checks them through ``data.fields``): imported, never restated.

MAX_QUESTION_FIELD_CHARS = 65536
"""The question field's fixed bound; the server's ``limits.max_question_chars`` (default 4000) is the
limit a question is then held to."""
MAX_VECTOR_DIMS = 8192
"""Numbers in a ``question_vector`` (the collection's encoder dimension is then required)."""
MAX_BATCH_FIELD = 4096
"""Requests in a batch body; the server's ``max_batch_request`` (default 256) then applies."""
MAX_TURNS_FIELD = 10000
"""Turns in an append body; the server's ``max_turns_per_append`` (default 1000) then applies."""
MAX_FORGET_IDS = 10_000
"""Turn ids in one forget (``POST /v1/banks/{bank_id}/forget``, MCP ``forget``)."""


class SelectRequest(BaseModel):
    """One question against one bank."""

    model_config = ConfigDict(extra="forbid")

    bank_id: str = Field(min_length=1, max_length=MAX_ID_CHARS, description="the bank to select from")
    question: str = Field(max_length=MAX_QUESTION_FIELD_CHARS,
                          description="the question (also used for BM25 and the demand features)")
    budget: int | None = Field(None, strict=True, description="B: most units in the workspace (default: the "
                                                              "server's; with a token_budget, no cap on units)")
    hops: int | None = Field(None, strict=True,
                             description="H: propagation hops over the thread graph (default: the server's)")
    token_budget: int | None = Field(
        None, strict=True, description="T: most tokens (cl100k_base) in the rendered workspace, headings included; the "
                          "selection then fits its units to T (default: the server's, usually none)")
    date: str | None = Field(None, max_length=MAX_DATE_CHARS,
                             description="the question's 'now' (ISO 8601 or any date the loaders read); "
                                         "used where the engine supports per-query dates")
    question_vector: list[Annotated[float, Strict()]] | None = Field(
        None, max_length=MAX_VECTOR_DIMS, description="the question's embedding from the collection's encoder (skips the encoder); "
                          "normalized by the server; JSON numbers only (no strings, no booleans)")


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: list[SelectRequest] = Field(min_length=1, max_length=MAX_BATCH_FIELD,
                                          description="requests answered together")


class Unit(BaseModel):
    id: str
    speaker: str
    date: str | None = Field(description="ISO 8601 date of the turn's session")
    timestamp: str = Field(description="the date as the source wrote it")
    text: str
    caption: str | None
    thread: int = Field(description="thread index within the bank")
    session: int
    members: list[str] = Field(default_factory=list, description="the ids of the messages the unit shows (a "
                               "burst of short messages: all of them, the first is `id`; else `id` alone)")


class ThreadHead(BaseModel):
    thread: int
    head: str | None


class Timings(BaseModel):
    queue_ms: float | None = Field(description="waiting for a batch")
    encode_ms: float = Field(description="the batch's encoder call (0 with a question_vector)")
    select_ms: float = Field(description="the batch's engine call for this request's (budget, hops)")
    assemble_ms: float = Field(description="this workspace's grouping, rendering and token count")
    batch_size: int
    total_ms: float | None = Field(None, description="arrival to answer, inside the server")


class SelectResponse(BaseModel):
    bank_id: str
    bank_n_units: int = Field(description="the bank's size when it was selected from (which version was read)")
    question: str
    budget: int | None = Field(description="B applied (None: no cap on units, under a token budget)")
    hops: int
    token_budget: int | None = Field(description="T applied (None: no token budget)")
    date: str | None
    date_used: bool = Field(description="whether the engine took the per-query date")
    units: list[Unit] = Field(description="selected turns in source order")
    threads: list[ThreadHead] = Field(description="threads of the selected turns with their heads, in source order")
    text: str = Field(description="the rendered workspace")
    n_tokens: int
    tokenizer: str
    timings: Timings


class BatchResponse(BaseModel):
    results: list[SelectResponse]


class TurnIn(BaseModel):
    """One turn, as a line of a JSONL history without ``bank_id``."""

    model_config = ConfigDict(extra="forbid")

    turn_id: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)] | Annotated[int, Strict()]
    speaker: str = Field(min_length=1, max_length=MAX_SPEAKER_CHARS)
    text: str = Field(max_length=MAX_TEXT_CHARS)
    timestamp: str = Field(min_length=1, max_length=MAX_DATE_CHARS,
                           description="ISO 8601 or LoCoMo style, e.g. '2:14 pm on 9 May, 2031'; one with an offset "
                                       "('...+05:00', '...Z') is read as its UTC time")
    caption: str | None = Field(None, max_length=MAX_CAPTION_CHARS)
    session: int | None = Field(None, strict=True, ge=0, le=MAX_SESSION,
                                description=f"session number in 0..{MAX_SESSION}; give it on every turn or on none")


class AppendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    turns: list[TurnIn] = Field(min_length=1, max_length=MAX_TURNS_FIELD,
                                description="turns in source order, after the bank's last turn and in time order "
                                            "(a turn dated before the turn it follows is refused)")


class BankSummary(BaseModel):
    bank_id: str
    n_units: int
    n_threads: int
    quarantined: str | None = Field(None, description="in a listing: why this bank is not served (its files "
                                                      "could not be loaded or prepared); DELETE it to remove it")


class BankList(BaseModel):
    banks: list[BankSummary]
    encoder: str | None
    dim: int


class BankInfo(BankSummary):
    n_sessions: int
    first_date: str | None
    last_date: str | None


class AppendResponse(BankInfo):
    created: bool
    appended: int
    stored: list[str | int] = Field(description="turn ids this request stored")
    already_stored: list[str | int] = Field(
        description="turn ids the bank held already, with the same speaker, text, timestamp and caption (a "
                    "retry of an append whose answer was lost); they are not stored twice")
    timings: dict[str, float]


class ForgetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    turn_ids: list[str] = Field(min_length=1, max_length=MAX_FORGET_IDS, description="turn ids of the bank to forget")


class ForgetResponse(BaseModel):
    bank_id: str
    forgotten: list[str] = Field(description="turn ids forgotten by this call (or a rerun it finished)")
    missing: list[str] = Field(description="ids asked for that the bank does not hold")
    deleted: bool = Field(description="the bank is gone (a whole-bank forget, or no turn left)")
    n_units: int
    cache_rows: int = Field(description="embedding / LLM cache rows erased")
    output_records: int


class Error(BaseModel):
    detail: str
    outcome: str | None = Field(None, description="on a 503/504 of an append: 'unknown' when the append may "
                                                  "or may not have been stored (resend it: a retry is safe)")
