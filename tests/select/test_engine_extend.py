"""An append's engine refresh from the tables of the bank it grew from (``select/engine/extend.py``,
``BM25Index.appended``, the burst offsets kept on the bank, the in-place publish of
``select/engine/publish.py``) gives exactly what a fresh engine over the appended bank builds:
every table row of every group, the bank's token costs, speakers, BM25 vocabulary and scores,
its burst view, and the picks. Random appends of real ``update_bank`` banks extend the last
session (and its last thread and burst), open new sessions, join earlier threads through the
nearest-head graph, change turn metadata, and go on after a forget; under each heading style."""
from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest

from word_encoder import WordEncoder
from trawmem_gpu.data.types import Conversation, Turn
from trawmem_gpu.ingest import build_banks, update_bank
from trawmem_gpu.ingest.forget import without_turns
from trawmem_gpu.memory.engines import ServedEngine
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.engine import bank_tables as tables_mod
from trawmem_gpu.select.engine.tables import TABLES
from trawmem_gpu.select.lexical import BM25Index
from trawmem_gpu.select.params import QueryParams
from trawmem_gpu.store.bursts import bank_bursts, burst_view

ENC = WordEncoder()
WORDS = ("dog cat hike lake paris school paint music trip sister book garden piano beach yoga race cook "
         "friend movie bike sunday yesterday").split()
QUESTIONS = ["When did they hike to the lake?", "Which book did her sister paint?", "What about the piano last sunday?"]
PARAMS = [QueryParams(budget=4), QueryParams(budget=None, token_budget=90), QueryParams(budget=6, hops=2)]


def _stream(rng, n: int, words: tuple[int, int], runs: bool) -> list[Turn]:
    """Messages in sessions: with ``runs``, runs of one speaker seconds apart (bursts), else every
    message the other speaker's; turns between speakers minutes apart, a new session a day later,
    metadata now and then."""
    out, t, session, spk = [], datetime(2024, 1, 1, 9), 1, "Ann"
    for i in range(n):
        r = rng.random()
        if i and r < 0.1:
            session, t = session + 1, t + timedelta(days=1)
        elif r < 0.5 and runs:
            t += timedelta(seconds=int(rng.choice([5, 10, 20])))  # a few gap values: the burst gap settles
        else:
            spk, t = ("Bob" if spk == "Ann" else "Ann"), t + timedelta(minutes=int(rng.choice([5, 15, 30])))
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(*words))))
        meta = {"topic": "work"} if rng.random() < 0.08 else None
        out.append(Turn(f"m{i}", spk, text, session, t.strftime("%d %B %Y"), t, metadata=meta))
    return out


def _make(banks, cfg):
    return SelectionEngine(banks, cfg, device="cpu")


def _rows(served: ServedEngine, bank_id: str) -> dict:
    eng = served.engine
    e = eng._store._entries[bank_id]
    snap = eng.snapshot
    out = {name: snap.t[name][e.start[g]:e.start[g] + e.count[g]].cpu().numpy().copy() for name, g, _, _ in TABLES}
    have = out["nbr"] >= 0  # packed rows (assembly.packed_length): a row's neighbours, then -1
    assert (have == np.cumprod(have, axis=1).astype(bool)).all()
    width = int((out["nbr"] >= 0).sum(1).max())  # the buffers' width is the widest bank's ever held
    assert (out["nbr"][:, width:] == -1).all() and (out["nbw"][:, width:] == 0).all()
    out["nbr"], out["nbw"] = out["nbr"][:, :width], out["nbw"][:, :width]
    info = snap.infos[snap.bank_index(bank_id)]
    if info.costs is not None:
        out["costs"] = (info.costs.unit, info.costs.heading, info.costs.runs(np.arange(info.n_threads)),
                        np.array([info.costs.bounded]))
    out["speakers"] = np.array(info.speakers, dtype=object)
    out["vocab"] = np.array(list(info.vocab.items()), dtype=object)
    # the BM25 matrix is the bm_* tables' rows (above); the info keeps a lean index (BM25Index.lean)
    # whose term frequencies and lengths a later append extends
    assert info.bm25.is_lean and "data" not in info.bm25.model.scores
    out["bm25_tf"], out["bm25_lens"] = info.bm25._post.tf, info.bm25._post.lens
    out["bm25_ptr"] = info.bm25.model.scores["indptr"]
    out["units"] = np.array([(t.turn_id, t.text) for t in info.bank.turns], dtype=object)
    return out


