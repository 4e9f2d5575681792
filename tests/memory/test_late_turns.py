"""Late turns (issue 45 item 1): a turn dated before a bank's last turn is stored at its place in
time, so a bank built from turns added in any interleaving equals one built from them in time
order (threads, heads, graph, bursts, facts and their validity, picks); skewed writers lose
nothing; a retry of a late batch stores nothing new."""
from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta

import numpy as np
import pytest

TOPICS = ["the garden and tomatoes", "a trip to Lisbon by train", "the new job at the bakery",
          "learning the violin", "a broken bicycle wheel", "the dog's vet visit"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAWMEM_CACHE", str(tmp_path / "cache"))


def _turns(seed: int, n: int = 30) -> list[dict]:
    """``n`` turns over a few days (some sharing a time), in time order; a speaker often sends two
    or three messages in a row, a minute apart or less (bursts, ``data.bursts``)."""
    rng = random.Random(seed)
    t0, out = datetime(2031, 3, 1, 9), []
    t, who = t0, "Ana"
    for i in range(n):
        t = t + timedelta(minutes=rng.choice([0, 1, 5, 30, 60 * 20]))
        who = who if rng.random() < 0.5 else ("Ben" if who == "Ana" else "Ana")
        topic = TOPICS[(i // 6 + seed) % len(TOPICS)]
        out.append({"turn_id": f"t{i}", "speaker": who,
                    "text": f"Turn {i}: about {topic}, detail {rng.randint(0, 99)}.", "timestamp": t.isoformat()})
    return out


def _facts(turns: list[dict]) -> list[dict]:
    """A deterministic extractor: one keyed fact per turn (its speaker ``is into`` its topic), valid
    from the turn's time (plus its index in seconds: no two facts of a key start together), so each
    speaker's facts form one supersession chain ordered by time."""
    out = []
    for t in turns:
        i = int(t["turn_id"][1:])
        start = datetime.fromisoformat(t["timestamp"]) + timedelta(seconds=i)
        out.append({"id": f"F:{t['turn_id']}", "text": f"{t['speaker']} is into {t['text'].split(': about ')[1]}",
                    "source_turns": [t["turn_id"]], "subject": t["speaker"], "attribute": "is into",
                    "valid_from": start.isoformat()})
    return out


def _bank(path):
    from trawmem_gpu.store import Collection

    return Collection(path).load("b")


def _same(got, want):
    assert [t.turn_id for t in got.turns] == [t.turn_id for t in want.turns]
    assert [t.session for t in got.turns] == [t.session for t in want.turns]
    assert np.array_equal(got.thread_offsets, want.thread_offsets) and got.heads == want.heads
    assert np.allclose(got.unit_vecs, want.unit_vecs, atol=1e-5)
    assert np.allclose(got.head_vecs, want.head_vecs, atol=1e-5)
    assert np.array_equal(got.edge_src, want.edge_src) and np.array_equal(got.edge_dst, want.edge_dst)
    _same_bursts(got, want)
    _same_facts(got, want)


def _same_bursts(got, want):
    """The bursts (``store.bursts``): offsets over the units and each burst unit's members."""
    from trawmem_gpu.store.bursts import bank_bursts, burst_view, unit_members

    assert np.array_equal(bank_bursts(got), bank_bursts(want))
    assert [unit_members(t) for t in burst_view(got).turns] == [unit_members(t) for t in burst_view(want).turns]


def _same_facts(got, want):
    """The facts layer by id: text, sources, session, key and validity (which fact supersedes
    which, ``valid_from`` / ``valid_to``), and vectors."""
    def facts(bank):
        return {f.fact_id: (f.text, f.source_turns, f.session, f.subject, f.attribute, f.valid_from, f.valid_to,
                            f.superseded_by) for f in bank.facts}

    assert facts(got) == facts(want)
    if got.facts:
        vg = {f.fact_id: v for f, v in zip(got.facts, got.fact_vecs)}
        assert all(np.allclose(vg[f.fact_id], v, atol=1e-5) for f, v in zip(want.facts, want.fact_vecs))


@pytest.mark.parametrize("seed", [1, 2])
def test_any_interleaving_equals_the_in_order_build(tmp_path, seed):
    from trawmem_gpu import Memory

    turns = _turns(seed)
    rng = random.Random(100 + seed)
    shuffled = turns[:]
    rng.shuffle(shuffled)
    m = Memory(tmp_path / "shuffled")
    i = 0
    while i < len(shuffled):
        k = rng.randint(1, 7)
        res = m.add("b", shuffled[i:i + k])
        assert not res["refused"], res["refused"]
        m.add_facts("b", _facts(shuffled[i:i + k]))  # each add's facts, as it comes
        i += k
    ref = Memory(tmp_path / "ordered")  # time order, equal times in order of arrival (a stable sort)
    in_order = sorted(shuffled, key=lambda t: t["timestamp"])
    ref.add("b", in_order)
    ref.add_facts("b", _facts(in_order))
    got, want = _bank(tmp_path / "shuffled"), _bank(tmp_path / "ordered")
    assert sum(f.superseded_by is not None for f in want.facts) >= 10  # the chains are long
    from trawmem_gpu.store.bursts import bank_bursts

    assert len(bank_bursts(want)) - 1 < want.n_units  # some bursts hold several messages
    _same(got, want)
    _same(m._core.registry.get("b"), ref._core.registry.get("b"))  # the banks each Memory serves, too
    for q in ["what about the violin?", "when did the bicycle break?", "the trip by train"]:
        a = m.select("b", q, budget=6).unit_ids
        b = ref.select("b", q, budget=6).unit_ids
        assert a == b


def test_a_late_turn_is_selected_at_once_and_a_retry_stores_nothing(tmp_path):
    from trawmem_gpu import Memory

    turns = _turns(7)
    m = Memory(tmp_path / "c")
    m.add("b", turns[20:])
    before = m.select("b", "Turn 3 about", budget=40).unit_ids
    assert "t3" not in before
    res = m.add("b", turns[:20])
    assert res["stored"] == [t["turn_id"] for t in turns[:20]] and not res["refused"]
    assert "t3" in m.select("b", "Turn 3 about", budget=40).unit_ids
    n = _bank(tmp_path / "c").n_units
    again = m.add("b", turns[:20])
    assert again["already_stored"] == [t["turn_id"] for t in turns[:20]] and again["stored"] == []
    assert _bank(tmp_path / "c").n_units == n == len(turns)


def test_a_late_turn_on_a_new_day_opens_its_session_and_renumbers_the_later_ones(tmp_path):
    from trawmem_gpu import Memory

    m = Memory(tmp_path / "c")
    m.add("b", [{"turn_id": "a", "speaker": "Ana", "text": "Day one.", "timestamp": "2031-03-01T10:00:00"},
                {"turn_id": "c", "speaker": "Ana", "text": "Day three.", "timestamp": "2031-03-03T10:00:00"}])
    m.add("b", [{"turn_id": "b", "speaker": "Ana", "text": "Day two.", "timestamp": "2031-03-02T10:00:00"},
                {"turn_id": "a2", "speaker": "Ana", "text": "Day one, later.", "timestamp": "2031-03-01T11:00:00"}])
    bank = _bank(tmp_path / "c")
    assert [(t.turn_id, t.session) for t in bank.turns] == [("a", 1), ("a2", 1), ("b", 2), ("c", 3)]


def test_two_writers_with_skewed_clocks_lose_nothing(tmp_path):
    from trawmem_gpu import Memory

    m = Memory(tmp_path / "c")
    base = datetime(2031, 3, 1, 9)
    errors: list = []

    def writer(name: str, skew: timedelta):
        try:
            for i in range(6):
                ts = (base + timedelta(minutes=10 * i) + skew).isoformat()
                res = m.add("b", [{"turn_id": f"{name}{i}", "speaker": name, "text": f"{name} says {i}.",
                                   "timestamp": ts}])
                assert not res["refused"], res["refused"]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ths = [threading.Thread(target=writer, args=("x", timedelta(0))),
           threading.Thread(target=writer, args=("y", timedelta(minutes=-45)))]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=600)
    assert not errors
    bank = _bank(tmp_path / "c")
    assert sorted(t.turn_id for t in bank.turns) == sorted([f"x{i}" for i in range(6)] + [f"y{i}" for i in range(6)])
    times = [t.time for t in bank.turns]
    assert times == sorted(times)


def test_a_late_turn_in_the_last_session_keeps_the_threads_before_it_and_equals_the_build():
    """``ingest.late.insert_bank`` keeps the threads of the sessions before the first one a late
    turn changes (the burst gap unchanged) and re-segments from there: the bank equals the build of
    the turns in time order; with the kept prefix refused (every session re-segmented) the same."""
    from dataclasses import replace

    from word_encoder import WordEncoder

    from trawmem_gpu.data.types import Conversation, Turn
    from trawmem_gpu.ingest import build_banks
    from trawmem_gpu.ingest import late
    from trawmem_gpu.ingest.config import BuildConfig

    enc, cfg = WordEncoder(), BuildConfig()
    turns = []
    for d in range(5):  # five days, one session each, a message every 7 minutes
        for i in range(8):
            t = datetime(2031, 3, 1 + d, 9) + timedelta(minutes=7 * i)
            turns.append(Turn(f"d{d}:{i}", "Ana" if i % 2 else "Ben", f"Day {d} on {TOPICS[(d + i // 4) % 6]}, {i}.",
                              d + 1, t.isoformat(), t))
    (bank,), _ = build_banks([Conversation("b", turns)], cfg, enc, progress=False)
    said = turns[-1].time - timedelta(minutes=3)  # a clock three minutes behind
    new = Turn("late", "Ben", "A late word on the violin.", 5, said.isoformat(), said)
    placed = late.place(bank.turns, [new], {"late"}, False)
    got, stats = late.insert_bank(bank, placed, cfg, enc)
    (want,), _ = build_banks([Conversation("b", placed)], cfg, enc, progress=False)
    assert stats["kept_threads"] > 0 and stats["resegmented_units"] == 9  # the last session only
    assert [t.turn_id for t in got.turns] == [t.turn_id for t in want.turns]
    assert got.turns.index(next(t for t in got.turns if t.turn_id == "late")) == len(turns) - 1
    _same(got, want)
    keep = late._kept_prefix
    try:
        late._kept_prefix = lambda *a: (0, 0)
        full, stats = late.insert_bank(bank, placed, cfg, enc)
    finally:
        late._kept_prefix = keep
    assert stats["kept_threads"] == 0 and stats["resegmented_units"] == len(placed)
    _same(full, want)
    assert late._kept_prefix(bank, [replace(t, session=t.session + 1) for t in placed], np.zeros(0)) == (0, 0)
