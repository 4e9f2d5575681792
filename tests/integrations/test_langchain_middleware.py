"""``TrawMemMiddleware`` in a real LangChain v1 agent (``create_agent``) with a fake chat model that
records what it is sent, over the real engine."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain")

from langchain.agents import create_agent  # noqa: E402
from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from pydantic import Field  # noqa: E402

from trawmem_gpu.errors import ConfigError, InputError  # noqa: E402
from trawmem_gpu.integrations.langchain import WORKSPACE_HEADER, TrawMemMiddleware  # noqa: E402
from trawmem_gpu.memory import Memory  # noqa: E402

PAST = [
    {"role": "user", "content": "My sister Maya moved to Lisbon last spring.", "id": "p1"},
    {"role": "assistant", "content": "Lisbon is lovely. Does she like her new flat?", "id": "p2"},
    {"role": "user", "content": "She does, it is near the river and she paints there.", "id": "p3"},
    {"role": "user", "content": "I adopted a grey cat called Pixel yesterday.", "id": "p4"},
    {"role": "assistant", "content": "Pixel is a great name for a cat.", "id": "p5"},
]


class Recorder(BaseChatModel):
    """A fake chat model: answers ``replies`` in turn and keeps every message list it is sent."""

    replies: list[str] = Field(default_factory=lambda: ["Noted."])
    seen: list = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "recorder"

    def _generate(self, messages, stop=None, run_manager=None, **kw):
        self.seen.append(list(messages))
        text = self.replies[min(len(self.seen), len(self.replies)) - 1]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


@pytest.fixture
def mem(tmp_path):
    m = Memory(tmp_path / "coll")
    m.add("ana", messages=PAST, speakers={"user": "Ana", "assistant": "Bot"})
    return m


def _system(messages) -> str:
    return "\n".join(m.content for m in messages if isinstance(m, SystemMessage))


def test_the_workspace_goes_before_the_model_and_the_exchange_into_the_bank(mem):
    model = Recorder(replies=["She lives in Lisbon."])
    agent = create_agent(model, tools=[], system_prompt="You are a helpful assistant.",
                         middleware=[TrawMemMiddleware(mem, token_budget=200)])
    out = agent.invoke({"messages": [HumanMessage("Where does my sister live now?", id="q1")]},
                       {"configurable": {"trawmem_bank": "ana", "thread_id": "t-7"}})
    assert out["messages"][-1].content == "She lives in Lisbon."
    system = _system(model.seen[0])
    assert system.startswith("You are a helpful assistant.")  # the agent's prompt stays first
    assert WORKSPACE_HEADER in system and "Lisbon" in system
    turns = {t.turn_id: t for t in mem.turns("ana")}
    assert turns["lc-q1"].text == "Where does my sister live now?"
    assert turns["lc-q1"].metadata == {"lc_msg": "lc-q1", "lc_thread": "t-7"}
    answers = [t for t in turns.values() if t.text == "She lives in Lisbon."]
    assert len(answers) == 1 and answers[0].turn_id.startswith("lc-")


def test_the_budget_from_the_config_bounds_the_workspace(mem):
    tokens = []
    for budget in (40, 400):
        model = Recorder()
        agent = create_agent(model, tools=[], middleware=[TrawMemMiddleware(mem, store=False)])
        agent.invoke({"messages": [HumanMessage("Tell me about Maya and the cat.")]},
                     {"configurable": {"trawmem_bank": "ana", "trawmem_token_budget": budget}})
        block = _system(model.seen[0])
        tokens.append(mem.select("ana", "Tell me about Maya and the cat.", token_budget=budget).tokens)
        assert block.startswith(WORKSPACE_HEADER)
    assert tokens[0] <= 40 < tokens[1] <= 400


def test_a_message_already_in_the_context_is_not_shown_again(mem):
    model = Recorder(replies=["First.", "Second."])
    agent = create_agent(model, tools=[], middleware=[TrawMemMiddleware(mem, bank_id="ana", token_budget=400)])
    first = agent.invoke({"messages": [HumanMessage("My neighbour Tomas plays the cello every night.", id="n1")]})
    agent.invoke({"messages": first["messages"] + [HumanMessage("What does Tomas play?", id="n2")]})
    second_input = model.seen[1]
    assert "lc-n1" in {t.turn_id for t in mem.turns("ana")}  # stored by the first call
    shown = _system(second_input)
    assert "Tomas plays the cello" not in shown  # it is in the messages already, not repeated
    assert sum("Tomas plays the cello" in str(m.content) for m in second_input) == 1


def test_a_retried_message_is_stored_once_and_a_read_only_middleware_stores_nothing(mem):
    n = len(mem.turns("ana"))
    agent = create_agent(Recorder(replies=["Yes."]), tools=[], middleware=[TrawMemMiddleware(mem, bank_id="ana")])
    for _ in range(2):
        agent.invoke({"messages": [HumanMessage("Is Pixel grey?", id="r1")]})
    ids = [t.turn_id for t in mem.turns("ana")]
    assert ids.count("lc-r1") == 1
    reader = create_agent(Recorder(), tools=[], middleware=[TrawMemMiddleware(mem, bank_id="ana", store=False)])
    before = len(mem.turns("ana"))
    reader.invoke({"messages": [HumanMessage("Anything new?")]})
    assert len(mem.turns("ana")) == before > n


def test_the_first_exchange_creates_the_bank(tmp_path):
    mem = Memory(tmp_path / "fresh")
    model = Recorder(replies=["Hello Ana."])
    agent = create_agent(model, tools=[], middleware=[TrawMemMiddleware(mem, bank_id="new-bank")])
    agent.invoke({"messages": [HumanMessage("Hi, I am Ana.", id="h1")]})
    assert WORKSPACE_HEADER not in _system(model.seen[0])  # nothing to recall yet
    assert [t.text for t in mem.turns("new-bank")] == ["Hi, I am Ana.", "Hello Ana."]


@pytest.mark.parametrize("configurable, exc, field", [
    ({}, ConfigError, "trawmem_bank"),
    ({"trawmem_bank": "ana", "trawmem_token_budget": -5}, ConfigError, "token_budget"),
    ({"trawmem_bank": "ana", "trawmem_where": {"user_id": {"gt": "x"}}}, InputError, "where"),
])
def test_bad_settings_are_clear_errors_before_the_model_and_store_nothing(mem, configurable, exc, field):
    model = Recorder()
    agent = create_agent(model, tools=[], middleware=[TrawMemMiddleware(mem)])
    before = [t.turn_id for t in mem.turns("ana")]
    with pytest.raises(exc, match=field):
        agent.invoke({"messages": [HumanMessage("Where is Maya?")]}, {"configurable": configurable})
    assert model.seen == [] and [t.turn_id for t in mem.turns("ana")] == before


def test_the_async_agent_selects_and_stores_through_async_memory(mem):
    model = Recorder(replies=["A grey cat."])
    agent = create_agent(model, tools=[], middleware=[TrawMemMiddleware(mem, bank_id="ana", token_budget=300)])
    out = asyncio.run(agent.ainvoke({"messages": [HumanMessage("What pet did I adopt?", id="a1")]}))
    assert out["messages"][-1].content == "A grey cat."
    assert "Pixel" in _system(model.seen[0])
    assert "lc-a1" in {t.turn_id for t in mem.turns("ana")}
