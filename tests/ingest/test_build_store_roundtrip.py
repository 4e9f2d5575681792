"""Banks end to end, the store round trip: save and load exactly, replace, collections, packing.

Encoding goes through the on-disk embedding cache (``TRAWMEM_CACHE`` or ~/.cache/trawmem_gpu),
so a rerun does not encode the dev turns again. Synthetic conversations are written by the
tests themselves; the dev data is only read in place.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from trawmem_gpu.ingest.config import BuildConfig
from trawmem_gpu.encode.base import Encoder
from trawmem_gpu.errors import BankError
from trawmem_gpu.store import FORMAT_VERSION, Collection, load_bank, pack_banks, save_bank
from trawmem_gpu.store.files import META, TENSORS, THREADS, UNITS
from bank_compare import assert_banks_equal


# ----------------------------------------------------------------------------------------------
# (b) store round trip
# ----------------------------------------------------------------------------------------------

def test_save_load_round_trip_exact_dev(dev_banks, tmp_path):
    _, banks, _ = dev_banks
    for b in banks:
        d = save_bank(b, tmp_path / b.bank_id)
        assert sorted(p.name for p in d.iterdir()) == sorted([TENSORS, UNITS, THREADS, META])
        back = load_bank(d)
        assert_banks_equal(b, back, exact=True)
        meta = json.loads((d / META).read_text())
        assert meta["format_version"] == FORMAT_VERSION
        assert meta["encoder_id"] == b.encoder_id == "all-MiniLM-L6-v2:mean:256"
        assert meta["build_config"] == BuildConfig().to_dict()
        assert set(meta["checksums"]) == {TENSORS, UNITS, THREADS} and meta["segments"] == []
    # no temp or old directories left behind
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_save_replaces_existing_bank(syn_bank, dev_banks, tmp_path):
    d = save_bank(dev_banks[1][1], tmp_path / "x")
    save_bank(syn_bank, d)
    assert_banks_equal(syn_bank, load_bank(d))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]


def test_collection_put_load(dev_banks, syn_bank, tmp_path):
    _, banks, _ = dev_banks
    coll = Collection(tmp_path / "coll", create=True)
    for b in banks:
        coll.put(b)
    coll.put(syn_bank)
    again = Collection(tmp_path / "coll")
    assert again.bank_ids == [b.bank_id for b in banks] + ["syn"]
    assert len(again) == 8 and "conv-26" in again and "nope" not in again
    assert again.encoder_id == syn_bank.encoder_id
    for b, back in zip(banks + [syn_bank], again.load_all()):
        assert_banks_equal(b, back)
    # replacing a bank keeps its directory and the index
    coll.put(syn_bank)
    assert Collection(tmp_path / "coll").bank_ids == again.bank_ids
    with pytest.raises(KeyError, match="unknown bank id"):
        again.load("nope")


def test_collection_errors(syn_bank, tmp_path):
    with pytest.raises(BankError, match="missing: does not exist"):
        Collection(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BankError, match="not a collection"):
        Collection(tmp_path / "empty")
    d = save_bank(syn_bank, tmp_path / "single")
    with pytest.raises(BankError, match="single bank"):
        Collection(d)
    c = Collection(tmp_path / "c", create=True)
    c.put(syn_bank)
    ip = tmp_path / "c" / "collection.json"
    idx = json.loads(ip.read_text())
    ip.write_text(json.dumps({**idx, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(BankError, match="format version"):
        Collection(tmp_path / "c")
    ip.write_text("{not json")
    with pytest.raises(BankError, match="corrupt collection index"):
        Collection(tmp_path / "c")

    class Other(Encoder):
        id, dim = "other-encoder", 384

        def _encode_batch(self, texts, is_query):
            raise AssertionError

    c2 = Collection(tmp_path / "c2", create=True)
    c2.put(syn_bank)
    alien = load_bank(c2.bank_path("syn"))
    alien.bank_id, alien.encoder_id = "alien", Other.id
    with pytest.raises(BankError, match="one embedding space"):
        c2.put(alien)


def test_pack_banks_consistent(dev_banks, syn_bank):
    import torch

    banks = list(dev_banks[1]) + [syn_bank]
    pk = pack_banks(banks, device="cpu")
    assert pk.bank_ids == [b.bank_id for b in banks]
    assert pk.device.type == "cpu" and pk.nbytes() > 0
    buo, bto = pk.bank_unit_offsets.numpy(), pk.bank_thread_offsets.numpy()
    toff, ut = pk.thread_offsets.numpy(), pk.unit_thread.numpy()
    ub, tb = pk.unit_bank.numpy(), pk.thread_bank.numpy()
    eoff, edst, ew = pk.edge_offsets.numpy(), pk.edge_dst.numpy(), pk.edge_w.numpy()
    assert np.array_equal(np.diff(buo), [b.n_units for b in banks])
    assert np.array_equal(np.diff(bto), [b.n_threads for b in banks])
    T = int(bto[-1])
    assert len(toff) == T + 1 and toff[0] == 0 and toff[-1] == buo[-1]
    assert len(eoff) == T + 1 and eoff[-1] == sum(len(b.edge_src) for b in banks) == len(edst)
    assert np.all(np.diff(eoff) >= 0)
    for i, b in enumerate(banks):
        assert pk.bank_index(b.bank_id) == i
        us, ue, ts, te = buo[i], buo[i + 1], bto[i], bto[i + 1]
        assert np.all(ub[us:ue] == i) and np.all(tb[ts:te] == i)
        # every global thread of bank i owns exactly that bank's units, in its local CSR
        assert np.array_equal(toff[ts:te + 1] - us, b.thread_offsets)
        assert np.array_equal(ut[us:ue] - ts, b.unit_thread)
        assert torch.equal(pk.unit_vecs[us:ue], torch.from_numpy(b.unit_vecs))
        assert torch.equal(pk.head_vecs[ts:te], torch.from_numpy(b.head_vecs))
        # edge CSR rows of bank i's threads hold exactly the bank's edges (sorted by src, dst)
        lo, hi = eoff[ts], eoff[te]
        rows = np.repeat(np.arange(ts, te), np.diff(eoff[ts:te + 1]))
        assert np.array_equal(rows - ts, b.edge_src)
        assert np.array_equal(edst[lo:hi] - ts, b.edge_dst)
        assert np.array_equal(ew[lo:hi], b.edge_w)
        assert np.all((edst[lo:hi] >= ts) & (edst[lo:hi] < te))  # no edge leaves its bank
    for t in range(0, T, 37):
        assert np.all(ub[toff[t]:toff[t + 1]] == tb[t])
    with pytest.raises(BankError):
        pack_banks([])
