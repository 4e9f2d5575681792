"""TriMem's fact extraction (``build --facts llm``): overlapping windows of turns, one structured
LLM call per window, the replies checked against the window.

Each window (``window`` turns, 40 by default as the paper finds best, the next one starting
``window - overlap`` turns later) is rendered as ``[turn id] (session date) speaker: text`` lines
and sent with the extraction prompt (``PromptSet.extract``). A reply is read with the tolerant
JSON reader; every entry becomes a :class:`Fact` when it has a sentence and at least one source
turn id of the window. Three things are counted and earn the window one retry, a follow-up
message that shows the model its reply and says what was wrong:

* ``malformed``: no ``{"facts": [...]}`` in the reply (or the request failed);
* ``unknown_ids``: source ids that are not turns of the window (dropped);
* ``empty``: a window with text that gave no fact.

After the retry the better of the two replies is kept (the retry unless it is malformed). The
calls go through ``llm.structured.ask`` (the reply's schema sent: constrained decoding). The
window is sized from the model's context (:func:`fit_window`); a window too long for the model
(its prompt overflowed the context, or its reply stopped at its token limit) is halved and each
half sent, down to ``MIN_WINDOW`` turns (``halved``). A fact is stored only when it cites turns of
its window and those turns support it (``llm.grounding.fact_problem``: no markup or prompt text,
lexical support by the cited turns with their speakers and dates); a refused fact is dropped and
counted (``refused``, ``refusals`` by reason; an error under ``--strict-llm``).

Dates: the model resolves relative dates against the session date (the prompt asks for it) and
gives ``date``; it is normalized to ``YYYY-MM-DD`` / ``YYYY-MM`` / ``YYYY``: a relative date the
model left as it was ("last Friday") is resolved against the session date of the fact's first
source turn (``dateutil.relativedelta``), free absolute forms go through ``data.dates.parse_date``
(python-dateutil); a missing or unreadable one, or one outside ``DATE_YEARS`` ("1000000 days ago"),
becomes that session date (``bad_dates`` counts them). The reply's values are read in
``ingest.layers.trimem_values``.

Every other value is checked as user input is: persons, locations, keywords and entities must be
strings of at most ``MAX_NAME_CHARS`` (a number such as ``5`` or ``1e308`` is refused, not stored as
"5"); each refused one is dropped and counted (``bad_values``).

Facts with the same sentence (case and spacing aside) from overlapping windows are one fact
with the union of their sources. With ``new_from`` (``build --update``) only facts citing a new
turn are kept; the windows start ``overlap`` turns before the first new one, for context.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ...data.types import Turn
from ...errors import ConfigError
from ...store.facts import Fact, fact_id
from ...llm.base import LLMBackend
from ...llm.grounding import fact_problem
from ...llm.prompts import RETRY_JSON
from ...llm.structured import ask, extract_json, fell_back
from .prompts import PromptSet
from .trimem_values import _ids, _session_date, _strings, normalize_date

WINDOW = 40
"""Turns per extraction window (the paper's best; fewer when the model's context is short)."""
MIN_WINDOW = 5
"""A window too long for the model is halved down to this many turns, no further."""
MAX_TOKENS = 2048
"""The extraction reply budget (at most half the model's context)."""
REPLY_TOKENS_PER_TURN = 40
"""Reply tokens a window's facts may take per turn (a window is at most the budget's worth)."""
OVERLAP = 10
"""Turns shared by consecutive windows."""
MAX_TURN_CHARS = 1200
"""Turns longer than this are clipped in the window text."""
MAX_FACT_CHARS = 1000
"""Longer fact sentences are clipped."""
ECHO_CHARS = 8000
"""How much of a reply a retry shows back to the model (extraction and profile replies are long)."""

NO_SOURCE = "cites no turn of its window"
"""Why a fact whose ``source_turns`` name no turn shown is refused."""
MALFORMED = "breaks the fact schema (store.facts)"
"""Why a fact the fact schema refuses (a lone surrogate in its text, say) is refused."""


@dataclass
class ExtractStats:
    """Counts of one extraction run (written into the bank's stats as ``facts_llm``)."""

    windows: int = 0
    requests: int = 0
    retried: int = 0
    malformed: int = 0
    unknown_ids: int = 0
    empty: int = 0
    failed: int = 0
    """Windows still malformed after the retry, or whose request failed (they give no fact)."""
    halved: int = 0
    """Windows too long for the model (the prompt overflowed its context, or the reply stopped at
    its token limit), sent again as two halves."""
    checked: int = 0
    """Facts put to their checks (the denominator of ``refused``)."""
    refused: int = 0
    """Facts refused by their checks (``llm.grounding.fact_problem``: markup, or not supported by
    the turns they cite)."""
    window: int = 0
    """The window the run used (turns), sized from the model's context."""
    dropped_no_source: int = 0
    duplicates: int = 0
    bad_dates: int = 0
    """Dates that could not be read, or fall outside ``DATE_YEARS`` (the session date is used)."""
    bad_values: int = 0
    """Persons, locations, keywords or entities refused (not strings, or too long)."""
    facts: int = 0
    refusals: dict = field(default_factory=dict)
    """Refused facts by reason."""
    prompt: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def windows(n: int, size: int = WINDOW, overlap: int = OVERLAP, start: int = 0) -> list[tuple[int, int]]:
    """``(lo, hi)`` turn ranges covering ``[start, n)`` (the first opens ``overlap`` turns before
    ``start`` when there are any), each ``size`` long but the last, each the previous plus
    ``size - overlap``."""
    if size < 1:
        raise ConfigError(f"`window` must be >= 1, got {size}")
    if not 0 <= overlap < size:
        raise ConfigError(f"`overlap` must be in [0, `window`), got {overlap}")
    if start >= n:
        return []
    lo = max(0, start - overlap) if start else 0
    out = []
    while True:
        hi = min(n, lo + size)
        out.append((lo, hi))
        if hi >= n:
            return out
        lo = hi - overlap


def render_window(turns: Sequence[Turn]) -> str:
    """``[turn id] (session date) speaker: text`` per turn (image captions as the text shows them)."""
    lines = []
    for t in turns:
        text = " ".join(t.text.split())
        if t.caption:
            text += f" [shares an image: {' '.join(t.caption.split())}]"
        if len(text) > MAX_TURN_CHARS:
            text = text[:MAX_TURN_CHARS - 1] + "…"
        lines.append(f"[{t.turn_id}] ({t.timestamp}) {t.speaker}: {text}")
    return "\n".join(lines)



@dataclass
class _Parsed:
    entries: list[dict]
    malformed: bool = False
    unknown: int = 0


def parse_reply(text: str | None, window_ids: set[str]) -> _Parsed:
    """The usable entries of a reply (``text`` and known ``source_turns`` kept), how many source
    ids were unknown, and whether the reply was malformed."""
    obj = extract_json(text)
    if isinstance(obj, dict):
        obj = obj.get("facts", obj.get("memories", obj.get("entries")))
    if not isinstance(obj, list):
        return _Parsed([], malformed=True)
    out, unknown = [], 0
    for e in obj:
        if not isinstance(e, dict) or not isinstance(e.get("text"), str) or not e["text"].strip():
            continue
        src = _ids(e.get("source_turns", e.get("source", e.get("src"))))
        known = tuple(s for s in src if s in window_ids)
        unknown += len(src) - len(known)
        out.append({**e, "source_turns": known})
    return _Parsed(out, unknown=unknown)


def _retry_message(p: _Parsed) -> str:
    if p.malformed:
        return RETRY_JSON
    if p.unknown:
        return ("Some source_turns are not ids of the turns shown. Use only the bracketed ids of this "
                "window. Reply again with the JSON object only.")
    return ("You returned no facts, but the window has turns with content. Extract its facts. Reply "
            "again with the JSON object only.")


def _needs_retry(p: _Parsed, has_text: bool) -> bool:
    return p.malformed or p.unknown > 0 or (has_text and not any(e["source_turns"] for e in p.entries))


def _norm_key(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


def _next_numbers(existing: Iterable[Fact]) -> dict[str, int]:
    """Per session, the next free n of ``F:<session>:<n>`` ids."""
    nxt: dict[str, int] = {}
    for f in existing:
        parts = f.fact_id.split(":")
        if len(parts) >= 3 and parts[0] == "F" and parts[-1].isdigit():
            s = ":".join(parts[1:-1])
            nxt[s] = max(nxt.get(s, 0), int(parts[-1]) + 1)
    return nxt


def fit_window(turns: Sequence[Turn], llm, prompt, window: int, max_tokens: int) -> tuple[int, int]:
    """``(window, max_tokens)`` sized from the model's context (``llm.context_tokens``, when
    known): the reply budget at most half the context, the window at most what fits beside it
    (the turns' mean rendered size, on the safe side) and at most ``max_tokens //
    REPLY_TOKENS_PER_TURN`` turns (the facts of a window must fit in the reply)."""
    from ...llm.endpoint import estimate_tokens

    ctx = getattr(llm, "context_tokens", None)
    window = min(window, max(MIN_WINDOW, max_tokens // REPLY_TOKENS_PER_TURN))
    if not ctx or not turns:
        return window, max_tokens
    max_tokens = max(256, min(max_tokens, ctx // 2))
    sample = list(turns[:200])
    per_turn = estimate_tokens([{"content": render_window(sample)}]) / len(sample)
    room = ctx - max_tokens - estimate_tokens([{"content": prompt.template}]) - 64
    fits = max(MIN_WINDOW, min(int(room // max(per_turn, 1.0)), max_tokens // REPLY_TOKENS_PER_TURN))
    return min(window, fits), max_tokens


def _halves(lo: int, hi: int, overlap: int) -> list[tuple[int, int]]:
    """A window's two halves, sharing up to a quarter of it (facts across the cut are kept)."""
    mid = (lo + hi) // 2
    share = min(overlap, (hi - lo) // 4)
    return [(lo, min(hi, mid + share)), (mid, hi)]


def extract_facts(turns: Sequence[Turn], llm: LLMBackend, prompts: PromptSet | None = None, *,
                  window: int = WINDOW, overlap: int = OVERLAP, new_from: int = 0, existing: Sequence[Fact] = (),
                  max_tokens: int = MAX_TOKENS) -> tuple[list[Fact], ExtractStats]:
    """Facts of ``turns[new_from:]`` (all turns by default) and the run's counts; see the module
    docstring. ``existing`` facts (an update's) reserve their ids and sentences. The window (and
    the reply budget) are sized from the model's context (:func:`fit_window`); a window whose
    prompt overflows the context or whose reply stops at its token limit is halved and each half
    sent, down to ``MIN_WINDOW`` turns (``halved`` counts them)."""
    ps = prompts or PromptSet()
    st = ExtractStats(prompt=ps.extract.describe())
    win, max_tokens = fit_window(turns, llm, ps.extract, window, max_tokens)
    st.window = win
    spans = windows(len(turns), win, max(0, min(overlap, win - 1)), new_from)
    st.windows = len(spans)
    parsed: list[_Parsed] = []
    failed = []
    while spans:
        convs, ids, has_text = [], [], []
        for lo, hi in spans:
            w = turns[lo:hi]
            convs.append(ps.extract.messages(window=render_window(w)))
            ids.append({t.turn_id for t in w})
            has_text.append(any((t.text or t.caption or "").strip() for t in w))

        def read(i, text):
            p = parse_reply(text, ids[i])
            return None if p.malformed else p

        outs = ask(llm, ps.extract, convs, read, desc="trimem-extract", max_tokens=max_tokens,
                   again=lambda i, p: _retry_message(p) if _needs_retry(p, has_text[i]) else None,
                   echo_chars=ECHO_CHARS)
        nxt = []
        for (lo, hi), o, h in zip(spans, outs, has_text):
            st.requests += o.asked
            st.retried += o.asked > 1
            st.malformed += o.first == "malformed"
            if not o.ok and o.too_long and hi - lo >= 2 * MIN_WINDOW:
                st.halved += 1
                nxt += _halves(lo, hi, overlap)
                continue
            if o.first_value is not None:  # counted on the first reply, as the retry it earns
                st.unknown_ids += o.first_value.unknown
                st.empty += (h and not any(e["source_turns"] for e in o.first_value.entries))
            if o.status in ("ok", "refused"):
                parsed.append(o.value)
            else:
                failed.append(o)
        spans = nxt
    st.failed = len(failed)
    fell_back(llm, "trimem-extract", failed, "window")
    facts = _facts_from(turns, parsed, new_from, existing, st, ps.extract.template)
    if st.checked:
        llm.usage.note("trimem-fact", checked=st.checked, refused=st.refused)
    if st.refused:
        fell_back(llm, "trimem-fact", [("refused", why) for why, n in st.refusals.items() for _ in range(n)], "fact")
    return facts, st


def cited_texts(turns: Sequence[Turn]) -> list[str]:
    """What a fact citing ``turns`` may draw on: each turn's speaker, session date and text."""
    return [f"{t.speaker} {t.timestamp} {t.text} {t.caption or ''}" for t in turns]


def _facts_from(turns: Sequence[Turn], parsed: list[_Parsed], new_from: int, existing: Sequence[Fact],
                st: ExtractStats, prompt_text: str = "") -> list[Fact]:
    pos = {t.turn_id: i for i, t in enumerate(turns)}
    nxt = _next_numbers(existing)
    seen = {_norm_key(f.text) for f in existing}
    order: list[str] = []
    merged: dict[str, dict] = {}
    for p in parsed:
        for e in p.entries:
            src = sorted(set(e["source_turns"]), key=pos.__getitem__)
            if not src:  # refused like any ungrounded fact (a small model cites the template's "<turn id>")
                st.checked += 1
                st.dropped_no_source += 1
                st.refused += 1
                st.refusals[NO_SOURCE] = st.refusals.get(NO_SOURCE, 0) + 1
                continue
            if new_from and pos[src[-1]] < new_from:
                continue  # about old turns only: the stored facts have it
            text = " ".join(e["text"].split())[:MAX_FACT_CHARS]
            st.checked += 1
            why = fact_problem(text, cited_texts([turns[pos[x]] for x in src]), prompt_text)
            if why:
                st.refused += 1
                st.refusals[why.split(" (")[0]] = st.refusals.get(why.split(" (")[0], 0) + 1
                continue
            key = _norm_key(text)
            if key in seen and key not in merged:
                st.duplicates += 1
                continue
            if key in merged:
                st.duplicates += 1
                m = merged[key]
                m["source_turns"] = sorted(set(m["source_turns"]) | set(src), key=pos.__getitem__)
                continue
            merged[key] = {**e, "text": text, "source_turns": src}
            order.append(key)
    out = []
    for key in order:
        e = merged[key]
        first = turns[pos[e["source_turns"][0]]]
        date = normalize_date(e.get("date"), first.time.date() if first.time else None)
        if date is None:
            st.bad_dates += e.get("date") not in (None, "", "null")
            date = _session_date(first)
        persons = _strings(e.get("persons"), st) or \
            tuple(dict.fromkeys(turns[pos[s]].speaker for s in e["source_turns"]))
        session = str(first.session)
        n = nxt.get(session, 0)
        try:  # the fact schema (``store.facts``): a reply's fact that breaks it is refused, counted
            out.append(Fact(fact_id=fact_id(session, n), text=e["text"], source_turns=tuple(e["source_turns"]),
                            persons=persons, locations=_strings(e.get("locations"), st),
                            keywords=_strings(e.get("keywords"), st), entities=_strings(e.get("entities"), st),
                            date=date, session=session))
            nxt[session] = n + 1
        except ValueError:
            st.refused += 1
            st.refusals[MALFORMED] = st.refusals.get(MALFORMED, 0) + 1
    st.facts = len(out)
    return out
