"""The OpenAI Agents SDK integration against the real ``openai-agents`` package: a fake Model (a
real ``Model`` subclass answering canned outputs, no network) and the real engine over the bundled
sample (bank ``ana-ben``)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

agents = pytest.importorskip("agents")
from agents import Agent, RunConfig, Runner  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import (ResponseFunctionToolCall, ResponseOutputMessage,  # noqa: E402
                                    ResponseOutputText)

from serve_util import build_sample_collection  # noqa: E402

from trawmem_gpu.errors import InputError  # noqa: E402
from trawmem_gpu.integrations.openai_agents import (WORKSPACE_HEADER, TrawMemSession,  # noqa: E402
                                                    is_workspace_item, memory_tools)

agents.set_tracing_disabled(True)
HANG_GUARD_S = 600


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id="msg_fake", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


def call(name: str, args: dict, call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", name=name, arguments=json.dumps(args), call_id=call_id,
                                    id=f"fc_{call_id}", status="completed")


class FakeModel(Model):
    """Answers ``turns`` (each a list of output items) one per model call; ``inputs`` keeps each call's input."""

    def __init__(self, turns: list[list]):
        self.turns, self.inputs = list(turns), []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, **kw):
        self.inputs.append(input if isinstance(input, str) else json.loads(json.dumps(input, default=str)))
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *a, **kw):  # pragma: no cover - no test streams
        raise NotImplementedError


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, HANG_GUARD_S))


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return build_sample_collection(tmp_path_factory.mktemp("oa") / "coll")


@pytest.fixture(scope="module")
def mem(sample):
    from trawmem_gpu import Memory

    return Memory(sample)


def files_holding(root: Path, needle: str) -> list[str]:
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file() and needle.encode() in p.read_bytes()]


def test_runner_stores_turns_and_the_next_run_reads_the_workspace(mem):
    session = TrawMemSession("oa-run", mem, token_budget=300)
    mem.add("oa-run", [{"turn_id": t.turn_id, "speaker": t.speaker, "text": t.text, "timestamp": t.timestamp}
                       for t in mem.turns("ana-ben")])  # an earlier conversation in the session's bank
    model = FakeModel([[say("Noted, a blue kayak.")], [say("Rotterdam, for the port authority job.")]])
    agent = Agent(name="assistant", model=model)
    run(Runner.run(agent, "I bought a blue kayak yesterday.", session=session))
    stored = {t.turn_id: t for t in mem.turns("oa-run")}
    assert stored["oa-0"].text == "I bought a blue kayak yesterday." and stored["oa-0"].speaker == "user"
    assert stored["oa-1"].text == "Noted, a blue kayak." and stored["oa-1"].speaker == "assistant"
    assert stored["oa-0"].metadata == {"oa_seq": 0} and stored["oa-1"].time >= stored["oa-0"].time

    cfg = RunConfig(session_input_callback=session.input_callback)
    run(Runner.run(agent, "Where does Ben's sister live now?", session=session, run_config=cfg))
    second = model.inputs[1]
    assert is_workspace_item(second[0]) and second[0]["role"] == "system"
    ws = second[0]["content"]
    assert "Rotterdam" in ws and "kayak" not in ws  # picked for the new question; the turns shown are left out
    assert [m["role"] for m in second[1:]] == ["user", "assistant", "user"]
    assert second[-1]["content"] == "Where does Ben's sister live now?"
    assert "oa-2" in {t.turn_id for t in mem.turns("oa-run")}
    # the workspace item is never stored: the session holds the four messages only
    items = run(session.get_items())
    assert [is_workspace_item(i) for i in items] == [True, False, False, False, False]
    assert not any(WORKSPACE_HEADER in t.text for t in mem.turns("oa-run"))


def test_get_items_limit_and_workspace(mem):
    session = TrawMemSession("oa-limit", mem, token_budget=200)
    items = [{"role": "user", "content": "My sister Clara moved to Rotterdam."},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Good to know.", "annotations": []}],
              "type": "message", "id": "msg_1", "status": "completed"},
             {"type": "function_call", "name": "lookup", "arguments": "{}", "call_id": "c1", "id": "fc_1"},
             {"type": "function_call_output", "call_id": "c1", "output": "ok"},
             {"role": "user", "content": "Where does Clara live?"}]
    run(session.add_items(items))
    got = run(session.get_items())
    assert got == items  # faithful, tool items too; every turn is shown, so no workspace
    assert [t.turn_id for t in mem.turns("oa-limit")] == ["oa-0", "oa-1", "oa-4"]
    last2 = run(session.get_items(limit=2))
    assert is_workspace_item(last2[0]) and last2[1:] == items[-2:]
    assert "Rotterdam" in last2[0]["content"]  # the first user message, not in the returned items
    none = run(session.get_items(limit=0))  # nothing shown: every turn may be picked
    assert len(none) == 1 and all(f"[{t}]" in none[0]["content"] for t in ("oa-0", "oa-1", "oa-4"))


