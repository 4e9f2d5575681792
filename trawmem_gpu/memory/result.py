"""What a selection returns: the workspace's units, its rendered text and its token count.

One home for the answer of ``Memory.select`` and of ``POST /v1/select`` (the server's body is
:meth:`SelectedWorkspace.to_dict` plus its request fields and timings).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..store.bank import Bank
from ..store.bursts import unit_members
from ..tokens import TOKENIZER_NAME, count_tokens_cached
from ..select.workspace import Headings, assemble


@dataclass(frozen=True)
class Unit:
    """One selected turn, as the workspace shows it."""

    id: str
    speaker: str
    text: str
    date: str | None
    """ISO date-time of the turn (None: the source gave no parsable date)."""
    timestamp: str
    """The date as the source wrote it."""
    caption: str | None
    thread: int
    """Bank-local thread index."""
    session: int
    metadata: dict | None = None
    """The turn's metadata (``data.metadata``), or None."""
    members: tuple[str, ...] = ()
    """The ids of the messages the unit shows: a burst's (``store.bursts``: short messages of one
    speaker shown as one unit, ``id`` the first), the unit's own id otherwise."""


@dataclass(frozen=True)
class Thread:
    thread: int
    head: str | None


@dataclass(frozen=True)
class SelectedWorkspace:
    """A workspace selected for one question: ``text`` is what an answer model reads."""

    bank_id: str
    question: str
    units: tuple[Unit, ...]
    """The selected turns, grouped by thread, threads in source order (as ``text`` shows them)."""
    threads: tuple[Thread, ...]
    text: str
    tokens: int
    """Tokens of ``text`` (``tokenizer``)."""
    tokenizer: str = TOKENIZER_NAME
    date_used: bool = False
    """Whether the batch this query ran in carried a date ("now") for the date-dependent terms."""
    searches: tuple[str, ...] = ()
    """Planned TrawMem's searches (``Memory(plan_llm=...)``): the question, then the planner's and
    the follow-ups; empty when the question alone was searched."""
    llm: dict | None = None
    """The LLM work of the ``select`` call that made this workspace (``Memory(plan_llm=...)``; the
    whole batch's: calls, retries, tokens, seconds, malformed / refused / fallen back,
    ``llm.base.LLMWork``); None without an LLM."""
    picks: tuple[str, ...] = ()
    """The ids of the selected units in the order the engine picked them (best first; ``units``
    and ``text`` show them by thread and time): what a front that ranks results reads."""

    @property
    def unit_ids(self) -> list[str]:
        """The ids of the messages shown (a burst: all its members), in order."""
        return [m for u in self.units for m in (u.members or (u.id,))]

    def to_dict(self) -> dict:
        """The JSON fields of the server's answer (``units``, ``threads``, ``text``, ``n_tokens``, ...)."""
        return {"bank_id": self.bank_id, "question": self.question, "date_used": self.date_used,
                "units": [{**u.__dict__, "metadata": None if u.metadata is None else dict(u.metadata)}
                          for u in self.units],
                "threads": [t.__dict__.copy() for t in self.threads],
                "text": self.text, "n_tokens": self.tokens, "tokenizer": self.tokenizer,
                **({"searches": list(self.searches)} if self.searches else {}),
                **({"llm": self.llm} if self.llm else {})}

    @classmethod
    def of(cls, bank: Bank, question: str, units: list[int], headings: Headings,
           date_used: bool = False, searches: tuple[str, ...] = (), keep=None) -> "SelectedWorkspace":
        """Assemble the picks ``units`` (bank-local indices) of ``bank`` into a workspace (``keep``:
        the unit mask of the filter they were selected under: a thread with a failing unit shows
        no head, ``select.workspace.assemble``)."""
        ws = assemble(bank, question, units, headings, keep)
        text = ws.render()
        return cls(bank.bank_id, question,
                   tuple(Unit(t.turn_id, t.speaker, t.text, t.time.isoformat() if t.time else None, t.timestamp,
                              t.caption, b.thread, t.session, getattr(t, "metadata", None), unit_members(t))
                         for b in ws.blocks for t in b.units),
                   tuple(Thread(b.thread, b.head or None) for b in ws.blocks),
                   text, count_tokens_cached(text),
                   date_used=date_used, searches=tuple(searches) if len(searches) > 1 else (),
                   picks=tuple(bank.turns[int(u)].turn_id for u in units))


def units_seen(bank: Bank, keep=None) -> int:
    """The units of ``bank`` a query saw: all of them, or those of ``keep`` (the unit mask of the
    filter of a caller bound to one, ``memory.scope``): a workspace's ``bank_n_units``."""
    import numpy as np

    return bank.n_units if keep is None else int(np.count_nonzero(np.asarray(keep)))
