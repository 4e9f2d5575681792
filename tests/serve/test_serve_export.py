"""Export and import of one bank under a key (issue 45 item 2, HTTP): ``GET /v1/banks/{bank_id}/export``
and ``POST /v1/banks/{bank_id}/import`` on a real server, through the Python clients too.

A bank exported over HTTP and imported into another bank exports the same lines again (turns,
facts, their validity); a key bound to a filter exports none of the other users' turns (their
texts and ids are searched for in the bytes) nor facts citing them; the refusals (a read-only
key, another tenant's bank, a file of another bank or version, a cut or oversized body) store
nothing.
"""
from __future__ import annotations

import asyncio
import io
import itertools
import json

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn, prometheus_client) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import httpx  # noqa: E402

from serve_util import KEYS, SAMPLE_BANK, build_sample_collection, keys_file, running  # noqa: E402

BIG = "acme-big"
"""A bank of 300 turns: its export is several pieces."""
COLL: list = []
"""The served collection's path (set by the fixture)."""
MIX = "acme-mix"
"""A bank of users u1 and u2 (turn metadata ``user_id``), with a fact citing each user's turn."""


def _mix_turns() -> list[dict]:
    return [{"turn_id": f"T{i}", "speaker": f"Speaker-{u}", "text": f"{u} says PRIVATE-{u} item {i}.",
             "timestamp": f"2024-03-0{i}T10:00:00", "metadata": {"user_id": u}}
            for i, u in enumerate(("u1", "u2", "u1", "u2"), 1)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(url, keys: rw / ro / other / u1 (acme-*, bound to user_id u1))."""
    from trawmem_gpu.memory import Memory
    from trawmem_gpu.serve.config import ServeConfig
    from trawmem_gpu.serve.keys import add_key

    tmp = tmp_path_factory.mktemp("export")
    coll = build_sample_collection(tmp / "coll")
    mem = Memory(coll)
    mem.add(MIX, _mix_turns())
    mem.add_facts(MIX, [{"id": "F1", "text": "u1 keeps a PRIVATE-u1 fact.", "source_turns": ["T1"]},
                        {"id": "F2", "text": "u2 keeps a PRIVATE-u2 fact.", "source_turns": ["T2"]}])
    mem.add(BIG, [{"turn_id": f"B{i}", "speaker": ("Ana", "Ben")[i % 2], "text": f"Turn {i} of a long chat.",
                   "timestamp": f"2024-04-{1 + i // 30:02d}T10:{i % 30:02d}:00"} for i in range(300)])
    del mem
    COLL.append(coll)
    path = keys_file(tmp / "keys.json")
    keys = {**KEYS, "u1": add_key(path, "acme-u1", ["acme-*"], writable=True, where={"user_id": "u1"})}
    with running(ServeConfig(collection=coll, keys_file=path, max_wait_ms=2)) as (url, _, _srv):
        yield url, keys


def _c(server, who: str) -> httpx.Client:
    url, keys = server
    return httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {keys[who]}"})


def _body(lines: bytes) -> list[dict]:
    """The lines after the header, parsed."""
    return [json.loads(x) for x in lines.decode().splitlines()[1:]]


def _content(lines: bytes) -> list[dict]:
    """The bank, turn and fact lines (the history is the importing collection's own: its adds)."""
    return [x for x in _body(lines) if x["type"] != "event"]


def _as(lines: bytes, src: str, dst: str) -> bytes:
    """An export of bank ``src`` made an export of bank ``dst``."""
    return lines.replace(f'"bank_id":"{src}"'.encode(), f'"bank_id":"{dst}"'.encode())


def test_round_trip_into_another_bank_is_equal(server, tmp_path):
    from trawmem_gpu.client import AsyncClient, Client

    url, keys = server
    with Client(url, api_key=keys["other"]) as cl:  # the sample bank: 33 turns, through the client
        out = tmp_path / "ana.jsonl"
        n = cl.export(SAMPLE_BANK, out)
        data = out.read_bytes()
        assert n == len(data) and json.loads(data.splitlines()[0])["format"] == "trawmem-export"
        src = _body(data)
        assert src[0] == {"type": "bank", "bank_id": SAMPLE_BANK, "n_turns": 33, "n_facts": 0}
        (tmp_path / "copy.jsonl").write_bytes(_as(data, SAMPLE_BANK, "other-copy"))
        got = cl.import_("other-copy", tmp_path / "copy.jsonl")
        assert (got.bank_id, got.stored, got.already_stored, got.refused) == ("other-copy", 33, 0, ())
        buf = io.BytesIO()
        cl.export("other-copy", buf)
        assert _content(buf.getvalue()) == _content(_as(data, SAMPLE_BANK, "other-copy"))
        again = cl.import_("other-copy", _as(data, SAMPLE_BANK, "other-copy"))  # a retry stores nothing twice
        assert (again.stored, again.already_stored) == (0, 33)
        a = cl.select(SAMPLE_BANK, "Why did Ana walk home during her long run?")
        b = cl.select("other-copy", "Why did Ana walk home during her long run?")
        assert [u.id for u in a.units] == [u.id for u in b.units] and a.units

    async def async_export():
        async with AsyncClient(url, api_key=keys["rw"]) as ac:
            text = io.StringIO()
            await ac.export(MIX, text)
            got = await ac.import_("acme-copy", _as(text.getvalue().encode(), MIX, "acme-copy"))
            back = io.StringIO()
            await ac.export("acme-copy", back)
            return text.getvalue().encode(), got, back.getvalue().encode()

    mix, got, back = asyncio.run(async_export())  # turns and facts, with their validity
    assert (got.stored, got.facts) == (4, 2)
    facts = [x for x in _body(mix) if x["type"] == "fact"]
    assert [f["id"] for f in facts] == ["F1", "F2"]
    assert _content(back) == _content(_as(mix, MIX, "acme-copy"))


def test_a_bound_key_exports_only_its_own_turns(server):
    with _c(server, "u1") as c, _c(server, "rw") as rw:
        whole = rw.get(f"/v1/banks/{MIX}/export")
        r = c.get(f"/v1/banks/{MIX}/export")
    assert whole.status_code == r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    assert b"PRIVATE-u2" in whole.content  # the unbound key's export holds them: the search below can fail
    assert b"PRIVATE-u2" not in r.content and b'"T2"' not in r.content and b'"T4"' not in r.content
    lines = _body(r.content)
    assert [x.get("id") for x in lines if x["type"] == "turn"] == ["T1", "T3"]
    assert [x["id"] for x in lines if x["type"] == "fact"] == ["F1"]  # F2 cites T2
    assert not [x for x in lines if x["type"] == "event"]  # history names other users' units
    assert lines[0]["n_turns"] == 2 and lines[0]["n_facts"] == 1


def test_refusals_store_nothing(server):
    with _c(server, "rw") as rw, _c(server, "ro") as ro, _c(server, "other") as other:
        mix = rw.get(f"/v1/banks/{MIX}/export").content
        assert ro.get(f"/v1/banks/{MIX}/export").status_code == 200  # a read-only key reads
        r = ro.post("/v1/banks/acme-new/import", content=_as(mix, MIX, "acme-new"))
        assert r.status_code == 403 and "read-only" in r.json()["detail"]
        for r in (other.get(f"/v1/banks/{MIX}/export"), other.post(f"/v1/banks/{MIX}/import", content=mix),
                  rw.get("/v1/banks/acme-none/export")):
            assert (r.status_code, r.json()["error"]) == (404, "unknown_bank"), r.text
        bad = {
            "line 2: field 'bank_id': 'acme-mix' is not the bank imported into ('acme-new')": mix,
            "line 1: field 'version'": mix.replace(b'"version":1', b'"version":2', 1),
            "truncated": _as(mix, MIX, "acme-new")[:-5],
            "line 1: not UTF-8": b"\xff\xfe" + mix,
            "line 1: empty file": b"",
        }
        for says, body in bad.items():
            r = rw.post("/v1/banks/acme-new/import", content=body)
            assert r.status_code == 422 and says in r.json()["detail"], (says, r.text)
        r = rw.post("/v1/banks/acme-new/import", content=b"x" * ((4 << 20) + 1))  # over max_body_bytes
        assert r.status_code == 413, r.text
        assert rw.get("/v1/banks/acme-new").status_code == 404  # nothing of any of them stored


def _no_created(data: bytes) -> bytes:
    head, rest = data.split(b"\n", 1)
    h = json.loads(head)
    h.pop("created")
    return json.dumps(h).encode() + b"\n" + rest


def test_the_export_is_streamed_in_pieces_equal_to_the_whole_export(server):
    """The answer is chunked (no Content-Length), in more than one piece for a bank of 300 turns,
    and its bytes are those of ``Memory.export`` of the same bank (the whole export, made at once)."""
    from trawmem_gpu import Memory

    with _c(server, "rw") as rw:
        for q in ("", "?vectors=true"):
            with rw.stream("GET", f"/v1/banks/{BIG}/export{q}") as r:
                assert r.status_code == 200 and r.headers.get("transfer-encoding") == "chunked", r.headers
                assert "content-length" not in r.headers
                pieces = list(r.iter_raw())
            assert len(pieces) > 1
            whole = io.StringIO()
            Memory(COLL[0], create=False).export(whole, [BIG], vectors=bool(q))
            assert _no_created(b"".join(pieces)) == _no_created(whole.getvalue().encode())
            head = json.loads(pieces[0].split(b"\n", 1)[0])
            assert ("vectors" in head) == bool(q)
    from trawmem_gpu.client import Client

    class Recording(io.BytesIO):
        writes = 0

        def write(self, b):
            self.writes += 1
            return super().write(b)

    url, keys = server
    with Client(url, api_key=keys["rw"]) as cl:  # the client writes the pieces as they come
        out = Recording()
        n = cl.export(BIG, out, vectors=True)
    assert out.writes > 1 and n == len(out.getvalue()) and b'"vector_of"' in out.getvalue()
    with Client(url, api_key=keys["rw"]) as cl:  # the vectors are taken by the server's import
        got = cl.import_("acme-big-copy", _as(out.getvalue(), BIG, "acme-big-copy"))
        back = io.BytesIO()
        cl.export("acme-big-copy", back, vectors=True)
    assert got.stored == 300 and _content(back.getvalue()) == _content(_as(out.getvalue(), BIG, "acme-big-copy"))


def test_an_import_body_is_read_line_by_line_and_bounded(server):
    """A line over the import's line bound is a 413 naming it, a streamed (chunked) body past
    ``max_body_bytes`` a 413 too, each before the rest is read; nothing stored."""
    from trawmem_gpu.memory.export import MAX_LINE_BYTES

    head = json.dumps({"format": "trawmem-export", "version": 1, "encoder": "x", "created": None}).encode() + b"\n"
    bank = json.dumps({"type": "bank", "bank_id": "acme-stream"}).encode() + b"\n"

    def turn(i: int, text: str = "hello") -> bytes:
        return json.dumps({"type": "turn", "bank_id": "acme-stream", "id": f"T{i}", "speaker": "Ana", "text": text,
                           "date": "2024-05-01T10:00:00"}).encode() + b"\n"

    def chunked(*parts):
        yield from parts

    with _c(server, "rw") as rw:
        long_line = turn(1, "w" * (MAX_LINE_BYTES + 10))
        for body in (head + bank + long_line, chunked(head, bank, long_line)):  # Content-Length, then chunked
            r = rw.post("/v1/banks/acme-stream/import", content=body)
            assert r.status_code == 413 and r.json()["detail"].startswith(
                f"line 3: longer than {MAX_LINE_BYTES} bytes"), r.text
        many = (turn(i) for i in range(3, 10 ** 6))  # past 4 MiB long before the million
        r = rw.post("/v1/banks/acme-stream/import", content=itertools.chain((head, bank), many))
        assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"], r.text
        assert rw.get("/v1/banks/acme-stream").status_code == 404
        ok = rw.post("/v1/banks/acme-stream/import", content=chunked(head, bank, turn(1), turn(2)))
        assert ok.status_code == 200 and ok.json()["stored"] == 2, ok.text