def test_pop_item_and_clear_session_leave_no_trace(mem, sample):
    session = TrawMemSession("oa-forget", mem)
    secret, other = "my locker code is 7311-ZEBRA", "the kettle is in the blue cupboard"
    run(session.add_items([{"role": "user", "content": other},
                           {"type": "function_call", "name": "f", "arguments": "{\"q\": \"QUOKKA-CALL\"}",
                            "call_id": "c9", "id": "fc_9"},
                           {"role": "user", "content": secret}]))
    assert files_holding(sample, "7311-ZEBRA") and files_holding(sample, "QUOKKA-CALL")
    popped = run(session.pop_item())
    assert popped == {"role": "user", "content": secret}
    assert files_holding(sample, "7311-ZEBRA") == []
    assert "oa-2" not in {t.turn_id for t in mem.turns("oa-forget")}
    assert "7311-ZEBRA" not in mem.select("oa-forget", "locker code", token_budget=500).text
    assert run(session.pop_item())["type"] == "function_call"
    assert files_holding(sample, "QUOKKA-CALL") == []
    run(session.clear_session())
    assert files_holding(sample, "blue cupboard") == [] and "oa-forget" not in mem
    assert run(session.get_items()) == [] and run(session.pop_item()) is None


def test_bad_input_names_the_field_and_stores_nothing(mem, sample):
    session = TrawMemSession("oa-bad", mem)
    run(session.add_items([{"role": "user", "content": "first"}]))
    n = len(mem.turns("oa-bad"))
    bad = [([{"role": "user", "content": "ok PELICAN"}, "not an item"], r"items\[1\]"),
           ([{"role": "user", "content": "ok PELICAN"}, {"role": "assistant", "content": "PELICAN" * 20000}],
            r"items\[1\].*text"),
           ([{"role": "user", "content": [{"type": "input_text", "text": 5}]}], r"items\[0\]\.content\[0\]\.text"),
           ([{"role": "user", "content": 3}], r"items\[0\]\.content"),
           ("PELICAN", r"^items")]
    for items, field in bad:
        with pytest.raises(InputError, match=field):
            run(session.add_items(items))
    assert len(mem.turns("oa-bad")) == n and files_holding(sample, "PELICAN") == []
    for kw, field in ((dict(session_id=""), "session_id"), (dict(token_budget=0), "token_budget"),
                      (dict(where={"n": {"gt": "x"}}), "where.n.gt"), (dict(role="tool"), "role")):
        with pytest.raises(InputError, match=field):
            TrawMemSession(**{"session_id": "s", "memory": mem, **kw})
    with pytest.raises(InputError, match="memory"):
        TrawMemSession("s", 42)


def test_recall_and_remember_tools_with_a_fake_model(mem):
    tools = memory_tools(mem, "oa-tools", token_budget=300)
    model = FakeModel([[call("remember", {"text": "Ana's bike is a green Bianchi."}, "r1")],
                       [call("recall", {"query": "What bike does Ana ride?"}, "q1")],
                       [call("remember", {"text": "   "}, "r2")],
                       [call("recall", {"query": ""}, "q2")],
                       [say("Done.")]])
    agent = Agent(name="assistant", model=model, tools=tools)
    session = TrawMemSession("oa-tools-chat", mem)
    out = run(Runner.run(agent, "Remember my bike, then recall it.", session=session))
    assert out.final_output == "Done."
    kinds = [i.get("type", "message") for i in run(session.get_items())]  # the tool calls are kept in order
    assert kinds == ["message"] + ["function_call", "function_call_output"] * 4 + ["message"]
    assert [t.text for t in mem.turns("oa-tools-chat")] == ["Remember my bike, then recall it.", "Done."]
    assert [t.turn_id for t in mem.turns("oa-tools")] == ["remember-r1"]
    assert mem.turns("oa-tools")[0].speaker == "memory"
    outputs = [i for i in model.inputs[-1] if i.get("type") == "function_call_output"]
    assert outputs[0]["output"] == "Remembered (turn remember-r1)."
    assert "green Bianchi" in outputs[1]["output"]
    assert outputs[2]["output"].startswith("error: text:")
    assert outputs[3]["output"].startswith("error: query:")
    assert len(mem.turns("oa-tools")) == 1


def test_an_add_whose_log_write_was_lost_is_repaired(mem, sample):
    from agents.memory.session import Session

    session = TrawMemSession("oa-lost", mem)
    assert isinstance(session, Session)
    run(session.add_items([{"role": "user", "content": "first message"}]))
    before = session._log.read()
    run(session.add_items([{"role": "user", "content": "a WOMBAT-LOST message"}]))
    session._log.write(before)  # the second call's turns are stored, its log write lost
    assert "oa-1" in {t.turn_id for t in mem.turns("oa-lost")}
    run(session.add_items([{"role": "user", "content": "another message"}]))  # oa-1 again, other content
    assert [(t.turn_id, t.text) for t in mem.turns("oa-lost")] == [("oa-0", "first message"),
                                                                   ("oa-1", "another message")]
    assert files_holding(sample, "WOMBAT-LOST") == []
    run(session.add_items([{"role": "user", "content": "another message"}]))  # a plain repeat: a new item
    assert [t.turn_id for t in mem.turns("oa-lost")][-1] == "oa-2"


def test_over_an_async_memory_and_a_damaged_log(mem):
    from trawmem_gpu.errors import BankError
    from trawmem_gpu.memory.aio import AsyncMemory

    session = TrawMemSession("oa-async", AsyncMemory.of(mem), role="developer")
    run(session.add_items([{"role": "user", "content": "Clara moved to Rotterdam."},
                           {"role": "user", "content": "Where is Clara?"}]))
    items = run(session.get_items(limit=1))
    assert items[0]["role"] == "developer" and "[oa-0]" in items[0]["content"]
    session._log.path.write_text("{not json", encoding="utf-8")
    with pytest.raises(BankError, match="item log"):
        run(session.get_items())
