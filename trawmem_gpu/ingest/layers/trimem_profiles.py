"""TriMem's profiles (``build --profiles llm``): facts grouped by person, one structured profile per
person, updated section by section.

A person with ``min_facts`` facts or more (``Fact.persons``; names compared case-blind) gets a
profile from the profile prompt over all of their facts. On an update (``new_fact_ids``), a
person who already has a profile and gets new facts is sent the update prompt with the current
profile and the new facts only; the reply holds the sections that change, every other section
is kept as it was (the same objects). A person without new facts is not asked at all.

Every line keeps the ids of the facts behind it: ids that are not facts of the person are
dropped (``unknown_ids``), and a line left without any is dropped (``lines_without_facts``).
Malformed replies get one retry (a follow-up asking for the JSON only); still malformed, a new
profile is skipped and an updated one kept as it was (``failed``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ...store.facts import SECTIONS, Fact, ProfileLine, ProfileSection
from ...llm.base import LLMBackend
from ...llm.prompts import retry_messages
from ...llm.structured import extract_json
from .trimem_extract import ECHO_CHARS
from .prompts import PromptSet

MIN_FACTS = 2
"""A person needs this many facts for a profile."""
MAX_FACTS = 400
"""At most this many of a person's facts (the latest) go into one prompt."""
MAX_LINE_CHARS = 500


@dataclass
class ProfileStats:
    """Counts of one profile run (the bank's stats ``profiles_llm``)."""

    persons: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    sections_changed: int = 0
    requests: int = 0
    retried: int = 0
    failed: int = 0
    unknown_ids: int = 0
    unknown_sections: int = 0
    lines_without_facts: int = 0
    prompts: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def group_by_person(facts: Iterable[Fact]) -> dict[str, list[Fact]]:
    """person (first spelling seen) -> their facts in input order; names compared case-blind."""
    spelling: dict[str, str] = {}
    out: dict[str, list[Fact]] = {}
    for f in facts:
        for p in dict.fromkeys(" ".join(x.split()) for x in f.persons if x.strip()):
            name = spelling.setdefault(p.casefold(), p)
            out.setdefault(name, []).append(f)
    return out


def render_facts(facts: Sequence[Fact]) -> str:
    """``[fact id] (date) sentence`` per fact."""
    return "\n".join(f"[{f.fact_id}]" + (f" ({f.date})" if f.date else "") + f" {f.text}" for f in facts)


def render_profile(sections: Sequence[ProfileSection]) -> str:
    """A profile as the update prompt shows it: ``section:`` then ``- line [fact ids]``."""
    out = []
    for s in sections:
        out.append(f"{s.section}:")
        out += [f"- {ln.text} [{', '.join(ln.fact_ids)}]" for ln in s.lines]
    return "\n".join(out) or "(empty)"


def parse_profile(text: str | None, person: str, known: set[str], st: ProfileStats) -> dict[str, ProfileSection] | None:
    """section -> ProfileSection from a reply, or None when malformed."""
    obj = extract_json(text)
    if isinstance(obj, dict) and isinstance(obj.get("sections"), dict):
        obj = obj["sections"]
    if not isinstance(obj, dict):
        return None
    out = {}
    for key, lines in obj.items():
        sec = str(key).strip().lower().replace(" ", "_")
        if sec not in SECTIONS:
            st.unknown_sections += 1
            continue
        if not isinstance(lines, list):
            continue
        kept = []
        for ln in lines:
            if not isinstance(ln, dict) or not isinstance(ln.get("text"), str) or not ln["text"].strip():
                continue
            ids = ln.get("fact_ids", ln.get("facts", ()))
            ids = [ids] if isinstance(ids, str) else (ids if isinstance(ids, list) else [])
            ids = [str(i).strip() for i in ids]
            good = tuple(dict.fromkeys(i for i in ids if i in known))
            st.unknown_ids += len([i for i in ids if i not in known])
            if not good:
                st.lines_without_facts += 1
                continue
            kept.append(ProfileLine(text=" ".join(ln["text"].split())[:MAX_LINE_CHARS], fact_ids=good))
        out[sec] = ProfileSection(person=person, section=sec, lines=tuple(kept))
    return out


