"""``trawmem mcp`` writes to stderr only what is at least ``--log-level`` (default warning): an
add (which builds a BM25 index: bm25s logs DEBUG on a logger it sets to DEBUG itself) leaves
stderr with the one start line."""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed")

ROOT = Path(__file__).resolve().parents[2]


def test_the_stdio_server_logs_nothing_below_warning(tmp_path):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRAWMEM_CACHE": str(tmp_path / "cache")}
    params = StdioServerParameters(command=sys.executable, env=env, cwd=str(tmp_path),
                                   args=["-m", "trawmem_gpu.cli", "mcp", "--collection", str(tmp_path / "coll")])
    turns = [{"turn_id": "S1:1", "speaker": "Ana", "text": "We planned the hike.", "timestamp": "2031-06-01T09:00:00"}]

    async def go(errlog):
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=300) as c:
            r = await c.call_tool("add_turns", {"bank_id": "ana", "turns": turns})
            assert not r.is_error, r.content
            r = await c.call_tool("forget", {"bank_id": "ana", "bogus": 1})  # a refused call: logged at INFO
            assert r.is_error

    with open(tmp_path / "stderr.txt", "w") as errlog:
        asyncio.run(asyncio.wait_for(go(errlog), 600))
    lines = (tmp_path / "stderr.txt").read_text().splitlines()
    assert lines == [f"trawmem mcp: {tmp_path / 'coll'} on stdio (0 banks)"], lines


def test_the_log_level_flag(tmp_path):
    from trawmem_gpu.cli import build_parser

    p = build_parser(["mcp"])
    assert p.parse_args(["mcp", "--collection", "c"]).log_level == "warning"
    assert p.parse_args(["mcp", "--collection", "c", "--log-level", "debug"]).log_level == "debug"
