"""The MCP tools' arguments: an unknown one is refused (never dropped), a whole-bank forget is its
own tool (a missing or misspelled ``turn_ids`` is an error, not "the whole bank"), writes carry the
caps of ``trawmem serve``, and every refusal is a tool error naming the field and the reason.

The tools run over a stand-in memory that records its calls (so a refused call is seen to reach
nothing) through the SDK's in-process client; one test replays the attack on a real ``Memory``."""
from __future__ import annotations

import asyncio
import re

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed")

from trawmem_gpu.errors import InputError  # noqa: E402

TOOLS = ("add_turns", "recall", "forget", "forget_bank", "list_banks")


class Recorder:
    """A stand-in ``Memory``: records each call; ``fail`` is raised by the next one."""

    def __init__(self):
        self.calls, self.fail = [], None

    def _call(self, *call):
        self.calls.append(call)
        if self.fail is not None:
            raise self.fail

    def add(self, bank_id, turns=None, **kw):
        self._call("add", bank_id, len(turns))
        ids = [t["turn_id"] for t in turns]
        return {"bank_id": bank_id, "n_units": len(turns), "n_threads": 1, "created": True, "appended": len(turns),
                "stored": ids, "already_stored": [], "refused": [],
                "items": [{"index": i, "status": "stored", "turn_id": t} for i, t in enumerate(ids)]}

    def forget(self, bank_id, turn_ids):
        self._call("forget", bank_id, turn_ids)
        return {"forgotten": turn_ids or ["S1:1", "S1:2"], "missing": [], "deleted": turn_ids is None}

    def banks(self):
        self._call("banks")
        return [{"bank_id": "acme-2", "n_units": 2, "n_threads": 1}]


def _turns(n: int) -> list[dict]:
    return [{"turn_id": f"S1:{i}", "speaker": "Ana", "text": "hello", "timestamp": "2031-06-01T09:00:00"}
            for i in range(n)]


def _calls(memory, *calls):
    """[(is_error, text or structured content)] of ``calls`` ((tool, arguments) pairs), and the tools."""
    from mcp import Client

    from trawmem_gpu.mcp.server import build_server
    from trawmem_gpu.serve.keys import LOCAL_TENANT

    async def go():
        async with Client(build_server(memory, lambda ctx: LOCAL_TENANT)) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            out = []
            for name, args in calls:
                r = await c.call_tool(name, args)
                text = re.sub(r"^Error executing tool \w+: ", "", " ".join(x.text for x in r.content))
                out.append((r.is_error, text if r.is_error else r.structured_content))
            return out, tools

    return asyncio.run(asyncio.wait_for(go(), 120))


def test_every_tool_advertises_and_enforces_no_extra_arguments():
    valid = {"add_turns": {"bank_id": "acme-2", "turns": _turns(1)}, "recall": {"bank_id": "acme-2", "question": "q"},
             "forget": {"bank_id": "acme-2", "turn_ids": ["S1:1"]}, "forget_bank": {"bank_id": "acme-2"},
             "list_banks": {}}
    mem = Recorder()
    out, tools = _calls(mem, *((name, {**args, "bogus_arg": 1}) for name, args in valid.items()))
    assert set(tools) == set(TOOLS)
    for name in TOOLS:
        assert tools[name].input_schema["additionalProperties"] is False, name
    takes = {"add_turns": "bank_id, turns, messages, speakers, roles, atomic",
             "recall": "bank_id, question, token_budget, date, as_of, where",
             "forget": "bank_id, turn_ids", "forget_bank": "bank_id", "list_banks": "none"}
    for (err, text), name in zip(out, valid):
        assert err and text == f"bogus_arg: unknown argument (takes {takes[name]})", (name, text)
    assert mem.calls == []  # nothing reached the memory


