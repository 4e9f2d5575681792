"""The burst view (store.bursts): a burst of short messages is one unit, which shows (and
counts as evidence) all its members; banks without bursts are their own view."""
from dataclasses import replace
from datetime import datetime, timedelta

import numpy as np

from trawmem_gpu.data.types import Turn
from trawmem_gpu.store.bursts import BurstUnit, burst_view, unit_members
from trawmem_gpu.store.facts import Fact
from trawmem_gpu.store.view import unit_view
from trawmem_gpu.select.workspace import assemble, token_costs

from engine_banks import make_bank

T0 = datetime(2023, 5, 1, 10, 0)


def _turn(tid, spk, text, session, dt):
    return Turn(tid, spk, text, session, "1 May 2023", T0 + timedelta(days=session, seconds=dt))


CHAT = [("m1", "Ann", "hi there", 0, 0), ("m2", "Ann", "guess what", 0, 3), ("m3", "Ann", "i got a dog", 0, 8),
        ("m4", "Bob", "no way", 0, 200), ("m5", "Bob", "what breed", 0, 205), ("m6", "Ann", "a beagle", 1, 0),
        ("m7", "Bob", "so cute", 1, 300)]


def chat_bank(lens=(5, 2), sessions=None):
    """Ann's three messages seconds apart, Bob's two, then a session of one message each."""
    b = make_bank("chat", list(lens), seed=1)
    rows = CHAT if sessions is None else [r[:3] + (s,) + r[4:] for r, s in zip(CHAT, sessions)]
    b = replace(b, turns=[_turn(*r) for r in rows])
    b.validate()
    return b


def test_a_burst_is_one_unit_with_its_members_and_their_mean_vector():
    bank = chat_bank()
    v = burst_view(bank)
    assert [unit_members(t) for t in v.turns] == [("m1", "m2", "m3"), ("m4", "m5"), ("m6",), ("m7",)]
    first = v.turns[0]
    assert isinstance(first, BurstUnit) and first.turn_id == "m1" and first.text == "hi there guess what i got a dog"
    assert first.speaker == "Ann" and first.time == bank.turns[0].time
    m = bank.unit_vecs[:3].astype(np.float64).mean(axis=0)
    assert np.allclose(v.unit_vecs[0], m / np.linalg.norm(m), atol=1e-6)
    assert np.array_equal(v.unit_vecs[2:], bank.unit_vecs[5:])  # a message alone keeps its vector, bit for bit
    assert v.thread_offsets.tolist() == [0, 2, 4] and v.heads == bank.heads
    assert np.array_equal(v.edge_src, bank.edge_src)


def test_a_bank_without_bursts_is_its_own_view():
    bank = make_bank("plain", [4, 3], seed=2)
    assert burst_view(bank) is bank and unit_view(bank) is bank


def test_a_thread_that_starts_inside_a_burst_cuts_it():
    bank = chat_bank(lens=(2, 3, 2), sessions=[0, 0, 0, 0, 0, 1, 1])
    assert [unit_members(t) for t in burst_view(bank).turns] == [("m1", "m2"), ("m3",), ("m4", "m5"), ("m6",), ("m7",)]


def test_a_change_of_metadata_cuts_a_burst_and_a_burst_carries_its_messages_metadata():
    from trawmem_gpu.data.metadata import Metadata
    from trawmem_gpu.select.restrict import unit_mask

    bank = chat_bank()
    meta = [{"user": "a"}, {"user": "a"}, {"user": "b"}, None, None, None, None]
    bank = replace(bank, turns=[replace(t, metadata=Metadata(m) if m else None) for t, m in zip(bank.turns, meta)])
    v = burst_view(bank)
    assert [unit_members(t) for t in v.turns] == [("m1", "m2"), ("m3",), ("m4", "m5"), ("m6",), ("m7",)]
    assert dict(v.turns[0].metadata) == {"user": "a"} and v.turns[2].metadata is None
    assert unit_mask(v, {"user": "a"}).tolist() == [True, False, False, False, False]


def test_a_burst_shows_once_under_one_label_and_costs_less():
    bank = chat_bank()
    v = unit_view(bank)
    ws = assemble(v, "what dog?", [0, 1], "date")
    assert ws.unit_ids == ["m1", "m2", "m3", "m4", "m5"]  # evidence on any member is shown
    text = ws.render()
    assert text.count("Ann:") == 1 and text.count("Bob:") == 1 and "[m1] Ann: hi there guess what i got a dog" in text
    apart = assemble(bank, "what dog?", [0, 1, 2, 3, 4], "date")
    assert apart.unit_ids == ws.unit_ids and ws.n_tokens < apart.n_tokens
    c = token_costs(v, "date")
    assert c.unit[0] < token_costs(bank, "date").unit[:3].sum()


def test_layers_over_bursts_point_at_the_burst_of_the_message_they_cite():
    bank = chat_bank()
    d = bank.unit_vecs.shape[1]
    fvec = np.eye(d, dtype=np.float32)[:1]
    bank = replace(bank, facts=(Fact("F:1", "Ann got a beagle", ("m3", "m6"), persons=("Ann",)),), fact_vecs=fvec)
    v = unit_view(bank, ("turns", "facts"))
    ids = [t.turn_id for t in v.turns]
    f = ids.index("F:1")
    assert [unit_members(t) for t in v.turns if t.turn_id != "F:1"][:2] == [("m1", "m2", "m3"), ("m4", "m5")]
    links = {(int(a), int(b)) for a, b in zip(v.support_src, v.support_dst)}
    assert links == {(f, ids.index("m1")), (f, ids.index("m6"))}
