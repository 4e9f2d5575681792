"""Workspaces: selected units grouped under their thread headings, rendered for the answer model.

Rendered format (what the answer model reads, and what ``context_tokens`` counts)::

    ## 2 March 2024 — Ana: Aww, Pixel is such a cute name! Is Clara still living in Lyon?
    [S1:6] Ben: By the way, my sister Clara just adopted a grey cat named Pixel.
    [S1:8] Ben: She moved to Rotterdam last month for a job at the port authority.

* one ``##`` heading per thread, threads in source order: the date of the thread (a thread
  never crosses a session, so it dates all its units). A heading identical to the one in force
  (the block above's) is not repeated: consecutive threads of one date share one ``## date``
  heading, their blocks still apart by a blank line. That is all a heading shows by default
  (``headings="date"``, ``SelectConfig.headings``): a gist costs tokens that, under a token
  budget, could hold more turns (the comparison: docs/design-notes.md). With
  ``headings="gist"`` it goes on with ``—`` and the thread's gist: for an extractive head its most
  central turn (``speaker: words ...``, clipped), for an LLM head its one-sentence summary; the
  gist is left out when that very turn is among the units shown. The gist tells the threads
  apart, so under ``gist`` a heading is shared only when it is the same line (same date, no gist
  left on either: both threads' quoted turns are shown); the date part alone is not split off
  (``## date`` then ``— gist`` lines would cost more tokens than they save);
* one line per selected unit, in thread order: ``[turn id] speaker: text``, then
  ``[shares an image: caption]`` for a shared image; a fact (a unit view with ``facts``,
  ``store.view``) is ``[F:3:1 from D3:7, D3:8] text`` (its id and the turns it cites, 5 tokens
  fewer than a ``fact:`` speaker and a ``[cites ...]`` tail), a profile section
  ``[P:Ana:career] profile: Ana, career: ...``;
* without headings (``headings="none"``: the baselines) each line carries its own date:
  ``[S1:6] (2 March 2024) Ben: ...``;
* a blank line between thread blocks.

Token budgets (``QueryParams.token_budget``) pay for this text. :func:`token_costs` gives each
unit's and each thread heading's token cost from the same line writers the rendering uses, so
that ``sum_{v in S} unit[v] + sum_{heading runs r that S hits} heading[r]`` bounds what the
rendered workspace of ``S`` costs (a run: consecutive threads of one date, which share one heading
under ``date``; tight: over by 0.03 tokens on average); :func:`fit_to_tokens` checks a
selection against the budget (rendering it where that bound does not settle it).

Texts are shown as the source wrote them except for characters that could mislead the reader
or forge structure: control characters (NUL, ESC, ...), bidirectional embeddings, overrides
and isolates (U+202A-U+202E, U+2066-U+2069) and the BOM are removed; line breaks inside a text
become a newline plus two spaces, so no text can start a line that looks like a heading or
another turn.
"""
from __future__ import annotations

import functools
import itertools
import re
import typing
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..data.types import Turn
from ..store.bank import Bank
from ..store.bursts import unit_members
from ..tokens import TOKENIZER_NAME, count_tokens_cached, count_tokens_many_cached, lines_count_apart
from .text_features import scan_cached

Headings = Literal["date", "gist", "none"]
"""What a workspace shows per thread: a ``## date`` heading (``date``), the heading with the
thread's gist (``gist``), or no heading and a date on every line (``none``)."""
HEADINGS: tuple[str, ...] = typing.get_args(Headings)
DEFAULT_HEADINGS: Headings = "date"
"""The default of ``SelectConfig.headings`` and of every function here."""


def headings_for(method: str, cfg) -> str:
    """How ``method``'s workspaces are rendered: TrawMem under thread headings as its config
    (``cfg``, a ``SelectConfig``) says, every baseline (ranked units, no threads) with ``none``.
    The one home of this rule: selection under a token budget and the rendering both ask it."""
    return cfg.headings if method == "trawmem" else "none"


def _check_headings(headings: str) -> None:
    if headings not in HEADINGS:
        raise ValueError(f"headings must be one of {', '.join(map(repr, HEADINGS))} (got {headings!r})")


_STRIP = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x84\x86-\x9f\u202a-\u202e\u2066-\u2069\ufeff\ufff9-\ufffb]")
_BREAK = re.compile(r"\r\n|[\n\r\x0c\x85\u2028\u2029]")


def clean(text: str) -> str:
    """``text`` safe to render: see the module docstring (removed characters, indented breaks)."""
    return _BREAK.sub("\n  ", _STRIP.sub("", text))


def one_line(text: str) -> str:
    """``clean`` with every line break turned into a space (headings, speakers, ids)."""
    return _BREAK.sub(" ", _STRIP.sub("", text)).strip()


