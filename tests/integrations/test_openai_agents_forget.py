"""Forgets through other doors reach the OpenAI Agents session: its item log keeps no message text,
so a turn or bank forgotten by ``Memory.forget`` leaves the text in no file and the item is gone."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("agents")

from trawmem_gpu.integrations.openai_agents import TrawMemSession  # noqa: E402
from trawmem_gpu.memory import Memory  # noqa: E402

SECRET = "Zorblax the parrot lives in Quillhaven"
HANG_GUARD_S = 600


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, HANG_GUARD_S))


def files_holding(root: Path, text: str) -> list[Path]:
    needle = text.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def items_of(session) -> list[dict]:
    return [it for it in run(session.get_items()) if it.get("role") != "system"]


@pytest.fixture
def session_with_secret(tmp_path):
    mem = Memory(tmp_path)
    s = TrawMemSession("chat-1", mem)
    run(s.add_items([{"role": "user", "content": "Hello there, how are you today?"},
                     {"type": "function_call", "name": "lookup", "arguments": "{}", "call_id": "c1"},
                     {"role": "user", "content": [{"type": "input_text", "text": SECRET},
                                                  {"type": "input_text", "text": "second part\nwith a line"}]}]))
    return tmp_path, mem, s


def test_log_keeps_no_text_and_get_items_rebuilds_the_messages(session_with_secret):
    root, mem, s = session_with_secret
    assert [p.name for p in files_holding(root, SECRET) if ".sessions" in p.parts] == []
    items = items_of(s)
    assert items[0]["content"] == "Hello there, how are you today?"
    assert items[1]["type"] == "function_call"
    assert items[2]["content"] == [{"type": "input_text", "text": SECRET},
                                   {"type": "input_text", "text": "second part\nwith a line"}]


def test_memory_forget_of_one_turn_reaches_the_session(session_with_secret):
    root, mem, s = session_with_secret
    mem.forget("chat-1", ["oa-2"])
    assert files_holding(root, SECRET) == []
    items = items_of(s)
    assert [it.get("type", "message") for it in items] == ["message", "function_call"]
    assert all(SECRET not in str(it) for it in items)


def test_memory_forget_of_the_bank_reaches_the_session(session_with_secret):
    root, mem, s = session_with_secret
    mem.forget("chat-1")
    assert files_holding(root, SECRET) == []
    assert all(it.get("type", "message") != "message" for it in items_of(s))


def test_cli_forget_reaches_the_session(session_with_secret):
    from trawmem_gpu.cli import main

    root, mem, s = session_with_secret
    assert main(["forget", "--collection", str(root), "--bank", "chat-1", "--turns", "oa-2"]) in (0, None)
    assert files_holding(root, SECRET) == []
    s2 = TrawMemSession("chat-1", Memory(root))
    assert all(SECRET not in str(it) for it in items_of(s2))
    assert len([it for it in items_of(s2) if it.get("type", "message") == "message"]) == 1
