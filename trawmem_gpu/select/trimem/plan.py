"""TriMem's query planning: the key-information step and the target-query step, and the
follow-up step of planned TrawMem (``eval.planned``).

For each question, two structured LLM calls (batched over all questions): the key information
(keywords, persons, time expression, location, entities) and one to three focused search
queries. The original question is always the first query, and at most ``MAX_QUERIES`` are kept.
Every value a reply gives is checked as user input is: a search (or keyword, person, time,
location, entity) that is not a string, or is longer than a question may be
(``data.types.MAX_QUESTION_CHARS``), is left out.
Without an LLM both steps are skipped and the question is the only query; a step whose reply is
still malformed after one retry, or whose request failed, falls back the same way for that
question (``QueryPlan.fallback`` says which step fell back). ``key_info=False`` skips the first
step (a caller that reads only the searches: planned TrawMem).

The follow-up step (:func:`follow_up_queries`) is one more structured call per question, given
the question and the text of the workspace found so far: at most ``MAX_FOLLOW_UPS`` searches for
evidence the workspace still lacks (none is a valid answer), searches already made left out;
a reply still malformed after one retry, or a failed request, gives None (no follow-up).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ...data.types import MAX_QUESTION_CHARS
from ...llm.base import LLMBackend
from ...llm.grounding import search_problem
from ...llm.structured import ask, extract_json, fell_back, reason
from ...ingest.layers.prompts import PromptSet

MAX_QUERIES = 3
"""Searches per question, the original question included (the paper: one to three)."""
MAX_FOLLOW_UPS = 2
"""Follow-up searches per question (:func:`follow_up_queries`)."""
MAX_WORKSPACE_CHARS = 12_000
"""Most characters of a workspace's text the follow-up prompt shows (the rest is cut, marked)."""


@dataclass(frozen=True)
class QueryPlan:
    """What TriMem searches for one question."""

    question: str
    queries: tuple[str, ...]
    """The searches, the question first."""
    keywords: tuple[str, ...] = ()
    persons: tuple[str, ...] = ()
    time: Optional[str] = None
    location: Optional[str] = None
    entities: tuple[str, ...] = ()
    planned: bool = False
    """True when both LLM steps answered."""
    fallback: tuple[str, ...] = field(default=())
    """The steps that fell back to the plain question ('key_info', 'target_query'); empty when
    planned or when no LLM was given."""
    fallback_why: tuple[str, ...] = field(default=())
    """Why each step of ``fallback`` fell back (malformed, refused: no search beyond the
    question, failed...), in the same order."""

    def to_dict(self) -> dict:
        return {"queries": list(self.queries), "keywords": list(self.keywords), "persons": list(self.persons),
                "time": self.time, "location": self.location, "entities": list(self.entities),
                "planned": self.planned, "fallback": list(self.fallback), "fallback_why": list(self.fallback_why)}


def plain_plan(question: str) -> QueryPlan:
    """The plan without an LLM: the question is the only query."""
    return QueryPlan(question=question, queries=(question,))


def _fits(v) -> bool:
    """A reply's string value within the question's bounds (``MAX_QUESTION_CHARS``, non-blank)."""
    return isinstance(v, str) and bool(v.strip()) and len(v) <= MAX_QUESTION_CHARS


def _strs(x) -> tuple[str, ...]:
    """The strings of a reply field (a lone string counts as one), whitespace collapsed; values that
    are not strings, or longer than a question may be, are refused (left out)."""
    if isinstance(x, str):
        x = [x]
    if not isinstance(x, (list, tuple)):
        return ()
    return tuple(dict.fromkeys(" ".join(v.split()) for v in x if _fits(v)))


def _opt(x) -> Optional[str]:
    if isinstance(x, list):
        x = next((v for v in x if _fits(v)), None)
    if not _fits(x) or x.strip().lower() in ("null", "none", "n/a"):
        return None
    return " ".join(x.split())


