"""MCP tools and metadata: ``add_turns`` stores a turn's ``metadata``, ``recall`` takes a ``where``
filter (errors name the path inside it), and a key bound to a filter (``serve-key --where``)
recalls, adds and forgets only what passes it, whatever a call asks. The SDK's in-process client
over a real ``Memory``."""
from __future__ import annotations

import asyncio
import re

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed")


def _turns(user: str, n: int = 4) -> list[dict]:
    day = {"u1": 1, "u2": 11}.get(user, 21)
    return [{"turn_id": f"{user}:{i}", "speaker": "Ana", "text": f"{user} booked the pottery class ({i}).",
             "timestamp": f"2031-06-{day + i:02d}T09:00:00", "metadata": {"user_id": user, "n": i}} for i in range(n)]


def _calls(memory, tenant, *calls):
    from mcp import Client

    from trawmem_gpu.mcp.server import build_server

    async def go():
        async with Client(build_server(memory, lambda ctx: tenant)) as c:
            out = []
            for name, args in calls:
                r = await c.call_tool(name, args)
                text = re.sub(r"^Error executing tool \w+: ", "", " ".join(x.text for x in r.content))
                d = r.structured_content
                out.append((r.is_error, text if r.is_error else (d["result"] if set(d) == {"result"} else d)))
            return out

    return asyncio.run(asyncio.wait_for(go(), 300))


def test_recall_where_and_a_key_bound_to_a_filter(tmp_path, monkeypatch):
    from trawmem_gpu.data.filters import parse_filter
    from trawmem_gpu.memory import Memory
    from trawmem_gpu.serve.keys import LOCAL_TENANT, Tenant

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    mem = Memory(tmp_path / "coll")
    q = {"bank_id": "b", "question": "Who booked the pottery class?"}
    out = _calls(mem, LOCAL_TENANT, ("add_turns", {"bank_id": "b", "turns": _turns("u1") + _turns("u2")}),
                 ("recall", {**q, "where": {"user_id": "u2", "n": {"gte": 2}}}),
                 ("recall", {**q, "where": {"n": {"gt": "two"}}}),
                 ("recall", {**q, "where": {"and": [{}] * 30_000}}),  # 90 KB: over the size bound
                 ("add_turns", {"bank_id": "b", "turns": [dict(_turns("u3", 1)[0], metadata={"user_id": None})]}))
    assert not out[0][0] and out[0][1]["appended"] == 8
    assert not out[1][0] and out[1][1]["unit_ids"] and set(out[1][1]["unit_ids"]) <= {"u2:2", "u2:3"}
    assert out[2] == (True, "where.n.gt: expected a number or an ISO 8601 date, got 'two' (gt compares numbers "
                            "and dates only)")
    assert out[3] == (True, "where: the filter is over 65536 bytes as JSON (the limit)")
    assert not out[4][0] and out[4][1]["refused"][0]["field"] == "turns[0].metadata.user_id"

    u1 = Tenant("u1", ("*",), True, None, parse_filter({"user_id": "u1"}))
    out = _calls(mem, u1, ("recall", q), ("recall", {**q, "where": {"or": [{"user_id": "u2"}, {"n": {"gte": 0}}]}}),
                 ("recall", {**q, "where": {"user_id": "u2"}}),
                 ("add_turns", {"bank_id": "b", "turns": [dict(_turns("u2", 1)[0], turn_id="u2:new")]}),
                 ("forget", {"bank_id": "b", "turn_ids": ["u2:0", "u1:0"]}), ("forget_bank", {"bank_id": "b"}))
    for err, ws in out[:2]:
        assert not err and ws["unit_ids"] and all(u.startswith("u1:") for u in ws["unit_ids"]), ws
    assert out[2] == (False, {**out[2][1], "unit_ids": []})  # narrowed to nothing, never widened
    assert out[3][0] and out[3][1].startswith("turns[0].metadata: does not pass this API key's filter")
    assert out[4] == (False, {"bank_id": "b", "forgotten": ["u1:0"], "missing": ["u2:0"], "deleted": False})
    assert out[5][0] and "forgets turns by id" in out[5][1]
    held = {t.turn_id for t in mem.turns("b")}
    assert "u2:0" in held and "u1:0" not in held and "u2:new" not in held
