"""Many banks, few in memory (issue 33.5): ``max_resident_bytes`` opens banks on first use and lets
the least recently used go past the budget; every bank still answers as it would all in memory,
and appends, forgets, listings and a bad bank work as they do when everything is loaded."""
from __future__ import annotations

import pytest
from word_encoder import WordEncoder

from trawmem_gpu import Memory
from trawmem_gpu.memory.resident import Resident, bank_nbytes

TOPICS = ("hiking trail mountain boots", "piano lesson music sheet", "garden tomato soil seeds",
          "kayak river paddle lake", "bread oven flour bake")


def _turns(b: int, n: int = 8) -> list[dict]:
    words = TOPICS[b % len(TOPICS)]
    return [{"turn_id": f"t{i}", "speaker": "Ana" if i % 2 else "Ben", "text": f"{words} note {b} {i} day {i % 3}",
             "timestamp": f"2031-03-{1 + i // 3:02d}T10:{i:02d}:00"} for i in range(n)]


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    d = tmp_path_factory.mktemp("many") / "c"
    m = Memory(d, encoder=WordEncoder())
    for b in range(12):
        m.add(f"bank-{b:02d}", _turns(b))
    return d


def _queries():
    return [(f"bank-{b:02d}", f"when was the {TOPICS[b % len(TOPICS)].split()[0]} note {b}?") for b in
            [0, 1, 2, 3, 0, 4, 5, 6, 7, 0, 8, 9, 10, 11, 1, 2, 0]]


def test_lazy_banks_under_a_budget_pick_what_resident_banks_pick(coll):
    everything = Memory(coll, encoder=WordEncoder())
    probe = Memory(coll, encoder=WordEncoder(), max_resident_bytes=10 ** 9)
    probe.select("bank-00", "hiking", budget=4)
    probe.select("bank-01", "piano", budget=4)  # the engine exists: its tables are prepared and counted
    one = probe._core.resident.total / 2
    assert one > bank_nbytes(probe._core.registry.get("bank-01"))
    budget = int(3.5 * one)
    lazy = Memory(coll, encoder=WordEncoder(), max_resident_bytes=budget)
    assert len(lazy._core.registry.banks()) == 0 and "bank-07" in lazy  # nothing loaded at open
    res = lazy._core.resident
    for bank_id, q in _queries():
        assert lazy.select(bank_id, q, budget=4).unit_ids == everything.select(bank_id, q, budget=4).unit_ids
        assert res.total <= budget and len(lazy._core.registry.banks()) <= 4
        assert set(lazy._core.engines.banks) <= set(lazy._core.registry.banks())
    assert res.evicted >= 8 and res.opened >= 12
    assert "bank-00" in res  # the most used bank stayed (least recently used go first)
    # listing every bank reads their metadata, it does not load them
    rows = lazy.banks()
    assert [r["bank_id"] for r in rows] == [f"bank-{b:02d}" for b in range(12)]
    assert rows == everything.banks() and len(lazy._core.registry.banks()) <= 4


def test_appends_and_forgets_of_cold_banks(coll, tmp_path):
    import shutil

    d = tmp_path / "c"
    shutil.copytree(coll, d)
    lazy = Memory(d, encoder=WordEncoder(), max_resident_bytes=1)  # one bank at a time
    out = lazy.add("bank-03", [{"turn_id": "new", "speaker": "Ana", "text": "kayak river at dawn again",
                                "timestamp": "2031-04-01T09:00:00"}])
    assert out["appended"] == 1 and out["n_units"] == 9
    assert "new" in lazy.select("bank-03", "kayak river at dawn", budget=3).unit_ids
    lazy.select("bank-05", "bread oven", budget=3)  # bank-03 goes out ...
    assert "bank-03" not in lazy._core.registry.banks()
    assert "new" in lazy.select("bank-03", "kayak river at dawn", budget=3).unit_ids  # ... and comes back, appended
    assert lazy.forget("bank-08", ["t2"])["forgotten"] == ["t2"]
    assert "t2" not in [t.turn_id for t in lazy.turns("bank-08")]
    assert "t2" not in Memory(d, encoder=WordEncoder()).select("bank-08", "note 8 2", budget=8).unit_ids
    assert lazy.add("fresh", _turns(2, 3))["created"]  # a new bank under a budget
    assert "fresh" in lazy and len(lazy.banks()) == 13


def test_a_bad_bank_is_quarantined_on_first_use_and_the_others_serve(coll, tmp_path):
    import shutil

    from trawmem_gpu.errors import QuarantinedBank

    d = tmp_path / "c"
    shutil.copytree(coll, d)
    (d / "banks" / "bank-04" / "units.json").write_text("[{")
    lazy = Memory(d, encoder=WordEncoder(), max_resident_bytes=10 ** 9)
    assert lazy.quarantined == {}  # not opened yet
    with pytest.raises(QuarantinedBank, match="units.json"):
        lazy.select("bank-04", "garden tomato", budget=3)
    assert "bank-04" in lazy.quarantined and lazy.select("bank-05", "bread", budget=3).unit_ids


def test_the_resident_bookkeeping():
    r = Resident(100)
    for b, n in (("a", 40), ("b", 40), ("c", 40)):
        r.touch(b, n)
    assert r.over() == ["a"] and r.over(keep={"a"}) == ["b"]
    r.touch("a")
    assert r.over() == ["b"] and r.total == 120
    r.drop("b")
    assert r.over() == [] and r.evicted == 1 and Resident(None).over() == []