def check_plans(plans: Sequence[QueryPlan], questions: Sequence[str]) -> list[QueryPlan]:
    """Plans given by a caller, one per question, each with its question first and every search a
    string within the question's bounds (``MAX_QUESTION_CHARS``); ``ConfigError`` naming the plan."""
    from ...errors import ConfigError

    plans = list(plans)
    if len(plans) != len(questions):
        raise ConfigError(f"{len(questions)} items but {len(plans)} `plans`")
    for i, (p, q) in enumerate(zip(plans, questions)):
        if not p.queries or p.queries[0] != q:
            raise ConfigError(f"`plans`[{i}]: the first search must be the item's question")
        bad = next((k for k, s in enumerate(p.queries) if not isinstance(s, str) or not s.strip()
                    or len(s) > MAX_QUESTION_CHARS), None)
        if bad is not None:
            s = p.queries[bad]
            what = f"{len(s)} characters" if isinstance(s, str) and s.strip() else "blank or not a string"
            raise ConfigError(f"`plans`[{i}]: search {bad} is {what}; a search is a non-blank string of at "
                              f"most {MAX_QUESTION_CHARS} characters, as a question is")
    return plans


def parse_key_info(text: Optional[str]) -> Optional[dict]:
    """``{"keywords", "persons", "time", "location", "entities"}`` from a reply, or None."""
    obj = extract_json(text)
    if not isinstance(obj, dict) or not any(k in obj for k in ("keywords", "persons", "entities",
                                                                "time_expression", "location")):
        return None
    return {"keywords": _strs(obj.get("keywords")), "persons": _strs(obj.get("persons")),
            "time": _opt(obj.get("time_expression", obj.get("time"))), "location": _opt(obj.get("location")),
            "entities": _strs(obj.get("entities"))}


def _query_list(text: Optional[str]) -> Optional[tuple[str, ...]]:
    """The searches a reply lists (``{"queries": [...]}`` or a bare list), whitespace collapsed and
    deduplicated; None when malformed."""
    obj = extract_json(text)
    if isinstance(obj, dict):
        obj = obj.get("queries", obj.get("search_queries"))
    if not isinstance(obj, list):
        return None
    return _strs(obj)


def parse_queries(text: Optional[str], question: str) -> Optional[tuple[str, ...]]:
    """The searches of a reply, the question first, at most ``MAX_QUERIES``; None when malformed."""
    got = _query_list(text)
    if got is None:
        return None
    qs = [question] + [q for q in got if q.casefold() != question.casefold()]
    return tuple(qs[:MAX_QUERIES])


def parse_follow_ups(text: Optional[str], asked: Sequence[str]) -> Optional[tuple[str, ...]]:
    """The follow-up searches of a reply, those in ``asked`` (casefolded) left out, at most
    ``MAX_FOLLOW_UPS`` (an empty tuple: nothing is missing); None when malformed."""
    got = _query_list(text)
    if got is None:
        return None
    seen = {a.casefold() for a in asked}
    return tuple(q for q in got if q.casefold() not in seen)[:MAX_FOLLOW_UPS]


def good_searches(searches: Sequence[str]) -> tuple[str, ...]:
    """The searches that are questions for the memory (``llm.grounding.search_problem``)."""
    return tuple(q for q in searches if search_problem(q) is None)


def _plan_problem(searches: tuple[str, ...]) -> Optional[str]:
    """Why a target-query reply is refused: no search beyond the question (after the checks)."""
    return None if len(searches) > 1 else "degenerate: no search beyond the question"


def _follow_problem(text: str, named: tuple[str, ...], got: tuple[str, ...]) -> Optional[str]:
    """Why a follow-up reply is refused: the new searches it ``named`` are no questions (``got``:
    those that are), or it has other fields beside an empty list of searches (a reply that copied
    the format, not an answer)."""
    obj = extract_json(text)
    if named and not got:
        return "degenerate: its searches are no questions for the memory"
    if not got and isinstance(obj, dict) and set(obj) - {"queries", "search_queries"}:
        return f"degenerate: no searches, other fields ({', '.join(sorted(map(str, obj))[:4])})"
    return None


