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

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, WithJsonSchema, create_model

from ..data.metadata import MAX_KEY_CHARS, MAX_METADATA_KEYS
from ..data.types import (MAX_CAPTION_CHARS, MAX_DATE_CHARS, MAX_ID_CHARS, MAX_SESSION, MAX_SPEAKER_CHARS,
                          MAX_TEXT_CHARS)

# A turn's bounds (ids, speaker, text, caption, timestamp, session) are the data layer's
# (``data.types``; every other door checks them through ``data.fields``): imported, never restated.

MAX_QUESTION_FIELD_CHARS = 65536
"""The question field's fixed bound; the server's ``limits.max_question_chars`` (default 4000) is the
limit a question is then held to."""
MAX_VECTOR_DIMS = 8192
"""Numbers in a ``question_vector`` (the collection's encoder dimension is then required)."""
SELECT_BODY_BYTES = 1 << 20
"""Most bytes of a single select's body (``POST /v1/select``), below ``max_body_bytes``: a body
with every field at its bound (a question of :data:`MAX_QUESTION_FIELD_CHARS` characters, each
escaped as ``\\uXXXX``; a vector of :data:`MAX_VECTOR_DIMS` numbers written out to 17 digits; a
filter of ``data.filters.MAX_FILTER_BYTES`` with three times as many bytes of white space) takes
under 0.9 MB. A larger one is refused with 413 before it is parsed: a 4 MB filter of empty
objects, which the bounds refuse only once parsed, cost its parse (about 0.3 s of the GIL,
shared with every other tenant's encoder and engine calls)."""
MAX_BATCH_FIELD = 4096
"""Requests in a batch body; the server's ``max_batch_request`` (default 256) then applies."""
MAX_TURNS_FIELD = 10000
"""Turns in an append body; the server's ``max_turns_per_append`` (default 1000) then applies."""
MAX_FORGET_IDS = 10_000
"""Turn ids in one forget (``POST /v1/banks/{bank_id}/forget``, MCP ``forget``)."""

Metadata = dict[Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)], Any]
"""A turn's metadata: at most ``MAX_METADATA_KEYS`` keys of bounded length here; every key and value
rule (a value is a string of at most ``MAX_VALUE_CHARS``, a number, a boolean or an ISO date) is
``data.metadata``'s, for every door, with messages naming ``metadata.KEY``."""
WHERE_DOC = ("a filter over turn metadata (docs/python-api.md, 'Metadata and filters'): {\"user_id\": \"u1\"}, "
             "{\"importance\": {\"gte\": 3}}, {\"or\": [...]}; operators eq, ne, in, nin, gt, gte, lt, lte, exists "
             "and and / or / not. Only turns that pass are candidates: the budget is spent on them. A key bound to a "
             "filter narrows it further, never widens it")


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
    where: dict[str, Any] | None = Field(None, description=WHERE_DOC)
    as_of: str | None = Field(None, max_length=MAX_DATE_CHARS,
                              description="show the facts valid on this date (superseded since, not before); "
                                          "default: the current facts (with the facts layer as units)")


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
    metadata: dict[str, Any] | None = Field(None, description="the turn's metadata (null: none)")
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
    as_of: str | None = Field(None, description="the date whose facts the workspace shows (null: the current ones)")
    date_used: bool = Field(description="whether the engine took the per-query date")
    where: dict[str, Any] | None = Field(None, description="the filter applied: the request's where and the key's, "
                                                         "in canonical form (null: none)")
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
    metadata: Metadata | None = Field(
        None, max_length=MAX_METADATA_KEYS,
        description="a flat map of keys to strings, numbers, booleans or ISO 8601 dates (user_id, agent_id, run_id, "
                    "...); selection filters (where) read it")


MAX_CONTENT_PARTS = 256
"""Content parts in one chat message (OpenAI's multi-part content)."""
MAX_ROLES = 8
"""Entries of an append's ``roles`` and ``speakers``."""


