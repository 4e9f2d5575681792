"""A ``Memory`` whose banks load as compact columns (``store.turn_columns``, the default) against the
same ``Memory`` with its banks loaded as lists of ``Turn`` (the loader patched back to a list):
identical workspaces, picks, candidate pools and stored files, through selects, an append and a
forget, on synthetic turns (unicode, empty texts, odd sizes) and on the LoCoMo dev turns when the
dev data is there; and a forget leaves no columns buffer in the process holding the forgotten text."""
from __future__ import annotations

import gc
import json
import shutil

import pytest

from trawmem_gpu.data.types import Turn
from trawmem_gpu.store.columns import Columns
from trawmem_gpu.store.turn_columns import TurnColumns

from turn_columns_data import QUESTIONS, synthetic_turns  # noqa: E402  (tests/support)


def _columns_from(n: int, monkeypatch):
    """Load banks of at least ``n`` turns as columns (``files.COLUMNS_MIN_TURNS``: these banks are small)."""
    from trawmem_gpu.store import files

    monkeypatch.setattr(files, "COLUMNS_MIN_TURNS", n)


def _as_list(monkeypatch):
    """Make ``load_bank`` give a list of ``Turn`` objects, as it did before the columns."""
    from trawmem_gpu.store import files

    real = files._read_turns

    def read(fp):
        turns, digest = real(fp)
        return list(turns), digest

    monkeypatch.setattr(files, "_read_turns", read)


def _stored(d) -> dict:
    """Every file of the collection's bank directories, ``meta.json`` without its ``stats``
    (build timings)."""
    out = {}
    for p in sorted(d.rglob("*")):
        if not p.is_file() or "banks" not in p.parts and p.name != "collection.json":
            continue
        rel = p.relative_to(d).as_posix()
        if p.name == "meta.json":
            m = json.loads(p.read_text())
            out[rel] = {k: v for k, v in m.items() if k not in ("stats", "meta_sha256")}
        else:
            out[rel] = p.read_bytes()
    return out


def _run(d, bank_id: str, questions, new, forget, expect_columns: bool) -> dict:
    """Selects, an append, selects, a forget, selects on the collection at ``d`` (a copy per mode)."""
    from word_encoder import WordEncoder

    from trawmem_gpu import Memory
    from trawmem_gpu.select.config import SelectConfig
    from trawmem_gpu.select.engine import SelectionEngine
    from trawmem_gpu.store import Collection

    assert isinstance(Collection(d).load(bank_id).turns, TurnColumns) == expect_columns
    mem = Memory(d, encoder=WordEncoder())
    rec = {}

    def selects(tag):
        for k, q in enumerate(questions):
            for budget in (40, 400):
                ws = mem.select(bank_id, q, token_budget=budget)
                rec[tag, k, budget] = (ws.text, list(ws.unit_ids), ws.tokens)
        rec[tag, "turns"] = list(mem.turns(bank_id))
        bank = Collection(d).load(bank_id)  # as stored, loaded as this mode loads it: the engine's pools
        eng = SelectionEngine([bank], SelectConfig(), device="cpu", threads=1)
        ids, qs = [bank_id] * len(questions), list(questions)
        Z = WordEncoder().encode(qs, is_query=True)
        rec[tag, "pools"] = [x.tolist() for x in eng.candidate_sets(ids, qs, Z)]
        rec[tag, "picks"] = [[int(u) for u in x] for x in eng.select_units(ids, qs, Z)]

    selects("loaded")
    mem.add(bank_id, new)
    selects("appended")
    mem.forget(bank_id, forget)
    selects("forgot")
    rec["files"] = _stored(d)
    return rec


def _compare(tmp_path, monkeypatch, bank_id, turns, questions, n_new, forget):
    from word_encoder import WordEncoder

    from trawmem_gpu import Memory
    from trawmem_gpu.store import records

    monkeypatch.setattr(records, "utc_now", lambda: "2030-01-01T00:00:00")  # the same stored_at in both
    _columns_from(0, monkeypatch)
    base = tmp_path / "base"
    Memory(base, encoder=WordEncoder()).add(bank_id, turns[:-n_new])
    for mode in ("cols", "list"):
        shutil.copytree(base, tmp_path / mode)
    got = _run(tmp_path / "cols", bank_id, questions, turns[-n_new:], forget, True)
    _as_list(monkeypatch)
    want = _run(tmp_path / "list", bank_id, questions, turns[-n_new:], forget, False)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == want[k], k
    assert any(got[k][1] for k in got if isinstance(k, tuple) and len(k) == 3)  # something was picked


@pytest.mark.parametrize("n", [5, 23, 61])
def test_columns_and_lists_give_the_same_memory_on_synthetic_turns(tmp_path, monkeypatch, n):
    turns = synthetic_turns(n + 3, seed=n)
    _compare(tmp_path, monkeypatch, "b", turns, QUESTIONS, 3, [turns[1].turn_id, turns[n // 2].turn_id])


def test_columns_and_lists_give_the_same_memory_on_the_dev_turns(tmp_path, monkeypatch, dev_path):
    from trawmem_gpu.data import load_conversations

    conv = load_conversations(dev_path)[0]
    turns = list(conv.turns)
    qs = [q.question for q in conv.questions[:6]]
    _compare(tmp_path, monkeypatch, conv.bank_id, turns, qs, 5, [turns[10].turn_id, turns[200].turn_id])


def test_a_forget_leaves_no_columns_buffer_with_the_forgotten_text(tmp_path, monkeypatch):
    from word_encoder import WordEncoder

    from trawmem_gpu import Memory

    _columns_from(0, monkeypatch)
    turns = synthetic_turns(30, seed=4)
    secret = "the vault code is zebra-4471"
    turns[7] = Turn(turns[7].turn_id, turns[7].speaker, secret, turns[7].session, turns[7].timestamp, turns[7].time)
    Memory(tmp_path / "m", encoder=WordEncoder()).add("b", turns)
    mem = Memory(tmp_path / "m", encoder=WordEncoder())
    mem.select("b", "what is the code?", token_budget=200)  # the bank loaded (as columns) into the engine
    held = [c for c in gc.get_objects() if type(c) is Columns and secret.encode() in c.texts.buf.tobytes()]
    assert held  # the check below can see a columns buffer holding it
    del held
    mem.forget("b", [turns[7].turn_id])
    mem.select("b", "what is the code?", token_budget=200)
    gc.collect()
    assert not [c for c in gc.get_objects() if type(c) is Columns and secret.encode() in c.texts.buf.tobytes()]


def test_a_bank_under_the_size_keeps_a_list_and_one_at_it_loads_columns(tmp_path, monkeypatch):
    """``files.COLUMNS_MIN_TURNS``: a small bank keeps list speed; from the size on, columns."""
    from word_encoder import WordEncoder

    from trawmem_gpu import Memory
    from trawmem_gpu.store import Collection

    turns = synthetic_turns(40, seed=6)
    Memory(tmp_path / "m", encoder=WordEncoder()).add("b", turns)
    _columns_from(41, monkeypatch)
    small = Collection(tmp_path / "m").load("b").turns
    assert type(small) is list and len(small) == 40
    _columns_from(40, monkeypatch)
    cols = Collection(tmp_path / "m").load("b").turns
    assert isinstance(cols, TurnColumns) and list(cols) == small