@functools.lru_cache(maxsize=1 << 16)
def date_label(t: Turn) -> str:
    """``2 March 2024`` (the source's own text when it gave no parsable date)."""
    return f"{t.time.day} {t.time:%B %Y}" if t.time else t.timestamp


def heading_line(date: str, gist: str | None) -> str:
    """A thread's heading: ``## <date> — <gist>``, or ``## <date>`` without a gist."""
    return f"## {date} — {one_line(gist)}" if gist else f"## {date}"


@functools.lru_cache(maxsize=1 << 16)  # keyed by the (frozen) turn's value: never stale
def unit_line(t: Turn, with_heads: bool) -> str:
    """One unit's line: ``[id] speaker: text`` under a heading (which carries the date), else
    ``[id] (date) speaker: text``; then the image caption, if any."""
    tid, spk = one_line(t.turn_id), one_line(t.speaker)
    if getattr(t, "layer", "turns") == "facts":  # a fact of a unit view (store.view.LayerUnit), with its sources
        tid += " from " + ", ".join(one_line(c) for c in t.cites)
        return f"[{tid}] {clean(t.text)}" if with_heads else f"[{tid}] ({date_label(t)}) {clean(t.text)}"
    s = f"[{tid}] {spk}: {clean(t.text)}" if with_heads else f"[{tid}] ({date_label(t)}) {spk}: {clean(t.text)}"
    if t.caption:
        s += f" [shares an image: {one_line(t.caption)}]"
    return s


def _extractive_prefix(turns: list[Turn]) -> str:
    """What ``ingest.heads.extractive_head`` writes before the quoted turn(s)."""
    date = turns[0].time.strftime("%d %B %Y") if turns[0].time else turns[0].timestamp
    return f"[{date}] " + " & ".join(dict.fromkeys(t.speaker for t in turns)) + ": "


@dataclass
class ThreadBlock:
    thread: int
    head: str | None
    """The stored head (None: no heading, ``headings="none"``)."""
    units: list[Turn]
    gist: str | None = None
    """What the heading shows after the date (None: the date only)."""


@dataclass
class Workspace:
    bank_id: str
    question: str
    blocks: list[ThreadBlock]
    unit_ids: list[str] = field(default_factory=list)
    """The ids of the messages shown, in source order: each selected unit's own id, or every
    member of a burst (``store.bursts.unit_members``: evidence on any member is shown)."""

    def render(self) -> str:
        """Text for the answer model, in the format of the module docstring (:func:`heading_line`
        and :func:`unit_line` write its lines; :func:`token_costs` counts the same lines)."""
        out, above = [], None
        for b in self.blocks:
            if b.head is not None:
                h = heading_line(date_label(b.units[0]), b.gist)
                if h != above:  # the heading in force already says it
                    out.append(h)
                above = h
            out += [unit_line(t, with_heads=b.head is not None) for t in b.units]
            out.append("")
        text = "\n".join(out).strip()
        return text + "\n" if text else ""  # no unit (none fits the token budget): nothing, not a newline

    @property
    def n_tokens(self) -> int:
        return count_tokens_cached(self.render())

    tokenizer = TOKENIZER_NAME


def thread_gist(head: str, thread_turns: list[Turn], shown: list[Turn]) -> str | None:
    """The heading text after the date. An extractive head loses its ``[date] A & B:`` prefix
    and every quoted turn that is itself shown (None when nothing is left); any other head is
    kept whole, less a leading ``[date]``."""
    prefix = _extractive_prefix(thread_turns)
    if not head.startswith(prefix):
        return head.removeprefix(prefix.split("] ", 1)[0] + "] ").strip() or None
    shown_text = [f"{t.speaker}: {t.text if t.text.strip() else (t.caption or '')}" for t in shown]
    keep = [q for q in head[len(prefix):].split(" | ")
            if not any(s.startswith(q.removesuffix(" ...").strip()) for s in shown_text)]
    return " | ".join(keep).strip() or None


def partial_threads(bank: Bank, keep: np.ndarray | None) -> np.ndarray | None:
    """``[J]`` bool: the threads holding a unit that ``keep`` (a filter's unit mask,
    ``select.restrict``) leaves out, whose head text a workspace hides (it may quote that unit);
    None without a mask."""
    if keep is None:
        return None
    return np.bincount(bank.unit_thread[~np.asarray(keep, dtype=bool)], minlength=bank.n_threads) > 0


