"""A key bound to a filter (``serve-key --where``) sees only what passes it, through every route of
the HTTP app and every MCP tool (issue 42, item 3; ``memory.scope``): in a bank shared by users
u1, u2 and u3, the u1 key's answers and errors hold no other user's turn id, text or date, and
every count and date range is that of u1's turns.

The routes are read from the app's route table and the tools from the MCP server's list, so a new
route or tool without a case here fails the test.
"""
from __future__ import annotations

import asyncio
import json
import re

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

USERS = ("u1", "u2", "u3")
TOPICS = ("the pottery class", "the harbour job", "the Lyon flat", "a grey cat", "the marathon", "Clara's wedding")


def _shared_turns() -> list[dict]:
    """Three sessions of six turns, users u1, u2, u3 in turn (u3 holds each session's last turn)."""
    out = []
    for s in (1, 2, 3):
        for i in range(1, 7):
            user = USERS[(i - 1) % 3]
            out.append({"turn_id": f"S{s}:{i}", "speaker": f"Speaker-{user}", "session": s,
                        "text": f"{user} says PRIVATE-{user} about {TOPICS[(i + s) % len(TOPICS)]} ({s}.{i}).",
                        "timestamp": f"2024-0{s + 2}-1{s}T09:0{i}:00", "metadata": {"user_id": user}})
    return out


def _import_body() -> str:
    """An export of bank ``shared`` holding a u1 turn and a u3 turn (after the bank's last turn)."""
    lines = [{"format": "trawmem-export", "version": 1}, {"type": "bank", "bank_id": "shared", "n_turns": 2}]
    lines += [{"type": "turn", "bank_id": "shared", "id": f"{u}-imp", "speaker": f"Speaker-{u}", "session": 3,
               "text": f"{u} imports PRIVATE-{u} about the harbour job.", "date": "2024-05-13T09:06:30",
               "metadata": {"user_id": u}} for u in ("u1", "u3")]
    return "".join(json.dumps(x) + "\n" for x in lines)


def _others(bank, sent=()) -> list[str]:
    """What must never reach the u1 key: other users' ids (but those it sent), texts and times."""
    out = []
    for t in bank.turns:
        if (t.metadata or {}).get("user_id") != "u1":
            out += [t.time.isoformat(), t.timestamp] + ([] if t.turn_id in sent else [t.turn_id])
    return out + ["PRIVATE-u2", "PRIVATE-u3"]


def _mine(bank) -> dict:
    """u1's counts and dates, computed here (not by the code under test)."""
    th = bank.unit_thread
    idx = [i for i, t in enumerate(bank.turns) if (t.metadata or {}).get("user_id") == "u1"]
    times = sorted(bank.turns[i].time for i in idx)
    return {"n_units": len(idx), "n_threads": len({int(th[i]) for i in idx}),
            "n_sessions": len({bank.turns[i].session for i in idx}),
            "first_date": times[0].isoformat(), "last_date": times[-1].isoformat()}


def _check(answer: str, bank, mine: dict, sent=()) -> None:
    """No other user's id, text or date in ``answer``; every count field equals u1's."""
    for s in _others(bank, sent):
        assert not re.search(rf"(?<![\w:]){re.escape(s)}(?![\w:])", answer), (s, answer[:2000])

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in mine and not isinstance(v, (dict, list)):  # (the OpenAPI document: schemas)
                    assert v == mine[k], (k, v, mine, answer[:2000])
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    try:
        walk(json.loads(answer))
    except json.JSONDecodeError:  # /metrics, the docs page: text only
        pass


