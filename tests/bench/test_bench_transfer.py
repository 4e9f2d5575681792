"""The transfer bench's pieces that need no dev data: the chunks of banks ``select_variant``
selects from (every question once, in a chunk of its bank, chunks about ``CHUNK_UNITS`` units)
and the verdict rule (a candidate loses a column when its interval lies wholly below 0)."""
from types import SimpleNamespace as NS

import pytest

from benchmarks.transfer_bench import variants
from benchmarks.transfer_bench.run import Run


def _set(sizes: dict, asks: list[str]):
    ctxs = {b: NS(bank=NS(n_units=n)) for b, n in sizes.items()}
    return NS(questions=[NS(bank_id=b) for b in asks], ctxs=ctxs)


@pytest.mark.parametrize("cap", [1, 300, 1000, 10**6])
def test_chunks_hold_every_question_once_by_bank_within_the_cap(monkeypatch, cap):
    monkeypatch.setattr(variants, "CHUNK_UNITS", cap)
    sizes = {"a": 250, "b": 600, "c": 120, "d": 1500, "e": 90}
    asks = ["b", "a", "b", "d", "e", "c", "a", "e", "e"]
    ds = _set(sizes, asks)
    rows = [0, 2, 3, 4, 5, 6, 8]  # one weight group's questions
    chunks = variants._bank_chunks(ds, rows, ds)
    assert sorted(i for c in chunks for i in c) == rows and all(chunks)
    banks = [{asks[i] for i in c} for c in chunks]
    assert all(not (x & y) for j, x in enumerate(banks) for y in banks[j + 1:])  # a bank in one chunk
    for bs in banks:  # over the cap only when one bank is over it alone
        assert sum(sizes[b] for b in bs) <= cap or len(bs) == 1
    if cap >= sum(sizes.values()):
        assert len(chunks) == 1
    if cap == 1:
        assert len(chunks) == len({asks[i] for i in rows})


def test_no_rows_no_chunks():
    ds = _set({"a": 10}, ["a"])
    assert variants._bank_chunks(ds, [], ds) == []


def test_a_candidate_loses_a_column_only_when_its_interval_is_below_zero():
    def row(v, lo, hi, mh=None):
        d = {"ci95": [lo, hi]} | ({"multi_hop": {"ci95": list(mh)}} if mh else {})
        return {"variant": v, "fit": "locomo", "set": "locomo/plain", "T": 400, "vs_defaults": d}

    out = Run.verdicts([{"variant": "defaults"}, row("x", -0.02, 0.01), row("x", -0.03, -0.001),
                        row("y", 0.001, 0.02), row("y", -0.01, 0.01, (-0.05, -0.01))])
    assert out["x"]["loses"] and len(out["x"]["loses"]) == 1 and not out["x"]["survives"]
    assert len(out["y"]["gains"]) == 1 and len(out["y"]["loses"]) == 1  # multi-hop below 0 loses too
    assert out["x"]["columns"] == 2 and "defaults" not in out


# -- the unit-vector experiment switch (transfer_bench.unit_vecs) --------------------------------

def _stub_encoder(dim=16):
    """Deterministic unit vectors by text (as the encoders give: L2-normalized), recording what it
    was asked."""
    import zlib

    import numpy as np

    seen: list = []

    def encode(texts, **_):
        seen.extend(texts)
        v = np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=dim) for t in texts])
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype("f4")

    return NS(encode=encode, seen=seen)


def _chat_bank():
    from dataclasses import replace
    from datetime import datetime, timedelta

    from engine_banks import make_bank
    from trawmem_gpu.data.types import Turn

    t0 = datetime(2023, 5, 1, 10, 0)
    rows = [("m1", "Ann", "hi there", 0), ("m2", "Ann", "i got a dog", 3), ("m3", "Bob", "no way. what breed?", 300)]
    b = replace(make_bank("chat", [3], seed=1), turns=[Turn(i, s, x, 0, "1 May 2023", t0 + timedelta(seconds=d))
                                                       for i, s, x, d in rows])
    b.validate()
    return b


def test_the_switch_is_off_unless_set_and_refuses_unknown_forms(monkeypatch):
    from benchmarks.transfer_bench import unit_vecs as U

    monkeypatch.delenv(U.ENV, raising=False)
    assert U.forms() == {} and U.form_for("split") == "mean"
    monkeypatch.setenv(U.ENV, "split=encoded, plain=sentence-mean,chat=mean")
    assert U.forms() == {"split": "encoded", "plain": "sentence-mean"}
    monkeypatch.setenv(U.ENV, "split=median")
    with pytest.raises(ValueError):
        U.forms()


def test_encoded_bursts_and_sentence_means_replace_only_their_units():
    import numpy as np

    from benchmarks.transfer_bench.unit_vecs import revectored
    from trawmem_gpu.store.bursts import burst_view

    bank, enc = _chat_bank(), _stub_encoder()
    view = burst_view(bank)
    assert len(view.turns) == 2  # Ann's burst, Bob's message
    got = revectored(view, bank, "encoded", enc)
    want = enc.encode([view.turns[0].embed_text()])[0]
    assert np.allclose(got.unit_vecs[0], want / np.linalg.norm(want), atol=1e-6)
    assert np.array_equal(got.unit_vecs[1], view.unit_vecs[1]) and got.turns == view.turns
    assert revectored(bank, bank, "encoded", enc) is bank  # no burst: nothing to encode
    sm = revectored(view, bank, "sentence-mean", enc)  # Bob's two sentences, each with date and speaker
    a, b = enc.encode(["[1 May 2023] Bob: no way.", "[1 May 2023] Bob: what breed?"])
    m = a.astype(np.float64) + b
    assert np.allclose(sm.unit_vecs[1], m / np.linalg.norm(m), atol=1e-5)
    assert np.array_equal(sm.unit_vecs[0], view.unit_vecs[0])  # one sentence: as it was


def test_the_switch_patches_the_burst_view_inside_its_block_only(monkeypatch):
    import trawmem_gpu.encode as E
    import trawmem_gpu.store.view as V
    from benchmarks.transfer_bench import unit_vecs as U

    orig = V.burst_view
    monkeypatch.setattr(E, "get_encoder", lambda *a, **k: _stub_encoder())
    monkeypatch.setenv(U.ENV, "split=encoded")
    with U.unit_vectors("plain"):
        assert V.burst_view is orig
    with U.unit_vectors("split"):
        assert V.burst_view is not orig
        bank = _chat_bank()
        assert not (V.unit_view(bank).unit_vecs == orig(bank).unit_vecs).all()
    assert V.burst_view is orig
