"""A loaded bank's turns as compact columns (``store.turn_columns.TurnColumns``) against the list of
``Turn`` objects they replace: the sequence itself (random turns: unicode, empty texts, captions,
metadata, aware and naive times; odd sizes and empty), appends, forgets, the id map, and a whole
``Memory`` over a collection loaded with columns against one loaded as lists (same workspaces,
picks, candidate pools and stored files)."""
from __future__ import annotations

import gc
import pickle
import random
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from trawmem_gpu.data.metadata import Metadata
from trawmem_gpu.data.types import Turn, turns_digest
from trawmem_gpu.store.columns import Columns
from trawmem_gpu.store.turn_columns import (FIELDS, TurnColumns, appended, common_prefix, duplicate_id, embed_texts,
                                            field_of, held_values, taken)

WORDS = ["", "dog", "café", "日本語", "🌍", "a\nb", "\"quoted\"", "x" * 300, "Ⅻ", "naïve"]


def random_turns(n: int, seed: int = 0, aware: bool = False) -> list[Turn]:
    """``n`` turns in source order with every field's kinds mixed (``aware``: some times carry an
    offset, which the columns store as naive UTC)."""
    rng = random.Random(seed)
    out, session = [], 0
    for i in range(n):
        session += rng.random() < 0.2
        when = None if rng.random() < 0.2 else datetime(2030, 1, 1) + timedelta(seconds=rng.randrange(10 ** 8),
                                                                                microseconds=rng.randrange(10 ** 6))
        if when is not None and aware and rng.random() < 0.5:
            when = when.replace(tzinfo=timezone(timedelta(hours=rng.randrange(-12, 13))))
        out.append(Turn(f"S{session}:{i}" if rng.random() < 0.8 else f"ü-{i}", rng.choice(["Ana", "Ben", "Zoë", ""]),
                        " ".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 6))), session,
                        f"day {session}" if rng.random() < 0.9 else "", when,
                        rng.choice([None, None, "a cat", ""]),
                        Metadata({"user_id": f"u{i % 3}"}) if rng.random() < 0.3 else None,
                        rng.choice([None, "2026-01-01T00:00:00", "2026-02-01T00:00:00.5"])))
    return out


def naive(turns: list[Turn]) -> list[Turn]:
    from trawmem_gpu.store.records import naive_utc_turns

    return list(naive_utc_turns(turns))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 33])
def test_the_columns_read_as_the_list(n):
    ref = random_turns(n, seed=n)
    cols = TurnColumns.of(ref)
    assert len(cols) == n and list(cols) == ref and cols == ref and ref == cols
    assert list(reversed(cols)) == ref[::-1]
    for i in range(-n, n):
        assert cols[i] == ref[i] and cols[np.int64(i)] == ref[i]
    for i in (n, -n - 1):
        with pytest.raises(IndexError):
            cols[i]
    with pytest.raises(TypeError):
        cols["0"]
    for a in (None, 0, 1, -1, 3, n, n + 5, -n - 5):
        for b in (None, 0, 2, -2, n, n + 5):
            for step in (None, 1, 2, -1, 3):
                assert list(cols[a:b:step]) == ref[a:b:step], (a, b, step)
    assert turns_digest(cols) == turns_digest(ref)
    assert pickle.loads(pickle.dumps(cols)) == ref
    assert cols.texts() == [t.text for t in ref] and cols.ids() == [t.turn_id for t in ref]
    assert cols.sessions().tolist() == [t.session for t in ref]
    for view, want in ((cols, ref), (appended(cols[1:], ref[:2]), ref[1:] + ref[:2])):
        for name in FIELDS:  # the engine build's readers: the columns' fields without a Turn per row
            assert field_of(view, name) == [getattr(t, name) for t in want], name
        assert embed_texts(view) == [t.embed_text() for t in want] == embed_texts(want)
    with pytest.raises(ValueError):
        field_of(cols, "stored_at")
    from trawmem_gpu.data.bursts import session_gaps

    for view, want in ((cols, ref), (appended(cols[1:], ref[:2]), ref[1:] + ref[:2])):
        np.testing.assert_array_equal(session_gaps(view), session_gaps(want))  # NaN where a time is missing
    if n:
        assert cols != ref[:-1] and cols != ref[:-1] + [Turn("other", "x", "y", 0, "")]


def test_aware_times_are_stored_as_their_utc_times():
    ref = random_turns(40, seed=3, aware=True)
    assert any(t.time is not None and t.time.utcoffset() is not None for t in ref)
    assert list(TurnColumns.of(ref)) == naive(ref)


def test_columns_refuse_what_they_cannot_hold():
    with pytest.raises(TypeError):
        Columns.of([Turn("a", "x", "y", True, "")])  # a bool session would be stored as 1
    with pytest.raises(ValueError):
        Columns.of([Turn("a", "x", "y", 2 ** 70, "")])