def test_a_misspelled_turn_ids_forgets_nothing():
    mem = Recorder()
    out, tools = _calls(mem, ("forget", {"bank_id": "acme-2", "turns_ids_typo": ["M7"]}),
                        ("forget", {"bank_id": "acme-2"}), ("forget", {"bank_id": "acme-2", "turn_ids": []}),
                        ("forget", {"bank_id": "acme-2", "turn_ids": None}))
    assert out[0] == (True, "turn_ids: required (forget_bank forgets a whole bank); "
                            "turns_ids_typo: unknown argument (takes bank_id, turn_ids)")
    assert out[1] == (True, "turn_ids: required (forget_bank forgets a whole bank)")
    assert out[2][0] and out[2][1].startswith("turn_ids: List should have at least 1 item")
    assert out[3][0] and out[3][1].startswith("turn_ids: ")
    assert mem.calls == []
    assert tools["forget"].input_schema["required"] == ["bank_id", "turn_ids"]
    assert tools["forget"].annotations.destructive_hint and tools["forget_bank"].annotations.destructive_hint
    assert tools["recall"].annotations.read_only_hint and tools["list_banks"].annotations.read_only_hint


def test_a_whole_bank_forget_is_its_own_tool():
    mem = Recorder()
    out, tools = _calls(mem, ("forget_bank", {"bank_id": "acme-2"}),
                        ("forget", {"bank_id": "acme-2", "turn_ids": ["S1:1", "S1:1"]}))
    assert out[0] == (False, {"bank_id": "acme-2", "forgotten": ["S1:1", "S1:2"], "missing": [], "deleted": True})
    assert not out[1][0]
    assert mem.calls == [("forget", "acme-2", None), ("forget", "acme-2", ["S1:1"])]
    assert tools["forget_bank"].input_schema["required"] == ["bank_id"]


def test_writes_carry_the_caps_of_the_http_server():
    from trawmem_gpu.data.types import MAX_ID_CHARS
    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.data.types import MAX_TEXT_CHARS
    from trawmem_gpu.select.params import SERVED_LIMITS
    from trawmem_gpu.serve.models import MAX_FORGET_IDS

    cap = ServeConfig.max_turns_per_append
    mem = Recorder()
    out, tools = _calls(
        mem, ("add_turns", {"bank_id": "acme-2", "turns": _turns(cap + 1)}),
        ("add_turns", {"bank_id": "acme-2", "turns": _turns(cap)}),
        ("add_turns", {"bank_id": "acme-2", "turns": []}),
        ("add_turns", {"bank_id": "acme-2", "turns": [{**_turns(1)[0], "text": "x" * (MAX_TEXT_CHARS + 1)}]}),
        ("add_turns", {"bank_id": "a" * (MAX_ID_CHARS + 1), "turns": _turns(1)}),
        ("forget", {"bank_id": "acme-2", "turn_ids": [f"t{i}" for i in range(MAX_FORGET_IDS + 1)]}),
        ("recall", {"bank_id": "acme-2", "question": "q" * (SERVED_LIMITS.max_question_chars + 1)}),
        ("recall", {"bank_id": "acme-2", "question": "q", "token_budget": SERVED_LIMITS.max_token_budget + 1}))
    assert out[0] == (True, f"turns: List should have at most {cap} items after validation, not {cap + 1}")
    assert not out[1][0] and out[1][1]["appended"] == cap
    assert out[2][0] and out[2][1].startswith("turns: List should have at least 1 item")
    assert not out[3][0]  # one turn's field: the memory answers it per item (refused, naming turns[0].text)
    assert out[4] == (True, f"bank_id: String should have at most {MAX_ID_CHARS} characters")
    assert out[5][0] and out[5][1].startswith(f"turn_ids: List should have at most {MAX_FORGET_IDS} items")
    assert out[6][0] and out[6][1].startswith("question: String should have at most")
    assert out[7][0] and out[7][1].startswith(f"token_budget: Input should be less than or equal to "
                                              f"{SERVED_LIMITS.max_token_budget}")
    assert mem.calls == [("add", "acme-2", cap), ("add", "acme-2", 1)]
    schema = tools["add_turns"].input_schema["properties"]["turns"]
    schema = next(x for x in schema.get("anyOf", [schema]) if x.get("type") == "array")
    assert (schema["minItems"], schema["maxItems"]) == (1, cap)


