"""The OpenAI Agents SDK (the ``openai-agents`` extra): a memory ``Session`` and a recall / remember
tool pair, over a ``Memory``, an ``AsyncMemory`` or a collection path.

::

    from agents import Agent, Runner
    from trawmem_gpu.integrations.openai_agents import TrawMemSession, memory_tools

    session = TrawMemSession("ana-ben", "memories/", token_budget=800)
    agent = Agent(name="assistant", tools=memory_tools("memories/", "ana-ben"))
    await Runner.run(agent, "Where does Ben's sister live?", session=session)

**One bank per session.** ``TrawMemSession(session_id, ...)`` keeps its conversation in the bank
whose id is ``session_id`` (the store's id rules; created on the first add). ``add_items`` stores
the user and assistant messages as turns ``oa-<n>`` (chat messages to ``Memory.add``, atomic:
an item refused refuses the call, nothing stored), time-ordered as ``Memory`` orders appends;
every item is kept in order in the session's item log (``_oa_items``): tool calls and outputs as
given, a message as its turn id and shape only, its text rebuilt from the bank's turn, so a turn
forgotten through any door (``Memory.forget``, the server, the CLI) leaves no text in the log and
its item is no longer returned.

**The workspace.** ``get_items(limit)`` returns the most recent ``limit`` items (all for None),
preceded by one input item ``{"role": "system", "content": "[trawmem workspace] ...\\n<text>"}``
(``role="developer"`` on request): the workspace ``Memory.select`` picks for the latest user
message under ``token_budget`` tokens (and ``where``), among the bank's turns not already in the
returned items (its other turns: earlier sessions, ``remember``, a built bank). No workspace item
when nothing is selected. Such an item given back to ``add_items`` is dropped, never stored.
When the SDK asks, the new user message is not stored yet: pass
``RunConfig(session_input_callback=session.input_callback)`` to select for it instead.

``pop_item`` removes the last item and forgets its turn; ``clear_session`` forgets every turn of
the session and deletes its item log: ``Memory.forget``'s erasure, no trace in the files.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from agents import RunContextWrapper, function_tool
from agents.memory.session import SessionABC
from agents.tool_context import ToolContext
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from ..errors import DuplicateTurns, InputError, TrawmemError, UnknownBank
from . import _oa_items as oa

WORKSPACE_HEADER = "[trawmem workspace]"
"""How a workspace item's content starts."""
DEFAULT_TOKEN_BUDGET = 800
"""Tokens of a workspace unless ``token_budget`` says otherwise."""


def _async_memory(memory, name: str = "memory"):
    """An ``AsyncMemory`` over ``memory`` (a ``Memory``, an ``AsyncMemory`` or a collection path)."""
    from ..memory import Memory
    from ..memory.aio import AsyncMemory

    if isinstance(memory, AsyncMemory):
        return memory
    if isinstance(memory, Memory):
        return AsyncMemory.of(memory)
    if isinstance(memory, (str, Path)):
        return AsyncMemory(memory)
    raise InputError(f"{name}: expected a Memory, an AsyncMemory or a collection path, got {type(memory).__name__}")


def _budget(token_budget) -> int:
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise InputError(f"token_budget: expected a positive integer, got {token_budget!r}")
    return token_budget


def _where(where):
    """``where`` as given, checked by the one filter parser (``InputError`` naming its path)."""
    from ..data.filters import parse_filter

    if where is not None and not isinstance(where, dict):
        raise InputError(f"where: expected a filter object (a dict), got {type(where).__name__}")
    parse_filter(where, "where")
    return where or None


def _question(text: str) -> str:
    from ..data.types import MAX_QUESTION_CHARS

    return text.strip()[-MAX_QUESTION_CHARS:]  # a long message: its end, the part nearest the answer


def is_workspace_item(item) -> bool:
    """Whether ``item`` is a workspace item of this module (never stored)."""
    return (isinstance(item, dict) and item.get("role") in ("system", "developer")
            and isinstance(item.get("content"), str) and item["content"].startswith(WORKSPACE_HEADER))