def test_a_bound_key_sees_only_its_own_turns_through_every_route(tmp_path, monkeypatch):
    from serve_util import running  # noqa: F401 - the package's test helpers on the path

    from trawmem_gpu.memory import Memory
    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.serve.keys import add_key
    from trawmem_gpu.serve.server import BackgroundServer, build_app

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    keys = tmp_path / "keys.json"
    admin = add_key(keys, "admin", ["*"], writable=True)
    u1 = add_key(keys, "u1", ["*"], writable=True, where={"user_id": "u1"})
    cfg = ServeConfig(collection=str(tmp_path / "c"), keys_file=str(keys), max_wait_ms=1)
    app, service = build_app(cfg)
    routes = {(m, r.path) for r in app.routes for m in (getattr(r, "methods", None) or ()) if m != "HEAD"}
    turn = lambda tid, ts, text="u1 adds a line about the pottery class.": {  # noqa: E731
        "turn_id": tid, "speaker": "Speaker-u1", "text": text, "timestamp": ts, "session": 3,
        "metadata": {"user_id": "u1"}}
    # per route, the u1 key's requests: (method, path, body, ids it sends, expected status)
    cases = {
        ("POST", "/v1/select"): [("POST", "/v1/select", {"bank_id": "shared", "question": q, **w}, (), 200)
                                 for q in ("What did u2 say about the harbour job?", "Who spoke of the Lyon flat?")
                                 for w in ({}, {"where": {"user_id": "u2"}}, {"where": {"not": {"user_id": "u1"}}})],
        ("POST", "/v1/select/batch"): [("POST", "/v1/select/batch", {"requests": [
            {"bank_id": "shared", "question": "the marathon?"}, {"bank_id": "shared", "question": "a grey cat?",
                                                                  "where": {"user_id": "u3"}}]}, (), 200)],
        ("POST", "/v1/banks/{bank_id:bank}/turns"): [
            # another user's id: refused as an id held "with other content", never whose, what or when
            ("POST", "/v1/banks/shared/turns", {"turns": [turn("S1:2", "2024-05-13T09:08:00")]}, ("S1:2",), 200),
            ("POST", "/v1/banks/shared/turns", {"turns": [turn("S1:2", "2024-05-13T09:08:00")], "atomic": True},
             ("S1:2",), 409),
            # older than the bank's last turn (a u3 turn): stored at its place in time (issue 45), a retry too
            ("POST", "/v1/banks/shared/turns", {"turns": [turn("u1-old", "2024-05-13T09:05:30")]}, (), 200),
            ("POST", "/v1/banks/shared/turns", {"turns": [turn("u1-old", "2024-05-13T09:05:30")], "atomic": True},
             (), 200),
            ("POST", "/v1/banks/shared/turns", {"turns": [turn("u1-new", "2024-05-13T09:07:00")]}, (), 200),
            # a chat message's assigned id (msg-<n>) counts the key's own turns, not the bank's
            ("POST", "/v1/banks/shared/turns", {"messages": [{"role": "user", "content": "u1 asks about a grey cat.",
                                                              "metadata": {"user_id": "u1"}}]}, (), 200),
            ("POST", "/v1/banks/shared/turns", {"turns": [dict(turn("S2:3", "2024-05-13T09:09:00"),
                                                               metadata={"user_id": "u3"})]}, ("S2:3",), 403)],
        ("GET", "/v1/banks"): [("GET", "/v1/banks", None, (), 200)],
        ("GET", "/v1/banks/{bank_id:bank}/export"): [("GET", "/v1/banks/shared/export", None, (), 200)],
        # an export of one u1 turn and one u3 turn: the u3 turn is refused, by its id alone
        ("POST", "/v1/banks/{bank_id:bank}/import"): [("POST", "/v1/banks/shared/import", _import_body(), ("u3-imp",),
                                                       200)],
        ("GET", "/v1/banks/{bank_id:bank}"): [("GET", "/v1/banks/shared", None, (), 200)],
        ("GET", "/v1/banks/{bank_id:bank}/units/{unit_id:path}/history"): [
            ("GET", "/v1/banks/shared/units/S1:1/history", None, (), 200),
            ("GET", "/v1/banks/shared/units/S3:6/history", None, ("S3:6",), 404),
            ("GET", "/v1/banks/shared/units/S3:5/history", None, ("S3:5",), 404)],
        ("DELETE", "/v1/banks/{bank_id:bank}"): [("DELETE", "/v1/banks/shared", None, (), 403)],
        ("DELETE", "/v1/banks/{bank_id:bank}/turns/{turn_id:path}"): [
            ("DELETE", "/v1/banks/shared/turns/S2:2", None, ("S2:2",), 404),
            ("DELETE", "/v1/banks/shared/turns/S2:1", None, (), 200)],
        ("POST", "/v1/banks/{bank_id:bank}/forget"): [
            ("POST", "/v1/banks/shared/forget", {"turn_ids": ["S1:4", "S1:5"]}, ("S1:5",), 200)],
        ("GET", "/healthz"): [("GET", "/healthz", None, (), 200)],
        ("GET", "/readyz"): [("GET", "/readyz", None, (), 200)],
        ("GET", "/metrics"): [("GET", "/metrics", None, (), 200)],
    }
    docs = {k for k in routes if k[1].startswith(("/openapi", "/docs", "/redoc"))}
    assert routes - docs - set(cases) == set(), "a route without a bound-key case here"
    with BackgroundServer(app, cfg) as srv:
        c = httpx.Client(base_url=srv.url, timeout=120)
        call = lambda key, m, p, body=None: c.request(  # noqa: E731
            m, p, json=None if isinstance(body, str) else body, content=body if isinstance(body, str) else None,
            headers={"Authorization": f"Bearer {key}"})
        r = call(admin, "POST", "/v1/banks/shared/turns", {"turns": _shared_turns()})
        assert r.status_code == 200 and r.json()["appended"] == 18, r.text
        bank = lambda: service.registry.get("shared")  # noqa: E731
        # another process forgets u2's and u3's turns of session 1 beside the server
        Memory(tmp_path / "c").forget("shared", ["S1:3", "S1:6"])
        answers = {}
        for key in [*sorted(cases), *sorted(docs)]:
            for m, p, body, sent, status in cases.get(key, [(key[0], key[1], None, (), 200)]):
                before = bank()
                r = call(u1, m, p, body)
                assert r.status_code == status, (m, p, r.text)
                answers[(m, p, json.dumps(body))] = r
                _check(r.text, before, _mine(bank()), sent)
                _check(r.text, bank(), _mine(bank()), sent)
        got = lambda m, p, body=None: answers[(m, p, json.dumps(body))].json()  # noqa: E731
        # the forget answers only its own id (not S1:3 and S1:6, gone beside; not u2's S1:5)
        assert got("POST", "/v1/banks/shared/forget", {"turn_ids": ["S1:4", "S1:5"]})["forgotten"] == ["S1:4"]
        assert got("POST", "/v1/banks/shared/forget", {"turn_ids": ["S1:4", "S1:5"]})["missing"] == ["S1:5"]
        msg = got("POST", "/v1/banks/shared/turns", {"messages": [{
            "role": "user", "content": "u1 asks about a grey cat.", "metadata": {"user_id": "u1"}}]})
        assert msg["stored"] == [f"msg-{msg['n_units']}"], msg  # its own turns' count, this one included
        # a held id is refused alike whoever holds it: another user's, or its own with other content
        other = got("POST", "/v1/banks/shared/turns", {"turns": [turn("S1:2", "2024-05-13T09:08:00")]})
        own = call(u1, "POST", "/v1/banks/shared/turns", {"turns": [turn("S1:1", "2024-05-13T09:08:00")]}).json()
        assert other["refused"][0]["reason"].replace("S1:2", "X") == own["refused"][0]["reason"].replace("S1:1", "X")
        old = got("POST", "/v1/banks/shared/turns", {"turns": [turn("u1-old", "2024-05-13T09:05:30")]})
        assert "u1-old" in old["stored"] + old["already_stored"] and not old["refused"], old  # late: at its place
        imp = got("POST", "/v1/banks/shared/import", _import_body())
        assert (imp["stored"], imp["refused"]) == (1, [{"id": "u3-imp", "reason": "does not pass this key's filter"}])
        assert "u1-imp" in {t.turn_id for t in bank().turns} and "u3-imp" not in {t.turn_id for t in bank().turns}
        # another user's turn answers as a unit that is not there at all
        h = [got("GET", f"/v1/banks/shared/units/{u}/history")["detail"].replace(u, "X") for u in ("S3:6", "S3:5")]
        assert h[0] == h[1] == call(u1, "GET", "/v1/banks/shared/units/nope/history").json()["detail"].replace(
            "nope", "X")
        assert [e["event"] for e in got("GET", "/v1/banks/shared/units/S1:1/history")["events"]] == ["added"]
        # the admin key still sees the whole bank
        assert call(admin, "GET", "/v1/banks/shared").json()["n_units"] == bank().n_units > _mine(bank())["n_units"]
        c.close()
        from trawmem_gpu.client import Client, UnitNotFound  # the Python client reads the bound view as is

        with Client(srv.url, api_key=u1) as cl:
            info, (row,) = cl.bank("shared"), cl.banks().banks
            assert (info.n_units, info.first_date, row.n_units) == (_mine(bank())["n_units"],
                                                                  _mine(bank())["first_date"], info.n_units)
            assert [e.event for e in cl.history("shared", "S1:1").events] == ["added"]
            said = []
            for u in ("S3:6", "nope"):  # another user's turn: as a unit that is not there (the same class too)
                with pytest.raises(UnitNotFound) as e:
                    cl.history("shared", u)
                said.append(f"{type(e.value).__name__}: {e.value}".replace(u, "X"))
            assert said[0] == said[1], said


