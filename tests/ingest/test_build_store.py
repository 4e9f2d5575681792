"""Banks end to end: build (dev data and synthetic), store round trip, corruption, incremental
updates, segmentation modes and the CLI.

Encoding goes through the on-disk embedding cache (``TRAWMEM_CACHE`` or ~/.cache/trawmem_gpu),
so a rerun does not encode the dev turns again. Synthetic conversations are written by the
tests themselves; the dev data is only read in place.
"""
from __future__ import annotations

import json
import os
import struct
from datetime import datetime

import numpy as np
import pytest

from trawmem_gpu.ingest import build_banks, update_bank
from trawmem_gpu.store.graph import ADJACENT, SEMANTIC
from trawmem_gpu.ingest.config import BuildConfig
from trawmem_gpu.data import load_jsonl, load_locomo, sample_path
from trawmem_gpu.data.types import Conversation, Turn
from trawmem_gpu.encode import get_encoder
from trawmem_gpu.encode.base import Encoder
from trawmem_gpu.errors import BankError, InputError, NoLLMConfigured
from trawmem_gpu.store import FORMAT_VERSION, Collection, load_bank, pack_banks, save_bank
from trawmem_gpu.store import files as store_files
from trawmem_gpu.store.files import META, TENSORS, UNITS
from bank_compare import assert_banks_equal

# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------

TOPICS = {
    "cooking": ["I tried a new lasagna recipe with fresh basil and ricotta last night.",
                "Did you make the pasta sheets yourself or buy them?",
                "I rolled the dough by hand, it took forever but tasted amazing.",
                "Next time add some nutmeg to the bechamel sauce, trust me.",
                "Good idea, my grandmother always used nutmeg in her sauces.",
                "Save me a slice of that lasagna please!"],
    "hiking": ["We finally hiked the ridge trail up to the summit on Saturday.",
               "How long did the climb to the mountain top take you?",
               "About five hours, my new boots gave me blisters on the descent.",
               "You should break in hiking boots on short walks first.",
               "The view over the valley from the peak was worth every blister.",
               "Let's plan a camping trip on that trail in the autumn."],
    "job": ["My manager offered me a promotion to team lead at the office.",
            "Congratulations! Will you get a raise with the new position?",
            "Yes, a salary increase, but I will manage eight engineers now.",
            "Leading a team is a big change from writing code all day.",
            "I start the new role after the quarterly performance reviews."],
    "pets": ["We adopted a rescue puppy from the animal shelter this week.",
             "What breed is the dog and what did you name him?",
             "He is a beagle mix, we call him Biscuit, he chews every shoe.",
             "Take him to the vet for his vaccinations and a checkup.",
             "The vet said Biscuit is healthy but needs a lot of walks on a leash.",
             "Puppies need training classes too, our dog loved obedience school."],
    "music": ["I started taking guitar lessons and learned my first chords.",
              "Which songs are you practicing on the guitar?",
              "Mostly folk songs, my fingers hurt from pressing the strings.",
              "We should go to the jazz concert downtown, the band is great.",
              "I would love to see a live band play, get us two tickets.",
              "My guitar teacher plays saxophone in that jazz band."],
    "travel": ["I booked a flight to Lisbon for the spring holidays.",
               "Do you have a hotel near the old town yet?",
               "Yes, a small hotel by the river, and I renewed my passport.",
               "Try the custard tarts in Belem and ride the yellow tram.",
               "I also want a day trip to the palaces in Sintra by train.",
               "Send me postcards from Portugal!"],
}

SESSIONS = [  # (date, [(topic, n turns)])
    (datetime(2024, 1, 5, 18, 0), [("cooking", 6), ("hiking", 6), ("job", 5)]),
    (datetime(2024, 1, 12, 9, 30), [("pets", 6), ("music", 6)]),
    (datetime(2024, 1, 20, 20, 15), [("travel", 6), ("cooking", 4), ("job", 4)]),
    (datetime(2024, 2, 1, 12, 0), [("music", 2)]),
]


