"""Facts that change over time: a new fact supersedes an older one about the same subject and
attribute; the old one stays, with ``valid_to`` and ``superseded_by`` (``store.facts.Fact``).

Two ways to find what a new fact supersedes:

* **By rule** (no LLM): facts that carry an explicit key (``subject``, ``attribute``, compared
  case and spacing aside) supersede the current fact of the same key that started before them
  (:func:`by_rule`). Among facts of one key, the one that starts last is current; a fact that
  arrives late (starts before the current one) is stored already superseded by it.
* **By the LLM** (``build --update --facts llm``, the ``existing=`` path): the new facts and the
  stored current facts that share a person, entity or keyword with them are shown to the model
  with :data:`SUPERSEDE`, which answers ``{"supersessions": [{"new": id, "old": id}]}``
  (:data:`SUPERSEDE_SCHEMA`). The reply is grounded: both ids must be facts shown (a new fact and a
  stored one), each stored fact is superseded once; anything else is dropped and counted, and a
  reply that is malformed or names unknown ids is retried once with the model's own reply shown
  back (as every structured call of the extraction).

:func:`apply` marks the superseded facts: ``valid_to`` = the superseding fact's start,
``superseded_by`` = its id. Nothing is deleted: ``as_of`` selection shows what held on a date.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Sequence

from ...llm.prompts import Prompt, RETRY_JSON, retry_messages
from ...llm.structured import extract_json
from ...store.facts import Fact

SUPERSEDE = Prompt(
    name="trimem_supersede",
    version="1",
    fields=("stored", "new"),
    json_mode=True,
    template=(
        "You keep a memory of facts about people up to date. Below are facts stored earlier and new facts, "
        "each with its id and date.\n\n"
        "A new fact supersedes a stored fact when both state the same property of the same subject (where "
        "someone lives, a job, a count, a preference, a plan) and the new value replaces the old one, so the "
        "stored fact is no longer true. A fact that adds information, or is about something else, supersedes "
        "nothing.\n\nStored facts:\n$stored\n\nNew facts:\n$new\n\n"
        'Reply with JSON only: {"supersessions": [{"new": "<new fact id>", "old": "<stored fact id>"}]} '
        "(an empty list when nothing is superseded)"
    ),
)

SUPERSEDE_SCHEMA = {
    "type": "object",
    "properties": {"supersessions": {"type": "array", "items": {
        "type": "object", "properties": {"new": {"type": "string"}, "old": {"type": "string"}},
        "required": ["new", "old"], "additionalProperties": False}}},
    "required": ["supersessions"], "additionalProperties": False,
}
"""The JSON schema of a :data:`SUPERSEDE` reply (for schema-constrained decoding)."""

MAX_CANDIDATES = 40
"""Most stored facts shown with one batch of new facts (those sharing most names with them)."""


@dataclass
class SupersedeStats:
    requests: int = 0
    retried: int = 0
    malformed: int = 0
    unknown_ids: int = 0
    """Proposals naming an id that was not shown (or a new fact as the old one): dropped."""
    proposed: int = 0
    superseded: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Supersession:
    old: str
    new: str
    cause: str
    """``rule`` or ``llm``."""


def by_rule(stored: Sequence[Fact], new: Sequence[Fact]) -> list[Supersession]:
    """Supersessions among keyed facts (module docstring): per key, every fact but the one that
    starts last (ties: the later one given) is superseded by the next one in start order."""
    groups: dict[tuple, list[tuple[int, Fact]]] = {}
    for order, f in enumerate([*stored, *new]):
        if f.key is not None:
            groups.setdefault(f.key, []).append((order, f))
    out = []
    new_ids = {f.fact_id for f in new}
    for items in groups.values():
        if not any(f.fact_id in new_ids for _, f in items):
            continue  # nothing new about this key
        items.sort(key=lambda x: (x[1].start_time or datetime.min, x[0]))  # instants, in UTC
        for (_, a), (_, b) in zip(items, items[1:]):
            if a.superseded_by != b.fact_id:
                out.append(Supersession(a.fact_id, b.fact_id, "rule"))
    return out


def apply(facts: Sequence[Fact], pairs: Sequence[Supersession]) -> tuple[Fact, ...]:
    """``facts`` with each pair's old fact marked superseded by its new one."""
    by_id = {f.fact_id: f for f in facts}
    mark = {p.old: by_id[p.new] for p in pairs if p.old in by_id and p.new in by_id}
    return tuple(replace(f, valid_to=mark[f.fact_id].start or f.valid_to, superseded_by=mark[f.fact_id].fact_id)
                 if f.fact_id in mark else f for f in facts)


