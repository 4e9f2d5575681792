"""``AsyncMemory`` (issue 35.4): Memory's methods as coroutines over the same core, with the same
parameters and errors, safe from many tasks beside a thread that uses the ``Memory`` itself."""
from __future__ import annotations

import asyncio
import inspect
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
    from trawmem_gpu.memory.aio import MIRRORED

    public = {n for n, v in vars(Memory).items() if not n.startswith("_") and inspect.isfunction(v)}
    assert public == set(MIRRORED) and {"add", "select", "select_many", "forget", "banks", "turns"} <= public
    for name in public:
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
