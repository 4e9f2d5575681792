"""TriMem's retrieval (``--method trimem``): facts top-K by dense, BM25 and symbolic matching,
then the source turns of those facts and the profiles of the persons involved.

For each search of the plan (``select.trimem.plan``; the question alone without an LLM) every fact is
ranked by cosine to the search's vector and by BM25 over its sentence, persons, keywords and
entities; the ranks are fused by reciprocal rank (k = 60) over all searches, and two symbolic
matches add one first-rank share each: a person of the plan (or, without a plan, a known person
named in the question) among the fact's persons, and a year / month of the plan's time
expression (or the question's) equal to the fact's date. The K best facts (K = 25, the paper's
best) are kept. Their source turns are recovered, and the profile sections of the persons
involved (the plan's persons that have a profile, else those of the three best facts), at most
``max_sections``, the ones sharing most words with the searches first.

:func:`priority_ids` lists what the workspace shows, in the order a token budget takes it: each
fact followed by its source turns not yet listed, the profile sections after the first
``profile_after`` facts. ``select.trimem.method`` maps the ids to the units of the bank's unit view
(``store.view``), whose workspace shows every fact, turn and section with its id.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ...data.types import Turn
from ...store.facts import SECTIONS, Fact, ProfileSection
from ..lexical import BM25Index, tokenize
from .plan import QueryPlan

TOP_K = 25
"""Facts retrieved per question (the paper's best)."""
K_RRF = 60
MAX_SECTIONS = 4
PROFILE_AFTER = 3
_YEAR = re.compile(r"\b(19\d{2}|20\d{2})\b")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_MONTH = re.compile(r"\b(" + "|".join(m for m in _MONTHS) + r"|" + "|".join(m[:3] for m in _MONTHS) + r")\b", re.I)


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
        vecs = np.asarray(fact_vecs, dtype=np.float32).reshape(len(facts), -1) if facts else \
            np.zeros((0, 1), np.float32)
        texts = [" ".join([f.text, *f.persons, *f.keywords, *f.entities, *f.locations]) for f in facts]
        persons: dict[str, set[int]] = {}
        for i, f in enumerate(facts):
            for p in f.persons:
                for key in {p.casefold(), p.split()[0].casefold()} if p.split() else ():
                    persons.setdefault(key, set()).add(i)
        return cls(facts, vecs, list(turns), list(profiles), BM25Index(texts) if facts else None,
                   {t.turn_id: i for i, t in enumerate(turns)}, persons)


class _SlicedBM25:
    """An index's BM25 (its corpus statistics) read at some of its facts."""

    def __init__(self, full, rows: np.ndarray):
        self.full, self.rows = full, rows

    def scores(self, query: str) -> np.ndarray:
        return self.full.scores(query)[self.rows]


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


def rank_facts(idx: TriMemIndex, plan: QueryPlan, query_vecs: np.ndarray, k: int = TOP_K,
               keep: np.ndarray | None = None) -> list[int]:
    """Indices of the ``k`` best facts for ``plan`` (its searches' vectors ``query_vecs``, [Q, d]);
    ``keep``: a filter's mask over the facts (``select.restrict``): only those are ranked (the ranks
    are among them; BM25 keeps the index's corpus statistics)."""
    if keep is not None:
        keep = np.asarray(keep, dtype=bool)
        sub = np.flatnonzero(keep)
        if not len(sub):
            return []
        part = TriMemIndex([idx.facts[i] for i in sub], idx.fact_vecs[sub], idx.turns, idx.profiles,
                           _SlicedBM25(idx.bm25, sub), idx.turn_pos,
                           {p: {int(np.searchsorted(sub, i)) for i in s if keep[i]} for p, s in idx.persons.items()})
        return [int(sub[i]) for i in rank_facts(part, plan, query_vecs, k)]
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


def priority_ids(idx: TriMemIndex, plan: QueryPlan, query_vecs: np.ndarray, *, k: int = TOP_K,
                 max_sections: int = MAX_SECTIONS, profile_after: int = PROFILE_AFTER,
                 keep: Optional[set] = None) -> list[str]:
    """Fact, turn and profile-section ids to show, in priority order (module docstring); ``keep``:
    the ids a filter passes (None: all), the only facts ranked and sections shown."""
    top = rank_facts(idx, plan, query_vecs, k,
                     None if keep is None else np.array([f.fact_id in keep for f in idx.facts], dtype=bool))
    sections = [s.unit_id for s in involved_sections(idx, plan, top, max_sections + (
        len(idx.profiles) if keep is not None else 0)) if keep is None or s.unit_id in keep][:max_sections]
    out: list[str] = []
    seen: set[str] = set()
    for r, i in enumerate(top):
        if r == profile_after:
            out += sections
        f = idx.facts[i]
        out.append(f.fact_id)
        for tid in f.source_turns:
            if tid in idx.turn_pos and tid not in seen:
                seen.add(tid)
                out.append(tid)
    if len(top) <= profile_after:
        out += sections
    return out
