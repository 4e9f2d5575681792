"""Workspaces: selected units grouped under their thread heads, rendered for the answer model.

Threads appear in source order, units in within-thread order, each unit with its id, speaker
and date, so the answer model sees provenance and time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .data.types import Turn
from .store.bank import Bank
from .tokens import TOKENIZER_NAME, count_tokens


@dataclass
class ThreadBlock:
    thread: int
    head: str | None
    units: list[Turn]


@dataclass
class Workspace:
    bank_id: str
    question: str
    blocks: list[ThreadBlock]
    unit_ids: list[str] = field(default_factory=list)
    """Selected turn ids in source order."""

    def render(self) -> str:
        """Text for the answer model. With heads, a thread never crosses a session, so its
        header carries the date of all its units; without heads each unit carries its date."""
        out = []
        for b in self.blocks:
            date = b.units[0].time.strftime("%d %B %Y") if b.units[0].time else b.units[0].timestamp
            if b.head is not None:
                head = _dedup_head(b.head, b.units)
                out.append(f"## {head}" if head.startswith(f"[{date}]") else f"## [{date}] {head}")
            for t in b.units:
                s = f"[{t.turn_id}] {t.speaker}: {t.text}" if b.head is not None else \
                    f"[{t.turn_id}] ({date}) {t.speaker}: {t.text}"
                if t.caption:
                    s += f" [shares an image: {t.caption}]"
                out.append(s)
            out.append("")
        return "\n".join(out).strip() + "\n"

    @property
    def n_tokens(self) -> int:
        return count_tokens(self.render())

    tokenizer = TOKENIZER_NAME


def _dedup_head(head: str, units: list[Turn]) -> str:
    """Drop an extractive head's quoted turn when that turn is itself in the workspace.

    Extractive heads read ``[date] A & B: <speaker>: <quote>``; repeating a selected turn adds
    tokens and no information, so the header keeps only ``[date] A & B``.
    """
    if not head.startswith("[") or ": " not in head:
        return head
    prefix, quote = head.split(": ", 1)
    quote = quote.removesuffix(" ...").strip()
    for t in units:
        if quote and f"{t.speaker}: {t.text}".startswith(quote):
            return prefix
    return head


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
    return Workspace(bank.bank_id, question, blocks, [bank.turns[u].turn_id for u in chosen])
