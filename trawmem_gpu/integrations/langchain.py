"""LangChain v1 (the ``langchain`` extra): ``TrawMemMiddleware``, an agent middleware that puts a
selected workspace in front of each model call and writes the exchange back as turns.

::

    from langchain.agents import create_agent
    from trawmem_gpu.integrations.langchain import TrawMemMiddleware

    agent = create_agent(model, tools=[], middleware=[TrawMemMiddleware("memories/", token_budget=800)])
    agent.invoke({"messages": [{"role": "user", "content": "Where does Ben's sister live?"}]},
                 {"configurable": {"trawmem_bank": "ana-ben", "thread_id": "t1"}})

**What it reads from the run's config** (``config["configurable"]``; each falls back to the
constructor's value): ``trawmem_bank`` (the bank; required one way or the other),
``trawmem_token_budget`` (the workspace's tokens), ``trawmem_where`` (a filter over the turns'
metadata, ``docs/python-api.md``). ``thread_id`` (LangGraph's own key) is stored on each turn as
the metadata ``lc_thread``.

**Before each model call** (``wrap_model_call`` / ``awrap_model_call``): ``Memory.select`` picks
the workspace for the latest human message under the token budget, among the bank's turns that are
not messages of the request itself (the metadata ``lc_msg``: a message already in the context is
never shown twice), and the workspace goes into the system message, after the agent's own system
prompt, as a block that starts with :data:`WORKSPACE_HEADER`. No block when the bank does not exist
yet or nothing is selected.

**After the model call**: the latest human message and the model's answer are added to the bank
as chat messages (``Memory.add(messages=...)``, atomic): turn ids ``lc-<message id>`` (a hash of the
text when a message has no id), so the human message of a tool-calling loop, seen by every model
call of the loop, is stored once (``already_stored``); an answer that only calls tools has no text
and is skipped. Bad input (a budget out of range, a filter that does not parse, no bank) raises
the ``Memory``'s own errors, naming the field, before the model is called.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from ..errors import ConfigError, UnknownBank

WORKSPACE_HEADER = "[trawmem workspace] Turns from earlier conversations, selected for the latest message:"
"""The first line of the block the middleware adds to the system message."""
DEFAULT_TOKEN_BUDGET = 800
"""Tokens of a workspace unless the config or the constructor says otherwise."""
CONFIG_KEYS = ("trawmem_bank", "trawmem_token_budget", "trawmem_where")
"""The keys of ``config["configurable"]`` the middleware reads."""


def _memory(memory):
    """A ``Memory`` over ``memory`` (a ``Memory`` or a collection path)."""
    from ..memory import Memory

    if isinstance(memory, Memory):
        return memory
    if isinstance(memory, (str, Path)):
        return Memory(memory)
    raise ConfigError(f"memory: expected a Memory or a collection path, got {type(memory).__name__}")


def message_text(msg: BaseMessage) -> str:
    """The text of a message: its string content, or its text parts joined by a new line."""
    content = msg.content
    if isinstance(content, str):
        return content
    parts = [p if isinstance(p, str) else p.get("text", "") for p in content
             if isinstance(p, str) or (isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"))]
    return "\n".join(p for p in parts if p)


def turn_id(msg: BaseMessage, role: str) -> str:
    """``lc-<message id>``, or ``lc-<role>-<sha256 of the text>`` for a message without an id."""
    if msg.id:
        return f"lc-{msg.id}"
    return f"lc-{role}-{hashlib.sha256(message_text(msg).encode()).hexdigest()[:32]}"


def _run_config() -> dict:
    """``config["configurable"]`` of the run being executed ({} outside a run)."""
    try:
        from langgraph.config import get_config

        return dict(get_config().get("configurable") or {})
    except RuntimeError:  # called outside a runnable context
        return {}


class TrawMemMiddleware(AgentMiddleware):
    """Inject the workspace before each model call; store the exchange after it (module docstring).

    :param memory: a ``Memory`` or a collection path
    :param bank_id: the bank when the run's config names none
    :param token_budget: the workspace's tokens when the run's config names none
    :param where: a filter over the turns' metadata when the run's config names none
    :param store: write the human message and the answer as turns (False: read only)
    :param speakers: speaker names by role (``{"user": "Ana", "assistant": "Bot"}``; default the role)
    """

    def __init__(self, memory, *, bank_id: str | None = None, token_budget: int = DEFAULT_TOKEN_BUDGET,
                 where: dict | None = None, store: bool = True, speakers: dict | None = None):
        super().__init__()
        self.memory = _memory(memory)
        self.bank_id, self.token_budget, self.where = bank_id, token_budget, where
        self.store, self.speakers = bool(store), speakers
        self._async = None

    # -- what a call selects and stores ---------------------------------------------------------
    def _settings(self) -> tuple[str, Any, Any, Any]:
        conf = _run_config()
        bank = conf.get("trawmem_bank", self.bank_id)
        if not isinstance(bank, str) or not bank:
            raise ConfigError("trawmem_bank: name the bank in config['configurable']['trawmem_bank'] "
                              "or TrawMemMiddleware(bank_id=...)")
        return (bank, conf.get("trawmem_token_budget", self.token_budget), conf.get("trawmem_where", self.where),
                conf.get("thread_id"))

    @staticmethod
    def _latest_human(messages) -> HumanMessage | None:
        return next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)

    @staticmethod
    def _where(user_where, messages) -> dict:
        """The caller's filter, and none of the request's own messages (the last ``MAX_IN_VALUES``)."""
        from ..data.filters import MAX_IN_VALUES

        own = [turn_id(m, "user" if isinstance(m, HumanMessage) else "assistant")
               for m in messages if isinstance(m, (HumanMessage, AIMessage))][-MAX_IN_VALUES:]
        parts = [user_where] if user_where else []
        if own:
            parts.append({"lc_msg": {"nin": own}})
        return {"and": parts} if len(parts) > 1 else (parts[0] if parts else {})

    def _with_workspace(self, request, workspace):
        if workspace is None or not workspace.units:
            return request
        block = f"{WORKSPACE_HEADER}\n{workspace.text}"
        system = request.system_message
        text = f"{message_text(system)}\n\n{block}" if system is not None and message_text(system) else block
        return request.override(system_message=SystemMessage(content=text))

    def _messages(self, human, answer, thread) -> list[dict]:
        out = []
        for msg, role in ((human, "user"), (answer, "assistant")):
            if msg is None or not message_text(msg).strip():
                continue
            tid = turn_id(msg, role)
            meta = {"lc_msg": tid}
            if isinstance(thread, (str, int)) and not isinstance(thread, bool) and str(thread):
                meta["lc_thread"] = str(thread)
            out.append({"role": role, "content": message_text(msg), "id": tid, "metadata": meta})
        return out

    @staticmethod
    def _answer(response) -> AIMessage | None:
        result = getattr(response, "result", None)
        msgs = result if isinstance(result, list) else [response] if isinstance(response, AIMessage) else []
        return next((m for m in reversed(msgs) if isinstance(m, AIMessage)), None)

    # -- the hooks ------------------------------------------------------------------------------
    def wrap_model_call(self, request, handler):
        bank, budget, where, thread = self._settings()
        human = self._latest_human(request.messages)
        workspace = None
        if human is not None and message_text(human).strip():
            try:
                workspace = self.memory.select(bank, message_text(human), token_budget=budget,
                                               where=self._where(where, request.messages))
            except UnknownBank:
                workspace = None  # the bank's first exchange: nothing to recall yet
        response = handler(self._with_workspace(request, workspace))
        if self.store and human is not None:
            msgs = self._messages(human, self._answer(response), thread)
            if msgs:
                self.memory.add(bank, messages=msgs, speakers=self.speakers, atomic=True)
        return response

    async def awrap_model_call(self, request, handler):
        from ..memory.aio import AsyncMemory

        if self._async is None:
            self._async = AsyncMemory.of(self.memory)
        bank, budget, where, thread = self._settings()
        human = self._latest_human(request.messages)
        workspace = None
        if human is not None and message_text(human).strip():
            try:
                workspace = await self._async.select(bank, message_text(human), token_budget=budget,
                                                     where=self._where(where, request.messages))
            except UnknownBank:
                workspace = None
        response = await handler(self._with_workspace(request, workspace))
        if self.store and human is not None:
            msgs = self._messages(human, self._answer(response), thread)
            if msgs:
                await self._async.add(bank, messages=msgs, speakers=self.speakers, atomic=True)
        return response
