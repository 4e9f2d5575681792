"""Workspaces: selected units grouped under their thread headings, rendered for the answer model.

Rendered format (what the answer model reads, and what ``context_tokens`` counts)::

    ## 2 March 2024 — Ana: Aww, Pixel is such a cute name! Is Clara still living in Lyon?
    [S1:6] Ben: By the way, my sister Clara just adopted a grey cat named Pixel.
    [S1:8] Ben: She moved to Rotterdam last month for a job at the port authority.

* one ``##`` heading per thread, threads in source order: the date of the thread (a thread
  never crosses a session, so it dates all its units), then ``—`` and the thread's gist: for an
  extractive head its most central turn (``speaker: words ...``, clipped), for an LLM head its
  one-sentence summary. The gist is left out when that very turn is among the units shown;
* one line per selected unit, in thread order: ``[turn id] speaker: text``, then
  ``[shares an image: caption]`` for a shared image;
* without heads (the baselines) no headings, and each line carries its date:
  ``[S1:6] (2 March 2024) Ben: ...``.

Texts are shown as the source wrote them except for characters that could mislead the reader
or forge structure: control characters (NUL, ESC, ...), bidirectional embeddings, overrides
and isolates (U+202A-U+202E, U+2066-U+2069) and the BOM are removed; line breaks inside a text
become a newline plus two spaces, so no text can start a line that looks like a heading or
another turn.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .data.types import Turn
from .store.bank import Bank
from .tokens import TOKENIZER_NAME, count_tokens

_STRIP = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x84\x86-\x9f\u202a-\u202e\u2066-\u2069\ufeff\ufff9-\ufffb]")
_BREAK = re.compile(r"\r\n|[\n\r\x0c\x85\u2028\u2029]")


def clean(text: str) -> str:
    """``text`` safe to render: see the module docstring (removed characters, indented breaks)."""
    return _BREAK.sub("\n  ", _STRIP.sub("", text))


def one_line(text: str) -> str:
    """``clean`` with every line break turned into a space (headings, speakers, ids)."""
    return _BREAK.sub(" ", _STRIP.sub("", text)).strip()


def date_label(t: Turn) -> str:
    """``2 March 2024`` (the source's own text when it gave no parsable date)."""
    return f"{t.time.day} {t.time:%B %Y}" if t.time else t.timestamp


def _extractive_prefix(turns: list[Turn]) -> str:
    """What ``build.heads.extractive_head`` writes before the quoted turn(s)."""
    date = turns[0].time.strftime("%d %B %Y") if turns[0].time else turns[0].timestamp
    return f"[{date}] " + " & ".join(dict.fromkeys(t.speaker for t in turns)) + ": "


@dataclass
class ThreadBlock:
    thread: int
    head: str | None
    """The stored head (None without heads)."""
    units: list[Turn]
    gist: str | None = None
    """What the heading shows after the date (None: date only, or no heading without heads)."""


@dataclass
class Workspace:
    bank_id: str
    question: str
    blocks: list[ThreadBlock]
    unit_ids: list[str] = field(default_factory=list)
    """Selected turn ids in source order."""

    def render(self) -> str:
        """Text for the answer model, in the format of the module docstring."""
        out = []
        for b in self.blocks:
            date = date_label(b.units[0])
            if b.head is not None:
                out.append(f"## {date} — {one_line(b.gist)}" if b.gist else f"## {date}")
            for t in b.units:
                tid, spk = one_line(t.turn_id), one_line(t.speaker)
                s = f"[{tid}] {spk}: {clean(t.text)}" if b.head is not None else \
                    f"[{tid}] ({date}) {spk}: {clean(t.text)}"
                if t.caption:
                    s += f" [shares an image: {one_line(t.caption)}]"
                out.append(s)
            out.append("")
        return "\n".join(out).strip() + "\n"

    @property
    def n_tokens(self) -> int:
        return count_tokens(self.render())

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


def assemble(bank: Bank, question: str, units: list[int], with_heads: bool = True) -> Workspace:
    """Group ``units`` (bank unit indices, any order) by thread; heads only if ``with_heads``."""
    ut = bank.unit_thread
    chosen = sorted(set(int(u) for u in units))
    blocks: list[ThreadBlock] = []
    for u in chosen:
        j = int(ut[u])
        if not blocks or blocks[-1].thread != j:
            blocks.append(ThreadBlock(j, bank.heads[j] if with_heads else None, []))
        blocks[-1].units.append(bank.turns[u])
    if with_heads:
        for b in blocks:
            b.gist = thread_gist(b.head, [bank.turns[i] for i in bank.thread_units(b.thread)], b.units)
    return Workspace(bank.bank_id, question, blocks, [bank.turns[u].turn_id for u in chosen])