def _structured(llm: LLMBackend, prompt, convs: list, parse, desc: str, max_tokens: int, check=None) -> list:
    """Values of one structured step (None where it falls back: counted, an error under --strict-llm)."""
    outs = ask(llm, prompt, convs, parse, desc=desc, max_tokens=max_tokens, check=check)
    fell_back(llm, desc, outs, "plan")
    return [(o.value if o.ok else None, reason(o)) for o in outs]


def plan_queries(questions: Sequence[str], llm: Optional[LLMBackend], prompts: PromptSet | None = None, *,
                 max_tokens: int = 256, key_info: bool = True) -> list[QueryPlan]:
    """One plan per question (module docstring); ``llm`` None gives the plain plans. A failure of
    the LLM layer itself (an unreachable server after its retries) also falls back, per step.
    ``key_info=False``: the target-query step only (no keywords, persons, time or location).
    A step's searches must be questions for the memory (``llm.grounding.search_problem``; the
    others are left out), and a target-query step left with none beyond the question is refused
    (degenerate) and falls back like a malformed one."""
    if llm is None or not questions:
        return [plain_plan(q) for q in questions]
    from ...errors import LLMFallbackError, TrawmemError

    ps = prompts or PromptSet()
    qs = list(questions)
    keys: list = [({}, None)] * len(qs)
    try:
        if key_info:
            keys = _structured(llm, ps.key_info, [ps.key_info.messages(question=q) for q in qs],
                               lambda i, t: parse_key_info(t), "trimem-key-info", max_tokens,
                               check=lambda i, v: None if any(v.values()) else "degenerate: no key information")
    except LLMFallbackError:
        raise
    except TrawmemError as e:
        keys = [(None, f"failed: {e}")] * len(qs)

    def searches_of(i, t):
        got = parse_queries(t, qs[i])
        return None if got is None else (qs[i],) + good_searches(got[1:])

    try:
        searches = _structured(llm, ps.target_query, [ps.target_query.messages(question=q) for q in qs], searches_of,
                               "trimem-target-query", max_tokens, check=lambda i, v: _plan_problem(v))
    except LLMFallbackError:
        raise
    except TrawmemError as e:
        searches = [(None, f"failed: {e}")] * len(qs)
    out = []
    for q, (k, kwhy), (s, swhy) in zip(qs, keys, searches):
        fb = tuple((n, w) for n, v, w in (("key_info", k, kwhy), ("target_query", s, swhy)) if v is None)
        out.append(QueryPlan(question=q, queries=s or (q,), planned=not fb, fallback=tuple(n for n, _ in fb),
                             fallback_why=tuple(w or "" for _, w in fb), **(k or {})))
    return out


def follow_up_queries(questions: Sequence[str], workspaces: Sequence[str], asked: Sequence[Sequence[str]],
                      llm: LLMBackend, prompts: PromptSet | None = None, *,
                      max_tokens: int = 256) -> list[Optional[tuple[str, ...]]]:
    """The follow-up searches of each question (module docstring): ``workspaces`` the text of each
    question's workspace so far, ``asked`` the searches already made; None where the step fell
    back (malformed after one retry, refused: searches that are no questions or a reply that
    copied the format, or the request failed)."""
    if not questions:
        return []
    from ...errors import LLMFallbackError, TrawmemError

    ps = prompts or PromptSet()
    cut = "\n[... the rest of the workspace is left out]"
    texts = [w if len(w) <= MAX_WORKSPACE_CHARS else w[:MAX_WORKSPACE_CHARS] + cut for w in workspaces]
    convs = [ps.follow_up.messages(question=q, workspace=w.strip() or "(nothing found)")
             for q, w in zip(questions, texts)]
    raw: dict[int, tuple] = {}

    def read(i, t):
        named = parse_follow_ups(t, asked[i])
        if named is None:
            return None
        raw[i] = (t, named)
        return good_searches(named)

    try:
        vals = _structured(llm, ps.follow_up, convs, read, "trawmem-follow-up", max_tokens,
                           check=lambda i, v: _follow_problem(*raw.get(i, ("", ())), v))
    except LLMFallbackError:
        raise
    except TrawmemError:
        return [None] * len(questions)
    return [v for v, _ in vals]