@pytest.mark.parametrize("n", [1, 5, 30])
def test_an_append_keeps_the_columns_and_adds_a_tail(n):
    ref = random_turns(n + 6, seed=n)
    cols = TurnColumns.of(ref[:n])
    one = appended(cols, ref[n:n + 2])
    two = appended(one, ref[n + 2:])
    assert one.cols is cols.cols and two.cols is cols.cols and list(two) == ref and list(one) == ref[:n + 2]
    assert (cols + ref[n:]) == ref and (ref[:1] + cols) == ref[:1] + ref[:n]
    for a in range(-3, n + 7):
        for b in range(a, n + 8):
            assert list(two[a:b]) == ref[a:b]
    assert common_prefix(cols, two) == n and common_prefix(one, two) == n + 2 and common_prefix(two, two) == n + 6
    assert common_prefix(two, TurnColumns.of(ref)) == 0 and common_prefix(two, ref, 2) == 2
    assert common_prefix(ref, ref[:3] + ref[3:]) == len(ref)
    assert list(TurnColumns.of(two)) == naive(ref) and not TurnColumns.of(two).tail
    assert list(held_values(two, 0)) == ref[n:] and list(held_values(ref, 2)) == ref[2:]


@pytest.mark.parametrize("n", [1, 4, 37])
def test_a_forget_takes_the_kept_rows_and_leaves_no_byte_of_the_others(n):
    ref = random_turns(n, seed=n)
    ref[0] = Turn(ref[0].turn_id, "Forgotten Speaker", "a secret ⚑ text", ref[0].session, "secret day",
                  None, "secret caption", Metadata({"k": "secret"}), "2026-03-03T00:00:00")
    both = appended(TurnColumns.of(ref[: n // 2 + 1]), ref[n // 2 + 1:])
    for keep in ([i for i in range(1, n)], [i for i in range(n) if i % 3], []):
        got = taken(both, keep)
        assert list(got) == [ref[i] for i in keep] and taken(ref, keep) == [ref[i] for i in keep]
        if 0 not in keep:
            c = got.cols
            assert b"secret" not in c.texts.buf.tobytes() and b"secret" not in c.ids.buf.tobytes()
            assert "Forgotten Speaker" not in c.speakers and "secret day" not in c.stamps
            assert "2026-03-03T00:00:00" not in c.stored_ats and "secret caption" not in c.caption.values()


def test_the_id_map_answers_as_the_dict():
    ref = random_turns(50, seed=5)
    both = appended(TurnColumns.of(ref[:40]), ref[40:])
    want = {t.turn_id: t for t in ref}
    got = both.id_map()
    assert len(got) == len(want) and list(got) == list(want) and dict(got.items()) == want
    for k in [*want, "missing", "S0:999", 7]:
        assert (k in got) == (k in want) and got.get(k) == want.get(k)
    view = both[10:45]  # a view's map holds its own rows only
    assert set(view.id_map()) == {t.turn_id for t in ref[10:45]} and ref[3].turn_id not in view.id_map()
    assert duplicate_id(both) is None and duplicate_id(ref) is None
    sent = pickle.loads(pickle.dumps(both))  # another process hashes strings otherwise: no index travels
    assert both.cols._hash is not None and sent.cols._hash is None and sent.id_map()[ref[3].turn_id] == ref[3]
    odd = appended(TurnColumns.of(ref[:3] + [Turn(i, "x", "y", 9, "") for i in ("msg-1", "msg", "msg-x9", "ms", "")]),
                   [Turn("msg-77", "x", "y", 9, ""), Turn("m", "x", "y", 9, "")])
    for view in (both, odd, odd[2:7], odd[4:4], TurnColumns.of([])):  # the message ids' prefix, found in the buffer
        for p in ("msg-", "S", "ü", "", "zz"):
            assert view.ids_with_prefix(p) == [t.turn_id for t in view if t.turn_id.startswith(p)], (view, p)
    dup = appended(both, [Turn(ref[7].turn_id, "x", "y", 99, "")])
    assert duplicate_id(dup) == ref[7].turn_id and duplicate_id(list(dup)) == ref[7].turn_id


def test_a_loaded_bank_holds_columns_and_equals_the_stored_bank(tmp_path, monkeypatch):
    from engine_banks import make_bank

    from trawmem_gpu.store import files
    from trawmem_gpu.store.files import load_bank, save_bank

    monkeypatch.setattr(files, "COLUMNS_MIN_TURNS", 0)  # this bank is small
    bank = make_bank("b", [3, 5, 1, 4, 2], seed=0)
    save_bank(bank, tmp_path / "b")
    got = load_bank(tmp_path / "b")
    assert isinstance(got.turns, TurnColumns) and got.turns == bank.turns
    assert got.turn_map()[bank.turns[3].turn_id] == bank.turns[3]


def test_a_filter_reads_the_columns_metadata_as_the_list():
    from dataclasses import replace

    from engine_banks import make_bank

    from trawmem_gpu.select.restrict import meta_columns, unit_mask

    bank = make_bank("b", [3, 5, 1, 4, 2], seed=0)
    turns = [replace(t, metadata=Metadata({"user_id": f"u{i % 3}"}) if i % 4 else None) for i, t in enumerate(bank.turns)]
    want = replace(bank, turns=turns)
    got = replace(bank, turns=appended(TurnColumns.of(turns[:11]), turns[11:]))
    assert meta_columns(got).__dict__.keys() == meta_columns(want).__dict__.keys()
    for where in ({"user_id": "u1"}, {"user_id": {"in": ["u0", "u2"]}}, None):
        a, b = unit_mask(got, where), unit_mask(want, where)
        assert (a is None and b is None) or a.tolist() == b.tolist()
    assert unit_mask(got, {"user_id": "u1"}).sum() == sum(1 for t in turns if t.metadata and t.metadata["user_id"] == "u1")