def assemble(bank: Bank, question: str, units: list[int], headings: Headings = DEFAULT_HEADINGS,
             keep: np.ndarray | None = None) -> Workspace:
    """Group ``units`` (bank unit indices, any order) by thread, under ``headings`` (:data:`HEADINGS`).

    ``keep``: the unit mask of a filter the units were selected under (``select.restrict``): a
    thread with a failing unit shows its heading without its head (no gist; its ``head`` is
    ``""``), since the head may quote a failing turn."""
    _check_headings(headings)
    with_heads = headings != "none"
    ut = bank.unit_thread
    chosen = sorted(set(int(u) for u in units))
    hidden = partial_threads(bank, keep) if with_heads else None
    blocks: list[ThreadBlock] = []
    for u in chosen:
        j = int(ut[u])
        if not blocks or blocks[-1].thread != j:
            head = bank.heads[j] if with_heads and (hidden is None or not hidden[j]) else ("" if with_heads else None)
            blocks.append(ThreadBlock(j, head, []))
        blocks[-1].units.append(bank.turns[u])
    if headings == "gist":
        for b in blocks:
            b.gist = thread_gist(b.head, [bank.turns[i] for i in bank.thread_units(b.thread)], b.units)
    return Workspace(bank.bank_id, question, blocks, [m for u in chosen for m in unit_members(bank.turns[u])])


# ----------------------------------------------------------------------------------------------
# token costs (token budgets)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenCosts:
    """Additive token costs (``cl100k_base``) of one bank's workspace lines.

    The rendered workspace of a unit set ``S`` costs at most ``sum_{v in S} unit[v] + sum_{r hit
    by S} heading[r]``, ``r`` over the heading runs (``heading_run``) that ``S`` hits: a heading is
    paid once, when the first unit of its run enters. A run is a stretch of consecutive threads
    that all show one and the same heading line (under ``date``: each thread of one date label, the
    same for all); the threads of a run that ``S`` hits are consecutive blocks of its workspace, so
    :meth:`Workspace.render` writes their heading once, and removing a heading line after a blank
    line takes exactly its own count off (the blank line joins the newline before it either way).
    Other merges (same-date threads apart in the bank with nothing shown between them, a ``gist``
    heading left with its date only) go uncredited: they only make the rendering cheaper. Why at most
    (``bounded``): the tokenizer counts a text of lines line by line (``tokens.lines_count_apart``;
    every workspace line starts with ``[`` or ``#``), except that the blank line between blocks
    joins the newline before it, and the rendering strips trailing whitespace off its last line
    (which can only remove tokens). So each cost is counted on its own line, rounded up where the
    join costs a token, and a heading is charged in full less, per shown quoted turn, the least
    that showing it takes off the heading whatever else is shown (counted on every variant), so
    the charges never exceed what the heading really loses. ``benchmarks/token_costs.py`` checks
    the bound, and how tight it is, against the real rendering (docs/design-notes.md; under
    ``gist`` the uncredited shared headings leave it looser).
    """

    unit: np.ndarray
    """[N] int64 tokens of each unit's line and its newline, plus 1 where a blank line after it
    costs a token of its own; with heads, less the least that showing the unit takes off its
    thread's heading (an extractive heading drops a quoted turn that is shown, see
    :func:`thread_gist`); at least 1."""
    heading: np.ndarray
    """[J] int64 tokens of each thread's heading line and its newline (with its full gist under
    ``gist``; 0 under ``none``)."""
    headings: str
    """The :data:`HEADINGS` mode these costs are counted for."""
    bounded: bool = True
    """The sum bounds the rendered workspace's tokens from above (as argued above): the tokenizer
    counts lines apart and no thread quotes more than :data:`MAX_QUOTED` turns. Else
    :func:`fit_to_tokens` renders every workspace to check it."""
    heading_run: np.ndarray | None = None
    """[J] int64: for each thread, the first thread of its heading run (itself when it shares its
    heading with no thread before it; ``heading`` is the same over a run). None: every thread is
    its own run. A knapsack that pays ``heading[heading_run[j]]`` once per run (rather than
    ``heading[j]`` once per thread, which is also an upper bound) sees the merged headings."""

    def runs(self, threads: np.ndarray) -> np.ndarray:
        """The heading run (its first thread) of each of ``threads`` (bank thread indices)."""
        threads = np.asarray(threads, dtype=np.int64)
        return threads if self.heading_run is None else self.heading_run[threads]

    def cost(self, units, unit_thread: np.ndarray) -> int:
        """The additive cost of the unit set ``units`` (bank unit indices)."""
        u = np.unique(np.asarray(list(units), dtype=np.int64))
        return int(self.unit[u].sum() + self.heading[np.unique(self.runs(unit_thread[u]))].sum()) if len(u) else 0


MAX_QUOTED = 4
"""Quoted turns per thread up to which :func:`token_costs` credits what showing them takes off
the heading (it counts the heading with every subset of them shown; beyond this, no credit, and
the costs are not ``bounded``)."""


TEXT_SCAN_CACHED = 1 << 16
"""The most turns a :func:`token_costs` pass reads through the ``unit_line`` / ``date_label``
caches (their size; past it, without them: ``text_features.scan_cached``; they held 61.4 MiB of
turns on the 10^5-unit bank of ``engine_resident``)."""


