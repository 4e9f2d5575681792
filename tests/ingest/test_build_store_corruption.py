"""Banks end to end, corruption: flipped bytes, truncated or deleted files, bad metadata, wrong
format versions, leftover temp dirs and writes killed part-way.

Encoding goes through the on-disk embedding cache (``TRAWMEM_CACHE`` or ~/.cache/trawmem_gpu),
so a rerun does not encode the dev turns again. Synthetic conversations are written by the
tests themselves; the dev data is only read in place.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from trawmem_gpu.errors import BankError
from trawmem_gpu.store import FORMAT_VERSION, Collection, load_bank, save_bank
from trawmem_gpu.store import files as store_files
from trawmem_gpu.store.files import META, TENSORS, UNITS
from bank_compare import assert_banks_equal


# ----------------------------------------------------------------------------------------------
# (c) corruption
# ----------------------------------------------------------------------------------------------

def _bank_error(path, *fragments, **kw):
    with pytest.raises(BankError) as ei:
        load_bank(path, **kw)
    msg = str(ei.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


@pytest.fixture
def saved(syn_bank, tmp_path):
    return save_bank(syn_bank, tmp_path / "bank")


def test_flipped_byte_in_tensors(saved):
    p = saved / TENSORS
    raw = bytearray(p.read_bytes())
    header = struct.unpack("<Q", raw[:8])[0]
    pos = 8 + header + (len(raw) - 8 - header) // 2  # inside the tensor data
    raw[pos] ^= 0x01
    p.write_bytes(bytes(raw))
    _bank_error(saved, TENSORS, "checksum mismatch")


def test_flipped_byte_in_units(saved):
    p = saved / UNITS
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x20
    p.write_bytes(bytes(raw))
    _bank_error(saved, UNITS, "checksum mismatch")


def test_truncated_tensors(saved):
    p = saved / TENSORS
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])
    _bank_error(saved, TENSORS, "checksum mismatch")
    # without checksum verification the truncation is still caught by the reader
    _bank_error(saved, TENSORS, "unreadable", verify=False)
    p.write_bytes(raw[:5])
    _bank_error(saved, TENSORS, "unreadable", verify=False)


def test_deleted_units(saved):
    (saved / UNITS).unlink()
    _bank_error(saved, UNITS, "missing")


def test_deleted_tensors(saved):
    (saved / TENSORS).unlink()
    _bank_error(saved, TENSORS, "missing")


@pytest.mark.parametrize("garbage", [b"\x00\xff garbage", b'{"format_version": 1, "bank_id": ', b"[1, 2]", b""])
def test_garbage_meta(saved, garbage):
    (saved / META).write_bytes(garbage)
    _bank_error(saved, META, "corrupt metadata")


def _rewrite_meta(saved, edit, rehash=True):
    """Edit meta.json; with ``rehash`` also fix its checksum (as a careless tool would), so the
    deeper checks are what catches the edit."""
    meta = json.loads((saved / META).read_text())
    edit(meta)
    if rehash:
        meta["meta_sha256"] = store_files.meta_digest(meta)
    (saved / META).write_text(json.dumps(meta))


def test_meta_missing_keys(saved):
    _rewrite_meta(saved, lambda m: m.pop("checksums"))
    _bank_error(saved, str(saved), "corrupt bank", "checksums")


def test_meta_inconsistent_with_tensors(saved):
    from trawmem_gpu.paths import file_sha256
    from trawmem_gpu.store.files import THREADS

    th = json.loads((saved / THREADS).read_text())
    (saved / THREADS).write_text(json.dumps({k: v[:-1] for k, v in th.items()}))  # validate() catches the count
    _rewrite_meta(saved, lambda m: m["checksums"].update({THREADS: file_sha256(saved / THREADS)}))
    _bank_error(saved, str(saved), "do not match")


@pytest.mark.parametrize("field,value", [("segments", [{"name": "seg-000009"}]), ("bank_id", "other"),
                                         ("build_config", {}), ("encoder_id", "x"), ("turns_sha256", "0" * 64)])
def test_meta_edit_without_rehash_is_caught(saved, field, value):
    """Segments, bank id, build config, encoder: everything that affects selection is checksummed."""
    def edit(m):
        m[field] = value
    _rewrite_meta(saved, edit, rehash=False)
    _bank_error(saved, META, "checksum mismatch", "rebuild")


def test_stats_are_outside_the_checksum(saved):
    _rewrite_meta(saved, lambda m: m.update(stats={"note": "bookkeeping only"}), rehash=False)
    assert load_bank(saved).stats == {"note": "bookkeeping only"}


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, 1])
def test_wrong_format_version(saved, version):
    _rewrite_meta(saved, lambda m: m.update(format_version=version))
    _bank_error(saved, "format version", str(version), "rebuild")


@pytest.mark.parametrize("version", ["2", 2.0, None, True])
def test_format_version_of_wrong_type(saved, version):
    _rewrite_meta(saved, lambda m: m.update(format_version=version))
    _bank_error(saved, META, "format_version must be an integer", repr(version))


def test_not_a_bank(tmp_path):
    _bank_error(tmp_path / "nothing", "no bank directory")
    (tmp_path / "empty").mkdir()
    _bank_error(tmp_path / "empty", "not a bank", META)


def test_leftover_temp_dir_from_killed_write(dev_banks, syn_bank, tmp_path):
    """A write killed before meta.json lands leaves a temp sibling: ignored, and not a bank."""
    coll = Collection(tmp_path / "coll", create=True)
    coll.put(syn_bank)
    coll.put(dev_banks[1][1])
    banks_dir = tmp_path / "coll" / "banks"
    tmp = banks_dir / f".{coll.banks['syn']}.tmp-killed"
    tmp.mkdir()
    store_files.write_bank_files(syn_bank, tmp)
    (tmp / META).unlink()  # killed before meta.json was renamed into place
    tmp2 = banks_dir / f".{coll.banks['conv-30']}.tmp-killed2"
    tmp2.mkdir()
    store_files.write_bank_files(dev_banks[1][1], tmp2)
    os.replace(tmp2 / META, tmp2 / (META + ".tmp"))  # killed between writing and renaming meta
    (tmp2 / TENSORS).write_bytes((tmp2 / TENSORS).read_bytes()[:100])

    again = Collection(tmp_path / "coll")
    assert again.bank_ids == ["syn", "conv-30"]
    loaded = again.load_all()
    assert_banks_equal(loaded[0], syn_bank)
    assert_banks_equal(loaded[1], dev_banks[1][1])
    _bank_error(tmp, "not a bank", META)
    _bank_error(tmp2, "not a bank", META)


class Killed(BaseException):
    """Stands in for a SIGKILL / KeyboardInterrupt in the middle of a write."""


def _other_version(bank):
    """The same bank id, different content: the first 30 turns only (rebuilt threads)."""
    from trawmem_gpu.store.bank import Bank

    j = int(np.searchsorted(bank.thread_offsets, 30, side="right")) - 1
    n = int(bank.thread_offsets[j])
    keep = (bank.edge_src < j) & (bank.edge_dst < j)
    return Bank(bank.bank_id, bank.turns[:n], bank.thread_offsets[:j + 1].copy(), bank.heads[:j],
                bank.head_kind[:j], bank.unit_vecs[:n], bank.head_vecs[:j], bank.edge_src[keep],
                bank.edge_dst[keep], bank.edge_w[keep], bank.edge_kind[keep], bank.encoder_id, bank.build_config)


def test_kill_during_write_bank_files_keeps_previous(syn_bank, tmp_path, monkeypatch):
    coll = Collection(tmp_path / "coll", create=True)
    coll.put(syn_bank)
    real = store_files.write_bank_files

    def partial(bank, d):
        from safetensors.numpy import save_file

        save_file({"unit_vecs": np.zeros((2, 2), np.float32)}, str(d / TENSORS))
        (d / UNITS).write_text("[{")
        raise Killed()

    monkeypatch.setattr(store_files, "write_bank_files", partial)
    with pytest.raises(Killed):
        coll.put(_other_version(syn_bank))
    monkeypatch.setattr(store_files, "write_bank_files", real)
    again = Collection(tmp_path / "coll")
    assert_banks_equal(again.load("syn"), syn_bank)
    assert sorted(p.name for p in (tmp_path / "coll" / "banks").iterdir()) == [coll.banks["syn"]]


def test_kill_during_swap_keeps_previous(syn_bank, tmp_path, monkeypatch):
    path = save_bank(syn_bank, tmp_path / "bank")
    real_replace = os.replace

    def failing_replace(src, dst):
        if ".tmp-" in str(src) and str(dst) == str(path):  # the new bank moving into place
            raise Killed()
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(Killed):
        save_bank(_other_version(syn_bank), path)
    monkeypatch.setattr(os, "replace", real_replace)
    assert_banks_equal(load_bank(path), syn_bank)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank"]


def test_hard_kill_between_renames_is_reported(syn_bank, tmp_path):
    """A SIGKILL between moving the old bank aside and the new one in: no bank loads, and the
    error says where the previous one is."""
    path = save_bank(syn_bank, tmp_path / "bank")
    os.replace(path, tmp_path / ".bank.old-12345")
    msg = _bank_error(path, "no bank directory", ".bank.old-12345")
    assert "rename it back" in msg
    os.replace(tmp_path / ".bank.old-12345", path)
    assert_banks_equal(load_bank(path), syn_bank)
