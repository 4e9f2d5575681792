"""``Memory.select(..., where=)`` and ``select_many``: one filter for all queries or one per query,
errors naming ``where`` / ``where[i]`` and the path inside, a filter nothing passes, and the heads of
threads a filter cuts, hidden from the workspace and its ``threads``."""
from __future__ import annotations

import pytest

from trawmem_gpu.errors import InputError


def _turns() -> list[dict]:
    """One day per topic, two users talking in each (so a user filter cuts every thread)."""
    out = []
    for d, topic in enumerate(["the pottery class", "the harbour job", "a grey cat", "the marathon"]):
        for i in range(6):
            out.append({"turn_id": f"D{d}:{i}", "speaker": "Ana" if i % 2 else "Ben",
                        "text": f"{'Ana' if i % 2 else 'Ben'} on {topic}: detail {i} of it.",
                        "timestamp": f"2024-03-{d + 1:02d}T10:{i:02d}:00",
                        "metadata": {"user_id": "u1" if i % 2 else "u2", "day": d}})
    return out


@pytest.fixture(scope="module")
def mem(tmp_path_factory):
    from trawmem_gpu import Memory
    from trawmem_gpu.select.config import SelectConfig

    d = tmp_path_factory.mktemp("mf")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAWMEM_CACHE", str(d / "cache"))
    m = Memory(d / "c", method=SelectConfig(headings="gist"))
    m.add("b", _turns())
    yield m
    mp.undo()


def test_select_where_keeps_to_the_turns_that_pass(mem):
    ws = mem.select("b", "What did Ana say about the pottery class?", budget=8, where={"user_id": "u1"})
    assert ws.units and all(u.metadata["user_id"] == "u1" for u in ws.units)
    assert all(t.head is None for t in ws.threads)  # every thread holds a u2 turn: no head is shown
    heads = [h for h in mem._core.engines.banks["b"].heads if h]
    assert heads and not any(h.split("] ", 1)[-1][:30] in ws.text for h in heads)
    free = mem.select("b", "What did Ana say about the pottery class?", budget=8)
    assert {u.metadata["user_id"] for u in free.units} == {"u1", "u2"}
    assert any(t.head for t in free.threads)


def test_one_filter_per_query_and_errors(mem):
    q = "What happened at the marathon?"
    a, b, c = mem.select_many([("b", q)] * 3, budget=6, where=[{"day": {"gte": 3}}, None, {"user_id": "nobody"}])
    assert a.units and all(u.metadata["day"] == 3 for u in a.units)
    assert b.unit_ids == mem.select("b", q, budget=6).unit_ids  # None: that query has no filter
    assert c.units == () and c.tokens <= 1  # nothing passes: an empty workspace
    with pytest.raises(InputError, match=r"^where: 2 filters for 3 queries"):
        mem.select_many([("b", q)] * 3, where=[None, None])
    with pytest.raises(InputError, match=r"^where\[1\]\.day\.gte: expected a number or an ISO 8601 date"):
        mem.select_many([("b", q)] * 2, where=[None, {"day": {"gte": "three"}}])
    with pytest.raises(InputError, match=r"^where\.user_id\.in: expected a non-empty list"):
        mem.select("b", q, where={"user_id": {"in": "u1"}})
    # the size bound: a 4 MB filter of empty objects is refused by its size (it once parsed for 21 s)
    with pytest.raises(InputError, match=r"^where: the filter is over 65536 bytes as JSON \(the limit\)"):
        mem.select("b", q, where={"and": [{}] * 1_000_000})
    with pytest.raises(InputError, match=r"^where\[1\]: the filter is over 65536 bytes"):
        mem.select_many([("b", q)] * 2, where=[None, {"and": [{}] * 1_000_000}])
