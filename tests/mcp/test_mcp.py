"""``trawmem mcp`` driven by the mcp SDK's own client: over stdio (the command as a subprocess, as a
desktop assistant starts it) and over streamable HTTP with tenant keys."""
from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

ROOT = Path(__file__).resolve().parents[2]
MARK = "Zorblax quartz tulip"  # a made-up marker: recalled, then forgotten
TOOLS = {"add_turns", "recall", "forget", "forget_bank", "list_banks"}


def _turns(n0: int = 1) -> list[dict]:
    texts = ["We planned the hike for Saturday.", f"My locker code is {MARK} 4411, don't tell anyone.",
             "The weather looks fine for the hike.", "Bring water and a map, please."]
    return [{"turn_id": f"S1:{n0 + i}", "speaker": "Ana" if i % 2 == 0 else "Ben", "text": t,
             "timestamp": f"2031-06-0{1 + i // 2}T09:0{i}:00"} for i, t in enumerate(texts)]


def _data(result):
    """A tool result's structured content (the SDK wraps a list result as {"result": [...]})."""
    assert not result.is_error, result.content
    d = result.structured_content
    return d["result"] if set(d) == {"result"} else d


def _error(result) -> str:
    """A tool error's text, without the SDK's "Error executing tool NAME: " prefix."""
    assert result.is_error
    return re.sub(r"^Error executing tool \w+: ", "", " ".join(c.text for c in result.content))


async def _exercise(client, bank: str, others_bank: str | None):
    """The same conversation over any transport: add, recall, forget, list; a foreign bank is invisible."""
    tools = await client.list_tools()
    assert {t.name for t in tools.tools} >= TOOLS
    recall = next(t for t in tools.tools if t.name == "recall")
    assert "token_budget" in recall.input_schema["properties"]

    added = _data(await client.call_tool("add_turns", {"bank_id": bank, "turns": _turns()}))
    assert added["created"] and added["appended"] == 4 and added["n_units"] == 4
    ws = _data(await client.call_tool("recall", {"bank_id": bank, "question": "What is the locker code?",
                                                 "token_budget": 200}))
    assert MARK in ws["text"] and "S1:2" in ws["unit_ids"] and 0 < ws["tokens"] <= 200
    assert bank in {b["bank_id"] for b in _data(await client.call_tool("list_banks", {}))}
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Pack the red tent.", "id": "m1",
             "timestamp": "2031-06-02T10:00:00"}, {"role": "user", "content": [{"type": "image_url"}], "id": "m2"}]
    got = _data(await client.call_tool("add_turns", {"bank_id": bank, "messages": chat, "speakers": {"user": "Ana"}}))
    assert got["stored"] == ["m1"] and [x["status"] for x in got["items"]] == ["skipped", "stored", "refused"]
    assert got["refused"][0]["field"] == "messages[2].content[0].type"

    f = _data(await client.call_tool("forget", {"bank_id": bank, "turn_ids": ["S1:2"]}))
    assert f["forgotten"] == ["S1:2"] and not f["deleted"]
    ws = _data(await client.call_tool("recall", {"bank_id": bank, "question": "What is the locker code?"}))
    assert MARK not in ws["text"] and "S1:2" not in ws["unit_ids"] and ws["unit_ids"]

    missing = _error(await client.call_tool("recall", {"bank_id": bank + "-nope", "question": "hike?"}))
    assert missing == f"unknown bank id {bank + '-nope'!r}"
    if others_bank is not None:  # exists, but is another tenant's: answered as a missing bank
        foreign = _error(await client.call_tool("recall", {"bank_id": others_bank, "question": "hike?"}))
        assert foreign == f"unknown bank id {others_bank!r}"
        assert others_bank not in {b["bank_id"] for b in _data(await client.call_tool("list_banks", {}))}
        assert _error(await client.call_tool("forget_bank", {"bank_id": others_bank})) == foreign

    assert "token_budget" in _error(await client.call_tool("recall", {"bank_id": bank, "question": "q",
                                                                        "token_budget": 0}))
    gone = _data(await client.call_tool("forget_bank", {"bank_id": bank}))
    assert gone["deleted"] and gone["forgotten"] == ["S1:1", "S1:3", "S1:4", "m1"]
    assert bank not in {b["bank_id"] for b in _data(await client.call_tool("list_banks", {}))}
    assert _error(await client.call_tool("recall", {"bank_id": bank, "question": "hike?"})) == \
        f"unknown bank id {bank!r}"