class TrawMemSession(SessionABC):
    """An Agents SDK session over bank ``session_id`` (module docstring).

    :param memory: a ``Memory``, an ``AsyncMemory`` or a collection path (opened as a ``Memory``)
    :param token_budget: most tokens of the workspace (``cl100k_base``)
    :param where: a filter over the turns' metadata the workspace is picked from
    :param role: the workspace item's role, ``system`` or ``developer``
    :param speakers: role -> speaker name of the stored turns (default: the role)
    :param session_settings: the SDK's settings (``limit``: the items ``get_items`` returns by default)
    """

    def __init__(self, session_id: str, memory, *, token_budget: int = DEFAULT_TOKEN_BUDGET, where=None,
                 role: str = "system", speakers: dict | None = None, session_settings: SessionSettings | None = None):
        from ..memory.banks import check_bank_id
        from ..memory.messages import check_speakers

        if not isinstance(session_id, str):
            raise InputError(f"session_id: expected a string (the bank id), got {type(session_id).__name__}")
        try:
            check_bank_id(session_id)
        except InputError as e:
            raise InputError(f"session_id: {e}") from None
        if role not in ("system", "developer"):
            raise InputError(f"role: expected 'system' or 'developer', got {role!r}")
        self.session_id = session_id
        self.session_settings = session_settings
        self.token_budget, self.where, self.role = _budget(token_budget), _where(where), role
        self.speakers = check_speakers(speakers)
        self.memory = _async_memory(memory)
        self._log = oa.ItemLog(self.memory.path, session_id)
        self._lock = asyncio.Lock()
        self._first_shown: int | None = None  # seq of the first turn get_items last returned

    @property
    def bank_id(self) -> str:
        return self.session_id

    # -- the workspace ----------------------------------------------------------------------------
    async def workspace(self, question: str, shown_from: int | None = None):
        """The ``SelectedWorkspace`` for ``question`` among the bank's turns, leaving out this session's
        turns numbered ``shown_from`` or later (those the model reads already); None when the bank
        does not exist yet or the question is empty."""
        if not question.strip() or self.session_id not in self.memory:
            return None
        wheres = [w for w in (self.where, None if shown_from is None else
                  {"or": [{"not": {oa.SEQ_KEY: {"exists": True}}}, {oa.SEQ_KEY: {"lt": shown_from}}]}) if w]
        where = None if not wheres else wheres[0] if len(wheres) == 1 else {"and": wheres}
        try:
            return await self.memory.select(self.session_id, _question(question), token_budget=self.token_budget,
                                            where=where)
        except UnknownBank:  # forgotten meanwhile
            return None

    def workspace_item(self, ws) -> dict | None:
        """The input item showing ``ws`` (None when it selected nothing)."""
        if ws is None or not ws.units:
            return None
        return {"role": self.role, "content": f"{WORKSPACE_HEADER} Past conversation turns selected from memory "
                f"for the latest user message ({ws.tokens} tokens):\n{ws.text}"}

    async def input_callback(self, history: list, new_items: list) -> list:
        """A ``RunConfig.session_input_callback``: the history with its workspace item selected for
        the new input's user message (else the history's latest), then the new items."""
        history = [it for it in history if not is_workspace_item(it)]
        question = next((q for q in map(oa.text_of, reversed(new_items + history)) if q.strip()), "")
        item = self.workspace_item(await self.workspace(question, self._first_shown))
        return ([item] if item else []) + history + list(new_items)

    # -- the Session protocol ---------------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list:
        """The most recent ``limit`` items (``session_settings.limit`` for None; all when both are None),
        after the workspace item for the latest user message (module docstring)."""
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InputError(f"limit: expected an integer or None, got {type(limit).__name__}")
        async with self._lock:
            entries = await self._entries(self._log.read()["entries"])
        tail = entries if limit is None or limit < 0 else entries[len(entries) - limit:] if limit else []
        shown = [e["seq"] for e in tail if e["turn"] is not None]
        self._first_shown = min(shown) if shown else None
        question = next((q for q in (oa.text_of(e["item"]) for e in reversed(entries)) if q.strip()), "")
        item = self.workspace_item(await self.workspace(question, self._first_shown))
        return ([item] if item else []) + [e["item"] for e in tail]

    async def add_items(self, items: list) -> None:
        """Store ``items``: their messages as turns (all or none: an ``InputError`` naming
        ``items[i]`` stores nothing), every item in the item log. Workspace items are dropped."""
        items = [it for it in oa.check_items(items) if not is_workspace_item(it)]
        if not items:
            return
        async with self._lock:
            log = self._log.read()
            seq0 = log["next_seq"]
            msgs, where = [], []
            for i, it in enumerate(items):
                m = oa.message_of(it, i, seq0 + i)
                if m is not None:
                    msgs.append(m[0])
                    where.append((i, m[1]))
            if msgs:
                await self._store(msgs, where, seq0)
            turned = {w[0] for w in where}
            log["entries"] += [{"seq": seq0 + i, "turn": oa.turn_id(seq0 + i) if i in turned else None,
                                "item": oa.skeleton(it) if i in turned else it} for i, it in enumerate(items)]
            log["next_seq"] = seq0 + len(items)
            self._log.write(log)

    async def _entries(self, entries: list) -> list:
        """``entries`` with each message item rebuilt from its turn's text (the log keeps no text);
        an entry whose turn is gone (forgotten through any door) is left out."""
        if not any(e["turn"] is not None for e in entries):
            return entries
        try:
            texts = {t.turn_id: t.text for t in await self.memory.turns(self.session_id)}
        except UnknownBank:
            texts = {}
        return [e if e["turn"] is None else {**e, "item": oa.rebuilt(e["item"], texts[e["turn"]])}
                for e in entries if e["turn"] is None or e["turn"] in texts]

    async def _store(self, msgs: list, where: list, seq0: int) -> None:
        """``Memory.add`` of the messages, atomic; turns numbered past the log (an add whose log write
        was lost: no log entry names them) are forgotten first and the add made again."""
        for attempt in (0, 1):
            try:
                await self.memory.add(self.session_id, messages=msgs, speakers=self.speakers or None, atomic=True)
                return
            except DuplicateTurns:
                if attempt:
                    raise
                orphans = [t.turn_id for t in await self.memory.turns(self.session_id)
                           if (oa.seq_of(t.turn_id) or -1) >= seq0]
                await self.memory.forget(self.session_id, orphans)
            except InputError as e:
                raise oa.renamed(e, where) from None

    async def pop_item(self):
        """Remove and return the most recent item (None when there is none); its turn is forgotten.
        Items whose turns were forgotten elsewhere are dropped on the way."""
        async with self._lock:
            log = self._log.read()
            last = None
            while log["entries"] and last is None:
                entry = log["entries"].pop()
                last = (await self._entries([entry]) or [None])[0]
            if last is not None and last["turn"] is not None and self.session_id in self.memory:
                await self.memory.forget(self.session_id, [last["turn"]])
            self._log.write(log) if log["entries"] else self._log.delete()
            return None if last is None else last["item"]

    async def clear_session(self) -> None:
        """Forget every turn of this session and delete its item log."""
        async with self._lock:
            turns = [e["turn"] for e in self._log.read()["entries"] if e["turn"] is not None]
            if turns and self.session_id in self.memory:
                await self.memory.forget(self.session_id, turns)
            self._log.delete()