class MessageIn(BaseModel):
    """One OpenAI-style chat message (``memory.messages`` reads it: roles, speakers, content parts);
    OpenAI's other message fields (``tool_calls``, ``tool_call_id``, ...) are accepted and not stored."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(max_length=32, description="user, assistant (stored by default), system, developer, tool, function")
    content: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | Annotated[
        list[dict], Field(max_length=MAX_CONTENT_PARTS)] | None = Field(
        None, description="the text, or a list of content parts (text parts are stored; others are refused)")
    name: str | None = Field(None, max_length=MAX_SPEAKER_CHARS, description="the speaker (else `speakers[role]`, "
                                                                              "else the role)")
    id: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)] | Annotated[int, Strict()] | None = Field(
        None, description="the turn id (assigned when absent: msg-<n>; give it for safe retries)")
    timestamp: str | None = Field(None, max_length=MAX_DATE_CHARS, description="when it was said (default: now)")
    caption: str | None = Field(None, max_length=MAX_CAPTION_CHARS)
    session: int | None = Field(None, strict=True, ge=0, le=MAX_SESSION)


class AppendRequest(BaseModel):
    """Turns, or chat messages, to append; each item is checked on its own and answered per item."""

    model_config = ConfigDict(extra="forbid")

    # Any item (not dict): an item that is not an object is refused alone (serve.appends), as every
    # malformed item is, not the whole request
    turns: list[Annotated[Any, WithJsonSchema(TurnIn.model_json_schema())]] | None = Field(
        None, min_length=1, max_length=MAX_TURNS_FIELD,
        description="turns (TurnIn) in source order; one dated before the bank's last turn is stored at its "
                    "place in time (by event time, then arrival)")
    messages: list[Annotated[Any, WithJsonSchema(MessageIn.model_json_schema())]] | None = Field(
        None, min_length=1, max_length=MAX_TURNS_FIELD,
        description="chat messages (MessageIn) instead of turns: OpenAI's {role, content, name}")
    speakers: dict[Annotated[str, Field(max_length=32)], Annotated[str, Field(max_length=MAX_SPEAKER_CHARS)]] | None = \
        Field(None, max_length=MAX_ROLES, description="messages: role -> speaker name for messages without a name")
    roles: list[Annotated[str, Field(max_length=32)]] | None = Field(
        None, max_length=MAX_ROLES, description="messages: the roles stored (default user and assistant)")
    atomic: bool = Field(False, strict=True, description="refuse the whole request (422 / 409, nothing stored) when "
                                                         "any item is refused; default: store the valid items")


class AppendItemOut(BaseModel):
    index: int = Field(description="the item's position in turns / messages")
    status: str = Field(description="stored, already_stored, refused or skipped")
    turn_id: str | None = Field(description="the id it is stored under (assigned for a message without one)")
    field: str | None = Field(None, description="refused or skipped: the field at fault (turns[3].timestamp)")
    reason: str | None = Field(None, description="refused or skipped: why")


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
    items: list[AppendItemOut] = Field(description="every item of the request, in order, with what was done with it")
    refused: list[AppendItemOut] = Field(description="the refused items (their field and reason)")
    timings: dict[str, float]


class HistoryEvent(BaseModel):
    event: str = Field(description="added, superseded, re-embedded, forgotten or reinstated")
    time: str | None = Field(description="ISO 8601 UTC (null: stored before history was kept, e.g. by a build)")
    cause: str = Field(description="add, forget, rule, llm, build, ...")
    by: str | None = Field(None, description="superseded: the id of the fact that replaced it ((forgotten) once it is)")
    supersedes: str | None = Field(None, description="added: the id of the fact this one replaced")
    event_time: str | None = Field(None, description="added, of a turn the bank holds: when it was said (its timestamp "
                                                     "as ISO 8601 UTC; null: undated)")
    stored_at: str | None = Field(None, description="added, of a turn the bank holds: when the bank stored it, ISO "
                                                    "8601 UTC (null: stored before this was kept)")


class History(BaseModel):
    bank_id: str
    unit_id: str
    events: list[HistoryEvent] = Field(description="oldest first; events hold no content")


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


class ImportRefused(BaseModel):
    id: str = Field(description="the turn id")
    reason: str = Field(description="why it was not imported: 'forgotten by this collection' or "
                                    "'does not pass this key's filter'")


class ImportResponse(BaseModel):
    bank_id: str
    stored: int = Field(description="turns stored by this import")
    already_stored: int = Field(description="turns the bank held already (an import can be retried)")
    refused: list[ImportRefused] = Field(description="turns not imported, each with why")
    facts: int = Field(description="facts added")
    profiles: int = Field(description="profile sections added")


class Error(BaseModel):
    detail: str
    error: str | None = Field(None, description="on a 404: what is missing, 'unknown_bank' (or not this key's), "
                                                "'unknown_unit' or 'unknown_turn'")
    outcome: str | None = Field(None, description="on a 503/504 of an append: 'unknown' when the append may "
                                                  "or may not have been stored (resend it: a retry is safe)")


def part_of(model: type[BaseModel], names: tuple[str, ...], name: str) -> type[BaseModel]:
    """The model of ``model``'s fields ``names``, each as declared there (type, default, description):
    a front that answers with part of a wire model (MCP's tools) names the part, never restates it."""
    return create_model(name, **{n: (model.model_fields[n].annotation, model.model_fields[n]) for n in names})
