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
profile is skipped and an updated one kept as it was (``failed``). The calls go through
``llm.structured.ask`` (the reply's schema sent: constrained decoding); a line holding markup or
prompt text is dropped (``lines_refused``), a new profile without any line is refused, and a
prompt too long for the model is sent again with half the facts (``halved``). Every fallback is
counted (an error under ``--strict-llm``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ...store.facts import SECTIONS, Fact, ProfileLine, ProfileSection
from ...llm.base import LLMBackend
from ...llm.grounding import markup
from ...llm.structured import ask, extract_json, fell_back
from .trimem_extract import ECHO_CHARS
from .prompts import PromptSet

MIN_FACTS = 2
"""A person needs this many facts for a profile."""
MAX_FACTS = 400
"""At most this many of a person's facts (the latest) go into one prompt."""
MAX_LINE_CHARS = 500
MIN_SHOWN = 4
"""A prompt too long for the model shows half the facts, down to this many."""
MAX_TOKENS = 2048
"""The profile reply budget (at most half the model's context)."""


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
    lines_refused: int = 0
    """Lines holding markup or prompt text (``llm.grounding.markup``), dropped."""
    halved: int = 0
    """Prompts too long for the model (overflow, or a reply cut at its token limit) sent again
    with half the facts (the latest)."""
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
            if markup(ln["text"]):
                st.lines_refused += 1
                continue
            kept.append(ProfileLine(text=" ".join(ln["text"].split())[:MAX_LINE_CHARS], fact_ids=good))
        out[sec] = ProfileSection(person=person, section=sec, lines=tuple(kept))
    return out


def _ask(llm: LLMBackend, prompt, conv_of, jobs: list, shown: list[int], parse, st: ProfileStats, max_tokens: int,
         desc: str, need_lines: bool) -> list:
    """Send one structured call per job (``conv_of(job, n)``: its conversation showing its latest
    ``n`` facts); a malformed reply is re-asked once, a prompt too long for the model is sent again
    with half the facts (down to ``MIN_SHOWN``). Parsed values (None: still malformed, refused,
    or failed; counted as fallbacks). ``need_lines``: a reply without any line is refused."""
    vals: list = [None] * len(jobs)
    todo, failed = list(range(len(jobs))), []
    while todo:
        convs = [conv_of(jobs[k], shown[k]) for k in todo]
        outs = ask(llm, prompt, convs, lambda i, t, ks=tuple(todo): parse(ks[i], t), desc=desc, max_tokens=max_tokens,
                   check=(lambda i, v: None if any(sec.lines for sec in v.values())
                          else "degenerate: no line cites a fact of the person") if need_lines else None,
                   echo_chars=ECHO_CHARS)
        nxt = []
        for k, o in zip(todo, outs):
            st.requests += o.asked
            st.retried += o.asked > 1
            if o.ok:
                vals[k] = o.value
            elif o.too_long and shown[k] >= 2 * MIN_SHOWN:
                shown[k] //= 2
                st.halved += 1
                nxt.append(k)
            else:
                failed.append(o)
        todo = nxt
    st.failed += len(failed)
    fell_back(llm, desc, failed, "profile")
    return vals


def _shown(llm, prompt, max_tokens: int) -> tuple[int, int]:
    """``(facts shown at most, reply budget)`` sized from the model's context (when known)."""
    from ...llm.endpoint import estimate_tokens

    ctx = getattr(llm, "context_tokens", None)
    if not ctx:
        return MAX_FACTS, max_tokens
    max_tokens = max(256, min(max_tokens, ctx // 2))
    room = ctx - max_tokens - estimate_tokens([{"content": prompt.template}]) - 64
    return max(MIN_SHOWN, min(MAX_FACTS, room // 40)), max_tokens  # a fact line: about 40 tokens


def build_profiles(facts: Sequence[Fact], llm: LLMBackend, prompts: PromptSet | None = None, *,
                   existing: Sequence[ProfileSection] = (), new_fact_ids: Iterable[str] | None = None,
                   min_facts: int = MIN_FACTS, max_tokens: int = MAX_TOKENS) -> tuple[list[ProfileSection], ProfileStats]:
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

    most, max_tokens = _shown(llm, ps.profile, max_tokens)
    got = _ask(llm, ps.profile, lambda j, n: ps.profile.messages(person=j[0], facts=render_facts(j[1][-n:])), create,
               [most] * len(create), parser(create, lambda j: j[1]), st, max_tokens, "trimem-profile", True)
    for (person, _), v in zip(create, got):
        if v:
            result[person] = v
            st.created += 1
    got = _ask(llm, ps.profile_update, lambda j, n: ps.profile_update.messages(
        person=j[0], profile=render_profile(j[2]), facts=render_facts(j[3][-n:])), update, [most] * len(update),
        parser(update, lambda j: j[1]), st, max_tokens, "trimem-profile-update", False)
    for (person, _, prev, _), v in zip(update, got):
        merged = {s.section: s for s in prev}
        if v:
            changed = {k: s for k, s in v.items() if merged.get(k) != s}
            st.sections_changed += len(changed)
            merged.update(changed)
            st.updated += bool(changed)
        result[person] = merged
    return [result[p][s] for p in sorted(result) for s in SECTIONS if s in result[p] and result[p][s].lines], st
