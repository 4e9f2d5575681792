"""TriMem's retrieval (``--method trimem``): facts top-K by dense, BM25 and symbolic matching,
then the source turns of those facts and the profiles of the persons involved.

For each search of the plan (``trimem.plan``; the question alone without an LLM) every fact is
ranked by cosine to the search's vector and by BM25 over its sentence, persons, keywords and
entities; the ranks are fused by reciprocal rank (k = 60) over all searches, and two symbolic
matches add one first-rank share each: a person of the plan (or, without a plan, a known person
named in the question) among the fact's persons, and a year / month of the plan's time
expression (or the question's) equal to the fact's date. The K best facts (K = 25, the paper's
best) are kept. Their source turns are recovered, and the profile sections of the persons
involved (the plan's persons that have a profile, else those of the three best facts), at most
``max_sections``, the ones sharing most words with the searches first.

The workspace shows three blocks, every item with its id::

    # Facts
    [F:3:0] (2031-05-02) Ana adopted a grey cat named Pixel. <- D3:4
    # Dialogue
    [D3:4] (2 May 2031) Ana: ...
    # Profiles
    [P:Ana:interests] Ana, interests: likes cats [F:3:0]; paints [F:1:2]

Under a token budget T the items are taken in priority order, each fact followed by its source
turns not yet shown and the profile sections after the first ``profile_after`` facts; an item
that does not fit is skipped and the rest goes on (the baselines' ``fill="skip"``), and the
rendered text (counted with ``cl100k_base`` like every workspace) is checked against T.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..data.types import Turn
from ..facts.schema import Fact, ProfileSection
from ..select.lexical import BM25Index, tokenize
from ..tokens import count_tokens
from ..workspace import clean, one_line, unit_line
from .plan import QueryPlan
from .prompts import SECTIONS

TOP_K = 25
"""Facts retrieved per question (the paper's best)."""
K_RRF = 60
MAX_SECTIONS = 4
PROFILE_AFTER = 3
_YEAR = re.compile(r"\b(19\d{2}|20\d{2})\b")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_MONTH = re.compile(r"\b(" + "|".join(m for m in _MONTHS) + r"|" + "|".join(m[:3] for m in _MONTHS) + r")\b", re.I)


def profile_id(s: ProfileSection) -> str:
    """A profile section's unit id, ``P:<person>:<section>``."""
    return f"P:{s.person}:{s.section}"


def fact_line(f: Fact) -> str:
    date = f" ({f.date})" if f.date else ""
    return f"[{one_line(f.fact_id)}]{date} {clean(f.text)} <- {', '.join(map(one_line, f.source_turns))}"


def profile_line(s: ProfileSection) -> str:
    body = "; ".join(f"{clean(ln.text)} [{', '.join(ln.fact_ids)}]" for ln in s.lines)
    return f"[{one_line(profile_id(s))}] {one_line(s.person)}, {s.section.replace('_', ' ')}: {body}"


HEADERS = {"fact": "# Facts", "turn": "# Dialogue", "profile": "# Profiles"}


@dataclass
class TriMemIndex:
    """One bank's facts, turns and profiles, with the query-independent parts of the retrieval."""

    facts: list[Fact]
    fact_vecs: np.ndarray
    """[F, d] float32, L2-normalized (the facts' vectors, same encoder as the queries)."""
    turns: list[Turn]
    profiles: list[ProfileSection]
    bm25: Optional[BM25Index] = None
    turn_pos: dict = field(default_factory=dict)
    persons: dict = field(default_factory=dict)
    """casefolded name (and first name) -> fact indices."""

    @classmethod
    def of(cls, facts: Sequence[Fact], fact_vecs: np.ndarray, turns: Sequence[Turn],
           profiles: Sequence[ProfileSection] = ()) -> "TriMemIndex":
        facts = list(facts)
        vecs = np.asarray(fact_vecs, dtype=np.float32).reshape(len(facts), -1) if facts else np.zeros((0, 1), np.float32)
        texts = [" ".join([f.text, *f.persons, *f.keywords, *f.entities, *f.locations]) for f in facts]
        persons: dict[str, set[int]] = {}
        for i, f in enumerate(facts):
            for p in f.persons:
                for key in {p.casefold(), p.split()[0].casefold()} if p.split() else ():
                    persons.setdefault(key, set()).add(i)
        return cls(facts, vecs, list(turns), list(profiles), BM25Index(texts) if facts else None,
                   {t.turn_id: i for i, t in enumerate(turns)}, persons)


@dataclass
class TriMemWorkspace:
    """What ``--method trimem`` shows for one question."""

    fact_ids: list[str]
    turn_ids: list[str]
    profile_ids: list[str]
    text: str
    n_tokens: int
    plan: QueryPlan

    @property
    def unit_ids(self) -> list[str]:
        """Every id shown: facts, turns, profile sections."""
        return self.fact_ids + self.turn_ids + self.profile_ids

    def mix(self) -> dict:
        return {"facts": len(self.fact_ids), "turns": len(self.turn_ids), "profiles": len(self.profile_ids)}


def _rank_share(scores: np.ndarray, positive_only: bool) -> np.ndarray:
    """1 / (K_RRF + rank) for every item (rank from 1, ties to the lower index); 0 where the score
    is not positive when ``positive_only`` (BM25: no shared term, no share)."""
    order = np.lexsort((np.arange(len(scores)), -scores))
    share = np.empty(len(scores))
    share[order] = 1.0 / (K_RRF + 1.0 + np.arange(len(scores)))
    if positive_only:
        share[scores <= 0] = 0.0
    return share


def _time_keys(text: Optional[str]) -> tuple[set[str], set[int]]:
    """Years and month numbers named in ``text``."""
    if not text:
        return set(), set()
    years = set(_YEAR.findall(text))
    months = set()
    for m in _MONTH.findall(text):
        low = m.lower()
        if low == "may" and not years:  # the modal verb: only with a year beside it
            continue
        months.add(next(i + 1 for i, name in enumerate(_MONTHS) if name.startswith(low[:3])))
    return years, months


def symbolic_matches(idx: TriMemIndex, plan: QueryPlan) -> tuple[np.ndarray, np.ndarray]:
    """``(person, time)`` [F] 0/1 matches of every fact (module docstring)."""
    F = len(idx.facts)
    person, time = np.zeros(F), np.zeros(F)
    names = [p.casefold() for p in plan.persons] if plan.persons else \
        [w.casefold() for w in re.findall(r"\b[A-Z][\w'-]+", plan.question) if w.casefold() in idx.persons]
    for n in names:
        for key in {n, n.split()[0]} if n.split() else ():
            for i in idx.persons.get(key, ()):
                person[i] = 1.0
    years, months = _time_keys(plan.time or plan.question)
    if years or months:
        for i, f in enumerate(idx.facts):
            d = f.date or ""
            y_ok = not years or d[:4] in years
            m_ok = not months or (len(d) >= 7 and d[5:7].isdigit() and int(d[5:7]) in months)
            time[i] = float(bool(d) and y_ok and m_ok)
    return person, time


def rank_facts(idx: TriMemIndex, plan: QueryPlan, query_vecs: np.ndarray, k: int = TOP_K) -> list[int]:
    """Indices of the ``k`` best facts for ``plan`` (its searches' vectors ``query_vecs``, [Q, d])."""
    F = len(idx.facts)
    if F == 0:
        return []
    Z = np.asarray(query_vecs, dtype=np.float64).reshape(len(plan.queries), -1)
    fused = np.zeros(F)
    V = idx.fact_vecs.astype(np.float64)
    for q, z in zip(plan.queries, Z):
        fused += _rank_share(V @ z, False)
        extra = " ".join([q, *plan.keywords, *plan.entities]) if q == plan.question else q
        fused += _rank_share(idx.bm25.scores(extra), True)
    person, time = symbolic_matches(idx, plan)
    fused += (person + time) / (K_RRF + 1.0)
    order = np.lexsort((np.arange(F), -fused))
    return [int(i) for i in order[:k]]


def involved_sections(idx: TriMemIndex, plan: QueryPlan, top: Sequence[int], max_sections: int = MAX_SECTIONS
                      ) -> list[ProfileSection]:
    """The profile sections shown: those of the persons involved, the most relevant first."""
    if not idx.profiles or max_sections <= 0:
        return []
    have = {s.person.casefold() for s in idx.profiles}
    first = {s.person.split()[0].casefold(): s.person.casefold() for s in idx.profiles if s.person.split()}
    wanted = [first.get(p.casefold(), p.casefold()) for p in plan.persons]
    wanted = [p for p in wanted if p in have]
    if not wanted:
        wanted = [p.casefold() for i in top[:PROFILE_AFTER] for p in idx.facts[i].persons if p.casefold() in have]
    wanted = list(dict.fromkeys(wanted))
    words = set()
    for q in plan.queries:
        words |= set(tokenize(q))
    words |= {w for x in (*plan.keywords, *plan.entities) for w in tokenize(x)}
    cand = [s for s in idx.profiles if s.person.casefold() in wanted]

    def key(s):
        body = set(tokenize(" ".join(ln.text for ln in s.lines)))
        return (-len(words & body), wanted.index(s.person.casefold()), SECTIONS.index(s.section))

    return sorted(cand, key=key)[:max_sections]


def render(items: list[tuple[str, str, str]]) -> str:
    """The three blocks (facts, dialogue, profiles) of ``(kind, id, line)`` items; turns in source
    order is the caller's business."""
    out = []
    for kind in ("fact", "turn", "profile"):
        lines = [ln for k, _, ln in items if k == kind]
        if lines:
            out.append(HEADERS[kind] + "\n" + "\n".join(lines))
    return "\n\n".join(out) + ("\n" if out else "")


def retrieve(idx: TriMemIndex, plan: QueryPlan, query_vecs: np.ndarray, *, k: int = TOP_K,
             token_budget: Optional[int] = None, max_sections: int = MAX_SECTIONS,
             profile_after: int = PROFILE_AFTER) -> TriMemWorkspace:
    """The workspace of one question (module docstring)."""
    top = rank_facts(idx, plan, query_vecs, k)
    sections = involved_sections(idx, plan, top, max_sections)
    queue: list[tuple[str, str, str]] = []
    shown_turns: set[str] = set()
    for r, i in enumerate(top):
        if r == profile_after:
            queue += [("profile", profile_id(s), profile_line(s)) for s in sections]
        f = idx.facts[i]
        queue.append(("fact", f.fact_id, fact_line(f)))
        for tid in f.source_turns:
            if tid in idx.turn_pos and tid not in shown_turns:
                shown_turns.add(tid)
                queue.append(("turn", tid, unit_line(idx.turns[idx.turn_pos[tid]], False)))
    if len(top) <= profile_after:
        queue += [("profile", profile_id(s), profile_line(s)) for s in sections]
    def arrange(items):  # facts by rank, turns in source order, profiles by relevance
        return sorted(items, key=lambda x: (("fact", "turn", "profile").index(x[0]),
                                            idx.turn_pos[x[1]] if x[0] == "turn" else 0))

    ordered = arrange(queue if token_budget is None else _fill(queue, int(token_budget), arrange))
    text = render(ordered)
    return TriMemWorkspace([x[1] for x in ordered if x[0] == "fact"], [x[1] for x in ordered if x[0] == "turn"],
                           [x[1] for x in ordered if x[0] == "profile"], text, count_tokens(text) if text else 0, plan)


def _fill(queue: list[tuple[str, str, str]], budget: int, arrange) -> list[tuple[str, str, str]]:
    """Items of ``queue`` in order while they fit ``budget`` tokens of rendered text (a block's
    header paid with its first item; an item that overflows is skipped); ``arrange`` puts items
    in their rendered order for the final check on the text."""
    room, taken, opened = budget, [], set()
    for item in queue:
        kind, _, line = item
        c = count_tokens(line + "\n") + (0 if kind in opened else count_tokens(HEADERS[kind] + "\n\n"))
        if c <= room:
            taken.append(item)
            room -= c
            opened.add(kind)
    while taken and count_tokens(render(arrange(taken))) > budget:  # token merges across lines: settle on the text
        taken.pop()
    return taken
