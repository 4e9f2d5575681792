"""Every prompt the package sends, each with a name, version and template hash for result files.

Templates use ``string.Template`` placeholders (``$name``); literal dollars are ``$$``. Each
prompt renders to a single user message. A prompt whose reply is JSON carries the JSON schema of
that reply beside its template (``Prompt.schema``): structured calls send it so that the server
constrains decoding to it (``llm.structured.ask``), and the bounds it sets (items, string
lengths) keep a small model from writing until its token limit. The schemas are built with
:func:`obj`, :func:`arr` and :func:`string` (the subset of JSON schema that llama.cpp's grammar
converter, vLLM's structured outputs and OpenAI's strict mode all take).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from string import Template
from typing import Optional


GRAMMAR_MAX_LENGTH = 1000
"""The longest ``maxLength`` a schema sends. llama.cpp turns a bounded string into one nested rule
per character; past its repetition limit the grammar does not parse, and llama-cpp-python's
server (0.3.36) then dies with a segmentation fault (seen on the real model: 1,000 parses, 1,200
kills the server). A longer bound is left to the reply's token budget."""


def string(max_len: int, min_len: int = 1) -> dict:
    """A JSON-schema string of ``min_len`` to ``max_len`` characters (``maxLength`` only up to
    :data:`GRAMMAR_MAX_LENGTH`)."""
    if max_len > GRAMMAR_MAX_LENGTH:
        return {"type": "string", "minLength": min_len}
    return {"type": "string", "minLength": min_len, "maxLength": max_len}


def arr(items: dict, max_items: int, min_items: int = 0) -> dict:
    """A JSON-schema array of ``min_items`` to ``max_items`` ``items``."""
    return {"type": "array", "items": items, "minItems": min_items, "maxItems": max_items}


def nullable(schema: dict) -> dict:
    """``schema`` or null."""
    return {"anyOf": [schema, {"type": "null"}]}


def obj(properties: dict, required: tuple = (), title: Optional[str] = None) -> dict:
    """A JSON-schema object of exactly ``properties`` (no others), ``required`` among them."""
    out = {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}
    if title:
        out = {"title": title, **out}
    return out


@dataclass(frozen=True)
class Prompt:
    """A versioned prompt template."""

    name: str
    """Stable identifier written into results."""
    version: str
    """Bumped whenever the template changes meaning."""
    template: str
    """``string.Template`` text; placeholders are listed in ``fields``."""
    fields: tuple = ()
    """Placeholder names the template needs."""
    json_mode: bool = False
    """Whether the reply is a JSON object (ask the backend for JSON mode)."""
    schema: Optional[dict] = field(default=None, compare=False)
    """The JSON schema of the reply (structured calls send it: constrained decoding); None for a
    plain-text reply."""

    @property
    def sha(self) -> str:
        """sha256 hex of the template text."""
        return hashlib.sha256(self.template.encode("utf-8")).hexdigest()

    @property
    def schema_sha(self) -> Optional[str]:
        """sha256 hex of the schema's canonical JSON (None without one)."""
        if self.schema is None:
            return None
        return hashlib.sha256(json.dumps(self.schema, sort_keys=True).encode("utf-8")).hexdigest()

    def render(self, **values) -> str:
        """Template text with ``values`` substituted (all of ``fields`` required)."""
        missing = [f for f in self.fields if f not in values]
        if missing:
            raise KeyError(f"prompt {self.name}: missing fields {missing}")
        return Template(self.template).substitute({k: str(v) for k, v in values.items()})

    def messages(self, **values) -> list[dict]:
        """One-message conversation for ``LLMBackend.chat``."""
        return [{"role": "user", "content": self.render(**values)}]

    def describe(self) -> dict:
        """name / version / sha (and the schema's sha) for result files."""
        d = {"name": self.name, "version": self.version, "sha": self.sha}
        if self.schema is not None:
            d["schema_sha"] = self.schema_sha
        return d


SEGMENT = Prompt(
    name="segment",
    version="1",
    fields=("turns",),
    json_mode=True,
    template=(
        "Below are the turns of one conversation session, numbered from 0.\n"
        "Split the session into event threads: a thread is a contiguous run of turns about one "
        "event, activity or topic. Start a new thread only where the conversation moves on to a "
        "different event; short asides stay in the surrounding thread.\n\n"
        "Turns:\n$turns\n\n"
        'Reply with JSON only, of the form {"boundaries": [0, i, j, ...]}: the indices of the '
        "turns where a new thread starts, in increasing order, always including 0."
    ),
    schema=obj({"boundaries": arr({"type": "integer", "minimum": 0}, 64, 1)}, ("boundaries",), "segment"),
)

