"""Banks end to end, incremental updates: ``update_bank`` equals a full build (synthetic splits,
several steps from disk, the dev conversations) and its errors.

Encoding goes through the on-disk embedding cache (``TRAWMEM_CACHE`` or ~/.cache/trawmem_gpu),
so a rerun does not encode the dev turns again. Synthetic conversations are written by the
tests themselves; the dev data is only read in place.
"""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.ingest import build_banks, update_bank
from trawmem_gpu.ingest.config import BuildConfig
from trawmem_gpu.data.types import Turn
from trawmem_gpu.encode.base import Encoder
from trawmem_gpu.errors import InputError
from trawmem_gpu.store import Collection
from bank_compare import assert_banks_equal
from build_store_cases import N_SYN, SESSION_STARTS, check_bank_invariants, split_turns


# ----------------------------------------------------------------------------------------------
# (d) incremental updates
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def syn_full(syn_conv, encoder):
    out = {}
    for mode in ("embedding", "fixed"):
        cfg = BuildConfig(segmentation=mode, fixed_size=4)
        (b,), _ = build_banks([syn_conv], cfg, encoder, progress=False)
        out[mode] = (cfg, b)
    return out


# split points: mid session 1, a session boundary (start of session 2), mid session 2,
# boundary into the short last session, one turn before the end, the very first turn
SPLITS = [8, SESSION_STARTS[1], 23, SESSION_STARTS[3], N_SYN - 1, 1]


@pytest.mark.parametrize("k", SPLITS)
@pytest.mark.parametrize("mode", ["embedding", "fixed"])
def test_update_equals_full_build_synthetic(syn_conv, syn_full, encoder, k, mode):
    cfg, full = syn_full[mode]
    prefix, rest = split_turns(syn_conv, k)
    (bank,), _ = build_banks([prefix], cfg, encoder, progress=False)
    new, stats = update_bank(bank, rest, cfg, encoder)
    assert stats["n_new_units"] == N_SYN - k
    first_session_start = max(s for s in SESSION_STARTS if s <= k)
    assert stats["resegmented_units"] == N_SYN - first_session_start
    # threads of earlier sessions are kept as they were
    assert stats["kept_threads"] == int(np.searchsorted(bank.thread_offsets, first_session_start))
    assert_banks_equal(new, full, exact=False)
    np.testing.assert_array_equal(new.edge_w, full.edge_w)
    check_bank_invariants(new, cfg)


def test_update_in_several_steps_from_disk(syn_conv, syn_full, encoder, tmp_path):
    cfg, full = syn_full["embedding"]
    prefix, _ = split_turns(syn_conv, 5)
    (bank,), _ = build_banks([prefix], cfg, encoder, progress=False)
    coll = Collection(tmp_path / "c", create=True)
    coll.put(bank)
    for lo, hi in ((5, 12), (12, 30), (30, 31), (31, N_SYN)):
        old = Collection(tmp_path / "c").load("syn")
        new, _ = update_bank(old, list(syn_conv.turns[lo:hi]), None, encoder)  # cfg from the bank
        coll.put(new)
    assert_banks_equal(Collection(tmp_path / "c").load("syn"), full, exact=False)


@pytest.mark.parametrize("where", ["mid_session", "session_boundary"])
def test_update_equals_full_build_dev(dev_banks, encoder, where):
    convs, banks, _ = dev_banks
    i = next(n for n, c in enumerate(convs) if c.bank_id == "conv-30")
    conv, full = convs[i], banks[i]
    sess = [t.session for t in conv.turns]
    boundary = next(n for n in range(len(sess) // 2, len(sess)) if sess[n] != sess[n - 1])
    k = boundary if where == "session_boundary" else boundary - 7
    assert where == "session_boundary" or sess[k] == sess[k - 1]
    prefix, rest = split_turns(conv, k)
    (bank,), _ = build_banks([prefix], BuildConfig(), encoder, progress=False)
    new, stats = update_bank(bank, rest, BuildConfig(), encoder)
    assert stats["resegmented_units"] < len(conv.turns) - k + 30
    assert_banks_equal(new, full, exact=False)
    np.testing.assert_array_equal(new.edge_w, full.edge_w)


def test_update_errors(syn_conv, encoder):
    prefix, rest = split_turns(syn_conv, 20)
    (bank,), _ = build_banks([prefix], BuildConfig(), encoder, progress=False)
    dup = [rest[0], syn_conv.turns[3]]
    with pytest.raises(InputError, match=r"duplicate turn id 'D1:4'"):
        update_bank(bank, dup, BuildConfig(), encoder)
    with pytest.raises(InputError, match="duplicate turn id"):
        update_bank(bank, [rest[0], rest[0]], BuildConfig(), encoder)
    back = Turn("D1:99", "Ana", "wait, one more thing", 1, rest[0].timestamp, rest[0].time)
    with pytest.raises(InputError, match="goes back to session 1 after session 2"):
        update_bank(bank, [back], BuildConfig(), encoder)
    with pytest.raises(InputError, match="goes back"):
        update_bank(bank, [rest[-1], rest[0]], BuildConfig(), encoder)
    same, st = update_bank(bank, [], BuildConfig(), encoder)
    assert same is bank and st["n_new_units"] == 0

    class Other(Encoder):
        id, dim = "other-encoder", 384

        def _encode_batch(self, texts, is_query):
            raise AssertionError("must not encode")

    with pytest.raises(InputError, match="other-encoder"):
        update_bank(bank, rest, BuildConfig(), Other())