def synthetic_conversation(bank_id: str = "syn") -> Conversation:
    """Four sessions (17, 12, 14, 2 turns), several topics per session, one image turn."""
    turns = []
    for s, (date, parts) in enumerate(SESSIONS, 1):
        k = 0
        for topic, n in parts:
            for text in TOPICS[topic][:n]:
                k += 1
                cap = "a photo of a beagle puppy on a rug" if (s == 2 and k == 3) else None
                turns.append(Turn(f"D{s}:{k}", "Ana" if k % 2 else "Ben", text, s, date.isoformat(), date, cap))
    return Conversation(bank_id, turns, ("Ana", "Ben"))


N_SYN = sum(n for _, parts in SESSIONS for _, n in parts)
SESSION_STARTS = np.cumsum([0] + [sum(n for _, n in parts) for _, parts in SESSIONS]).tolist()  # [0,17,29,43,45]


@pytest.fixture(scope="session")
def encoder():
    return get_encoder("minilm")


@pytest.fixture(scope="session")
def syn_conv():
    return synthetic_conversation()


@pytest.fixture(scope="session")
def syn_bank(syn_conv, encoder):
    (bank,), _ = build_banks([syn_conv], BuildConfig(), encoder, progress=False)
    return bank


@pytest.fixture(scope="session")
def dev_banks(dev_path, encoder):
    """(conversations, banks, stats) for all 7 dev conversations, default build config."""
    convs = load_locomo(dev_path)
    banks, stats = build_banks(convs, BuildConfig(), encoder, progress=False)
    return convs, banks, stats


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def check_bank_invariants(bank, cfg: BuildConfig):
    N, J = bank.n_units, bank.n_threads
    off = bank.thread_offsets
    lens = np.diff(off)
    assert off[0] == 0 and off[-1] == N
    assert np.all(lens > 0), "empty thread"
    # every unit in exactly one thread
    ut = bank.unit_thread
    assert len(ut) == N and np.array_equal(np.bincount(ut, minlength=J), lens)
    # no thread crosses a session; threads start at every session start
    sess = np.array([t.session for t in bank.turns])
    for j in range(J):
        assert len(set(sess[off[j]:off[j + 1]])) == 1, f"thread {j} crosses a session"
    session_starts = {0} | {i for i in range(1, N) if sess[i] != sess[i - 1]}
    assert session_starts <= set(off[:-1].tolist())
    if cfg.segmentation == "embedding":
        assert lens.max() <= cfg.max_thread_len
        sess_len = {s: int((sess == s).sum()) for s in set(sess.tolist())}
        for j in range(J):
            assert lens[j] >= cfg.min_thread_len or lens[j] == sess_len[sess[off[j]]]
    # vectors finite and unit-norm
    for v, n in ((bank.unit_vecs, N), (bank.head_vecs, J)):
        assert v.shape[0] == n and v.dtype == np.float32
        assert np.all(np.isfinite(v))
        np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert len(bank.heads) == J and all(h.strip() for h in bank.heads)
    assert set(bank.head_kind) == {"extractive"}
    # edges: symmetric, sorted, no self loops or duplicates, weights in [0, 1]
    src, dst, w, kind = bank.edge_src, bank.edge_dst, bank.edge_w, bank.edge_kind
    assert len(src) == len(dst) == len(w) == len(kind)
    assert np.all(src != dst)
    assert np.all((w >= 0) & (w <= 1))
    order = np.lexsort((dst, src))
    assert np.array_equal(order, np.arange(len(src))), "edges not sorted by (src, dst)"
    pairs = list(zip(src.tolist(), dst.tolist()))
    assert len(set(pairs)) == len(pairs)
    fwd = {(a, b): (float(x), int(k)) for a, b, x, k in zip(src.tolist(), dst.tolist(), w, kind)}
    for (a, b), v in fwd.items():
        assert fwd.get((b, a)) == v, f"edge {a}->{b} has no mirror"
    # adjacency edges are exactly the consecutive thread pairs, weight 1
    adj = {(a, b) for (a, b), (x, k) in fwd.items() if k == ADJACENT}
    assert adj == {(j, j + 1) for j in range(J - 1)} | {(j + 1, j) for j in range(J - 1)}
    assert all(x == 1.0 for (x, k) in fwd.values() if k == ADJACENT)
    # semantic edges: weight = cosine of the heads, at least the threshold
    sem = [(a, b, x) for (a, b), (x, k) in fwd.items() if k == SEMANTIC]
    assert set(kind.tolist()) <= {ADJACENT, SEMANTIC}
    for a, b, x in sem:
        assert abs(b - a) > 1
        c = float(bank.head_vecs[a] @ bank.head_vecs[b])
        assert abs(x - min(max(c, 0.0), 1.0)) < 1e-4
        assert c >= cfg.knn_threshold - 1e-5
    bank.validate()


