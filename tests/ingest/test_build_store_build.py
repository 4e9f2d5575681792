"""Banks end to end, the build: the dev conversations' thread statistics and heads, the synthetic
bank's invariants, the segmentation modes (embedding, fixed windows, LLM without a backend).

Encoding goes through the on-disk embedding cache (``TRAWMEM_CACHE`` or ~/.cache/trawmem_gpu),
so a rerun does not encode the dev turns again. Synthetic conversations are written by the
tests themselves; the dev data is only read in place.
"""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.ingest import build_banks, update_bank
from trawmem_gpu.store.graph import SEMANTIC
from trawmem_gpu.ingest.config import BuildConfig
from trawmem_gpu.data.types import Conversation
from trawmem_gpu.errors import InputError, NoLLMConfigured
from build_store_cases import N_SYN, SESSION_STARTS, SESSIONS, check_bank_invariants, split_turns


# ----------------------------------------------------------------------------------------------
# (a) building the dev conversations
# ----------------------------------------------------------------------------------------------

def test_dev_build_thread_statistics(dev_banks):
    convs, banks, stats = dev_banks
    cfg = BuildConfig()
    assert [b.bank_id for b in banks] == [c.bank_id for c in convs]
    assert len(banks) == 7 and sum(b.n_units for b in banks) == 4003
    for c, b in zip(convs, banks):
        assert b.turns == c.turns
        check_bank_invariants(b, cfg)
        mean_len = b.n_units / b.n_threads
        assert 2 <= mean_len <= 15, (b.bank_id, mean_len)
        assert np.sum(b.edge_kind == SEMANTIC) > 0  # the graph has semantic edges, not just a chain
    all_lens = np.concatenate([np.diff(b.thread_offsets) for b in banks])
    assert 2 <= all_lens.mean() <= 15
    assert len(set(all_lens.tolist())) > 3  # segmentation adapts, not a fixed window
    for k in ("encode_units_s", "segment_s", "heads_s", "encode_heads_s", "graph_s"):
        assert stats[k] >= 0
    assert stats["n_units"] == 4003 and stats["n_banks"] == 7


def test_dev_heads_are_extractive_with_date_and_speakers(dev_banks):
    convs, banks, _ = dev_banks
    b = banks[0]
    for j in range(0, b.n_threads, 17):
        t0 = b.turns[b.thread_offsets[j]]
        h = b.heads[j]
        assert t0.time.strftime("%B") in h and str(t0.time.year) in h  # the session date
        assert any(b.turns[i].speaker in h for i in b.thread_units(j))  # who spoke


def test_synthetic_build_invariants(syn_bank, syn_conv):
    check_bank_invariants(syn_bank, BuildConfig())
    assert syn_bank.n_units == N_SYN
    assert syn_bank.n_threads >= len(SESSIONS) + 2  # topic shifts inside sessions are found
    img = next(i for i, t in enumerate(syn_conv.turns) if t.caption)
    # the image caption reaches the encoder: the unit vector is that of the captioned text
    assert "beagle puppy" in syn_conv.turns[img].embed_text()


def test_build_rejects_empty_conversation(encoder):
    with pytest.raises(InputError, match="empty"):
        build_banks([Conversation("nothing", [])], BuildConfig(), encoder, progress=False)


# ----------------------------------------------------------------------------------------------
# (e) segmentation modes
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 4, 6, 50])
def test_fixed_segmentation_windows(syn_conv, encoder, size):
    cfg = BuildConfig(segmentation="fixed", fixed_size=size)
    (b,), _ = build_banks([syn_conv], cfg, encoder, progress=False)
    expected = [s for lo, hi in zip(SESSION_STARTS[:-1], SESSION_STARTS[1:]) for s in range(lo, hi, size)]
    assert b.thread_offsets.tolist() == expected + [N_SYN]
    check_bank_invariants(b, cfg)
    assert b.build_config["segmentation"] == "fixed" and b.build_config["fixed_size"] == size


def test_llm_segmentation_without_backend(syn_conv, encoder):
    with pytest.raises(NoLLMConfigured) as ei:
        build_banks([syn_conv], BuildConfig(segmentation="llm"), encoder, llm=None, progress=False)
    msg = str(ei.value)
    assert "segmentation='llm'" in msg and "none configured" in msg and "`llm`" in msg
    with pytest.raises(NoLLMConfigured, match="heads='llm'.*none configured"):
        build_banks([syn_conv], BuildConfig(heads="llm"), encoder, llm=None, progress=False)


def test_llm_update_without_backend(syn_conv, encoder):
    prefix, rest = split_turns(syn_conv, 20)
    (bank,), _ = build_banks([prefix], BuildConfig(), encoder, progress=False)
    with pytest.raises(NoLLMConfigured):
        update_bank(bank, rest, BuildConfig(segmentation="llm"), encoder)