def memory_tools(memory, bank_id: str, *, token_budget: int = DEFAULT_TOKEN_BUDGET, where=None,
                 speaker: str = "memory") -> list:
    """``[recall, remember]``: Agents SDK function tools over bank ``bank_id``.

    ``recall(query)`` answers the workspace ``Memory.select`` picks for ``query`` under
    ``token_budget`` tokens (and ``where``); ``remember(text)`` appends ``text`` as a turn of
    ``speaker`` (id ``remember-<tool call id>``: a retried call is stored once). Bad input is
    answered as the tool's output, ``error: <field>: <why>``; nothing is stored then.
    """
    from ..memory.banks import check_bank_id

    mem = _async_memory(memory)
    check_bank_id(bank_id)
    token_budget, where = _budget(token_budget), _where(where)
    if not isinstance(speaker, str) or not speaker.strip():
        raise InputError("speaker: expected a speaker name (a non-empty string)")

    async def recall(query: str) -> str:
        """Recall what past conversations say about a question: the relevant turns from memory.

        Args:
            query: the question or topic to recall
        """
        if not isinstance(query, str) or not query.strip():
            return "error: query: expected a non-empty question"
        try:
            ws = await mem.select(bank_id, _question(query), token_budget=token_budget, where=where)
        except UnknownBank:
            return "Nothing is remembered yet."
        except TrawmemError as e:
            return f"error: {e}"
        return ws.text if ws.units else "Nothing relevant is remembered."

    async def remember(ctx: RunContextWrapper, text: str) -> str:
        """Remember a fact or note for later conversations.

        Args:
            text: what to remember, in one or a few sentences
        """
        if not isinstance(text, str) or not text.strip():
            return "error: text: expected a non-empty text to remember"
        call = getattr(ctx, "tool_call_id", None) if isinstance(ctx, ToolContext) else None
        msg = {"role": "user", "content": text.strip(), **({"id": f"remember-{call}"} if call else {})}
        try:
            res = await mem.add(bank_id, messages=[msg], speakers={"user": speaker}, atomic=True)
        except TrawmemError as e:
            return f"error: {str(e).replace('messages[0].content', 'text').replace('messages[0]', 'text')}"
        return f"Remembered (turn {(res['stored'] or res['already_stored'])[0]})."

    return [function_tool(recall, name_override="recall"),
            function_tool(remember, name_override="remember")]