def token_costs(bank: Bank, headings: Headings = DEFAULT_HEADINGS) -> TokenCosts:
    """Each unit's and each thread heading's token cost in ``bank``'s workspaces under
    ``headings`` (see :class:`TokenCosts`), counted on the lines :func:`unit_line` and
    :func:`heading_line` write."""
    _check_headings(headings)
    with_heads = headings != "none"
    line_of, label_of = (scan_cached(f, bank.n_units, TEXT_SCAN_CACHED) for f in (unit_line, date_label))
    lines, each = [], []  # each unit's line and (date headings) its date label, in one pass over the turns
    for t in bank.turns:
        lines.append(line_of(t, with_heads) + "\n")
        if headings == "date":
            each.append(label_of(t))
    n = count_tokens_many_cached(lines + [x + "\n" for x in lines])
    N = bank.n_units
    unit = np.array(n[:N], dtype=np.int64) + (np.array(n[N:], dtype=np.int64) > np.array(n[:N]))
    heading = np.zeros(bank.n_threads, dtype=np.int64)
    bounded = lines_count_apart()
    if not with_heads or not N:
        return TokenCosts(unit, heading, headings, bounded)
    if headings == "date":  # a heading is its date line; showing a unit takes nothing off it
        off = bank.thread_offsets.tolist()
        labels = {j: list(dict.fromkeys(each[off[j]:off[j + 1]])) for j in range(bank.n_threads)}
        flat = list(dict.fromkeys(lbl for v in labels.values() for lbl in v))
        cnt = dict(zip(flat, count_tokens_many_cached([heading_line(lbl, None) + "\n" for lbl in flat])))
        run = np.arange(bank.n_threads, dtype=np.int64)
        for j, v in labels.items():
            heading[j] = max((cnt[lbl] for lbl in v), default=0)
            if j and len(v) == 1 and labels[j - 1] == v:  # one date, the one before's: one heading
                run[j] = run[j - 1]
        return TokenCosts(unit, heading, headings, bounded, run)
    threads = []  # per thread: (unit ids, date labels, quoted positions, heading variants counted)
    head_lines: dict = {}
    for j in range(bank.n_threads):
        idx = [int(i) for i in bank.thread_units(j)]
        tu = [bank.turns[i] for i in idx]
        full = thread_gist(bank.heads[j], tu, [])
        labels = list(dict.fromkeys(label_of(t) for t in tu))  # a thread's turns share a date in practice
        quoted = [k for k, t in enumerate(tu) if thread_gist(bank.heads[j], tu, [t]) != full]
        variants = [()] if len(quoted) > MAX_QUOTED else \
            [c for r in range(len(quoted) + 1) for c in itertools.combinations(quoted, r)]
        for lbl in labels:
            for c in variants:
                gist = full if not c else thread_gist(bank.heads[j], tu, [tu[k] for k in c])
                head_lines[(j, lbl, c)] = heading_line(lbl, gist) + "\n"
        threads.append((idx, labels, quoted, variants))
    cnt = dict(zip(head_lines, count_tokens_many_cached(list(head_lines.values()))))
    for j, (idx, labels, quoted, variants) in enumerate(threads):
        heading[j] = max(cnt[(j, lbl, ())] for lbl in labels)
        if len(quoted) > MAX_QUOTED:
            bounded = False
            continue
        for k in quoted:  # the least that showing unit k takes off, over the other quotes shown
            take = min(cnt[(j, lbl, c)] - cnt[(j, lbl, tuple(sorted(c + (k,))))]
                       for lbl in labels for c in variants if k not in c)
            unit[idx[k]] -= max(0, take)
    np.maximum(unit, 1, out=unit)
    return TokenCosts(unit, heading, headings, bounded)


def fit_to_tokens(bank: Bank, units: list[int], token_budget: int, headings: Headings = DEFAULT_HEADINGS,
                  costs: TokenCosts | None = None, keep: np.ndarray | None = None) -> list[int]:
    """``units`` (in pick order) less picks from the end until the rendered workspace holds at
    most ``token_budget`` tokens: the check of every selection under a token budget. With the
    bank's ``costs`` (``bounded``, same ``headings``) whose sum for ``units`` is within the
    budget, the workspace provably fits (:class:`TokenCosts`) and is not rendered; otherwise it is
    rendered (as :func:`assemble` renders it with ``keep``, a filter's unit mask) and counted, and
    cut until it fits."""
    if costs is not None and costs.bounded and costs.headings == headings \
            and costs.cost(units, bank.unit_thread) <= token_budget:
        return list(units)
    k = len(units)
    while k and assemble(bank, "", units[:k], headings, keep).n_tokens > token_budget:
        k -= 1
    return list(units[:k])