def split_turns(conv, k):
    return Conversation(conv.bank_id, list(conv.turns[:k]), conv.speakers), list(conv.turns[k:])


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
# (b) store round trip
# ----------------------------------------------------------------------------------------------

def test_save_load_round_trip_exact_dev(dev_banks, tmp_path):
    _, banks, _ = dev_banks
    for b in banks:
        d = save_bank(b, tmp_path / b.bank_id)
        assert sorted(p.name for p in d.iterdir()) == sorted([TENSORS, UNITS, META])
        back = load_bank(d)
        assert_banks_equal(b, back, exact=True)
        meta = json.loads((d / META).read_text())
        assert meta["format_version"] == FORMAT_VERSION
        assert meta["encoder_id"] == b.encoder_id == "all-MiniLM-L6-v2:mean:256"
        assert meta["build_config"] == BuildConfig().to_dict()
        assert set(meta["checksums"]) == {TENSORS, UNITS}
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
    _rewrite_meta(saved, lambda m: m.update(heads=m["heads"][:-1]))  # validate() catches the count
    _bank_error(saved, str(saved), "do not match")


@pytest.mark.parametrize("field,value", [("heads", None), ("bank_id", "other"), ("build_config", {}),
                                         ("encoder_id", "x"), ("turns_sha256", "0" * 64)])
def test_meta_edit_without_rehash_is_caught(saved, field, value):
    """Heads, bank id, build config, encoder: everything that affects selection is checksummed."""
    def edit(m):
        m[field] = value if value is not None else [h + " tampered" for h in m["heads"]]
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


# ----------------------------------------------------------------------------------------------
# (f) CLI
# ----------------------------------------------------------------------------------------------

def _main(argv):
    from trawmem_gpu.cli import main

    return main(argv)