def _line(f: Fact) -> str:
    return f"[{f.fact_id}] ({f.start or 'undated'}) {' '.join(f.text.split())}"


def candidates(stored: Sequence[Fact], new: Sequence[Fact], limit: int = MAX_CANDIDATES) -> list[Fact]:
    """The stored current facts that share a person, entity, keyword or location with a new fact,
    those sharing most first (at most ``limit``)."""
    names = {n.casefold() for f in new for n in (*f.persons, *f.entities, *f.keywords, *f.locations)}
    scored = []
    for i, f in enumerate(stored):
        if not f.current:
            continue
        k = len(names & {n.casefold() for n in (*f.persons, *f.entities, *f.keywords, *f.locations)})
        if k:
            scored.append((-k, i, f))
    return [f for _, _, f in sorted(scored)[:limit]]


def parse_reply(text: str | None, new_ids: set[str], old_ids: set[str]) -> tuple[list[tuple[str, str]] | None, int]:
    """The grounded ``(new, old)`` pairs of a reply and how many proposals were dropped; None when
    the reply is malformed (not ``{"supersessions": [...]}``)."""
    obj = extract_json(text)
    items = obj.get("supersessions") if isinstance(obj, dict) else None
    if not isinstance(items, list):
        return None, 0
    out, bad, seen = [], 0, set()
    for x in items:
        n = x.get("new") if isinstance(x, dict) else None
        o = x.get("old") if isinstance(x, dict) else None
        if not (isinstance(n, str) and isinstance(o, str) and n in new_ids and o in old_ids) or o in seen:
            bad += 1
            continue
        seen.add(o)
        out.append((n, o))
    return out, bad


def by_llm(stored: Sequence[Fact], new: Sequence[Fact], llm, st: SupersedeStats | None = None,
           max_tokens: int = 512) -> list[Supersession]:
    """The supersessions the LLM proposes of ``stored`` facts by ``new`` ones (module docstring)."""
    st = st if st is not None else SupersedeStats()
    cands = candidates(stored, new)
    if not cands or not new:
        return []
    new_ids, old_ids = {f.fact_id for f in new}, {f.fact_id for f in cands}
    conv = SUPERSEDE.messages(stored="\n".join(map(_line, cands)), new="\n".join(map(_line, new)))

    def parsed(t):
        return parse_reply(t, new_ids, old_ids)

    (res,) = llm.chat([conv], max_tokens=max_tokens, temperature=0.0, json_mode=True, desc="supersede",
                      accept=lambda i, t: parsed(t)[0] is not None)
    st.requests += 1
    pairs, bad = parsed(res.text if res.error is None else None)
    if pairs is None or bad:
        st.retried += 1
        st.malformed += pairs is None
        st.unknown_ids += bad
        why = RETRY_JSON if pairs is None else ("Some ids are not ids of the facts shown, or a stored fact is named "
                                                "twice. Use only the bracketed ids. Reply again with the JSON object "
                                                "only.")
        (r2,) = llm.chat([retry_messages(conv, res.text or "", why)], max_tokens=max_tokens, temperature=0.0,
                         json_mode=True, desc="supersede-retry", accept=lambda i, t: parsed(t)[0] is not None)
        st.requests += 1
        p2, bad2 = parsed(r2.text if r2.error is None else None)
        if p2 is not None:
            pairs = p2
            st.unknown_ids += bad2
    pairs = pairs or []
    st.proposed += len(pairs)
    return [Supersession(o, n, "llm") for n, o in pairs]


@dataclass
class Superseded:
    """:func:`supersede`'s answer: every fact (stored and new, marked) and the supersessions."""

    facts: tuple[Fact, ...]
    pairs: list[Supersession] = field(default_factory=list)


def supersede(stored: Sequence[Fact], new: Sequence[Fact], llm=None, st: SupersedeStats | None = None) -> Superseded:
    """``stored + new`` with their supersessions applied: by rule for keyed facts, and, given an
    ``llm``, as it proposes for the others (a stored fact a rule already superseded is not shown)."""
    pairs = by_rule(stored, new)
    if llm is not None:
        ruled = {p.old for p in pairs}
        keyless = [f for f in new if f.key is None]
        pairs += by_llm([f for f in stored if f.fact_id not in ruled], keyless, llm, st)
    if st is not None:
        st.superseded += len(pairs)
    return Superseded(apply([*stored, *new], pairs), pairs)