def test_stdio_server_as_a_desktop_assistant_starts_it(tmp_path):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    coll = tmp_path / "coll"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRAWMEM_CACHE": str(tmp_path / "cache")}
    params = StdioServerParameters(command=sys.executable, env=env, cwd=str(tmp_path),
                                   args=["-m", "trawmem_gpu.cli", "mcp", "--collection", str(coll),
                                         "--banks", "ana-*"])

    async def go():
        async with Client(params, read_timeout_seconds=300) as c:
            await _exercise(c, "ana-hike", None)
            # outside --banks: invisible, and not creatable
            err = _error(await c.call_tool("add_turns", {"bank_id": "zed-1", "turns": _turns()}))
            assert err == "unknown bank id 'zed-1'"

    asyncio.run(asyncio.wait_for(go(), 600))
    assert (coll / "collection.json").exists()
    blob = b"".join(p.read_bytes() for p in coll.rglob("*") if p.is_file())
    assert MARK.encode() not in blob


@pytest.fixture
def http_server(tmp_path):
    """``trawmem mcp --http`` with a keys file (``ana`` and ``zed`` read-write, ``ana-ro``), on
    127.0.0.1 and a free port; ``zed-1`` already holds a bank."""
    from trawmem_gpu.mcp.server import http_app
    from trawmem_gpu.memory import Memory
    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.serve.keys import KeyStore, add_key
    from trawmem_gpu.serve.server import BackgroundServer

    keys_file = tmp_path / "keys.json"
    keys = {"ana": add_key(keys_file, "ana", ["ana-*"], True), "ro": add_key(keys_file, "ana-ro", ["ana-*"], False),
            "zed": add_key(keys_file, "zed", ["zed-*"], True)}
    mem = Memory(tmp_path / "coll")
    mem.add("zed-1", _turns())
    with BackgroundServer(http_app(mem, KeyStore.load(keys_file)), ServeConfig()) as srv:
        yield srv.url + "/mcp", keys, mem


def _http_client(url: str, key: str | None):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=300)
    return Client(streamable_http_client(url, http_client=http)), http


def test_streamable_http_with_tenant_keys(http_server):
    import httpx

    url, keys, mem = http_server

    async def as_(key, fn):
        client, http = _http_client(url, key)
        try:
            async with client as c:
                return await fn(c)
        finally:
            await http.aclose()

    async def go():
        await as_(keys["ana"], lambda c: _exercise(c, "ana-hike", "zed-1"))

        async def read_only(c):
            assert _error(await c.call_tool("add_turns", {"bank_id": "ana-x", "turns": _turns()})) == \
                "this API key is read-only"
            assert _error(await c.call_tool("forget_bank", {"bank_id": "zed-1"})) == "unknown bank id 'zed-1'"
            return _data(await c.call_tool("list_banks", {}))
        assert await as_(keys["ro"], read_only) == []

        async def owner(c):
            return _data(await c.call_tool("recall", {"bank_id": "zed-1", "question": "What is the locker code?"}))
        assert MARK in (await as_(keys["zed"], owner))["text"]

    asyncio.run(asyncio.wait_for(go(), 600))
    assert "zed-1" in mem and "ana-hike" not in mem
    # no key, or a wrong one: 401 before the MCP layer, as `trawmem serve` answers
    init = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    for hdr in ({}, {"Authorization": "Bearer nope"}, {"X-API-Key": keys["zed"] + "x"}):
        r = httpx.post(url, json=init, headers={"accept": "application/json, text/event-stream", **hdr}, timeout=60)
        assert r.status_code == 401 and json.loads(r.text) == {"detail": "missing or invalid API key"}


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    from trawmem_gpu.cli import main

    for argv, msg in ((["--http", "--host", "0.0.0.0"], "without --keys"), (["--keys", "k.json"], "for --http"),
                      (["--http", "--keys", "k.json", "--banks", "a-*"], "without --keys")):
        assert main(["mcp", "--collection", str(tmp_path / "c"), *argv]) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1


def test_the_http_command_serves_with_its_keys_file(tmp_path):
    """`trawmem mcp --http --keys FILE` as a process: it loads the keys and answers on /mcp."""
    import socket
    import subprocess
    import time

    import httpx

    from trawmem_gpu.serve.keys import add_key

    keys_file = tmp_path / "keys.json"
    key = add_key(keys_file, "ana", ["ana-*"], True)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRAWMEM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "mcp", "--collection", str(tmp_path / "c"),
                             "--http", "--port", str(port), "--keys", str(keys_file)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        for _ in range(600):  # bounded: at most ~5 min for the encoder to load
            try:
                if httpx.post(url, json={}, timeout=5).status_code == 401:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.5)

        async def go():
            client, http = _http_client(url, key)
            try:
                async with client as c:
                    assert {t.name for t in (await c.list_tools()).tools} >= TOOLS
                    return _data(await c.call_tool("list_banks", {}))
            finally:
                await http.aclose()
        assert asyncio.run(asyncio.wait_for(go(), 300)) == []
    finally:
        proc.terminate()
        proc.wait(60)