HEAD = Prompt(
    name="head",
    version="1",
    fields=("thread",),
    json_mode=True,
    template=(
        "Summarize the following conversation thread in one sentence. Name the speakers, give "
        "the date of the session, and state the main event or facts (who did what, when, where).\n\n"
        "Thread:\n$thread\n\n"
        'Reply with JSON only: {"head": "<one sentence>"}'
    ),
    schema=obj({"head": string(300)}, ("head",), "head"),
)

_ANSWER_PREAMBLE = (
    "You are answering a question about a long conversation between two people, using the "
    "memory excerpts below (grouped by thread, each turn with its speaker and session date).\n\n"
    "Memory:\n$context\n\n"
    "Question: $question\n\n"
)
"""Shared opening of ``ANSWER`` and ``ANSWER_TEMPORAL``: the memory and the question."""

ANSWER = Prompt(
    name="answer",
    version="1",
    fields=("context", "question"),
    template=_ANSWER_PREAMBLE + (
        "Answer with a short phrase (a few words), using the exact words of the memory where "
        "possible. Do not explain. If the memory does not contain the answer, reply: "
        "Not mentioned in the conversation."
    ),
)

ANSWER_TEMPORAL = Prompt(
    name="answer_temporal",
    version="1",
    fields=("context", "question"),
    template=_ANSWER_PREAMBLE + (
        "This question is about time. Use the session dates: when a turn says 'yesterday', "
        "'last week' or 'next month', work out the date or period from the date of its session "
        "(for example 'the week before 9 June 2023'), and answer with that date or period rather "
        "than the relative words.\n"
        "Answer with a short phrase (a few words). Do not explain. If the memory does not contain "
        "the answer, reply: Not mentioned in the conversation."
    ),
)

JUDGE = Prompt(
    name="judge",
    version="1",
    fields=("question", "gold", "prediction"),
    json_mode=True,
    template=(
        "You grade an answer to a question about a conversation.\n\n"
        "Question: $question\n"
        "Gold answer: $gold\n"
        "Generated answer: $prediction\n\n"
        "Be lenient on form: the generated answer is CORRECT if it refers to the same thing as the "
        "gold answer, even when it is longer, worded differently, or uses another date notation "
        "(for example '7 May 2023', 'May 7th' and '2023-05-07' are the same; for time questions a "
        "stated period that contains or equals the gold date or period is CORRECT). It is WRONG if "
        "it names something else, misses the point, or says the information is not available "
        "while the gold answer gives it.\n\n"
        'Reply with JSON only: {"label": "CORRECT"} or {"label": "WRONG"}'
    ),
    schema=obj({"label": {"type": "string", "enum": ["CORRECT", "WRONG"]}}, ("label",), "judge"),
)

ALL_PROMPTS = {p.name: p for p in (SEGMENT, HEAD, ANSWER, ANSWER_TEMPORAL, JUDGE)}
"""All prompts by name."""

RETRY_JSON = (
    "Your reply could not be read as the requested JSON. Reply again with the JSON object only, "
    "no other text."
)
"""Follow-up message sent when a structured reply was malformed."""


def retry_messages(conv: list[dict], reply: str | None, message: str = RETRY_JSON, max_chars: int = 4000
                   ) -> list[dict]:
    """The follow-up of a reply that needs another try: ``conv``, the model's reply shown back
    (its first ``max_chars`` characters), then ``message`` (by default: the JSON asked again)."""
    return list(conv) + [{"role": "assistant", "content": (reply or "")[:max_chars]},
                         {"role": "user", "content": message}]


def answer_prompt(category, use_session_dates_cat2: bool = True) -> Prompt:
    """ANSWER, or ANSWER_TEMPORAL for category 2 when ``use_session_dates_cat2``."""
    try:
        cat = int(category)
    except (TypeError, ValueError):
        cat = None
    return ANSWER_TEMPORAL if (cat == 2 and use_session_dates_cat2) else ANSWER
