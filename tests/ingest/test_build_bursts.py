"""Building banks of short chat messages: threads never start inside a burst (segmentation takes
each burst as one vector), and an append grows the open burst the way a full build forms it."""
from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest

from trawmem_gpu.data.bursts import burst_starts
from trawmem_gpu.data.chat_views import view_conversation, view_spec
from trawmem_gpu.data.types import Conversation, Turn
from trawmem_gpu.ingest import build_banks, update_bank
from trawmem_gpu.ingest.config import BuildConfig
from trawmem_gpu.store.bursts import bank_bursts, burst_view, unit_members
from bank_compare import assert_banks_equal
from build_store_cases import synthetic_conversation


@pytest.fixture(scope="module")
def chat_conv():
    """The synthetic conversation as people chat it (the ``chat`` view: sentences minutes apart, informal)."""
    return view_conversation(synthetic_conversation(), view_spec("chat"))[0]


def test_threads_start_only_where_bursts_start(chat_conv, encoder):
    for mode in ("embedding", "fixed"):
        (bank,), _ = build_banks([chat_conv], BuildConfig(segmentation=mode, fixed_size=4), encoder, progress=False)
        starts = set(burst_starts(bank.turns))
        assert len(starts) < bank.n_units  # the view made bursts
        assert {int(s) for s in bank.thread_offsets[:-1]} <= starts, mode
        assert len(bank_bursts(bank)) - 1 == len(starts)  # no burst is cut by a thread


def test_an_append_to_an_open_burst_equals_a_full_build(chat_conv, encoder):
    """The last burst's messages arrive one at a time: each append re-forms the session the way a
    full build over the same messages does, and the burst view shows one growing unit."""
    cfg = BuildConfig()
    starts = burst_starts(chat_conv.turns) + [len(chat_conv.turns)]
    lo, hi = next((a, b) for a, b in zip(starts[-2::-1], starts[::-1]) if b - a >= 2)  # the last of 2 or more
    (bank,), _ = build_banks([Conversation(chat_conv.bank_id, chat_conv.turns[:lo + 1])], cfg, encoder, progress=False)
    for k in range(lo + 1, hi):
        bank, _ = update_bank(bank, [chat_conv.turns[k]], cfg, encoder)
        (full,), _ = build_banks([Conversation(chat_conv.bank_id, chat_conv.turns[:k + 1])], cfg, encoder,
                                 progress=False)
        assert_banks_equal(bank, full)
        last = burst_view(bank).turns[-1]
        assert unit_members(last) == tuple(t.turn_id for t in chat_conv.turns[lo:k + 1])


def test_a_message_after_a_long_gap_starts_a_new_burst(chat_conv, encoder):
    last = chat_conv.turns[-1]
    late = Turn("late", last.speaker, "oh and one more thing", last.session, last.timestamp,
                last.time + timedelta(hours=3))
    (bank,), _ = build_banks([chat_conv], BuildConfig(), encoder, progress=False)
    bank, _ = update_bank(bank, [late], BuildConfig(), encoder)
    v = burst_view(bank)
    assert unit_members(v.turns[-1]) == ("late",) and "late" not in unit_members(v.turns[-2])
    assert isinstance(v.turns[-2].time, datetime) and np.isfinite(v.unit_vecs).all()