def test_a_bound_key_sees_only_its_own_turns_through_every_mcp_tool(tmp_path, monkeypatch):
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    from mcp import Client

    from trawmem_gpu.data.filters import parse_filter
    from trawmem_gpu.mcp.server import build_server
    from trawmem_gpu.memory import Memory
    from trawmem_gpu.serve.keys import Tenant

    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))
    mem = Memory(tmp_path / "coll")
    mem.add("shared", _shared_turns())
    Memory(tmp_path / "coll").forget("shared", ["S1:3", "S1:6"])  # another process, beside
    u1 = Tenant("u1", ("*",), True, None, parse_filter({"user_id": "u1"}))
    turn = {"turn_id": "S1:2", "speaker": "Speaker-u1", "text": "u1 again.", "timestamp": "2024-05-13T09:08:00",
            "session": 3, "metadata": {"user_id": "u1"}}
    cases = {"recall": [({"bank_id": "shared", "question": q, **w}, ()) for q in ("the harbour job?", "cat?")
                        for w in ({}, {"where": {"user_id": "u3"}})],
             "list_banks": [({}, ())],
             "add_turns": [({"bank_id": "shared", "turns": [turn]}, ("S1:2",)),
                           ({"bank_id": "shared", "turns": [dict(turn, turn_id="u1-old", timestamp="2024-05-13T09:05:30")]},
                            ()),
                           ({"bank_id": "shared", "turns": [dict(turn, turn_id="u1-new")]}, ())],
             "forget": [({"bank_id": "shared", "turn_ids": ["S1:4", "S1:5"]}, ("S1:5",))],
             "forget_bank": [({"bank_id": "shared"}, ())]}
    server = build_server(mem, lambda ctx: u1)

    async def go():
        async with Client(server) as c:
            tools = {t.name for t in (await c.list_tools()).tools}
            assert tools == set(cases), "a tool without a bound-key case here"
            out = {}
            for name in sorted(cases):
                for args, sent in cases[name]:
                    before = mem._core.registry.get("shared")
                    r = await c.call_tool(name, args)
                    text = " ".join(x.text for x in r.content)
                    bank = mem._core.registry.get("shared")
                    _check(text, before, _mine(bank), sent)
                    _check(text, bank, _mine(bank), sent)
                    out.setdefault(name, []).append((r.is_error, r.structured_content))
            return out

    out = asyncio.run(asyncio.wait_for(go(), 300))
    (err, fg), = out["forget"]
    assert not err and fg["forgotten"] == ["S1:4"] and fg["missing"] == ["S1:5"], fg
    assert out["forget_bank"][0][0]  # refused
    (row,) = out["list_banks"][0][1]["result"]
    assert row["n_units"] == _mine(mem._core.registry.get("shared"))["n_units"]


