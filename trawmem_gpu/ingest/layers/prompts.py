"""TriMem's prompts (the seed paper's appendix E), as versioned ``Prompt``s, and the prompt set a
build or an evolution step uses.

The extraction and profile prompts are what TextGrad evolution edits (``eval.evolve``); an
evolved set is a JSON file (``save_prompt_set`` / ``load_prompt_set``, ``build --prompts FILE``)
whose templates must keep their placeholders. The planning prompts (key information, target
queries, and the follow-up searches of planned TrawMem, ``eval.planned``) and the critique
prompts stay fixed: evolution scores a prompt set by the memory it builds, which the planning
prompts do not touch.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from string import Template

from ...errors import InputError, loads_json
from ...store.facts import SECTIONS
from ...llm.prompts import Prompt, arr, nullable, obj, string

_NAMES = arr(string(80), 4)
"""Persons, locations: a few short names."""
_FACT = obj({"text": string(300), "source_turns": arr(string(40), 4, 1), "persons": _NAMES, "locations": _NAMES,
             "keywords": arr(string(60), 6), "entities": arr(string(80), 6), "date": nullable(string(10, 4))},
            ("text", "source_turns", "persons", "date"))
_LINE = obj({"text": string(300), "fact_ids": arr(string(40), 6, 1)}, ("text", "fact_ids"))
_PROFILE_SCHEMA = obj({s: arr(_LINE, 6) for s in SECTIONS}, (), "profile")

EXTRACT = Prompt(
    name="trimem_extract",
    version="1",
    fields=("window",),
    json_mode=True,
    template=(
        "You are a memory extraction agent. Below is a window of a conversation; each turn has its "
        "id in brackets, the date of its session, the speaker and the text.\n\n"
        "Extract every fact worth remembering as a list of memory entries. Rules:\n"
        "- Factual and source-traceable: only what the turns say; give the ids of the turns each "
        "entry comes from (ids from this window only).\n"
        "- Lossless restatement: one sentence per entry, keeping exact names, numbers, titles and "
        "adjectives.\n"
        "- Disambiguated: replace every pronoun with the person's name.\n"
        "- Temporally normalized: resolve relative dates ('yesterday', 'last Friday', 'next month') "
        "against the session date and write the absolute date in the sentence; give it in \"date\" "
        "as YYYY-MM-DD (or YYYY-MM / YYYY for a month or year), else null.\n"
        "- Atomic: one fact per entry; never merge several facts into one summary entry.\n"
        "- Skip greetings, thanks and other social gestures.\n"
        "- Name things that are described but not named (\"the painting of a sunset\").\n\n"
        "Turns:\n$window\n\n"
        'Reply with JSON only: {"facts": [{"text": "<one sentence>", "source_turns": ["<turn id>", ...], '
        '"persons": [...], "locations": [...], "keywords": [...], "entities": [...], "date": "YYYY-MM-DD" or null}]}'
    ),
    schema=obj({"facts": arr(_FACT, 24)}, ("facts",), "facts"),
)

_PROFILE_FORMAT = (
    f"Sections: {', '.join(SECTIONS)}. "
    "Each line is one statement about the person with the ids of the facts behind it; infer "
    "traits and preferences only where the facts support them, and keep exact adjectives."
)

PROFILE = Prompt(
    name="trimem_profile",
    version="1",
    fields=("person", "facts"),
    json_mode=True,
    template=(
        "You build the profile of $person from facts remembered about them (each with its id).\n"
        + _PROFILE_FORMAT + "\n\nFacts:\n$facts\n\n"
        'Reply with JSON only: {"identity": [{"text": "...", "fact_ids": ["<fact id>", ...]}], '
        '"personality": [...], "interests": [...], "career": [...], "relationships": [...], '
        '"life_events": [...], "preferences": [...]} (leave a section out when no fact supports it)'
    ),
    schema=_PROFILE_SCHEMA,
)

PROFILE_UPDATE = Prompt(
    name="trimem_profile_update",
    version="1",
    fields=("person", "profile", "facts"),
    json_mode=True,
    template=(
        "You update the profile of $person with new facts (each with its id).\n"
        + _PROFILE_FORMAT + "\nUpdate only the sections the new facts affect; keep every line the "
        "new facts do not contradict (with its fact ids); a section you do not return stays as it is.\n\n"
        "Current profile:\n$profile\n\nNew facts:\n$facts\n\n"
        'Reply with JSON only, the changed sections in full: {"<section>": [{"text": "...", '
        '"fact_ids": ["<fact id>", ...]}], ...}'
    ),
    schema=_PROFILE_SCHEMA,
)

KEY_INFO = Prompt(
    name="trimem_key_info",
    version="1",
    fields=("question",),
    json_mode=True,
    template=(
        "Analyze the question and extract the key information needed to search a memory of past "
        "conversations.\n\nQuestion: $question\n\n"
        'Reply with JSON only: {"keywords": [...], "persons": [...], "time_expression": "<text>" or null, '
        '"location": "<text>" or null, "entities": [...]}'
    ),
    schema=obj({"keywords": arr(string(60), 8), "persons": _NAMES, "time_expression": nullable(string(80)),
                "location": nullable(string(80)), "entities": arr(string(80), 6)},
               ("keywords", "persons", "time_expression", "location", "entities"), "key_info"),
)

TARGET_QUERY = Prompt(
    name="trimem_target_query",
    version="1",
    fields=("question",),
    json_mode=True,
    template=(
        "Plan searches of a memory of past conversations for the question below. Work out the "
        "question type, the entities and relationships involved and the minimal information "
        "required, then write one to three focused, non-redundant search queries. Always include "
        "the original question; prefer fewer, more targeted queries.\n\nQuestion: $question\n\n"
        'Reply with JSON only: {"queries": ["<query>", ...]}'
    ),
    schema=obj({"queries": arr(string(200, 3), 3, 1)}, ("queries",), "queries"),
)

FOLLOW_UP = Prompt(
    name="trawmem_follow_up",
    version="1",
    fields=("question", "workspace"),
    json_mode=True,
    template=(
        "A memory of past conversations was searched for the question below; the excerpts found so "
        "far follow it.\n\nQuestion: $question\n\nExcerpts:\n$workspace\n\n"
        "Work out which pieces of evidence the question needs (each part of a question with several "
        "parts; a second fact that a found excerpt points to: a person, event, object or date it "
        "names) and which of them the excerpts do not hold yet. Write at most two focused search "
        "queries for the missing evidence, each naming what to find rather than repeating the "
        "question; write none when the excerpts already hold everything the question needs.\n\n"
        'Reply with JSON only: {"queries": ["<query>", ...]}'
    ),
    schema=obj({"queries": arr(string(200, 3), 2)}, ("queries",), "follow_ups"),
)

CRITIQUE = Prompt(
    name="trimem_critique",
    version="1",
    fields=("prompt_name", "prompt", "failures"),
    json_mode=True,
    template=(
        "You improve the system prompt '$prompt_name' of a memory system. With the memory it "
        "built, these questions were answered wrongly:\n$failures\n\n"
        "The prompt:\n<<<\n$prompt\n>>>\n\n"
        "Criticize the prompt: what in it made the memory miss or distort what the answers needed "
        "(lost details, merged facts, unresolved dates, missing traits)? Be specific and brief.\n"
        'Reply with JSON only: {"critique": "<text>"}'
    ),
    schema=obj({"critique": string(1500)}, ("critique",), "critique"),
)

APPLY_CRITIQUE = Prompt(
    name="trimem_apply_critique",
    version="1",
    fields=("prompt_name", "prompt", "critiques", "placeholders"),
    json_mode=True,
    template=(
        "Rewrite the system prompt '$prompt_name' to address the critiques below, changing as "
        "little as needed. Keep every placeholder ($placeholders) exactly once and keep the reply "
        "format the prompt asks for.\n\nPrompt:\n<<<\n$prompt\n>>>\n\nCritiques:\n$critiques\n\n"
        'Reply with JSON only: {"prompt": "<the full new prompt>"}'
    ),
    schema=obj({"prompt": string(6000, 20)}, ("prompt",), "prompt"),
)

EVOLVABLE = ("extract", "profile", "profile_update")
"""PromptSet fields a prompts file may replace (``evolve-prompts`` edits ``eval.evolve.EVOLVED`` of them)."""


@dataclass(frozen=True)
class PromptSet:
    """The prompts one build / query uses; evolution replaces ``EVOLVABLE`` members."""

    extract: Prompt = EXTRACT
    profile: Prompt = PROFILE
    profile_update: Prompt = PROFILE_UPDATE
    key_info: Prompt = KEY_INFO
    target_query: Prompt = TARGET_QUERY
    follow_up: Prompt = FOLLOW_UP

    def describe(self) -> dict:
        """name / version / sha of every prompt, for result files and bank stats."""
        return {f.name: getattr(self, f.name).describe() for f in fields(self)}

    @property
    def sha(self) -> str:
        """One digest over the evolvable templates (a prompt set's identity)."""
        h = hashlib.sha256()
        for name in EVOLVABLE:
            h.update(getattr(self, name).template.encode("utf-8") + b"\0")
        return h.hexdigest()

    def with_template(self, name: str, template: str, version: str) -> "PromptSet":
        """A copy with ``name``'s template replaced (checked by :func:`check_template`)."""
        if name not in EVOLVABLE:
            raise InputError(f"prompt {name!r} cannot be replaced; evolvable: {', '.join(EVOLVABLE)}")
        old: Prompt = getattr(self, name)
        check_template(old, template)
        return replace(self, **{name: replace(old, template=template, version=version)})


def placeholders(template: str) -> set[str]:
    """The ``$name`` placeholders of a ``string.Template`` text (ValueError when malformed)."""
    t = Template(template)
    if not t.is_valid():
        raise ValueError("malformed placeholder (a lone '$'; write '$$' for a dollar)")
    return set(t.get_identifiers())


def check_template(prompt: Prompt, template: str) -> None:
    """Raise ``InputError`` unless ``template`` holds exactly ``prompt``'s placeholders."""
    if not isinstance(template, str) or not template.strip():
        raise InputError(f"prompt {prompt.name}: the template is empty")
    try:
        names = placeholders(template)
    except ValueError as e:
        raise InputError(f"prompt {prompt.name}: {e}") from None
    want = set(prompt.fields)
    if names != want:
        raise InputError(f"prompt {prompt.name}: the template must use the placeholders "
                         f"{sorted('$' + n for n in want)}, it uses {sorted('$' + n for n in names)}")


PROMPTS_FORMAT = 1
"""Version of the prompt-set file layout."""


def prompt_set_to_dict(ps: PromptSet) -> dict:
    """The evolvable templates with their versions (what a prompts file holds)."""
    return {"format": PROMPTS_FORMAT, "sha": ps.sha,
            "prompts": {n: {"name": getattr(ps, n).name, "version": getattr(ps, n).version,
                            "template": getattr(ps, n).template} for n in EVOLVABLE}}


def prompt_set_from_dict(d: dict, where: str = "prompts") -> PromptSet:
    """Inverse of :func:`prompt_set_to_dict`; members not given keep the defaults."""
    if not isinstance(d, dict) or d.get("format") != PROMPTS_FORMAT or not isinstance(d.get("prompts"), dict):
        raise InputError(f"{where}: not a TriMem prompt set (format {PROMPTS_FORMAT} with a 'prompts' object)")
    ps = PromptSet()
    for name, p in d["prompts"].items():
        if not isinstance(p, dict) or not isinstance(p.get("template"), str):
            raise InputError(f"{where}: prompts.{name} needs a 'template' string")
        ps = ps.with_template(name, p["template"], str(p.get("version", "evolved")))
    return ps


def load_prompt_set(path: str | Path | None) -> PromptSet:
    """The default prompts (``path`` None), or those of a prompts file (``build --prompts``): a
    file written by :func:`save_prompt_set`, or an ``evolve-prompts`` result (its ``best``)."""
    if path is None:
        return PromptSet()
    p = Path(path)
    try:
        d = loads_json(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"prompts file {p} does not exist") from None
    except ValueError as e:
        raise InputError(f"prompts file {p} is not JSON: {e}") from None
    if isinstance(d, dict) and "best" in d and "prompts" not in d:
        d = d["best"]
    return prompt_set_from_dict(d, str(p))


def save_prompt_set(ps: PromptSet, path: str | Path, extra: dict | None = None) -> None:
    """Write ``ps`` (and ``extra`` keys) to ``path`` atomically."""
    from ...store.files import write_json_atomic

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic({**prompt_set_to_dict(ps), **(extra or {})}, p, indent=1)