def _same(got: dict, want: dict, step: str) -> None:
    assert got.keys() == want.keys()
    for k in want:
        g, w = got[k], want[k]
        for a, b in (zip(g, w) if isinstance(w, tuple) else [(g, w)]):
            np.testing.assert_array_equal(a, b, err_msg=f"{k} after {step}")


def _picks(served: ServedEngine, Z) -> list:
    eng = served.engine
    return [eng.select_units(["c"] * len(QUESTIONS), QUESTIONS, Z, params=[p] * len(QUESTIONS)) for p in PARAMS]


@pytest.mark.parametrize("headings,runs", [("date", False), ("gist", False), ("none", False), ("date", True)],
                         ids=["date", "gist", "none", "date-bursts"])
def test_random_appends_refresh_what_a_fresh_engine_builds(headings, runs, monkeypatch):
    calls = []
    real = tables_mod.extend_arrays
    monkeypatch.setattr(tables_mod, "extend_arrays", lambda *a: calls.append(r := real(*a)) or r)
    rng = np.random.default_rng(7 + len(headings) + runs)
    turns = _stream(rng, 64, (2, 9), runs)
    (bank,), _ = build_banks([Conversation("c", turns[:16])], encoder=ENC, progress=False)
    cfg = SelectConfig(headings=headings)
    served = ServedEngine({"c": bank}, cfg, _make)
    Z = ENC.encode(QUESTIONS, is_query=True)
    n, forgot = 16, False
    while n < len(turns):
        k = int(rng.integers(1, 4))
        bank, _ = update_bank(bank, turns[n:n + k], encoder=ENC)
        n += k
        step = f"{n} turns"
        if not forgot and n > 40:  # a forget in the middle: the next appends extend the bank it left
            bank, _ = without_turns(bank, [bank.turns[len(bank.turns) // 2].turn_id], ENC)
            forgot, step = True, step + " and a forget"
        served.refresh(bank, served.prepare(bank))
        fresh = ServedEngine({"c": bank}, cfg, _make)
        _same(_rows(served, "c"), _rows(fresh, "c"), step)
        assert _picks(served, Z) == _picks(fresh, Z), step
        bare = type(bank)(**{f: getattr(bank, f) for f in (  # the bank without what was kept on it
            "bank_id", "turns", "thread_offsets", "heads", "head_kind", "unit_vecs", "head_vecs", "edge_src",
            "edge_dst", "edge_w", "edge_kind", "encoder_id")})
        assert bank_bursts(bank).tolist() == bank_bursts(bare).tolist(), step
        view, whole = served.views["c"], burst_view(bare)
        assert view.turns == whole.turns and np.array_equal(view.unit_vecs, whole.unit_vecs), step
        assert np.array_equal(view.thread_offsets, whole.thread_offsets), step
    if runs:  # the bursts make a view
        assert fresh.views["c"] is not bank
    assert sum(c is not None for c in calls) >= (5 if runs else 10), len(calls)


def test_bm25_appended_is_an_index_built_whole():
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 9)))) for _ in range(120)]
    texts[5], texts[40] = "", "a I"  # no terms at all
    texts[70] = "zebra quokka " * 3  # new terms, repeated
    texts = [t + f" rare{i}" if i % 3 == 0 else t for i, t in enumerate(texts)]  # terms of one text only
    idx, n, kept, refused = BM25Index(texts[:10]), 10, 0, 0
    cur = texts[:10]
    while n < len(texts):
        k, drop = int(rng.integers(1, 12)), int(rng.integers(0, 3))  # drop: the last texts change (a burst grows)
        new = idx.appended(texts[n:n + k], len(cur) - drop)
        if new is None:  # a term first occurs in a dropped text: the index is built whole
            refused += 1
            assert drop and any(w not in BM25Index(cur[:-drop]).vocab for w in BM25Index(cur[-drop:]).vocab if w)
            continue
        kept += drop > 0
        idx, cur, n = new, cur[:len(cur) - drop] + texts[n:n + k], n + k
        whole = BM25Index(cur)
        assert list(idx.vocab.items()) == list(whole.vocab.items())
        for key in ("data", "indices", "indptr", "num_docs"):
            a, b = idx.model.scores[key], whole.model.scores[key]
            assert np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b), key
        for q in QUESTIONS + ["zebra"]:
            assert np.array_equal(idx.scores(q), whole.scores(q))
    assert kept and refused