def _ask(llm: LLMBackend, convs: list[list[dict]], parse, st: ProfileStats, max_tokens: int, desc: str) -> list:
    """Send ``convs``; re-ask malformed replies once; parsed values (None: still malformed)."""
    if not convs:
        return []
    res = llm.chat(convs, max_tokens=max_tokens, temperature=0.0, json_mode=True, desc=desc,
                   accept=lambda i, t: parse(i, t) is not None)
    st.requests += len(res)
    vals = [parse(i, r.text) if r.error is None else None for i, r in enumerate(res)]
    again = [i for i, v in enumerate(vals) if v is None]
    if again:
        st.retried += len(again)
        follow = [retry_messages(convs[i], res[i].text, max_chars=ECHO_CHARS) for i in again]
        res2 = llm.chat(follow, max_tokens=max_tokens, temperature=0.0, json_mode=True, desc=f"{desc}-retry",
                        accept=lambda j, t: parse(again[j], t) is not None)
        st.requests += len(res2)
        for i, r in zip(again, res2):
            vals[i] = parse(i, r.text) if r.error is None else None
    st.failed += sum(v is None for v in vals)
    return vals


def build_profiles(facts: Sequence[Fact], llm: LLMBackend, prompts: PromptSet | None = None, *,
                   existing: Sequence[ProfileSection] = (), new_fact_ids: Iterable[str] | None = None,
                   min_facts: int = MIN_FACTS, max_tokens: int = 2048) -> tuple[list[ProfileSection], ProfileStats]:
    """Every person's profile sections after this run, and its counts (module docstring).

    ``facts``: all facts of the bank (an update's old and new); ``existing``: the stored sections;
    ``new_fact_ids``: the facts this update added (None: a fresh build, every profile is made anew).
    """
    ps = prompts or PromptSet()
    st = ProfileStats(prompts={"profile": ps.profile.describe(), "profile_update": ps.profile_update.describe()})
    groups = {p: fs for p, fs in group_by_person(facts).items() if len(fs) >= min_facts}
    old: dict[str, list[ProfileSection]] = {}
    for s in existing:
        old.setdefault(s.person.casefold(), []).append(s)
    new_ids = None if new_fact_ids is None else set(new_fact_ids)
    st.persons = len(groups)
    create, update, result = [], [], {}
    for person, fs in groups.items():
        prev = old.get(person.casefold()) if new_ids is not None else None
        if prev:
            fresh = [f for f in fs if f.fact_id in new_ids]
            if fresh:
                update.append((person, fs, prev, fresh))
            else:
                st.unchanged += 1
                result[person] = {s.section: s for s in prev}
        else:
            create.append((person, fs))
    if new_ids is not None:  # profiles of persons no longer in the groups stay as they were
        for key, prev in old.items():
            if not any(p.casefold() == key for p in groups):
                result[prev[0].person] = {s.section: s for s in prev}

    def parser(jobs, idx_facts):
        def parse(i, text):
            person, known = jobs[i][0], {f.fact_id for f in idx_facts(jobs[i])}
            return parse_profile(text, person, known, st)
        return parse

    convs = [ps.profile.messages(person=p, facts=render_facts(fs[-MAX_FACTS:])) for p, fs in create]
    for (person, _), v in zip(create, _ask(llm, convs, parser(create, lambda j: j[1]), st, max_tokens,
                                           "trimem-profile")):
        if v:
            result[person] = v
            st.created += 1
    convs = [ps.profile_update.messages(person=p, profile=render_profile(prev), facts=render_facts(fresh[-MAX_FACTS:]))
             for p, _, prev, fresh in update]
    for (person, _, prev, _), v in zip(update, _ask(llm, convs, parser(update, lambda j: j[1]), st, max_tokens,
                                                     "trimem-profile-update")):
        merged = {s.section: s for s in prev}
        if v:
            changed = {k: s for k, s in v.items() if merged.get(k) != s}
            st.sections_changed += len(changed)
            merged.update(changed)
            st.updated += bool(changed)
        result[person] = merged
    return [result[p][s] for p in sorted(result) for s in SECTIONS if s in result[p] and result[p][s].lines], st