def test_package_errors_are_tool_errors_in_field_terms():
    from pydantic import BaseModel, Field, ValidationError

    from trawmem_gpu.errors import UnknownBank

    class Turn(BaseModel):
        session: int = Field(ge=0, le=2 ** 31)

    try:
        Turn(session=10 ** 30)
    except ValidationError as e:
        schema_error = e
    answers = []
    for fail in (InputError("turns[0]: field 'timestamp': unparseable date 'garbage'"), schema_error,
                 UnknownBank("acme-2", detail=" (the collection holds 'acme-1', 'acme-3')")):
        mem = Recorder()
        mem.fail = fail
        (answer,), _ = _calls(mem, ("add_turns", {"bank_id": "acme-2", "turns": _turns(1)}))
        answers.append(answer)
    assert answers[0] == (True, "turns[0]: field 'timestamp': unparseable date 'garbage'")
    assert answers[1] == (True, "session: Input should be less than or equal to 2147483648")
    assert answers[2] == (True, "unknown bank id 'acme-2'")  # never what else the collection holds


def test_the_attack_on_a_real_memory_keeps_the_bank(tmp_path, monkeypatch):
    """``forget`` with ``turns_ids_typo`` answered OK with every turn forgotten; now the bank stays."""
    from trawmem_gpu.memory import Memory

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    mem = Memory(tmp_path / "coll")
    mem.add("acme-2", _turns(3))
    out, _ = _calls(mem, ("forget", {"bank_id": "acme-2", "turns_ids_typo": ["S1:1"]}),
                    ("forget", {"bank_id": "acme-2"}), ("list_banks", {}))
    assert out[0][0] and "turns_ids_typo: unknown argument" in out[0][1]
    assert out[1][0] and "turn_ids: required" in out[1][1]
    assert out[2] == (False, {"result": [{"bank_id": "acme-2", "n_units": 3, "n_threads": 1}]})
    (gone,), _ = _calls(mem, ("forget_bank", {"bank_id": "acme-2"}))
    assert gone == (False, {"bank_id": "acme-2", "forgotten": ["S1:0", "S1:1", "S1:2"], "missing": [],
                            "deleted": True})
    assert "acme-2" not in mem


def test_add_turns_refuses_an_item_that_is_not_an_object_alone(tmp_path, monkeypatch):
    """``"turns": [1, "x", null, turn]`` refused the whole call ("Input should be a valid
    dictionary" three times, the valid turn not stored); now, as over HTTP, each non-object item is
    refused alone, naming its place and what it is, and the valid one is stored; with atomic the
    call is refused and nothing stored (issue 42 item 7)."""
    from trawmem_gpu.memory import Memory

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    mem = Memory(tmp_path / "coll")
    msg = {"role": "user", "content": "hello"}
    out, tools = _calls(mem, ("add_turns", {"bank_id": "b1", "turns": [1, "x", None, *_turns(1)]}),
                        ("add_turns", {"bank_id": "b1", "messages": [[msg], msg]}),
                        ("add_turns", {"bank_id": "b2", "turns": [7, *_turns(1)], "atomic": True}))
    (err1, turns), (err2, messages), (err3, atomic) = out
    assert not err1 and turns["stored"] == ["S1:0"]
    assert [(r["index"], r["field"]) for r in turns["refused"]] == [(0, "turns[0]"), (1, "turns[1]"), (2, "turns[2]")]
    assert [r["reason"].rsplit(" ", 1)[-1] for r in turns["refused"]] == ["int", "str", "NoneType"]
    assert all(r["reason"].startswith("expected a dict") for r in turns["refused"])
    assert [i["status"] for i in turns["items"]] == ["refused", "refused", "refused", "stored"]
    assert not err2 and messages["appended"] == 1 and messages["refused"][0]["field"] == "messages[0]"
    assert "expected a message" in messages["refused"][0]["reason"]
    assert err3 and "turns[0]" in atomic and "b2" not in mem
    # the tool still advertises objects: the schema of a turn, not "any value"
    assert tools["add_turns"].input_schema["properties"]["turns"]["anyOf"][0]["items"]["type"] == "object"
    assert mem.history("b1", "S1:0")
