"""``AsyncMemory`` (issue 35.4): Memory's methods as coroutines over the same core, with the same
parameters and errors, safe from many tasks beside a thread that uses the ``Memory`` itself."""
from __future__ import annotations

import asyncio
import inspect
import json
import threading

import pytest

from trawmem_gpu.errors import InputError, UnknownBank


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def _t(tid, day=1, text=None):
    return {"turn_id": tid, "speaker": "Ana", "text": text or f"Turn {tid}: the red kayak is at the lake.",
            "timestamp": f"2031-05-{day:02d}T10:00:00"}


def test_every_memory_method_is_a_coroutine_with_the_same_signature():
    from trawmem_gpu import AsyncMemory, Memory
    from trawmem_gpu.memory.aio import MIRRORED, STREAMED

    public = {n for c in Memory.__mro__ if c is not object for n, v in vars(c).items()
              if not n.startswith("_") and inspect.isfunction(v)}
    assert public == set(MIRRORED) | set(STREAMED)
    assert {"add", "select", "select_many", "forget", "banks", "turns", "export", "import_", "history"} <= set(MIRRORED)
    assert inspect.isasyncgenfunction(AsyncMemory.export_lines)
    for name in MIRRORED:
        mine = getattr(AsyncMemory, name)
        assert inspect.iscoroutinefunction(mine), name
        assert inspect.signature(mine) == inspect.signature(getattr(Memory, name)), name
    props = {n for n, v in vars(Memory).items() if isinstance(v, property)}
    assert props <= {n for n, v in vars(AsyncMemory).items() if isinstance(v, property)}


def test_many_tasks_beside_a_thread_using_the_memory(tmp_path):
    from trawmem_gpu import AsyncMemory, Memory

    mem = Memory(tmp_path / "c")
    mem.add("shared", [_t("s0")])
    errors: list = []

    def thread_writer():  # the plain Memory, on a thread of its own, on the same banks
        try:
            for k in range(3):
                assert mem.add("shared", [_t(f"th{k}", day=2)])["stored"] == [f"th{k}"]
                mem.add("thread-only", [_t(f"x{k}", day=2 + k)])
                assert mem.select("shared", "Where is the kayak?", budget=4).units
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    async def main():
        amem = AsyncMemory.of(mem)
        th = threading.Thread(target=thread_writer)
        th.start()
        adds = [amem.add(f"task-{i}", [_t(f"a{i}-{k}", day=2 + k) for k in range(2)]) for i in range(4)]
        adds += [amem.add("shared", messages=[{"role": "user", "content": f"Message {i} about the kayak.",
                                               "id": f"m{i}", "timestamp": "2031-05-02T10:00:00"}]) for i in range(3)]
        selects = [amem.select("shared", "Where is the kayak?", budget=4) for _ in range(6)]
        got = await asyncio.gather(*adds, *selects)
        assert all(r["appended"] == 2 for r in got[:4]) and all(r["appended"] == 1 for r in got[4:7])
        assert all(ws.units for ws in got[7:])
        with pytest.raises(UnknownBank):  # the same errors, raised in the awaiting task
            await amem.select("nope", "q")
        with pytest.raises(InputError, match="turns"):
            await amem.add("shared", "not a list of turns")
        ws = await amem.select_many([("task-0", "kayak"), ("shared", "kayak")], budget=2)
        assert [w.bank_id for w in ws] == ["task-0", "shared"]
        assert "task-3" in amem and (await amem.turns("task-3"))[0].turn_id == "a3-0"
        await asyncio.get_running_loop().run_in_executor(None, th.join)
        res = await amem.forget("task-1", ["a1-0"])
        assert res["forgotten"] == ["a1-0"]
        await amem.aclose()

    asyncio.run(asyncio.wait_for(main(), 600))
    assert errors == []
    again = Memory(tmp_path / "c")  # everything either side wrote is stored, once
    shared = [t.turn_id for t in again.turns("shared")]
    assert sorted(shared) == sorted(["s0", "th0", "th1", "th2", "m0", "m1", "m2"])
    assert {b["bank_id"] for b in again.banks()} == {"shared", "thread-only", "task-0", "task-1", "task-2", "task-3"}
    assert [t.turn_id for t in again.turns("task-1")] == ["a1-1"]


def test_an_async_memory_opens_its_own_collection(tmp_path):
    from trawmem_gpu import AsyncMemory

    async def main():
        async with AsyncMemory(tmp_path / "c", budget=3) as amem:
            await amem.add("b", [_t("t1"), _t("t2")])
            assert amem.defaults.budget == 3 and str(amem.path) == str(tmp_path / "c")
            return [b["bank_id"] for b in await amem.banks()]

    assert asyncio.run(main()) == ["b"]
    with pytest.raises(TypeError):
        from trawmem_gpu import AsyncMemory as A

        A.of("not a memory")


def test_export_and_import_from_asyncio(tmp_path):
    """``AsyncMemory`` exports (a file, and lines as an async iterator, made on its pool) and
    imports like ``Memory``: the lines equal ``Memory.export_lines``' (but the header's time), and
    an import into an empty collection holds the same turns."""
    from trawmem_gpu import AsyncMemory, Memory

    mem = Memory(tmp_path / "a")
    mem.add("b1", [_t(f"t{k}", day=1 + k) for k in range(5)])
    mem.add("b2", [_t("u0", text="Ben likes chess.")])
    want = list(mem.export_lines())

    async def main():
        amem = AsyncMemory.of(mem)
        got = [line async for line in amem.export_lines(chunk=2)]
        summary = await amem.export(tmp_path / "out.jsonl")
        with pytest.raises(TypeError, match="chunk"):
            [x async for x in amem.export_lines(chunk=0)]
        async with AsyncMemory(tmp_path / "b") as other:
            res = await other.import_(tmp_path / "out.jsonl")
            turns = {b: [t.turn_id for t in await other.turns(b)] for b in ("b1", "b2")}
        await amem.aclose()
        return got, summary, res, turns

    got, summary, res, turns = asyncio.run(main())
    assert got[1:] == want[1:] and json.loads(got[0])["format"] == json.loads(want[0])["format"]
    assert summary["turns"] == 6 and sum(b["stored"] for b in res["banks"]) == 6
    assert turns == {"b1": [f"t{k}" for k in range(5)], "b2": ["u0"]}