def test_the_bound_view_crosses_to_the_engine_process(tmp_path):
    """``--http-workers``: the key's filter travels with bank reads, history, appends and forgets to
    the engine process, which answers the bound view (the same answers as in one process)."""
    import os
    import subprocess
    import sys
    import time

    from trawmem_gpu.serve.keys import add_key

    keys = tmp_path / "keys.json"
    admin = add_key(keys, "admin", ["*"], writable=True)
    u1 = add_key(keys, "u1", ["*"], writable=True, where={"user_id": "u1"})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRAWMEM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "trawmem_gpu.cli", "serve", "--collection", str(tmp_path / "c"),
                             "--port", "0", "--http-workers", "2", "--threads", "1", "--keys", str(keys)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url, lines = None, []
        while url is None and proc.poll() is None:  # the URL line (bounded by the test run's timeout)
            lines.append(proc.stdout.readline())
            m = re.search(r"(http://127\.0\.0\.1:\d+)", lines[-1])
            url = m.group(1) if m else None
        assert url, "".join(lines)
        c = httpx.Client(base_url=url, timeout=300)
        for _ in range(3000):  # ready within 300 s
            try:
                if c.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        call = lambda key, m, p, body=None: c.request(  # noqa: E731
            m, p, json=None if isinstance(body, str) else body, content=body if isinstance(body, str) else None,
            headers={"Authorization": f"Bearer {key}"})
        assert call(admin, "POST", "/v1/banks/shared/turns", {"turns": _shared_turns()}).status_code == 200
        t = {"speaker": "Speaker-u1", "text": "u1 line.", "session": 3, "metadata": {"user_id": "u1"}}
        info = call(u1, "GET", "/v1/banks/shared").json()
        assert (info["n_units"], info["last_date"]) == (6, "2024-05-13T09:04:00"), info
        assert call(u1, "GET", "/v1/banks").json()["banks"][0]["n_units"] == 6
        assert call(u1, "GET", "/v1/banks/shared/units/S3:6/history").status_code == 404
        old = call(u1, "POST", "/v1/banks/shared/turns", {"turns": [
            dict(t, turn_id="u1-old", timestamp="2024-05-13T09:05:30")]}).json()
        assert old["stored"] == ["u1-old"] and not old["refused"], old  # late: stored at its place in time
        new = call(u1, "POST", "/v1/banks/shared/turns", {"turns": [
            dict(t, turn_id="u1-new", timestamp="2024-05-13T09:07:00")]}).json()
        assert (new["stored"], new["n_units"]) == (["u1-new"], 8), new
        gone = call(u1, "POST", "/v1/banks/shared/forget", {"turn_ids": ["S1:1", "S1:2"]}).json()
        assert (gone["forgotten"], gone["missing"], gone["n_units"]) == (["S1:1"], ["S1:2"], 7), gone
        c.close()
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
