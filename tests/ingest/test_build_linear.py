"""A build and an append cost linear in the bank's size (issue 33): the conversation's burst gap
comes from its session gaps computed once per build (not once per session, and not once per
thread), and an append extends the gaps the bank it appends to keeps instead of reading every
turn again. Picks and banks are unchanged (``test_build_bursts``); these tests count the work."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trawmem_gpu.data import bursts as data_bursts
from trawmem_gpu.data.bursts import session_gaps
from trawmem_gpu.data.chat_views import view_conversation, view_spec
from trawmem_gpu.ingest import build_banks, builder, update_bank
from build_store_cases import synthetic_conversation


@pytest.fixture(scope="module")
def chat_conv():
    return view_conversation(synthetic_conversation(), view_spec("chat"))[0]


def _count_gap_reads(monkeypatch) -> list[int]:
    """Count the whole-conversation gap computations (``session_gaps``) and the turns they read."""
    calls = []
    real = data_bursts.session_gaps

    def counted(turns):
        calls.append(len(turns))
        return real(turns)

    monkeypatch.setattr(builder, "session_gaps", counted)
    monkeypatch.setattr(data_bursts, "session_gaps", counted)
    return calls


def test_a_build_reads_the_session_gaps_once(chat_conv, encoder, monkeypatch):
    sessions = len({t.session for t in chat_conv.turns})
    assert sessions >= 3
    calls = _count_gap_reads(monkeypatch)
    (bank,), _ = build_banks([chat_conv], encoder=encoder, progress=False)
    assert calls == [len(chat_conv.turns)]  # before: once per session and once more for the heads
    np.testing.assert_array_equal(bank.__dict__[builder.SESSION_GAPS], session_gaps(chat_conv.turns))


def test_an_append_extends_the_gaps_it_holds(chat_conv, encoder, monkeypatch):
    turns = chat_conv.turns
    n = len(turns) - 5
    (bank,), _ = build_banks([type(chat_conv)(chat_conv.bank_id, turns[:n])], encoder=encoder, progress=False)
    calls = _count_gap_reads(monkeypatch)
    for i in range(n, len(turns)):  # one message at a time, each append on the bank the last returned
        bank, _ = update_bank(bank, [turns[i]], encoder=encoder)
        np.testing.assert_array_equal(bank.__dict__[builder.SESSION_GAPS], session_gaps(turns[:i + 1]))
    assert calls == []  # no append read every turn's time again
    (full,), _ = build_banks([chat_conv], encoder=encoder, progress=False)
    assert [int(x) for x in bank.thread_offsets] == [int(x) for x in full.thread_offsets]
    assert list(bank.heads) == list(full.heads)


def test_an_appended_banks_resident_size_adds_its_new_turns(chat_conv, encoder):
    """``memory.resident.bank_nbytes`` of a bank an append returned: its base's turn bytes plus the
    new turns' (kept on the bank object), equal to walking every turn."""
    from trawmem_gpu.memory.resident import TURN_OVERHEAD, bank_nbytes

    turns = chat_conv.turns
    n = len(turns) - 3
    (bank,), _ = build_banks([type(chat_conv)(chat_conv.bank_id, turns[:n])], encoder=encoder, progress=False)
    bank_nbytes(bank)
    for i in range(n, len(turns)):
        new, _ = update_bank(bank, [turns[i]], encoder=encoder)
        assert new.extends is not None and new.extends.base is bank
        bank_nbytes(new)
        assert new.__dict__["_turns_nbytes"] == sum(len(t.text) + len(t.turn_id) + TURN_OVERHEAD for t in new.turns)
        bank = new


def test_an_appends_history_events_equal_the_whole_comparison(chat_conv, encoder):
    """``memory.history.append_events`` of an append (the new bank keeps the old one's turns):
    what comparing every turn id of both banks gives, without building those maps."""
    from trawmem_gpu.memory import history

    turns = chat_conv.turns
    n = len(turns) - 4
    (old,), _ = build_banks([type(chat_conv)(chat_conv.bank_id, turns[:n])], encoder=encoder, progress=False)
    new, _ = update_bank(old, turns[n:], encoder=encoder)
    fast = history.append_events(old, new, [t.turn_id for t in turns[n:]])
    assert history._appended(old, new) == n
    sessions = {t.session for t in turns[n:]} | {old.turns[-1].session}
    whole = history._turn_events(old, new, "add", "T", sessions, None)
    key = lambda evs: [(e["unit"], e["event"]) for e in evs]  # noqa: E731
    assert key(fast) == key(whole) and [e["unit"] for e in fast] == [t.turn_id for t in turns[n:]]
    vecs = new.unit_vecs.copy()
    vecs[n - 1] = -vecs[n - 1]  # a kept turn of the last old session re-embedded: both report it
    changed = dataclasses.replace(new, unit_vecs=vecs)
    assert ("re-embedded" in [e["event"] for e in history.append_events(old, changed, [t.turn_id for t in turns[n:]])])
    assert key(history.append_events(old, changed, [t.turn_id for t in turns[n:]])) == \
        key(history._turn_events(old, changed, "add", "T", sessions, None))


def test_an_appended_bank_extends_the_turn_map_it_holds(chat_conv, encoder):
    """``Bank.turn_map`` of an appended bank: the old bank's map plus the new turns, its own dict
    (the old bank's is left as it was), and a duplicate id is still refused."""
    from trawmem_gpu.errors import InputError

    turns = chat_conv.turns
    n = len(turns) - 2
    (old,), _ = build_banks([type(chat_conv)(chat_conv.bank_id, turns[:n])], encoder=encoder, progress=False)
    before = dict(old.turn_map())
    new, _ = update_bank(old, turns[n:], encoder=encoder)
    assert "_turn_map" in new.__dict__ and new.turn_map() is not old.turn_map()
    assert new.turn_map() == {t.turn_id: t for t in turns} and old.turn_map() == before
    with pytest.raises(InputError, match="duplicate turn id"):
        update_bank(new, [dataclasses.replace(turns[-1], session=turns[-1].session)], encoder=encoder)
    with pytest.raises(InputError, match="duplicate turn id"):  # twice in one request
        extra = dataclasses.replace(turns[-1], turn_id="fresh-1")
        update_bank(new, [extra, extra], encoder=encoder)