def test_cli_build_and_info_sample(tmp_path, capsys):
    out = tmp_path / "coll"
    assert _main(["build", "--input", str(sample_path()), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "built 1 bank," in printed and "encode" in printed and "graph" in printed
    assert _main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    convs = load_jsonl(sample_path())
    n = sum(len(c.turns) for c in convs)
    assert info["banks"] == len(convs) and info["units"] == n
    assert info["encoder"] == "all-MiniLM-L6-v2:mean:256"
    tl = info["thread_length"]
    assert 2 <= tl["mean"] <= 15 and tl["min"] >= 1 and tl["max"] <= BuildConfig().max_thread_len
    assert info["threads"] == sum(r["threads"] for r in info["per_bank"])
    assert info["edges"]["adjacent"] == info["threads"] - info["banks"]
    bank = Collection(out).load(convs[0].bank_id)
    check_bank_invariants(bank, BuildConfig())
    # plain-text info, and info on one bank directory
    assert _main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{n} units" in text and "thread length: mean" in text
    assert _main(["info", str(Collection(out).bank_path(convs[0].bank_id)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["units"] == n


def test_cli_fixed_segmentation(tmp_path, capsys):
    out = tmp_path / "coll"
    assert _main(["build", "--input", str(sample_path()), "--out", str(out), "--segmentation", "fixed",
                  "--fixed-size", "5", "--quiet"]) == 0
    capsys.readouterr()
    (b,) = Collection(out).load_all()
    assert b.build_config["segmentation"] == "fixed" and np.diff(b.thread_offsets).max() <= 5


def test_cli_update(tmp_path, capsys):
    lines = sample_path().read_text(encoding="utf-8").splitlines(keepends=True)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(lines[:20]), encoding="utf-8")
    inc, full = tmp_path / "inc", tmp_path / "full"
    assert _main(["build", "--input", str(part), "--out", str(inc), "--quiet"]) == 0
    assert _main(["build", "--input", str(sample_path()), "--out", str(inc), "--update", "--quiet"]) == 0
    printed = capsys.readouterr().out
    bank_id = load_jsonl(sample_path())[0].bank_id
    assert f"updated {bank_id}: +{len([l for l in lines if l.strip()]) - 20} units" in printed
    assert _main(["build", "--input", str(sample_path()), "--out", str(full), "--quiet"]) == 0
    capsys.readouterr()
    assert_banks_equal(Collection(inc).load(bank_id), Collection(full).load(bank_id), exact=False)
    # an input whose history conflicts with the stored one is refused with exit code 2
    other = tmp_path / "other.jsonl"
    rec = json.loads(lines[3])
    rec["text"] = "an edited message"
    other.write_text("".join(lines[:3]) + json.dumps(rec) + "\n" + "".join(lines[4:]), encoding="utf-8")
    assert _main(["build", "--input", str(other), "--out", str(inc), "--update", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"turn {rec['turn_id']!r} differs" in err and "'text'" in err and "Traceback" not in err


def _one_line_error(capsys, *fragments):
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert err.count("\n") == 0, err
    assert "Traceback" not in cap.err
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"
    return err


def test_cli_bad_input_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(sample_path().read_text().splitlines()[0] + "\n{oops\n", encoding="utf-8")
    assert _main(["build", "--input", str(bad), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = _one_line_error(capsys, f"{bad}:2", "bad JSON")
    assert err.startswith("trawmem build: error:")
    assert not (tmp_path / "o" / "banks").exists()

    miss = tmp_path / "missing.jsonl"
    miss.write_text('{"bank_id": "a", "turn_id": "1", "speaker": "A", "timestamp": "2024-01-01"}\n')
    assert _main(["build", "--input", str(miss), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    _one_line_error(capsys, f"{miss}:1", "'text'")

    loc = tmp_path / "bad.json"
    loc.write_text(json.dumps([{"sample_id": "s", "conversation": {"session_1_date_time": "never",
                                                                    "session_1": [{"speaker": "A", "dia_id": "D" + "1:1",
                                                                                   "text": "hi"}]}}]))
    assert _main(["build", "--input", str(loc), "--out", str(tmp_path / "o"), "--format", "locomo"]) == 2
    _one_line_error(capsys, str(loc), "sample 0", "session_1_date_time")

    assert _main(["build", "--input", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "nope.jsonl", "not found")


def test_cli_llm_without_backend_exit_2(tmp_path, capsys):
    assert _main(["build", "--input", str(sample_path()), "--out", str(tmp_path / "o"), "--segmentation", "llm",
                  "--quiet"]) == 2
    _one_line_error(capsys, "segmentation='llm'", "none configured")


def test_cli_info_on_corrupt_or_missing(tmp_path, capsys, syn_bank):
    assert _main(["info", str(tmp_path / "nothing")]) == 2
    _one_line_error(capsys, "nothing: does not exist")
    (tmp_path / "empty").mkdir()
    assert _main(["info", str(tmp_path / "empty")]) == 2
    _one_line_error(capsys, "not a collection")
    d = save_bank(syn_bank, tmp_path / "b")
    (d / UNITS).unlink()
    assert _main(["info", str(d)]) == 2
    _one_line_error(capsys, UNITS, "missing")
